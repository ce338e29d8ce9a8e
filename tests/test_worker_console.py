"""The Dask engine's local workers keep failed tasks' tracebacks off the terminal when the CLI asks
(``kepsilon/worker_console.py``): ``kepsilon release`` and ``kepsilon check`` ask unless ``--debug``.

The whole path (a Dask release whose workers' tasks fail on a full disk, one line and no traceback) is the
heavy test in ``test_reliability.py`` and the full-disk case of ``make reliability``'s bad settings.
"""

from __future__ import annotations

import logging
import os

import pytest
from typer.testing import CliRunner

import kepsilon.cli as cli_module
from kepsilon.cli import app
from kepsilon.worker_console import ENV_WORKER_TRACEBACKS, NoTracebacks

from .conftest import ROOT

runner = CliRunner()
SPEC = ROOT / "releases" / "paper-synthetic.yaml"


@pytest.fixture
def setting_seen(monkeypatch, tmp_path):
    """What KEPSILON_WORKER_TRACEBACKS holds when the command reaches the Prefect API (where the flow, and
    with it the local cluster's workers, would start); the command stops there."""
    monkeypatch.delenv(ENV_WORKER_TRACEBACKS, raising=False)  # restored after the test, whatever the CLI set
    monkeypatch.setenv("KEPSILON_AUDIT_DB", str(tmp_path / "audit.db"))
    seen: list[str | None] = []

    def reached(*args, **kwargs):
        seen.append(os.environ.get(ENV_WORKER_TRACEBACKS))
        raise RuntimeError("stopped where the run would start")

    monkeypatch.setattr(cli_module, "_prefect_api", reached)
    return seen


@pytest.mark.parametrize("command", ["release", "check"])
@pytest.mark.parametrize("debug, expected", [([], "hidden"), (["--debug"], "shown")])
def test_release_and_check_ask_the_workers_to_hide_task_tracebacks_unless_debug(setting_seen, command, debug, expected):
    # `kepsilon release` lost this in a merge: a full disk under a Dask release printed the workers' tracebacks.
    runner.invoke(app, [command, str(SPEC), *debug])
    assert setting_seen == [expected]


def test_the_workers_console_filter_drops_only_records_carrying_an_exception():
    try:
        raise OSError(28, "No space left on device")
    except OSError as error:
        failed = logging.LogRecord("prefect.task_runs", logging.ERROR, __file__, 1, "Task run failed", None,
                                   (type(error), error, error.__traceback__))
    plain = logging.LogRecord("prefect.task_runs", logging.ERROR, __file__, 1, "Task run failed", None, None)
    assert not NoTracebacks().filter(failed) and NoTracebacks().filter(plain)
