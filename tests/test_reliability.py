"""Reliability and security, one small real run of each category (``make reliability`` repeats them).

Releases run through the real ``kepsilon`` command against the session's real local Prefect server
(``prefect_server_env`` in conftest.py; the orchestrator scenario kills a server of its own); each
scenario's checks are listed on failure. Scenarios live in ``reliability/scenarios.py``.
"""

import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from kepsilon.faults import ENV_FAULT_AT, fault_point
from reliability.harness import Results
from reliability.scenarios import (
    BAD_DAY_CATEGORY,
    FAULT_POINTS,
    ORCHESTRATOR_CATEGORY,
    bad_input_scenario,
    fault_scenario,
    inprocess_cli,
    late_lock,
    leak_scenario,
    noise_scenario,
    orchestrator_death,
    race_scenario,
    sample_source,
    tamper_scenario,
)

pytestmark = pytest.mark.server


def assert_all_pass(results: Results, category: str, minimum: int) -> None:
    own = [c for c in results.checks if c.category == category]
    failed = [f"{c.name}: {c.detail}" for c in own if not c.ok]
    assert not failed, "\n".join(failed)
    assert len(own) >= minimum, f"only {len(own)} {category} checks ran"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tmp_path_factory.mktemp("reliability")


@pytest.fixture(scope="module")
def server(prefect_server_env):
    return prefect_server_env


@pytest.fixture(scope="module")
def sample(base):
    return sample_source(base / "sample.csv", 400)


@pytest.fixture(scope="module")
def race(server, base, sample):
    """Three concurrent releases of one population, 0.4 each against a cap of 1.0."""
    results = Results()
    race_scenario(results, server, base / "race", sample, processes=3)
    return results, base / "race" / "audit.db"


def test_fault_point_is_inert_unless_named(monkeypatch):
    monkeypatch.delenv(ENV_FAULT_AT, raising=False)
    fault_point("after-noise")
    monkeypatch.setenv(ENV_FAULT_AT, "after-staging")
    fault_point("after-noise")  # another point: still alive
    killed = subprocess.run(
        [sys.executable, "-c", "from kepsilon.faults import fault_point; fault_point('after-noise'); print('alive')"],
        env={**os.environ, ENV_FAULT_AT: "after-noise"}, capture_output=True, text=True,
    )
    assert killed.returncode == -signal.SIGKILL and "alive" not in killed.stdout


# One kill in each phase of the release: with the noise drawn and nothing staged, with the files staged and
# nothing recorded, and after the record's commit. make reliability kills at every point of FAULT_POINTS.
SHORT_FAULT_POINTS = ("after-noise", "after-staging", "after-audit-commit")


def test_a_kill_in_each_phase_leaves_a_consistent_state_and_a_deterministic_rerun(server, base, sample):
    assert set(SHORT_FAULT_POINTS) <= set(FAULT_POINTS)
    results = Results()
    with ThreadPoolExecutor(max_workers=3) as pool:
        list(pool.map(lambda point: fault_scenario(results, server, base / f"fault-{point}", sample, point, 0),
                      SHORT_FAULT_POINTS))
    assert_all_pass(results, "faults", minimum=len(SHORT_FAULT_POINTS) * 14)
    names = " ".join(c.name for c in results.checks)
    assert names.count("equals the bytes staged by the killed run") == 2  # the kills from after-staging on


def test_concurrent_releases_over_the_cap_admit_exactly_the_admissible_ones(race):
    results, _ = race
    assert_all_pass(results, "races", minimum=6)


def test_bad_inputs_are_refused_naming_the_problem_and_spend_nothing(server, base, sample):
    results = Results()
    table = bad_input_scenario(results, server, base / "bad", sample, inprocess_cli)
    assert_all_pass(results, "bad input", minimum=len(table) * 2)
    outcomes = {row["case"]: row["outcome"] for row in table}
    assert outcomes["truncated CSV (last record cut mid-field)"] == "refused"
    assert outcomes["k > n (k=500)"] == "refused"
    # One zero-diameter class: no noise, every record links to itself; refused before ε (max_linking_risk).
    assert outcomes["all rows identical (60 rows)"] == "refused"


def test_no_canary_or_seed_reaches_outputs_logs_audit_store_or_prefect(server, base):
    results = Results()
    matrix = leak_scenario(results, server, base / "leak", sample_source(base / "leak-sample.csv", 600))
    assert_all_pass(results, "leaks", minimum=12)
    assert matrix["Prefect database (raw file bytes)"] >= 1


def test_edited_deleted_and_truncated_audit_history_is_detected(race, server, base):
    results = Results()
    _, store = race
    tried = tamper_scenario(results, server, base / "tamper", store)
    assert_all_pass(results, "tampering", minimum=tried * 2)
    assert tried == 7


def test_a_late_lock_leaves_nothing_under_the_final_name_and_the_rerun_resumes(server, base, sample):
    """Short version of make reliability's late lock (held 90 s against a 60 s busy timeout): here 6 s against 2 s.

    The lock is taken as the release starts staging, so neither its record nor its failure record can be
    written: one line says the reservation stands, and the rerun publishes with one spend and one draw.
    """
    results = Results()
    row = late_lock(results, server, base / "bad-day", sample, seconds=6, busy_timeout=2, rerun_cli=inprocess_cli)
    assert_all_pass(results, BAD_DAY_CATEGORY, minimum=5)
    assert (row["outcome"], row["releases"], row["epsilon"], row["records"]) == ("failed after ε, then resumed", 1, 1.0, "1 published")


def test_noise_fits_laplace_lies_on_its_grid_and_a_wrong_scale_is_caught():
    results = Results()
    noise_scenario(results, samples=5000)
    assert_all_pass(results, "noise", minimum=6 * 5)


# --- A store only its owner reads (issue 21.3; reliability/private_store.py) ------------------------------


def test_private_files_are_owner_only_a_store_copy_is_no_oracle_and_a_shared_folder_is_refused(server, base, sample):
    from reliability.private_store import CATEGORY, private_store_scenario

    results = Results()
    private_store_scenario(results, server, base / "private-store", sample)
    assert_all_pass(results, CATEGORY, minimum=4)


def test_when_the_prefect_server_dies_after_the_noise_the_cli_tells_what_the_store_records(base, sample, migrated_prefect_database):
    """Short version of make reliability's three kills: the server SIGKILLed with the noise drawn.

    The release goes on without it and is published; the CLI says so in one line from the audit store
    (exit 0), instead of retrying for minutes and ending ``release failed: ConnectError``.
    """
    results = Results()
    row = orchestrator_death(results, base / "orchestrator", sample, "after-noise", migrated_database=migrated_prefect_database)
    assert_all_pass(results, ORCHESTRATOR_CATEGORY, minimum=7)
    assert (row["store"], row["exit"]) == ("published", 0)


# --- A store put back from a backup (issue 24.1; reliability/rollback.py) ---------------------------------


def test_a_store_put_back_from_a_backup_with_its_head_log_is_refused_before_epsilon(server, base, sample):
    """Short version of make reliability's rollback block: the issue's own scenario (the store and its head
    log put back after a second release) through the CLI. The other two ways (head log deleted, newer head
    log kept) run in make reliability; tests/test_rollback.py and tests/test_audit_integrity.py check all
    three through the library."""
    from reliability.rollback import CATEGORY, WAYS, rollback_scenario

    results = Results()
    ways = WAYS[:1]
    assert ways[0][0] == "store and head log put back"
    table = rollback_scenario(results, server, base / "rollback", sample, ways=ways)
    assert_all_pass(results, CATEGORY, minimum=8)
    assert [row["refused_before_epsilon"] for row in table] == [True]


@pytest.mark.heavy  # a release, a throw-away server of the CLI's kind and a Datasette: about 90 s
def test_unauthenticated_requests_to_prefect_and_the_officers_datasette_are_refused(server, base, sample):
    from reliability.logins import CATEGORY, logins_scenario

    results = Results()
    logins_scenario(results, server, base / "logins", sample)
    assert_all_pass(results, CATEGORY, minimum=35)


# --- Every check that needs no noise before ε, through the CLI (issue 24.3, 24.5; reliability/pre_epsilon.py) ---


def test_the_noise_grid_the_scratch_folder_and_an_empty_release_are_refused_before_epsilon_and_by_check(server, base, sample):
    """Short version of make reliability's 'before ε' cases: ε 1e7 under a cap of 2e7 (the grid under the
    float precision), a Dask scratch folder inside the output folder, and a release confidence suppression
    would empty. Each: ``kepsilon release`` exit 2 in one line naming the parameter, nothing reserved or
    spent; ``kepsilon check`` marks the same verdict NO."""
    from reliability.pre_epsilon import CATEGORY, GRID_CASES, empty_release, noise_grid_cases, scratch_in_output

    results = Results()
    rows = noise_grid_cases(results, server, base / "before-epsilon", sample, cases=GRID_CASES[1:])
    rows += [scratch_in_output(results, server, base / "before-epsilon", sample),
             empty_release(results, server, base / "before-epsilon", sample)]
    assert_all_pass(results, CATEGORY, minimum=8 + 7 + 7)  # the grid case also checks that ε is not repeated
    assert [row["exit"] for row in rows] == [2, 2, 2]


def test_a_deleted_seed_key_is_refused_not_recreated_and_the_rerun_resumes_once_it_is_back(server, base, sample):
    """Issue 24.3: a release killed after its noise, its seed key deleted: the rerun and the check refuse naming
    KEPSILON_SEED_KEY_FILE and create no new key; with the key put back, the rerun publishes on the same
    reservation and seed (one spend): no ε lost."""
    from reliability.pre_epsilon import CATEGORY, deleted_seed_key

    results = Results()
    deleted_seed_key(results, server, base / "seed-key", sample)
    assert_all_pass(results, CATEGORY, minimum=11)


@pytest.mark.heavy  # a Dask release (cluster start), the disk filled under it, and its rerun: over a minute
def test_a_full_disk_under_a_dask_release_prints_one_line_and_no_worker_traceback(server, base, sample):
    """The full-disk case of make reliability's bad settings: the output and scratch on a 32 MiB tmpfs filled
    right after the reservation. One ``release failed`` line naming the full disk, exit 2, no traceback from
    the local workers' tasks (the shard tasks printed theirs when ``kepsilon release`` stopped asking the
    workers to hide them), recorded as failed; the rerun with room again publishes on the same reservation."""
    from reliability.scenarios import SETTINGS_CATEGORY, full_disk_dask

    results = Results()
    if full_disk_dask(results, server, base / "full-disk", sample) is None:
        pytest.skip("no tmpfs mount here (needs root in a container that allows mount)")
    assert_all_pass(results, SETTINGS_CATEGORY, minimum=4)
