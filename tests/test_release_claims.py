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


def test_the_first_claim_on_a_fresh_machine_makes_the_stores_private_folder(tmp_path):
    """`make demo` on a fresh clone: the claim comes before the store is opened, so its folder (the default
    ./.kepsilon) does not exist yet; it is made 0700, and a store folder others can write to is refused."""
    import stat

    from kepsilon.audit.claims import claim_file, release_claim
    from kepsilon.audit.private import PrivateFolderError

    store = tmp_path / "fresh" / ".kepsilon" / "audit.db"
    with release_claim(store, "first-release"):
        assert claim_file(store, "first-release").exists()
    for folder in (store.parent, claim_file(store, "first-release").parent):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    assert stat.S_IMODE(claim_file(store, "first-release").stat().st_mode) == 0o600

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(PrivateFolderError, match="KEPSILON_AUDIT_DB"):
        with release_claim(shared / "audit.db", "r"):
            pass
