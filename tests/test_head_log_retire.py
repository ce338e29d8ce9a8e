"""A store removed on purpose, and the recorded way to start from nothing: ``kepsilon audit retire-head-log``.

The user's path, as a user runs it (subprocesses of the real ``kepsilon``): a release publishes (the store has a
chain, its head log in the account's state folder records it); the checkout — store, keys, published folder — is
deleted and cloned again at the same path; the next release is refused as rolled back, since the head log
outlives the checkout, and the refusal names the way out; ``verify`` says the log remains; the officer retires it
with ``--by`` and ``--reason``; the release then publishes on a new store. Retiring is refused while the store has
chain entries, and leaves the log untouched.

Then the store alone is removed with its publication kept in the output folder: after the log is retired, the
publication's manifest refuses the new store, naming the way out (move the publications aside), and the release
publishes once they are moved.

One module workspace runs the whole path once (five releases, two of them refused before ε); each test asserts
on one step, so the tests pass in any order.
"""

import json
import shutil
import sqlite3
import stat
import subprocess

import pytest
import yaml

from .conftest import ROOT, release_spec_dict

pytestmark = pytest.mark.server

KEPSILON = str(ROOT / ".venv" / "bin" / "kepsilon") if (ROOT / ".venv" / "bin" / "kepsilon").exists() else "kepsilon"
POPULATION = "retire-people"
RETIRE = "kepsilon audit retire-head-log --by NAME --reason TEXT"


def _kepsilon(work, env, *args) -> subprocess.CompletedProcess:
    return subprocess.run([KEPSILON, *args], env=env, cwd=work, capture_output=True, text=True, timeout=300)


def _one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]


def _ledger_rows(store) -> int:
    if not store.exists():
        return 0
    conn = sqlite3.connect(store)
    try:
        return conn.execute("SELECT COUNT(*) FROM ledger").fetchone()[0]
    finally:
        conn.close()


@pytest.fixture(scope="module")
def path(tmp_path_factory, prefect_server_env):
    """The whole path, once: each step's outcome, by name, for the tests to assert on."""
    work = tmp_path_factory.mktemp("retire")
    checkout, state = work / "checkout", work / "state"
    store = checkout / ".kepsilon" / "audit.db"
    spec = release_spec_dict("paper-synthetic", release_id="retire-demo", population_id=POPULATION,
                             output_dir=str(checkout / "out"))
    (work / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    env = {**prefect_server_env, "KEPSILON_AUDIT_DB": str(store), "XDG_STATE_HOME": str(state),
           "KEPSILON_SEED_KEY_FILE": str(checkout / ".kepsilon" / "seed.key"),
           "KEPSILON_REPORTS_DIR": str(checkout / "reports"), "KEPSILON_DEFAULT_CAP": "10"}  # as `make demo` runs it
    for name in ("KEPSILON_SEED_KEY", "KEPSILON_FINGERPRINT_KEY", "KEPSILON_FINGERPRINT_KEY_FILE",
                 "KEPSILON_AUDIT_HEAD_LOG", "KEPSILON_FAULT_AT", "DO_NOT_TRACK"):
        env.pop(name, None)
    heads = state / "kepsilon" / "heads"
    steps: dict = {"store": store, "heads": heads}

    def release():
        return _kepsilon(work, env, "release", str(work / "spec.yaml"))

    steps["first"] = release()
    logs = sorted(heads.glob("*.heads"))
    steps["logs"] = logs
    log = logs[0] if len(logs) == 1 else heads / "missing.heads"
    steps["log"] = log
    steps["log_before"] = log.read_bytes() if log.exists() else b""
    steps["retire_with_entries"] = _kepsilon(work, env, "audit", "retire-head-log", "--by", "A. Officer",
                                             "--reason", "should be refused")
    steps["log_after_refusal"] = log.read_bytes() if log.exists() else b""
    steps["retired_after_refusal"] = sorted(heads.glob("*.retired-*"))

    shutil.rmtree(checkout)  # the checkout deleted (store, keys, published folder), cloned again at the same path
    checkout.mkdir()
    steps["removed"] = release()
    steps["ledger_after_removed"] = _ledger_rows(store)
    steps["verify_removed"] = _kepsilon(work, env, "audit", "verify")
    steps["no_by"] = _kepsilon(work, env, "audit", "retire-head-log", "--reason", "checkout cloned again")
    steps["no_reason"] = _kepsilon(work, env, "audit", "retire-head-log", "--by", "A. Officer")
    steps["blank_by"] = _kepsilon(work, env, "audit", "retire-head-log", "--by", "  ", "--reason", "x")
    steps["log_kept"] = log.exists()
    steps["retire"] = _kepsilon(work, env, "audit", "retire-head-log", "--by", "A. Officer",
                                "--reason", "checkout deleted and cloned again")
    steps["retired"] = sorted(heads.glob("*.retired-*"))
    steps["log_gone"] = not log.exists()
    steps["retire_again"] = _kepsilon(work, env, "audit", "retire-head-log", "--by", "A. Officer", "--reason", "twice")
    steps["after"] = release()
    steps["verify_after"] = _kepsilon(work, env, "audit", "verify", "--format", "json")

    # The store alone removed, its publication kept in the output folder: the log retired, the manifest refuses.
    shutil.rmtree(store.parent)
    steps["retire_kept_publication"] = _kepsilon(work, env, "audit", "retire-head-log", "--by", "A. Officer",
                                                 "--reason", "store removed, publications kept")
    steps["kept_publication"] = release()
    steps["ledger_kept_publication"] = _ledger_rows(store)
    shutil.move(checkout / "out", work / "old-publications")
    steps["moved_aside"] = release()
    return steps


def test_the_first_release_publishes_and_its_head_log_is_in_the_state_folder(path):
    assert path["first"].returncode == 0, path["first"].stderr
    assert len(path["logs"]) == 1 and path["log_before"], path["logs"]
    assert path["logs"][0].name.startswith("audit.db-")


def test_retiring_is_refused_while_the_store_has_chain_entries_and_the_log_is_untouched(path):
    done = path["retire_with_entries"]
    assert done.returncode == 2 and not done.stdout
    line = _one_line(done.stderr)
    assert line.startswith(f"error: audit store {str(path['store'])!r} has ") and "chain entries" in line, line
    assert "`kepsilon audit verify`" in line and "Traceback" not in done.stderr
    assert path["log_after_refusal"] == path["log_before"] and not path["retired_after_refusal"]


def test_a_release_after_the_store_was_removed_is_refused_naming_the_way_out(path):
    done = path["removed"]
    assert done.returncode == 2, done.stdout + done.stderr
    refusals = [line for line in done.stderr.splitlines() if line.startswith("release refused:")]
    assert len(refusals) == 1, done.stderr
    assert done.stderr.rstrip().endswith(refusals[0]), "the reason is the last thing printed"
    assert "rolled back: the store has no chain, but its head log recorded" in refusals[0]
    assert RETIRE in refusals[0] and "Traceback" not in done.stdout + done.stderr
    assert path["ledger_after_removed"] == 0  # nothing reserved, nothing recorded


def test_verify_says_the_store_is_gone_but_its_head_log_remains(path):
    done = path["verify_removed"]
    assert done.returncode == 2
    line = _one_line(done.stderr)
    assert line.startswith(f"error: no audit store at {str(path['store'])!r}, but its head log {str(path['log'])!r} remains")
    assert RETIRE in line


@pytest.mark.parametrize("step, option", [("no_by", "--by"), ("no_reason", "--reason"), ("blank_by", "--by")])
def test_retiring_needs_a_name_and_a_reason(path, step, option):
    done = path[step]
    assert done.returncode == 2 and not done.stdout
    assert _one_line(done.stderr).startswith(f"error: option '{option}': give ")
    assert path["log_kept"]


def test_retiring_moves_the_log_aside_recording_who_why_and_its_head(path):
    done = path["retire"]
    assert done.returncode == 0, done.stderr
    assert len(path["retired"]) == 1 and path["log_gone"]
    retired = path["retired"][0]
    assert retired.parent == path["log"].parent and retired.name.startswith(path["log"].name + ".retired-")
    assert stat.S_IMODE(retired.stat().st_mode) == 0o600 and stat.S_IMODE(retired.parent.stat().st_mode) == 0o700
    line = _one_line(done.stdout)
    assert line.startswith(f"head log of audit store {str(path['store'])!r} retired by 'A. Officer'")
    assert repr(str(retired)) in line
    content = retired.read_bytes()
    assert content.startswith(path["log_before"])  # every head it logged, kept
    record = json.loads(content.splitlines()[-1])
    logged = max(json.loads(raw)["entries"] for raw in path["log_before"].splitlines())
    assert record["by"] == "A. Officer" and record["reason"] == "checkout deleted and cloned again"
    assert record["retired_head"]["entries"] == logged and record["retired_at"].endswith("Z")
    assert record["store"] == str(path["store"])


def test_retiring_again_says_there_is_no_head_log(path):
    done = path["retire_again"]
    assert done.returncode == 2
    assert _one_line(done.stderr).startswith(f"error: no head log to retire for audit store {str(path['store'])!r}")


def test_after_retiring_the_release_publishes_on_a_new_store(path):
    assert path["after"].returncode == 0, path["after"].stderr
    assert "records published" in path["after"].stdout
    assert path["verify_after"].returncode == 0, path["verify_after"].stderr
    assert json.loads(path["verify_after"].stdout)[0]["ok"] is True
    assert path["log"].exists()  # the new store's own log, in the same place


def test_publications_of_a_removed_store_refuse_the_new_one_naming_the_way_out(path):
    assert path["retire_kept_publication"].returncode == 0, path["retire_kept_publication"].stderr
    done = path["kept_publication"]
    assert done.returncode == 2, done.stdout + done.stderr
    refusals = [line for line in done.stderr.splitlines() if line.startswith("release refused:")]
    assert len(refusals) == 1 and done.stderr.rstrip().endswith(refusals[0]), done.stderr
    assert "rolled back: the store has 0 chain entries, but the published manifest" in refusals[0]
    assert "move that store's publications out of the output folder first" in refusals[0]
    assert path["ledger_kept_publication"] == 0  # nothing reserved, nothing recorded


def test_with_the_publications_moved_aside_the_release_publishes(path):
    done = path["moved_aside"]
    assert done.returncode == 0, done.stderr
    assert "records published" in done.stdout
