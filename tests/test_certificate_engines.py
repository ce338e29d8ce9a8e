"""The officer's certificate on the Dask engine and in the DP mode.

The Dask engine computes the certificate's figures by reduction over its partitions
(``tasks/certificate_dask.py``): its stages run here in this process and their figures are compared
with the in-memory path's, computed from the whole table with the same seed (same published records).
Then the real flows: a Dask release on a local cluster and a DP release each write a certificate that
verifies against the store, with figures checked against independent counts on the published files,
and the journalist and marketer gates refuse on Dask before any ε is reserved.
"""

import json
import os
import subprocess
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from kepsilon.engine import risk
from kepsilon.engine.anonymise import k_anonymise
from kepsilon.engine.perturb import perturb
from kepsilon.engine.randomness import RecordStreams
from kepsilon.engine.suppress import suppress_failing_groups, suppress_records
from kepsilon.flows.spec import ReleaseSpec, parse_spec
from kepsilon.tasks.certificate import certificate_figures, refuse_risk_over_limits
from kepsilon.tasks.certificate_dask import (
    dask_certificate_figures,
    refuse_risk_over_limits_on_partitions,
    shard_sketches,
)
from kepsilon.tasks.classify import classify
from kepsilon.tasks.errors import SpecError
from kepsilon.tasks.ingest import read_source
from kepsilon.tasks.partitioned import (
    DATASET,
    GroupCoder,
    GroupCounts,
    Scratch,
    combine_intakes,
    distinct_count,
    distribute,
    failing_groups,
    intake,
    perturb_and_suppress,
    publish_part,
)
from kepsilon.tasks.sources import plan_source

from .conftest import ADULT, ROOT, SYNTHETIC, capped_store, release_spec_dict
from .test_dask_release import anonymise_in_shards

SEED = bytes(range(32))
KEPSILON = str(ROOT / ".venv" / "bin" / "kepsilon") if (ROOT / ".venv" / "bin" / "kepsilon").exists() else "kepsilon"


def make_spec(tmp_path: Path, **changes) -> ReleaseSpec:
    sensitive = changes.pop("sensitive", None)
    weight_noised = changes.pop("weight_noised", False)
    data = release_spec_dict(
        "paper-synthetic", release_id="cert-test", population_id="test-population",
        source={"path": str(SYNTHETIC / "people.csv"), "delimiter": ";"}, output_dir=str(tmp_path / "out"), **changes,
    )
    if sensitive is not None:
        data["roles"]["sensitive"] = sensitive
    if weight_noised:  # a second ε-quasi, for the correlations
        data["roles"]["explicit"].remove("WEIGHT")
        data["roles"]["e_quasi"].append({"column": "WEIGHT", "lower": 20, "upper": 220})
    return ReleaseSpec.model_validate(data)


def _classes_distributed(spec: ReleaseSpec, partitions: int, root: Scratch):
    """The partitioned path's intake, anonymiser on the shards and distribution of the records to their class
    partitions, in this process: (pieces, the combined intake, the anonymised tuples, the classes)."""
    plan = plan_source(spec.source, partitions)
    pieces = len(plan.pieces)
    table = combine_intakes([intake(plan, piece, spec, root) for piece in plan.pieces], spec,
                            lambda number: distinct_count(root, number, pieces))
    anonymised, classes = anonymise_in_shards(spec, plan, table, root)
    for piece, offset in zip(plan.pieces, table.offsets):
        distribute(piece.index, offset, root, [q.column for q in spec.roles.e_quasi])
    return pieces, table, anonymised, classes


def dask_stage_figures(spec: ReleaseSpec, partitions: int, folder: Path) -> dict:
    """The partitioned path's stages in this process (as tests/test_dask_release.py runs them), then the
    certificate's reduction over what they left in the scratch."""
    root, pieces, table, anonymised, coder, written = published_in_parts(spec, partitions, folder)
    assert shard_sketches(spec, root, pieces, each_in_turn, anonymised.hierarchies) is None
    assert not any((root.path(name)).exists() for name in ("certificate-projections", "certificate-answers"))
    return dask_certificate_figures(spec, root, pieces, pieces, pieces, anonymised.hierarchies,
                                    written, coder, table.rows - int(written.sizes.sum()))


def published_in_parts(spec: ReleaseSpec, partitions: int, folder: Path):
    """The partitioned path's stages to the published parts, in this process: (the scratch, pieces, the combined
    intake, the anonymised tuples, the group coder, the written groups)."""
    root = Scratch.new(folder / "scratch")
    pieces, table, anonymised, classes = _classes_distributed(spec, partitions, root)
    coder = GroupCoder.build(spec, anonymised.hierarchies, anonymised.criteria)
    parts = [perturb_and_suppress(j, pieces, root, spec, RecordStreams(SEED), anonymised.hierarchies, classes.levels,
                                  coder, pieces) for j in range(pieces)]
    failing = failing_groups(GroupCounts.add([part.groups for part in parts]), anonymised.criteria)
    meta = next(part.meta for part in parts if part.meta is not None)
    staging = folder / "staging"
    (staging / DATASET).mkdir(parents=True)
    written = GroupCounts.add([publish_part(q, pieces, root, str(staging), failing, spec, meta, False, len(coder.sensitive)).groups
                               for q in range(pieces)])
    return root, pieces, table, anonymised, coder, written


def each_in_turn(name, function, arguments):
    """``tasks/shards.py``'s ``each`` in this process: ``function(*a)`` for every ``a``, in turn."""
    return [function(*a) for a in arguments]


def dask_stages_to_the_gate(spec: ReleaseSpec, partitions: int, folder: Path) -> dict | None:
    """The partitioned path's stages up to the class partitions, then the journalist and marketer gates
    as the Dask flow checks them before ε (each partition counts its predicted groups)."""
    folder.mkdir(exist_ok=True)
    root = Scratch.new(folder / "scratch")
    pieces, _table, anonymised, classes = _classes_distributed(spec, partitions, root)
    return refuse_risk_over_limits_on_partitions(spec, root, pieces, classes.levels, anonymised.hierarchies, each_in_turn)


def memory_figures(spec: ReleaseSpec) -> dict:
    """The in-memory path's figures for the same seed (its stages as ``kepsilon.engine.preview`` runs them)."""
    table = classify(read_source(spec.source).frame, spec)
    partition = k_anonymise(table.frame, spec)
    kept = table.frame[partition.kept]
    class_ids = partition.class_ids[partition.kept]
    perturbed = perturb(kept, class_ids, spec.roles.e_quasi, spec.epsilon_split(), spec.scale_basis, RecordStreams(SEED))
    suppression = suppress_records(kept, perturbed.frame, class_ids, perturbed.scales, spec)
    suppression = suppress_failing_groups(kept, class_ids, suppression, partition, spec.roles.names())
    return certificate_figures(spec, table, partition, kept, class_ids, perturbed.frame, suppression.removed)


CASES = [
    (3, {"confidence": 0.9, "certificate": {"utility_target": "GENDER"}, "population": {"sampling_fraction": 0.1},
         "weight_noised": True}),
    (2, {"algorithm": "ola", "sensitive": [{"column": "RELIGION", "l_diversity": {"l": 2}}, "ICD"]}),
    # Sampling weights (issue 27): summed per published, predicted and source group over the partitions.
    (1, {"population": {"weight_column": "HEIGHT"}}),
    (3, {"population": {"weight_column": "HEIGHT"}, "certificate": {"suda_max_size": 4}}),
    (4, {"algorithm": "ola", "population": {"weight_column": "WEIGHT", "sampling_fraction": 0.2}, "weight_noised": True}),
    (5, {"confidence": 0.9, "population": {"weight_column": "HEIGHT"}, "weight_noised": True}),
]


def _rounded(figures):
    """``figures`` with every float to 12 significant digits (a sum's last bits depend on its order)."""
    if isinstance(figures, dict):
        return {key: _rounded(value) for key, value in figures.items()}
    if isinstance(figures, list | tuple):
        return [_rounded(value) for value in figures]
    if isinstance(figures, float):
        return float(f"{figures:.12g}")
    return figures


@pytest.mark.parametrize("partitions, changes", CASES)
def test_the_dask_reduction_gives_the_in_memory_figures(tmp_path, partitions, changes):
    spec = make_spec(tmp_path, **changes)
    dask = dask_stage_figures(spec, partitions, tmp_path)
    memory = memory_figures(spec)
    assert dask["computed"] and memory["computed"]
    weighted = changes.get("population", {}).get("weight_column")
    for name in ("published", "predicted"):
        assert dask["risk"][name]["population_basis"] == ("sampling weights" if weighted else
                                                          memory["risk"][name]["population_basis"])
    assert dask["risk"]["special_uniques"]["records_with_msu"] > 0  # SUDA's figures are not trivially empty
    for name in ("published", "predicted", "source", "special_uniques"):
        assert "computed" not in dask["risk"][name], dask["risk"][name]
        # Equal up to the order of float sums: the Dask engine adds its groups shard by shard.
        assert _rounded(dask["risk"][name]) == _rounded(memory["risk"][name]), name
    utility, expected = dask["utility"], memory["utility"]
    assert list(utility["columns"]) == list(expected["columns"])
    for column, measures in expected["columns"].items():
        assert utility["columns"][column]["kind"] == measures["kind"]
        for measure, value in measures.items():
            if measure != "kind":
                assert utility["columns"][column][measure] == pytest.approx(value, rel=1e-9, abs=1e-12), (column, measure)
    assert utility["discernibility"] == expected["discernibility"]
    if "weight_noised" in changes:
        assert len(expected["correlations"]["pairs"]) == 1
        for mine, theirs in zip(utility["correlations"]["pairs"], expected["correlations"]["pairs"]):
            assert mine["before"] == pytest.approx(theirs["before"], abs=1e-9)
            assert mine["after"] == pytest.approx(theirs["after"], abs=1e-9)
    else:
        assert utility["correlations"] is expected["correlations"] is None  # one ε-quasi: no pair
    moved = [m for m in expected["columns"].values() if m["kind"] != "generalised"]
    assert any((m.get("total_variation") or m.get("ks") or 0) > 0 for m in moved)  # the figures are not trivially 0
    if changes.get("certificate", {}).get("utility_target"):
        classifier = utility["classifier"]
        assert classifier["computed"] and classifier["target"] == "GENDER"
        assert classifier["training_records"] == expected["classifier"]["training_records"] == 3000
        assert classifier["test_records"] == expected["classifier"]["test_records"] == 3000
        for model in ("logistic_regression", "random_forest"):  # another random subset: close, not equal
            assert classifier["models"][model]["source"] == pytest.approx(expected["classifier"]["models"][model]["source"], abs=0.05)


@pytest.mark.parametrize("partitions", [1, 2, 5])
def test_the_parts_samples_are_read_only_where_the_classifier_sample_takes_them(tmp_path, partitions):
    """``read_part_sketches`` empties the samples of the parts past the first ``SAMPLE_ROWS`` records: the sample
    the classifier trains on is the one the whole sketches give (32,000 records: 2 and 5 parts have more than
    enough in their first ones), and an emptied sample keeps its columns and types."""
    from kepsilon.tasks.certificate_dask import PART_SKETCH, SAMPLE_ROWS, _sample, read_part_sketches

    spec = make_spec(tmp_path)
    root, pieces, *_ = published_in_parts(spec, partitions, tmp_path)
    whole = [root.read(PART_SKETCH, q) for q in range(pieces) if root.exists(PART_SKETCH, q)]
    read = read_part_sketches(root, pieces)
    assert len(read) == len(whole) == pieces
    for mine, theirs in zip(_sample(read), _sample(whole)):
        assert len(mine) == SAMPLE_ROWS
        pd.testing.assert_frame_equal(mine, theirs)
    kept = [len(sketch["sample_released"]) for sketch in read]
    emptied = [q for q, rows in enumerate(kept) if rows == 0]
    assert emptied == ([] if partitions == 1 else list(range(1 if partitions == 2 else 3, partitions)))
    for q in emptied:
        for name in ("sample_source", "sample_released"):
            assert list(read[q][name].dtypes.items()) == list(whole[q][name].dtypes.items())
    for name in ("pairs", "numbers", "as_read"):  # the counts are read whole
        assert [sorted(s[name]) for s in read] == [sorted(s[name]) for s in whole]


# --------------------------------------------------------------------------- the flows


def _verify(release_id: str, path: Path) -> subprocess.CompletedProcess:
    """``kepsilon audit certificate RELEASE --verify FILE`` as a user runs it (the test's store: capped_store's setting)."""
    return subprocess.run([KEPSILON, "audit", "certificate", release_id, "--verify", str(path)], capture_output=True,
                          text=True, env=os.environ.copy(), timeout=300)


@pytest.fixture(scope="module")
def cluster():
    from distributed import LocalCluster

    one = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0")
    try:
        yield one
    finally:
        one.close()


@pytest.mark.flow
@pytest.mark.heavy  # a whole release on a local cluster: about 100 s on the shared 2-core machine
@pytest.mark.usefixtures("prefect_harness")
def test_a_dask_release_writes_a_certificate_with_its_figures_that_verifies(cluster, tmp_path, monkeypatch):
    from kepsilon.flows.release import governed_release

    store = capped_store(tmp_path, monkeypatch, "test-population")
    execution = {"engine": "dask", "scheduler": cluster.scheduler_address, "partitions": 3}
    # With sampling weights and a gate on them (issue 27: the Dask engine sums the weights per predicted group).
    spec = make_spec(tmp_path, execution=execution, max_marketer_risk=0.5, certificate={"utility_target": "GENDER"},
                     population={"weight_column": "HEIGHT"})
    record = governed_release(spec)
    figures = record["certificate"]
    assert figures["computed"] and figures["engine"] == "dask"
    for name in ("published", "predicted"):
        assert figures["risk"][name]["population_basis"] == "sampling weights"
    assert figures["risk"]["special_uniques"]["records"] == record["rows_in"]
    data = pq.read_table(Path(record["output_dir"]) / "data.parquet").to_pandas()
    groups = data.groupby([q.column for q in spec.roles.k_quasi], dropna=False).size().to_numpy()
    published = figures["risk"]["published"]
    assert published["prosecutor"]["highest"] == pytest.approx(1 / groups.min())  # independent count on the files
    assert published["prosecutor"]["average"] == pytest.approx(len(groups) / len(data))
    assert figures["utility"]["classifier"]["computed"]
    assert "certificate" not in json.loads((Path(record["output_dir"]) / "manifest.json").read_text())

    path = tmp_path / "reports" / "cert-test" / "certificate.html"
    text = path.read_text(encoding="utf-8")
    assert "Not computed" not in text and "Classifier utility" in text
    assert store.execute("SELECT entry_hash FROM chain WHERE table_name = 'releases'").fetchone()[0] in text
    assert _verify("cert-test", path).returncode == 0
    changed = bytearray(path.read_bytes())
    changed[changed.index(b"records were")] = ord("R")
    (tmp_path / "changed.html").write_bytes(bytes(changed))
    assert _verify("cert-test", tmp_path / "changed.html").returncode == 2


@pytest.mark.flow
@pytest.mark.usefixtures("prefect_harness")
def test_a_marketer_gate_on_dask_refuses_before_any_reservation(cluster, tmp_path, monkeypatch):
    from kepsilon.audit.ledger import remaining
    from kepsilon.flows.release import governed_release

    store = capped_store(tmp_path, monkeypatch, "test-population")
    execution = {"engine": "dask", "scheduler": cluster.scheduler_address, "partitions": 2}
    with pytest.raises(SpecError, match="max_marketer_risk"):
        governed_release(make_spec(tmp_path, execution=execution, max_marketer_risk=0.001))
    assert store.execute("SELECT COUNT(*) FROM ledger WHERE kind = 'reserve'").fetchone()[0] == 0
    assert remaining(store, "test-population") == pytest.approx(5.0)


@pytest.mark.parametrize("partitions", [1, 2, 4])
def test_the_dask_gates_with_sampling_weights_check_the_in_memory_figures(tmp_path, partitions):
    weights = {"population": {"weight_column": "HEIGHT"}}
    spec = make_spec(tmp_path, execution={"engine": "dask"}, max_journalist_risk=0.9, max_marketer_risk=0.9, **weights)
    memory = _memory_gate(spec)
    dask = dask_stages_to_the_gate(spec, partitions, tmp_path / "pass")
    assert dask["population_basis"] == memory["population_basis"] == "sampling weights"
    assert _rounded(dask) == _rounded(memory)
    # Sampling weights of about 170 people a record: the journalist risk is far below the prosecutor's.
    assert dask["journalist"]["highest"] < dask["prosecutor"]["highest"] / 10
    limit = dask["journalist"]["highest"] * 0.99  # just under the figure: both engines refuse, before ε
    strict = make_spec(tmp_path, execution={"engine": "dask"}, max_journalist_risk=limit, **weights)
    with pytest.raises(SpecError, match="max_journalist_risk"):
        _memory_gate(strict)
    with pytest.raises(SpecError, match="max_journalist_risk"):
        dask_stages_to_the_gate(strict, partitions, tmp_path / "refuse")


def test_a_weight_column_that_is_not_numbers_is_refused_alike_on_both_engines(tmp_path):
    from kepsilon.tasks.errors import InputError

    spec = make_spec(tmp_path, execution={"engine": "dask"}, max_marketer_risk=0.9, population={"weight_column": "ICD"})
    with pytest.raises(InputError) as in_memory:
        _memory_gate(spec)
    with pytest.raises(InputError) as on_dask:
        dask_stages_to_the_gate(spec, 3, tmp_path)
    assert str(on_dask.value) == str(in_memory.value) == "column 'ICD': sampling weights must be positive numbers"


def test_weights_that_are_not_numbers_leave_the_weighted_figures_not_computed_alike_on_both_engines(tmp_path):
    """After ε a figure never fails the release: the weighted rows say why, in the same words on both engines."""
    spec = make_spec(tmp_path, population={"weight_column": "ICD"})
    dask, memory = dask_stage_figures(spec, 2, tmp_path), memory_figures(spec)
    reason = {"computed": False, "reason": "column 'ICD': sampling weights must be positive numbers"}
    for name in ("published", "predicted", "source"):
        assert dask["risk"][name] == memory["risk"][name] == reason, name
    assert _rounded(dask["risk"]["special_uniques"]) == _rounded(memory["risk"]["special_uniques"])


def _memory_gate(spec: ReleaseSpec) -> dict | None:
    table = classify(read_source(spec.source).frame, spec)
    return refuse_risk_over_limits(table, k_anonymise(table.frame, spec), spec)


@pytest.mark.flow
@pytest.mark.usefixtures("prefect_harness")
def test_a_dp_release_writes_a_certificate_with_its_figures_that_verifies(tmp_path, monkeypatch):
    from kepsilon.audit.ledger import set_cap
    from kepsilon.flows.release import governed_release

    from .test_dp_flow import dp_spec

    store = capped_store(tmp_path, monkeypatch, "dp-population")
    set_cap(store, "dp-population", 5.0, by="test-officer", reason="test caps", delta=0.01)
    spec = dp_spec(tmp_path, certificate={"utility_target": "salary-class"}, population={"sampling_fraction": 0.05})
    record = governed_release(parse_spec(spec))
    figures = record["certificate"]
    assert figures["computed"] and figures["mode"] == "dp"
    quasi = ["sex", "race", "marital-status", "education", "age"]
    assert figures["quasi_identifiers"] == quasi
    data = pd.read_csv(Path(record["output_dir"]) / "data.csv", dtype=str, keep_default_na=False)
    groups = data.groupby(quasi).size().to_numpy()
    published = figures["risk"]["published"]
    assert published["prosecutor"]["highest"] == pytest.approx(1 / groups.min()) and groups.min() >= 30
    expected = risk.individual_risk(groups, groups / 0.05)
    assert published["journalist"]["highest"] == pytest.approx(expected.max())
    assert figures["risk"]["predicted"]["computed"] is False
    source = pd.read_csv(ADULT / "adult.csv", sep=";", dtype=str, keep_default_na=False)
    p, q = (frame["salary-class"].value_counts(normalize=True) for frame in (source, data))
    independent = 0.5 * (p - q.reindex(p.index, fill_value=0)).abs().sum()
    assert figures["utility"]["columns"]["salary-class"]["total_variation"] == pytest.approx(independent)
    for column in quasi:
        assert figures["utility"]["columns"][column]["kind"] == "generalised"
    assert figures["utility"]["columns"]["sex"]["granularity"] == 1.0  # level 0: released as read
    assert 0 < figures["utility"]["columns"]["age"]["granularity"] < 1
    assert figures["utility"]["classifier"]["computed"]

    path = tmp_path / "reports" / "dp-release" / "certificate.html"
    text = path.read_text(encoding="utf-8")
    assert "δ in use (DP mode)" in text and "Not computed: the record holds no" not in text
    assert _verify("dp-release", path).returncode == 0
    changed = bytearray(path.read_bytes())
    changed[changed.index(b"records were")] = ord("R")
    (tmp_path / "changed.html").write_bytes(bytes(changed))
    assert _verify("dp-release", tmp_path / "changed.html").returncode == 2
