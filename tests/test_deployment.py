"""The scripted deployment check, run as a test: a real local Prefect server, a process work pool, a
worker, and a run of the nightly deployment with k and ε changed as an operator would from the UI."""

import os
import subprocess
import sys

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.server


def test_a_deployment_run_with_changed_parameters_completes(migrated_prefect_database, tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "deployments" / "check_deployment.py"), "--k", "7", "--epsilon", "0.5",
         "--prefect-database", str(migrated_prefect_database)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TMPDIR": str(tmp_path)},  # where its folder is made
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAIL" not in result.stdout
    assert "PASS  published file is 7-anonymous" in result.stdout
    assert "PASS  manifest records the changed k=7" in result.stdout
    # A passed check leaves nothing behind: its folder held a store, a seed key, reports and published files.
    assert list(tmp_path.glob("kepsilon-deploy-*")) == []
