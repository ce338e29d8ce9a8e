# Every target sets up its own project-local environment: a fresh machine needs only python3 and make.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

# Prefect and Great Expectations stay local and offline; results never persist (they would hold microdata).
export PREFECT_HOME := $(CURDIR)/.prefect
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export PREFECT_RESULTS_PERSIST_BY_DEFAULT := false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS := 120
export GX_ANALYTICS_ENABLED := false
export DO_NOT_TRACK := 1

.PHONY: install demo test test-heavy bench bench-scale certificate-cost certificate-demo disclosure-cost dp-adult serve deployment-check audit-ui audit-ui-check clean reliability paper

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test]'
	touch $@

## demo: anonymise the bundled sample (data/paper-synthetic) and publish it under out/
## A population without a cap gets KEPSILON_DEFAULT_CAP (10 here), recorded as set by 'kepsilon-default'.
demo: install
	KEPSILON_DEFAULT_CAP=$${KEPSILON_DEFAULT_CAP:-10} $(BIN)/kepsilon release releases/paper-synthetic.yaml

## test: lint (ruff), types (mypy through scripts/typecheck.py, over [tool.mypy] files in pyproject.toml) and the test
## suite (the heavy variants run in make test-heavy), spread over TEST_WORKERS pytest-xdist processes (2: this
## project's machines have 2 cores; each worker starts its own session Prefect servers). A module stays on one
## worker (--dist loadscope), so a module's shared fixtures (a cluster, a workspace) start once; the slowest modules
## go first (tests/conftest.py's SLOWEST_MODULES), so that neither worker is left alone with one at the end.
## The type check runs beside the tests at the lowest priority (nice 19): it takes the core time the tests leave idle
## (servers starting, subprocesses waiting) instead of 40 s before them on a fresh clone. Its output is printed
## after the tests'; the target fails if either fails.
TEST_WORKERS ?= 2
test: install
	$(BIN)/ruff check .
	@types_log=$$(mktemp); \
	nice -n 19 $(BIN)/python scripts/typecheck.py > "$$types_log" 2>&1 & types_pid=$$!; \
	$(BIN)/pytest -m "not heavy" -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder; tests=$$?; \
	wait $$types_pid; types=$$?; \
	echo "--- types (mypy through scripts/typecheck.py):"; cat "$$types_log"; rm -f "$$types_log"; \
	test $$tests -eq 0 && test $$types -eq 0

## test-heavy: the slow variants: the Prefect UI's run pages in headless Chromium, every stop signal of make serve
test-heavy: install
	$(BIN)/pytest -m heavy

## bench: stage timings and two whole releases (release-1m in memory, release-10m-dask), written to
## benchmarks/results.json; the synthetic populations are generated once into benchmarks/.populations/
bench: install
	$(BIN)/python -m benchmarks.run

## bench-scale: fine-grained k-quasis (5-digit ZIP over 3,000 codes, Zipf-like) at 1M, 10M and 30M rows on a
## configured Prefect server and an existing TLS Dask cluster of 2 one-thread workers: wall time, distinct tuples,
## classes, every process's peak memory, CPU time, stage times, the fixed cost apart from the per-record cost
## (benchmarks/scale-results.json, "fine"; docs/performance.md). The older resampled series: BENCH_SCALE=series
bench-scale: install
	$(BIN)/python -m benchmarks.scale $(if $(filter series,$(BENCH_SCALE)),--series,--fine)

## certificate-cost: what the officer's certificate costs a release, on UCI Adult (memory engine), on the fine-grained 10M population and on
## 10M rows (dask engine, 2 workers): benchmarks/certificate-cost.json and a markdown table; about 10 minutes
certificate-cost: install
	$(BIN)/python -m benchmarks.certificate_cost

## certificate-demo: the demo release's certificate verified, refused after one changed byte, printed to PDF,
## and screenshotted in headless Chromium into docs/certificate-demo.png (needs Debian's chromium)
certificate-demo: install
	$(BIN)/python scripts/certificate_demo.py

## disclosure-cost: what ℓ = 2 and t = 0.2 on salary-class cost on UCI Adult (markdown table)
disclosure-cost: install
	$(BIN)/python -m benchmarks.disclosure_cost

## dp-adult: the DP mode on UCI Adult at ε = 1, δ ≤ 1e-6: each quality model and the walk, ARX Granularity, the walk's budget swept (markdown tables, benchmarks/dp-adult.json)
dp-adult: install
	$(BIN)/python -m benchmarks.dp_adult

## serve: local Prefect server with its UI (http://127.0.0.1:4200), the deployments, and a worker
serve: install
	deployments/serve.sh

## deployment-check: a deployment run with changed k and ε completes on a throw-away local server
deployment-check: install
	$(BIN)/python deployments/check_deployment.py

## audit-ui: read-only Datasette over the audit store, officers' questions as canned queries only (port 8001):
## no SQL, no table pages, writes answered 405. The metadata's canned queries attach to a database named
## "audit", so the store's file must be called audit.db (the default ./.kepsilon/audit.db is).
## Behind a login: officers' accounts from `kepsilon officers add NAME` (docs/logins.md); none, no server.
audit-ui: install
	$(BIN)/kepsilon officers check
	$(BIN)/datasette serve $${KEPSILON_AUDIT_DB:-.kepsilon/audit.db} --metadata audit/datasette.yaml \
		--plugins-dir audit/datasette_plugins --host 127.0.0.1 --port 8001

## audit-ui-check: the canned queries rendered in headless Chromium (needs Debian's chromium)
audit-ui-check: install
	$(BIN)/python scripts/audit_ui_check.py

## reliability: faults, races, bad input, leaks, tampering, noise; writes reliability/report.md
reliability: install
	$(BIN)/python -m reliability.run

## paper: the method's campaign (method.md §8) on the bundled sample; writes reports/paper/README.md and plots
paper: install
	$(BIN)/python -m benchmarks.paper

## clean: the demo's outputs and Prefect's state; the private folder ./.kepsilon (audit store, keys)
## is kept: it holds the ε ledger and the keys that reruns need. Removing it does not start from nothing: its head
## log (in the account's state folder) then refuses the empty store until an officer runs
## kepsilon audit retire-head-log --by NAME --reason TEXT (docs/private-store.md)
clean:
	rm -rf out .prefect
