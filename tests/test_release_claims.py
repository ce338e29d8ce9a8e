"""Same-id races (issue 24, item 5): a run of a release that another live run is publishing is refused
before it reads, reserves or records anything; once that run is over, the release goes ahead.

The race itself, three real processes started together, is ``reliability/scenarios.py``'s
``same_id_race`` (``make reliability``).
"""

import os

import pytest

from kepsilon.audit.claims import ReleaseInProgress, release_claim
from kepsilon.flows.release import governed_release
from kepsilon.flows.spec import parse_spec

from .conftest import capped_store

pytestmark = [pytest.mark.flow, pytest.mark.usefixtures("prefect_harness")]


def test_a_run_of_a_release_another_live_run_holds_is_refused_and_adds_nothing(tmp_path, monkeypatch, synthetic_spec_dict):
    store = capped_store(tmp_path, monkeypatch, "test-population")
    spec = parse_spec(synthetic_spec_dict)
    with release_claim(os.environ["KEPSILON_AUDIT_DB"], spec.release_id):  # the other run, alive
        with pytest.raises(ReleaseInProgress, match="'test-release' is already being published by another run"):
            governed_release(spec)
    assert list(store["releases"].rows) == []
    assert [row["kind"] for row in store["ledger"].rows] == ["cap"]
    assert list(store["sealed_seeds"].rows) == []
    assert not (tmp_path / "out" / "test-release").exists()

    record = governed_release(spec)  # the other run is over: this one publishes
    assert record["release_id"] == "test-release" and (tmp_path / "out" / "test-release" / "manifest.json").exists()
    assert [(r["release_id"], r["outcome"]) for r in store["releases"].rows] == [("test-release", "published")]
