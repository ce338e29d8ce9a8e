"""Shared fixtures: paths to the bundled data, a small valid release spec, one Prefect server per session."""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SYNTHETIC = ROOT / "data" / "paper-synthetic"
ADULT = ROOT / "data" / "adult"

# `kepsilon release` without PREFECT_API_URL looks for `make serve`'s server at 127.0.0.1:PREFECT_PORT
# (default 4200). A test must never report to a developer's own server: port 1 never answers here, so
# a CLI run without an API starts its own server as it would on a machine without `make serve`.
# Tests of that lookup set PREFECT_PORT themselves.
os.environ["PREFECT_PORT"] = "1"

# pytest-xdist's workers set COLUMNS=80 and LINES=24 (execnet's defaults): a CLI run in a tmux pane or with
# CliRunner's own COLUMNS would be drawn 80 wide, as no user's terminal is. Tests run as the suite does serially.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)


# The modules that take longest in make test (seconds of test time on a quiet 2-core machine, 2026-11-29: 256, 210,
# 160, 74, 40, 37, 35, 25, 20), collected first. make test hands whole modules to its two pytest-xdist workers in
# collection order (--dist loadscope --no-loadscope-reorder; xdist's own reorder puts the modules with most tests
# first, which left the reliability and CLI modules to the end, one worker finishing them while the other idled).
# Only the order changes; a module missing from the list keeps its place after these.
SLOWEST_MODULES = (
    "test_reliability", "test_cli_output", "test_dask_release", "test_flow", "test_certificate_engines",
    "test_refusal_order", "test_deployment", "test_serve", "test_principals_cli",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: place for place, name in enumerate(SLOWEST_MODULES)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: each module keeps its own order


def release_spec_dict(name: str, **changes) -> dict:
    """A shipped release spec (``releases/<name>.yaml``) as a mapping with absolute paths, changed as asked."""
    from kepsilon.flows.spec import load_spec

    spec = load_spec(ROOT / "releases" / f"{name}.yaml").model_dump(mode="json")
    spec.update(changes)
    return spec


@pytest.fixture
def synthetic_spec_dict(tmp_path) -> dict:
    """The shipped paper-synthetic release, under test names, publishing under a temporary folder."""
    return release_spec_dict(
        "paper-synthetic", release_id="test-release", population_id="test-population", output_dir=str(tmp_path / "out")
    )


@pytest.fixture(scope="session", autouse=True)
def private_state_folder(tmp_path_factory):
    """The default head logs (``$XDG_STATE_HOME/kepsilon/heads``, one per store path) of the whole session
    under a temporary folder, never in the account's real state folder; set before any module's store."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
        yield


@pytest.fixture(scope="session")
def prefect_harness(prefect_server_env):
    """The session's real Prefect server (``prefect_server_env``) for every in-process flow run of the session
    (``pytest.mark.usefixtures("prefect_harness")``); under pytest-xdist, one per worker.

    It was Prefect's ``prefect_test_harness``, a second server per worker beside the one the CLI's subprocesses
    use: one server fewer per worker saves its start and its background services' CPU over the whole run (two
    cores, both busy for the whole of make test). Tests that read the API back filter by their own flow run,
    artifact key or release id, so the other runs in the same database do not change what they see.

    Flow-run heartbeats are off here: each in-process run otherwise spends 1.5–2.5 s emitting its first
    heartbeat and joining the heartbeat thread at exit (measured on a quiet 2-core machine: a paper-synthetic
    release 3.1–4.9 s with them, 1.6–2.7 s without), and no test reads a heartbeat.
    """
    import inspect

    import prefect.context
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import (
        PREFECT_API_AUTH_STRING,
        PREFECT_API_URL,
        PREFECT_CLIENT_MAX_RETRIES,
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        temporary_settings,
    )
    from prefect.utilities.asyncutils import run_coro_as_sync

    env = prefect_server_env
    with temporary_settings(updates={
        PREFECT_API_URL: env["PREFECT_API_URL"],
        PREFECT_API_AUTH_STRING: env["PREFECT_API_AUTH_STRING"],
        PREFECT_CLIENT_MAX_RETRIES: int(env["PREFECT_CLIENT_MAX_RETRIES"]),
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None,
    }):
        # As Prefect's harness does: code running in a context copied before this one sees the same server.
        with prefect.context._temporary_global_settings_context(prefect.context.get_settings_context()):
            yield

            async def drain() -> None:
                # Send the runs' last logs and events while the server still answers.
                for worker in (APILogWorker, EventsWorker):
                    try:
                        drained = worker.drain_all()
                        if inspect.isawaitable(drained):
                            await drained
                    except RuntimeError:  # never started
                        pass

            run_coro_as_sync(drain())


def capped_store(tmp_path, monkeypatch, population: str):
    """A fresh audit store with a cap of 5 ε for ``population``; seed key and private figures beside it.

    Everything a release writes outside its output folder goes under ``tmp_path``, never into the checkout.
    """
    from kepsilon.audit.ledger import set_cap
    from kepsilon.audit.store import open_store

    path = tmp_path / "audit.db"
    monkeypatch.setenv("KEPSILON_AUDIT_DB", str(path))
    monkeypatch.setenv("KEPSILON_SEED_KEY_FILE", str(tmp_path / "keys" / "seed.key"))
    monkeypatch.delenv("KEPSILON_DEFAULT_CAP", raising=False)
    monkeypatch.setenv("KEPSILON_REPORTS_DIR", str(tmp_path / "reports"))
    db = open_store(path)
    set_cap(db, population, 5.0, by="test-officer", reason="test cap")
    return db


@pytest.fixture(scope="session")
def migrated_prefect_database(tmp_path_factory) -> Path:
    """A Prefect database Prefect itself has created and migrated (``prefect server database upgrade``), made
    once for the whole run (both pytest-xdist workers, under a lock) and copied by
    :func:`kepsilon.local_server.seeded_prefect_home`.

    A server started on an empty PREFECT_HOME spends about 4.5 s of CPU running Prefect's migrations before it
    answers (8 s to healthy against 3.3 s on a migrated database, quiet 2-core machine), and make test starts
    about ten. What those tests check (logins, stops, busy databases, the CLI's messages) is the same on a
    migrated database. The CLI's own server on a fresh home, as a new user's first `kepsilon release` starts
    it, keeps an empty one (test_cli_output's "no server answering" tests), as does `make demo`.
    """
    import fcntl
    import subprocess
    import sys

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the run's folder, above each worker's own
    home = shared / "migrated-prefect"
    database = home / "prefect.db"
    with open(shared / "migrated-prefect.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not database.exists():
            home.mkdir(exist_ok=True)
            env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{home / 'making.db'}"}
            made = subprocess.run([str(Path(sys.executable).parent / "prefect"), "server", "database", "upgrade", "-y"],
                                  env=env, capture_output=True, text=True, timeout=300)
            assert made.returncode == 0, made.stdout + made.stderr
            (home / "making.db").rename(database)  # whole, or not there: a second worker never copies half of it
    return database


@pytest.fixture(scope="session")
def prefect_server_env(tmp_path_factory, migrated_prefect_database) -> Iterator[dict]:
    """One real local Prefect server (with its UI) for every CLI run of the session that needs one.

    Yields the environment a ``kepsilon`` subprocess needs to report there (PREFECT_API_URL,
    PREFECT_HOME, telemetry off). Starting a server costs about 15 s on a loaded machine: the CLI tests
    used to start one per run. A test that kills its server (reliability) starts its own.
    """
    from kepsilon.local_server import prefect_server

    with prefect_server(tmp_path_factory.mktemp("session-prefect"), database=migrated_prefect_database) as env:
        # Several releases at once (the reliability scenarios run three) keep its SQLite database busy; its
        # 503 answers outlast the client's default five retries on a loaded 2-core machine.
        yield {**env, "PREFECT_CLIENT_MAX_RETRIES": "8"}
