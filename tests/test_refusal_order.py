"""Both engines refuse a bad spec the same way: one governance (``flows/governance.govern``), one refusal order.

Each bad spec is released twice, in memory and then on Dask (a local cluster shared by the module),
against one audit store with a cap of 5 ε. Both must stop with the same error (class and one-line
message), leave the same refusal rows in their stores (or none), reserve nothing and publish nothing. The
specs with two faults pin the order: the checks that read no record (the output folder, then the roles)
come before those that read the records (a non-numeric value), and all before the approval and the cap.
"""

from pathlib import Path

import pandas as pd
import pytest

from kepsilon.flows.spec import ReleaseSpec
from kepsilon.tasks.errors import KepsilonError

from .conftest import SYNTHETIC, capped_store, release_spec_dict

# A refusal's row in ``releases``, but for its id and time: the spec's hash and the idempotency key leave
# ``execution`` out (the same logical release on either engine), so they must agree too.
REFUSAL_FIELDS = ("release_id", "population_id", "idempotency_key", "spec_hash", "outcome", "outcome_detail",
                  "failure_reason", "reservation_id", "k", "epsilon", "algorithm", "source_path", "source_sha256",
                  "rows_in", "rows_published")


# The installation's fingerprint key, the same for this process and the cluster's workers (which start before
# any test sets up its store, and would otherwise make a key of their own): the same source, the same fingerprint.
FINGERPRINT_KEY = "5e" * 32


@pytest.fixture(scope="module")
def cluster():
    from distributed import LocalCluster

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KEPSILON_FINGERPRINT_KEY", FINGERPRINT_KEY)  # inherited by the worker processes
        local = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0")
        try:
            yield local
        finally:
            local.close()


def _blocked_output(tmp_path: Path) -> str:
    blocker = tmp_path / "blocker"
    blocker.write_text("not a folder")
    return str(blocker / "out")  # a folder under a file: refused by name (output_dir)


def _text_in_height(tmp_path: Path) -> dict:
    sample = pd.read_csv(SYNTHETIC / "people.csv", sep=";", dtype=str, keep_default_na=False)
    sample.loc[[5, 2200], "HEIGHT"] = "tall"
    path = tmp_path / "text-in-height.csv"
    sample.to_csv(path, sep=";", index=False)
    return {"path": str(path), "delimiter": ";"}


def _bad_spec(case: str, tmp_path: Path) -> tuple[object, type, str]:
    """(the spec's changes, the error class, a phrase of its message) for one bad spec."""
    from kepsilon.audit.approvals import ApprovalMissing
    from kepsilon.audit.ledger import BudgetExceeded
    from kepsilon.tasks.errors import InputError, SpecError

    missing_role = {"roles": {**release_spec_dict("paper-synthetic")["roles"]}}
    missing_role["roles"]["sensitive"] = [*missing_role["roles"]["sensitive"], "POSTCODE"]
    return {
        "output folder": ({"output_dir": _blocked_output(tmp_path)}, SpecError, "output_dir"),
        "role naming a missing column": (missing_role, InputError, "'POSTCODE'"),
        "approval missing": ({"approval_required": True, "operator": "alice"}, ApprovalMissing, "approv"),
        "cap exceeded": ({"epsilon": 6.0}, BudgetExceeded, "test-population"),
        # Two faults: the first in the one order wins on both engines.
        "output folder before a text value": (
            {"output_dir": _blocked_output(tmp_path), "source": _text_in_height(tmp_path)}, SpecError, "output_dir"),
        "missing column before the approval": (
            {**missing_role, "approval_required": True, "operator": "alice"}, InputError, "'POSTCODE'"),
        "text value before the cap": ({"source": _text_in_height(tmp_path), "epsilon": 6.0}, InputError, "'HEIGHT'"),
    }[case]


def _refuse(spec: ReleaseSpec, store) -> tuple[KepsilonError, list[dict], int]:
    """Release ``spec``: (the error, the refusal rows it added to the store, the reservations and spends it added)."""
    from kepsilon.flows.release import governed_release

    def ledger() -> int:
        return store.conn.execute("SELECT COUNT(*) FROM ledger WHERE kind IN ('reserve', 'spend')").fetchone()[0]

    rows_before, reserved_before = store["releases"].count, ledger()
    with pytest.raises(KepsilonError) as refused:
        governed_release(spec)
    rows = [{name: row[name] for name in REFUSAL_FIELDS} for row in list(store["releases"].rows)[rows_before:]]
    return refused.value, rows, ledger() - reserved_before


@pytest.mark.flow
@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.parametrize("case", [
    "output folder", "role naming a missing column", "approval missing", "cap exceeded",
    "output folder before a text value", "missing column before the approval", "text value before the cap",
])
def test_the_same_bad_spec_is_refused_the_same_way_on_both_engines(cluster, tmp_path, monkeypatch, case):
    import tempfile

    changes, error_class, phrase = _bad_spec(case, tmp_path)
    data = release_spec_dict("paper-synthetic", release_id="refused", population_id="test-population",
                             output_dir=str(tmp_path / "out"))
    data.update(changes)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # the Dask engine's default scratch, the test's own

    # One store for both runs: the cap is 5 ε and a refusal reserves nothing, so the second run meets the store
    # as the first did.
    store = capped_store(tmp_path, monkeypatch, "test-population")
    memory = _refuse(ReleaseSpec.model_validate(data), store)
    on_dask = ReleaseSpec.model_validate(
        {**data, "execution": {"engine": "dask", "scheduler": cluster.scheduler_address, "partitions": 2}}
    )
    dask = _refuse(on_dask, store)

    for error, _, _ in (memory, dask):
        assert type(error) is error_class and phrase in str(error) and "\n" not in str(error)
    assert str(dask[0]) == str(memory[0])
    # The same refusal rows, field for field (or none, for a check before the approval).
    assert len(dask[1]) == len(memory[1])
    for on_dask, in_memory in zip(dask[1], memory[1]):
        assert {name: (on_dask[name], in_memory[name]) for name in REFUSAL_FIELDS if on_dask[name] != in_memory[name]} == {}
    recorded = error_class.__name__ in ("ApprovalMissing", "BudgetExceeded")
    assert [row["outcome"] for row in memory[1]] == (["refused"] if recorded else [])
    assert memory[2] == dask[2] == 0  # nothing reserved, nothing spent
    assert not (tmp_path / "out" / "refused").exists()
    assert [p for p in scratch.rglob("*") if not p.is_dir()] == []  # the Dask run's scratch is gone (its 0700 root stays)
