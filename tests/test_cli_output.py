"""What ``kepsilon release`` prints, run as a user runs it: a subprocess on the bundled sample.

A success prints no ERROR and no traceback (it used to, now and then, when Prefect's temporary server
shut down); a refusal prints its reason as one line with exit code 2 and no traceback (it used to print
Prefect's two tracebacks first), ``--debug`` adds the traceback; a crash still shows what failed and
where. With no Prefect API configured, the command runs its flow against a local server it starts and
stops itself: the test checks that the server is gone afterwards and left no log of a clean run.
Each case starts a Prefect server (about 15 s).
"""

import os
import re
import subprocess
import sys
import urllib.request

import pytest
import yaml

from .conftest import ROOT, release_spec_dict

pytestmark = pytest.mark.server

KEPSILON = str(ROOT / ".venv" / "bin" / "kepsilon") if (ROOT / ".venv" / "bin" / "kepsilon").exists() else "kepsilon"
POPULATION = "cli-output-people"
SUCCESS_RUNS = int(os.environ.get("KEPSILON_CLI_OUTPUT_RUNS", "3"))


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A spec publishing under a temporary folder, its own audit store, seed key and PREFECT_HOME; cap 10."""
    work = tmp_path_factory.mktemp("cli-output")
    # Several releases of the same source here: each is a new release, not "unchanged since the last one".
    spec = release_spec_dict("paper-synthetic", release_id="cli-output", population_id=POPULATION,
                             output_dir=str(work / "out"), rerelease_unchanged=True)
    (work / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    env = {**os.environ, "PREFECT_HOME": str(work / "prefect"), "KEPSILON_AUDIT_DB": str(work / "audit.db"),
           "KEPSILON_SEED_KEY_FILE": str(work / "seed.key"), "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_RESULTS_PERSIST_BY_DEFAULT": "false",
           "DO_NOT_TRACK": "1"}
    # No configured API: the path under test is the one a user without a Prefect server takes.
    for name in ("PREFECT_API_URL", "KEPSILON_SEED_KEY", "KEPSILON_DEFAULT_CAP", "KEPSILON_FAULT_AT"):
        env.pop(name, None)
    capped = subprocess.run([KEPSILON, "audit", "set-cap", POPULATION, "10", "--by", "tester", "--reason", "test"],
                            env=env, cwd=work, capture_output=True, text=True)
    assert capped.returncode == 0, capped.stderr
    return work, env


def run(workspace, *args, command=None):
    work, env = workspace
    done = subprocess.run(command or [KEPSILON, "release", str(work / "spec.yaml"), *args], env=env, cwd=work,
                          capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout, done.stderr


def server_is_gone(output: str) -> bool:
    """The run's server (its port is in the flow run's 'View at' line) no longer answers."""
    ports = set(re.findall(r"View at http://127\.0\.0\.1:(\d+)/", output))
    assert ports, output
    for port in ports:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=2)
            return False
        except OSError:
            pass
    return True


@pytest.mark.parametrize("attempt", range(SUCCESS_RUNS))
def test_a_successful_release_prints_no_error_and_no_traceback(workspace, attempt):
    code, out, err = run(workspace, "--release-id", f"cli-ok-{attempt}")
    assert code == 0, err
    assert "records published" in out
    for text in (out, err):
        assert "Traceback" not in text, text
        assert "ERROR" not in text, text
    assert server_is_gone(err)
    work, _ = workspace
    assert not list((work / "prefect").glob("kepsilon-release-server-*.log")), "a clean run keeps no server log"


def _only_line(err: str, prefix: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, err
    assert err.rstrip().endswith(lines[0]), "the reason is the last thing printed"
    return lines[0]


def greedy_spec(workspace) -> str:
    """The workspace's spec with the gate's limits open, so that ε = 500 passes the checks before ε (its
    predicted linking risk and suppression are far above the defaults) and meets the cap."""
    work, _ = workspace
    spec = yaml.safe_load((work / "spec.yaml").read_text(encoding="utf-8"))
    spec.update(max_linking_risk=1.0, suppression_budget=1.0)
    (work / "greedy.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return str(work / "greedy.yaml")


def test_a_refusal_over_the_cap_prints_one_line_and_no_traceback(workspace):
    code, out, err = run(workspace, command=[KEPSILON, "release", greedy_spec(workspace), "--release-id", "cli-greedy",
                                             "--epsilon", "500"])
    assert code == 2
    line = _only_line(err, "release refused:")
    assert POPULATION in line and "exceeds the remaining budget" in line
    assert "Traceback" not in err + out
    assert server_is_gone(err)


def test_a_refusal_for_an_unknown_column_prints_one_line_and_no_traceback(workspace):
    work, _ = workspace
    spec = yaml.safe_load((work / "spec.yaml").read_text(encoding="utf-8"))
    spec["roles"]["sensitive"] = [*spec["roles"]["sensitive"], "NO_SUCH_COLUMN"]
    (work / "unknown-column.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    code, out, err = run(workspace, command=[KEPSILON, "release", str(work / "unknown-column.yaml"),
                                              "--release-id", "cli-unknown-column"])
    assert code == 2
    assert "NO_SUCH_COLUMN" in _only_line(err, "release refused:")
    assert "Traceback" not in err + out


def test_debug_shows_the_refusals_traceback(workspace):
    code, _, err = run(workspace, command=[KEPSILON, "release", greedy_spec(workspace), "--release-id",
                                           "cli-greedy-debug", "--epsilon", "500", "--debug"])
    assert code == 2
    assert "Traceback" in err and "BudgetExceeded" in err
    _only_line(err, "release refused:")


def test_a_crash_still_says_what_failed_and_where(workspace):
    """Not a refusal: an unexpected exception inside a task keeps its traceback on the console."""
    work, _ = workspace
    crash = (
        "import sys\n"
        "import kepsilon.tasks.ingest as ingest\n"
        "def crash(source):\n"
        "    raise RuntimeError('simulated crash while reading')\n"
        "ingest.read_source = crash\n"
        "from kepsilon.cli import app\n"
        f"sys.argv = ['kepsilon', 'release', {str(work / 'spec.yaml')!r}, '--release-id', 'cli-crash']\n"
        "app()\n"
    )
    code, out, err = run(workspace, command=[sys.executable, "-c", crash])
    assert code == 1
    assert "Traceback" in err and "in crash" in err
    assert _only_line(err, "release failed:") == "release failed: RuntimeError: simulated crash while reading"
    assert server_is_gone(err)


def test_a_failed_gate_says_failed_and_that_its_epsilon_is_spent(workspace):
    # The gate runs on the noisy release, after the spend: "refused" would tell the steward nothing was spent.
    work, _ = workspace
    spec = yaml.safe_load((work / "spec.yaml").read_text(encoding="utf-8"))
    spec["max_prosecutor_risk"] = 0.01  # every group has fewer than 100 members
    (work / "strict-gate.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    code, out, err = run(workspace, command=[KEPSILON, "release", str(work / "strict-gate.yaml"),
                                              "--release-id", "cli-strict-gate"])
    assert code == 2
    line = _only_line(err, "release failed:")
    assert "prosecutor_risk" in line and "its ε is spent" in line
    assert "release refused:" not in err and "Traceback" not in err + out
    assert not (work / "out" / "cli-strict-gate").exists()


@pytest.mark.heavy
def test_kepsilon_check_ends_with_its_verdict_line_and_exit_code(workspace):
    """`kepsilon check` as the README runs it: one line per verdict, then the verdict line; exit 0 only for
    `would publish`. Nothing is reserved (the ledger's reservations are counted before and after)."""
    import sqlite3

    work, _ = workspace

    def reservations() -> int:
        with sqlite3.connect(work / "audit.db") as db:
            return db.execute("SELECT COUNT(*) FROM ledger WHERE kind = 'reserve'").fetchone()[0]

    before = reservations()
    spec = str(work / "spec.yaml")
    code, out, err = run(workspace, command=[KEPSILON, "check", spec, "--release-id", "cli-check-16", "--epsilon", "9"])
    assert code == 2, err
    last = out.strip().splitlines()[-1]
    assert last.startswith("would be refused: suppression ") and "(limit 5.00 %); try " in last
    assert "Traceback" not in out + err
    code, out, err = run(workspace, command=[KEPSILON, "check", spec, "--release-id", "cli-check-ok"])
    assert code == 0, err
    assert out.strip().splitlines()[-1] == "would publish"
    assert reservations() == before
