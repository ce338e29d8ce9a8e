"""The partitioned (Dask) release path publishes exactly what the in-memory path publishes for the same seed.

Two levels. The stage functions of ``tasks/partitioned.py`` run in this process over several partition
counts and sources (a CSV, a CSV whose fields hold quoted line breaks and empty cells, a typed Parquet
dataset), and their parts are compared cell by cell, and data.csv byte by byte, with
``kepsilon.engine.preview`` (the in-memory path's stages) for the same seed; refusals too. Then the real
flow runs on Dask — local clusters of 1 and 2 worker processes, one of each shared by the module — and its
published folder is compared with the in-memory path run with the seed it sealed.
"""

import csv
import io
import json
import os
from pathlib import Path
from uuid import UUID

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kepsilon.engine.preview import preview
from kepsilon.engine.randomness import RecordStreams
from kepsilon.flows.manifest import published_groups
from kepsilon.flows.spec import ReleaseSpec
from kepsilon.tasks.classify import classify
from kepsilon.tasks.errors import InputError, KepsilonError, SpecError
from kepsilon.tasks.ingest import read_source
from kepsilon.tasks.partitioned import (
    DATASET,
    GroupCoder,
    GroupCounts,
    Scratch,
    combine_intakes,
    combine_outcome,
    distinct_count,
    distribute,
    failing_groups,
    intake,
    order_ranges,
    perturb_and_suppress,
    publish_part,
)
from kepsilon.tasks.publish import csv_bytes, csv_header, parquet_bytes
from kepsilon.tasks.shards import anonymise_shards, merge_shard
from kepsilon.tasks.sources import plan_source
from kepsilon.tasks.text_codes import decode_text

from .conftest import SYNTHETIC, release_spec_dict

SEED = bytes(range(32))


# --------------------------------------------------------------------------- sources


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, dict]:
    """Source settings (for the spec) of the three test sources."""
    folder = tmp_path_factory.mktemp("sources")
    sample = pd.read_csv(SYNTHETIC / "people.csv", sep=";", dtype=str, keep_default_na=False)

    tricky = sample.head(4000).copy()
    rows = np.arange(len(tricky))
    tricky.loc[rows % 97 == 3, "RELIGION"] = 'Roman "Catholic",\nreformed'  # quotes, a comma, a line break
    tricky.loc[rows % 89 == 5, "ICD"] = ""  # missing: published as a null
    tricky_path = folder / "tricky.csv"
    tricky.to_csv(tricky_path, sep=";", index=False, quoting=csv.QUOTE_MINIMAL, lineterminator="\r\n")

    typed = sample.copy()
    typed["YOB"] = typed["YOB"].astype("int64")
    typed["HEIGHT"] = typed["HEIGHT"].astype("float64")
    typed["RELIGION"] = typed["RELIGION"].mask(np.arange(len(typed)) % 50 == 7)  # nulls in a sensitive column
    dataset = folder / "dataset"
    dataset.mkdir()
    for number, chunk in enumerate(np.array_split(np.arange(len(typed)), 3)):
        pq.write_table(pa.Table.from_pandas(typed.iloc[chunk], preserve_index=False), dataset / f"part-{number}.parquet",
                       row_group_size=2500)
    return {
        "sample": {"path": str(SYNTHETIC / "people.csv"), "delimiter": ";"},
        "tricky": {"path": str(tricky_path), "delimiter": ";"},
        "dataset": {"path": str(dataset)},
    }


def make_spec(source: dict, tmp_path: Path, **changes) -> ReleaseSpec:
    sensitive = changes.pop("sensitive", None)
    data = release_spec_dict(
        "paper-synthetic", release_id="dask-test", population_id="test-population", source=source,
        output_dir=str(tmp_path / "out"), **changes,
    )
    if sensitive is not None:
        data["roles"]["sensitive"] = sensitive
    return ReleaseSpec.model_validate(data)


def in_memory(spec: ReleaseSpec, seed: bytes):
    """What the in-memory path publishes with ``seed``: the table, data.csv's bytes, the metrics."""
    frame = classify(read_source(spec.source).frame, spec).frame
    result = preview(frame, spec, seed)
    return result.released, csv_bytes(result.released), result


def as_published(frame: pd.DataFrame) -> pd.DataFrame:
    """The table as data.parquet holds it (types as published)."""
    return pq.read_table(io.BytesIO(parquet_bytes(frame))).to_pandas()


# --------------------------------------------------------------------------- the stages, in this process


def in_process(name, function, arguments):
    """``tasks/shards.py``'s ``each`` run here, one call after the other."""
    return [function(*a) for a in arguments]


def anonymise_in_shards(spec: ReleaseSpec, plan, table, root: Scratch, max_tuples: int = 300):
    """The flow's merge of the partials into shards and the anonymiser on them (small leaves: the
    distributed top of Mondrian's tree does cut)."""
    columns = [q.column for q in spec.roles.k_quasi]
    summaries = [merge_shard(root, b, table.offsets, columns) for b in range(len(plan.pieces))]
    sharded = anonymise_shards(spec, root, summaries, table.values, in_process, max_tuples=max_tuples)
    anonymised = sharded.anonymised()
    return anonymised, anonymised.classes


def run_stages(spec: ReleaseSpec, seed: bytes, partitions: int, folder: Path):
    """The partitioned path's stages one after the other, as the flow orders them (no Prefect, no Dask)."""
    root = Scratch.new(folder / "scratch")
    plan = plan_source(spec.source, partitions)
    pieces = len(plan.pieces)
    intakes = [intake(plan, piece, spec, root) for piece in plan.pieces]
    table = combine_intakes(intakes, spec, lambda number: distinct_count(root, number, pieces))
    anonymised, classes = anonymise_in_shards(spec, plan, table, root)
    for piece, offset in zip(plan.pieces, table.offsets):
        distribute(piece.index, offset, root, [q.column for q in spec.roles.e_quasi])
    coder = GroupCoder.build(spec, anonymised.hierarchies, anonymised.criteria)
    parts = [
        perturb_and_suppress(j, pieces, root, spec, RecordStreams(seed), anonymised.hierarchies, classes.levels, coder, pieces)
        for j in range(pieces)
    ]
    groups = GroupCounts.add([part.groups for part in parts])
    failing = failing_groups(groups, anonymised.criteria)
    outcome = combine_outcome(parts, failing, groups, classes.report, spec, anonymised.criteria)
    meta = next(part.meta for part in parts if part.meta is not None)
    staging = folder / "staging"
    (staging / DATASET).mkdir(parents=True)
    written = [publish_part(q, pieces, root, str(staging), failing, spec, meta, True, len(coder.sensitive))
               for q in range(pieces)]
    data_csv = csv_header(meta) + b"".join(root.read("csv", q) for q in range(pieces))
    published = pq.read_table(staging / DATASET).to_pandas()
    return published, data_csv, outcome, written, plan


CASES = [
    ("sample", 1, {}),
    ("sample", 2, {}),
    ("sample", 7, {}),
    ("tricky", 3, {"sensitive": [{"column": "RELIGION", "l_diversity": {"l": 2}}, "ICD"]}),
    ("tricky", 5, {"algorithm": "ola", "sensitive": ["RELIGION", {"column": "ICD", "t_closeness": {"t": 0.6}}]}),
    ("dataset", 1, {}),
    ("dataset", 4, {"scale_basis": "bounds"}),
]


@pytest.mark.parametrize("partitions, share", [(1, 1.0), (3, 1.0), (3, 0.5)])
def test_the_class_partitions_predict_what_the_in_memory_path_predicts(sources, tmp_path, partitions, share):
    """Before ε, the partitioned path predicts each class partition (``predict_partition``) and adds the parts:
    the exact predicted errors equal the in-memory prediction's, and the throw-away draws' figures are close,
    also where each partition's draws take a sample of its classes at the table's share (a table over 1M records,
    ``design_for``)."""
    import numpy as np

    from kepsilon.engine.anonymise import k_anonymise
    from kepsilon.engine.predict import Prediction, predict
    from kepsilon.tasks.classify import classify
    from kepsilon.tasks.ingest import read_source
    from kepsilon.tasks.partitioned import predict_partition

    spec = make_spec(sources["sample"], tmp_path)
    root = Scratch.new(tmp_path / "scratch")
    plan = plan_source(spec.source, partitions)
    pieces = len(plan.pieces)
    table = combine_intakes([intake(plan, piece, spec, root) for piece in plan.pieces], spec,
                            lambda number: distinct_count(root, number, pieces))
    anonymise_in_shards(spec, plan, table, root)
    for piece, offset in zip(plan.pieces, table.offsets):
        distribute(piece.index, offset, root, [q.column for q in spec.roles.e_quasi])
    whole = Prediction(draws=8, share=share, published=np.zeros(8))
    for index in range(pieces):
        whole = whole.add(predict_partition(index, pieces, root, spec, 8, index, share))
    frame = classify(read_source(spec.source).frame, spec).frame
    partition = k_anonymise(frame, spec)
    kept = frame[partition.kept]
    memory = predict(kept[["HEIGHT"]], partition.class_ids[partition.kept], spec, 8, np.random.default_rng(0))
    assert whole.records == memory.records == len(kept)
    assert whole.relative_errors()["HEIGHT"] == pytest.approx(memory.relative_errors()["HEIGHT"], rel=1e-12)
    assert whole.linking_risk() == pytest.approx(memory.linking_risk(), abs=0.03)
    assert whole.published_records() == pytest.approx(memory.published_records(), rel=0.02)
    assert whole.share == share and 0.8 * share < whole.drawn.sum() / (8 * len(kept)) <= share * 1.2


@pytest.mark.parametrize("source, partitions, changes", CASES)
def test_the_stages_publish_the_in_memory_values_in_its_order(sources, tmp_path, source, partitions, changes):
    spec = make_spec(sources[source], tmp_path, **changes)
    expected, expected_csv, memory = in_memory(spec, SEED)
    published, data_csv, outcome, written, plan = run_stages(spec, SEED, partitions, tmp_path)

    assert len(plan.pieces) == partitions
    pd.testing.assert_frame_equal(published, as_published(expected))  # cell by cell, in the same order
    assert data_csv == expected_csv
    assert len(published) > 0.9 * memory.partition.report["rows"]
    # The private figures: counts exactly, mean errors up to the order of a floating-point sum.
    metrics = memory.metrics
    for key in ("rows_removed", "rows_published", "linking_risk", "classes"):
        assert outcome.metrics[key] == metrics[key], key
    loss, expected_loss = outcome.metrics["information_loss"], metrics["information_loss"]
    assert loss["measured"] == pytest.approx(expected_loss["measured"], rel=1e-12)
    assert loss["predicted"] == pytest.approx(expected_loss["predicted"], rel=1e-12)
    sizes = GroupCounts.add([part.groups for part in written]).sizes
    figures = published_groups(expected, [q.column for q in spec.roles.k_quasi], metrics["rows_published"])
    assert (len(sizes), int(sizes.min())) == (figures["published"], figures["smallest"])
    assert all(all(checks.values()) for checks in (part.checks for part in written))


def test_intake_leaves_each_records_tuple_and_each_tuples_bucket_for_the_distribution(sources, tmp_path):
    """Intake numbers each record's tuple as the piece's histogram does (in order of first occurrence) and buckets
    each distinct tuple by its hash (computed once per tuple): the distribution gives a record its tuple's class
    from these two, without matching or hashing the record's values again."""
    from kepsilon.tasks.shards import tuple_buckets

    spec = make_spec(sources["dataset"], tmp_path)
    root = Scratch.new(tmp_path / "scratch")
    plan = plan_source(spec.source, 3)
    columns = [q.column for q in spec.roles.k_quasi]
    for piece in plan.pieces:
        intake(plan, piece, spec, root)
        records, tuple_of_record, bucket_of_tuple, encoded = root.read("classified", piece.index)
        frame = decode_text(records, encoded)[columns]
        numbers = frame.groupby(columns, sort=False, dropna=False, observed=True).ngroup().to_numpy()
        assert len(frame) > 0 and np.array_equal(tuple_of_record, numbers)
        tuples = frame.drop_duplicates().reset_index(drop=True)  # one row per tuple, in order of first occurrence
        assert np.array_equal(bucket_of_tuple, tuple_buckets(tuples, columns, len(plan.pieces)))


def test_the_csv_pieces_end_at_record_boundaries_not_at_quoted_line_breaks(sources):
    spec = ReleaseSpec.model_validate(release_spec_dict("paper-synthetic", source=sources["tricky"]))
    plan = plan_source(spec.source, 40)
    raw = Path(sources["tricky"]["path"]).read_bytes()
    starts = [piece.segments[0][0] for piece in plan.pieces]
    assert len(starts) == 40 and all(raw[start - 2:start] == b"\r\n" for start in starts[1:])
    # Every piece starts outside quotes: an even number of quote characters before it.
    assert all(raw[:start].count(b'"') % 2 == 0 for start in starts)
    assert plan.sha256 == read_source(spec.source).sha256


@pytest.mark.parametrize(
    "problem",
    ["k_quasi_missing", "e_quasi_text", "e_quasi_outside", "k_too_large", "identifier"],
)
def test_bad_input_is_refused_with_the_in_memory_message(tmp_path, problem):
    sample = pd.read_csv(SYNTHETIC / "people.csv", sep=";", dtype=str, keep_default_na=False).head(3000)
    changes = {}
    if problem == "k_quasi_missing":
        sample.loc[[10, 1500, 2999], "RACE"] = ""
    elif problem == "e_quasi_text":
        sample.loc[[5, 2200], "HEIGHT"] = "1,70"
    elif problem == "e_quasi_outside":
        sample.loc[[7, 8, 2900], "HEIGHT"] = "250"
    elif problem == "k_too_large":
        changes["k"] = 3001
    path = tmp_path / "bad.csv"
    sample.to_csv(path, sep=";", index=False)
    spec = make_spec({"path": str(path), "delimiter": ";"}, tmp_path, **changes)
    if problem == "identifier":  # a released e-mail column
        data = spec.model_dump()
        data["roles"]["explicit"].remove("EMAIL")
        data["roles"]["sensitive"].append("EMAIL")
        spec = ReleaseSpec.model_validate(data)
    with pytest.raises(KepsilonError) as memory:
        classify(read_source(spec.source).frame, spec)
    with pytest.raises(KepsilonError) as partitioned:
        run_stages(spec, SEED, 3, tmp_path)
    assert type(partitioned.value) is type(memory.value) and str(partitioned.value) == str(memory.value)
    assert isinstance(memory.value, (InputError, SpecError))


def test_order_ranges_split_the_key_space_in_order():
    keys = np.sort(np.random.default_rng(1).integers(0, 2**63, size=10_000, dtype=np.int64).astype(np.uint64) * 2)
    ranges = order_ranges(keys, 7)
    assert (np.diff(ranges) >= 0).all() and set(ranges) == set(range(7))
    assert order_ranges(np.array([0, 2**64 - 1], dtype=np.uint64), 5).tolist() == [0, 4]


# --------------------------------------------------------------------------- the flow on Dask


class Clusters(dict):
    """Local clusters of 1 and 2 worker processes, by their number of workers, each started when first asked for:
    make test's flows use only the 2-worker one (the 1-worker cases are heavy)."""

    def __missing__(self, workers: int):
        from distributed import LocalCluster

        self[workers] = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0")
        return self[workers]


@pytest.fixture(scope="module")
def clusters():
    """The module's local clusters (``Clusters``), shared by its flow runs (each takes seconds to start)."""
    started = Clusters()
    try:
        yield started
    finally:
        for cluster in started.values():
            cluster.close()


def private_temporary_folder(tmp_path, monkeypatch) -> Path:
    """A temporary folder of the test's own as the system's (where the default scratch goes)."""
    import tempfile

    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def unsealed_seed(store, release_id: str) -> bytes:
    from kepsilon.audit.seeds import unseal_seed

    return unseal_seed(store, release_id=release_id, by="test", reason="compare the engines")


# make test runs two whole flows on a cluster: a CSV with quotes, line breaks and missing values under ℓ-diversity,
# and the typed Parquet dataset under OLA. make test-heavy adds one partition on one worker, the dataset on one
# worker, and OLA on the CSV sample; the stage tests above run every source at several partition counts.
FLOW_CASES = [
    pytest.param(1, "sample", 1, {}, marks=pytest.mark.heavy),
    pytest.param(1, "dataset", 4, {}, marks=pytest.mark.heavy),
    (2, "tricky", 3, {"sensitive": [{"column": "RELIGION", "l_diversity": {"l": 2}}, "ICD"]}),
    pytest.param(2, "sample", 5, {"algorithm": "ola"}, marks=pytest.mark.heavy),
    (2, "dataset", 5, {"algorithm": "ola"}),
]


@pytest.mark.flow
@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.parametrize("workers, source, partitions, changes", FLOW_CASES)
def test_the_flow_on_dask_publishes_what_the_in_memory_path_publishes(
    clusters, sources, tmp_path, monkeypatch, workers, source, partitions, changes
):
    from kepsilon.flows.release import governed_release

    from .conftest import capped_store

    store = capped_store(tmp_path, monkeypatch, "test-population")
    temporary = private_temporary_folder(tmp_path, monkeypatch)
    execution = {"engine": "dask", "scheduler": clusters[workers].scheduler_address, "partitions": partitions, "csv": True}
    spec = make_spec(sources[source], tmp_path, execution=execution, **changes)
    record = governed_release(spec)

    folder = Path(record["output_dir"])
    assert sorted(p.name for p in folder.iterdir()) == ["data.csv", "data.parquet", "manifest.json"]
    assert len(list((folder / "data.parquet").iterdir())) == partitions
    seed = unsealed_seed(store, "dask-test")
    expected, expected_csv, memory = in_memory(spec, seed)
    pd.testing.assert_frame_equal(pq.read_table(folder / "data.parquet").to_pandas(), as_published(expected))
    assert (folder / "data.csv").read_bytes() == expected_csv
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest == record["public_manifest"] and manifest["records"]["published"] == len(expected)
    assert all(check["success"] for check in manifest["checks"])
    assert [c["name"] for c in manifest["checks"]] == _in_memory_check_names(spec)
    assert set(manifest["outputs"]) == {"data.csv", *(f"data.parquet/part-{q:05d}.parquet" for q in range(partitions))}
    assert record["rows_removed"] == memory.metrics["rows_removed"]
    assert record["execution"]["engine"] == "dask"
    releases = list(store["releases"].rows)
    assert [(r["release_id"], r["outcome"], r["rows_published"]) for r in releases] == [("dask-test", "published", len(expected))]
    # The private scratch was outside the output folder and is gone: the account's folder is empty.
    assert list((temporary / f"kepsilon-scratch-{os.getuid()}").iterdir()) == []
    assert _progress_of(record["execution"]["flow_run_id"]) == 100.0
    _assert_the_api_never_saw_the_seed(record["execution"]["flow_run_id"], seed)


def _assert_the_api_never_saw_the_seed(flow_run_id: str, seed: bytes) -> None:
    """The flow run's parameters, task runs and logs as the Prefect API holds them: the perturbation ran as one
    task run (its partitions sent to the workers as plain Dask tasks) whose one input, the stage's work, is
    recorded as nothing at all, and the seed appears nowhere."""
    import base64

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterFlowRunId

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(UUID(flow_run_id))
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])))
    perturbing = [t for t in tasks if t.name.startswith("perturb-suppress")]
    assert len(perturbing) == 1
    # The stage's work (the streams, the scratch folder's key, inside its arguments) is one plain object, which
    # Prefect neither walks nor records: not even its type.
    assert perturbing[0].task_inputs == {"work": []}
    assert "key=<withheld>" not in json.dumps([t.model_dump(mode="json") for t in tasks])
    seen = json.dumps({"parameters": run.parameters, "tasks": [t.model_dump(mode="json") for t in tasks],
                       "logs": [entry.message for entry in logs]})
    for form in (seed.hex(), base64.b64encode(seed).decode(), base64.urlsafe_b64encode(seed).decode(), repr(seed)):
        assert form not in seen


def _progress_of(flow_run_id: str) -> float | None:
    """The progress artifact of a flow run (per partition of each stage), as the UI shows it."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterType

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[UUID(flow_run_id)]), type=ArtifactFilterType(any_=["progress"])))
    data = artifacts[0].data if len(artifacts) == 1 else None
    return float(data) if isinstance(data, (int, float)) else None


def _in_memory_check_names(spec: ReleaseSpec) -> list[str]:
    from kepsilon.engine.anonymise import k_anonymise
    from kepsilon.tasks.validate import validate_release

    frame = classify(read_source(spec.source).frame, spec).frame
    roles = spec.roles.names()
    report = validate_release(
        frame.head(0)[[c for c in frame.columns]], k_quasi=roles["k_quasi"], e_quasi=roles["e_quasi"],
        explicit=roles["explicit"], k=spec.k, rows_in=len(frame), rows_removed=0,
        suppression_budget=spec.suppression_budget, criteria=k_anonymise(frame, spec).criteria, linking_risk=0.0,
        max_linking_risk=spec.max_linking_risk, max_prosecutor_risk=spec.max_prosecutor_risk,
    )
    return [c["name"] for c in report.checks]


@pytest.mark.flow
@pytest.mark.usefixtures("prefect_harness")
def test_a_failed_gate_on_dask_publishes_nothing_and_records_the_failure(
    clusters, sources, tmp_path, monkeypatch
):
    import kepsilon.flows.release_dask as dask_flow
    from kepsilon.flows.release import governed_release
    from kepsilon.tasks.errors import SpecError, ValidationFailed

    from .conftest import capped_store

    store = capped_store(tmp_path, monkeypatch, "test-population")
    private_temporary_folder(tmp_path, monkeypatch)
    execution = {"engine": "dask", "scheduler": clusters[2].scheduler_address, "partitions": 2}
    spec = make_spec(sources["sample"], tmp_path, execution=execution, max_linking_risk=0.001)
    # The partitions' prediction refuses it before ε (nothing reserved, no record) ...
    with pytest.raises(SpecError, match=r"max_linking_risk.*linking risk .* \(limit 0\.10 %\), predicted before any ε"):
        governed_release(spec)
    assert store.conn.execute("SELECT COUNT(*) FROM ledger WHERE kind = 'reserve'").fetchone()[0] == 0
    # ... and with the prediction switched off, as if it had missed, the gate after the noise stops it.
    monkeypatch.setattr(dask_flow, "_pre_epsilon", lambda *args: {"switched_off": True})
    with pytest.raises(ValidationFailed, match="linking_risk_within_limit"):
        governed_release(spec)
    out = Path(spec.output_dir)
    assert sorted(p.name for p in out.iterdir()) == []  # no release folder, no staging, no scratch
    releases = list(store["releases"].rows)
    assert [(r["release_id"], r["outcome"]) for r in releases] == [("dask-test", "failed")]
    assert "linking_risk_within_limit" in releases[0]["failure_reason"]


@pytest.mark.flow
@pytest.mark.heavy
@pytest.mark.usefixtures("prefect_harness")
def test_the_flows_process_never_loads_the_gates_checks(clusters, sources, tmp_path, monkeypatch):
    """Great Expectations (about 6 s of CPU to load) stays out of the flow's process: the workers run every check,
    the release gate's included (``release_gate``), and hand back plain data. A release whose flow cannot import
    ``tasks/validate.py`` at all publishes."""
    import sys

    from kepsilon.flows.release import governed_release

    from .conftest import capped_store

    store = capped_store(tmp_path, monkeypatch, "test-population")
    private_temporary_folder(tmp_path, monkeypatch)
    monkeypatch.setitem(sys.modules, "kepsilon.tasks.validate", None)  # any import of it here raises ImportError
    execution = {"engine": "dask", "scheduler": clusters[2].scheduler_address, "partitions": 2}
    record = governed_release(make_spec(sources["sample"], tmp_path, execution=execution))
    assert record["checks"] and all(check["success"] for check in record["checks"])
    assert [(r["release_id"], r["outcome"]) for r in store["releases"].rows] == [(record["release_id"], "published")]


@pytest.mark.flow
@pytest.mark.usefixtures("prefect_harness")
def test_workers_that_cannot_load_the_gates_checks_are_refused_before_epsilon(clusters, sources, tmp_path, monkeypatch):
    """The workers run every check of the gate (the flow's process never loads Great Expectations: ``release_gate``);
    they load them before ε (``load_gate_checks``), so that a broken install there spends nothing."""
    from distributed import Client

    from kepsilon.flows.release import governed_release

    from .conftest import capped_store

    def hide(name: str, dask_worker) -> None:  # on each worker (client.run): any import of the module raises ImportError
        import sys

        dask_worker.kepsilon_hidden = sys.modules.get(name)
        sys.modules[name] = None  # type: ignore[assignment]

    def restore(name: str, dask_worker) -> None:
        import sys

        if dask_worker.kepsilon_hidden is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = dask_worker.kepsilon_hidden

    store = capped_store(tmp_path, monkeypatch, "test-population")
    private_temporary_folder(tmp_path, monkeypatch)
    cluster = clusters[2]
    execution = {"engine": "dask", "scheduler": cluster.scheduler_address, "partitions": 2}
    spec = make_spec(sources["sample"], tmp_path, execution=execution)
    with Client(cluster.scheduler_address) as client:
        client.run(hide, "kepsilon.tasks.validate")
        try:
            with pytest.raises(ImportError, match="kepsilon.tasks.validate"):
                governed_release(spec)
        finally:
            client.run(restore, "kepsilon.tasks.validate")
    assert store.conn.execute("SELECT COUNT(*) FROM ledger WHERE kind = 'reserve'").fetchone()[0] == 0
    assert list(store["releases"].rows) == []


@pytest.mark.flow
@pytest.mark.usefixtures("prefect_harness")
def test_a_configured_cluster_without_workers_is_refused_before_epsilon(sources, tmp_path, monkeypatch):
    """Its scheduler accepts the tasks and holds them: the release used to wait on its first one forever."""
    from distributed import LocalCluster

    import kepsilon.flows.release_dask as dask_flow
    from kepsilon.flows.release import governed_release

    from .conftest import capped_store

    store = capped_store(tmp_path, monkeypatch, "test-population")
    private_temporary_folder(tmp_path, monkeypatch)
    monkeypatch.setattr(dask_flow, "WORKERS_WAIT_SECONDS", 2.0)
    with LocalCluster(n_workers=0, processes=False, scheduler_port=0, dashboard_address=None, protocol="tcp://") as empty:
        spec = make_spec(sources["sample"], tmp_path, execution={"engine": "dask", "scheduler": empty.scheduler_address,
                                                                  "partitions": 2})
        with pytest.raises(SpecError, match=r"'execution.scheduler': the cluster has no worker \(none joined within 2 s\)"):
            governed_release(spec)
    assert store.conn.execute("SELECT COUNT(*) FROM ledger").fetchone()[0] == 1  # the cap alone: nothing reserved
    assert not Path(spec.output_dir).exists() or not any(Path(spec.output_dir).iterdir())


@pytest.mark.flow
@pytest.mark.usefixtures("prefect_harness")
def test_a_cluster_that_loses_every_worker_after_epsilon_fails_and_is_recorded(sources, tmp_path, monkeypatch):
    """Its scheduler held the stage's tasks for a worker that never came: the release waited forever, its ε
    reserved and nothing recorded. Now the stage's tasks are cancelled and the failure recorded."""
    import time

    from distributed import LocalCluster

    import kepsilon.flows.release_dask as dask_flow
    from kepsilon.flows.release import governed_release
    from kepsilon.tasks.errors import ReleaseFailed

    from .conftest import capped_store

    store = capped_store(tmp_path, monkeypatch, "test-population")
    private_temporary_folder(tmp_path, monkeypatch)
    monkeypatch.setattr(dask_flow, "WORKERS_WAIT_SECONDS", 2.0)
    monkeypatch.setattr(dask_flow, "WATCH_SECONDS", 0.5)
    with LocalCluster(n_workers=1, processes=False, scheduler_port=0, dashboard_address=None, protocol="tcp://") as cluster:
        figure_inputs = dask_flow._figure_inputs

        def then_every_worker_leaves(*args):  # after ε, between the group checks and the parts
            cluster.scale(0)
            deadline = time.monotonic() + 30
            while cluster.scheduler_info["workers"] and time.monotonic() < deadline:
                time.sleep(0.1)
            return figure_inputs(*args)

        monkeypatch.setattr(dask_flow, "_figure_inputs", then_every_worker_leaves)
        spec = make_spec(sources["sample"], tmp_path, execution={"engine": "dask", "scheduler": cluster.scheduler_address,
                                                                  "partitions": 2})
        started = time.monotonic()
        with pytest.raises(ReleaseFailed, match=r"ClusterLost: the cluster lost every worker during stage 'publish-part' "
                                                r"and none joined within 2 s.*recorded as failed"):
            governed_release(spec)
        assert time.monotonic() - started < 120
    releases = list(store["releases"].rows)
    assert [(r["release_id"], r["outcome"]) for r in releases] == [("dask-test", "failed")]
    assert "lost every worker during stage 'publish-part'" in releases[0]["failure_reason"]
    # Nothing published: at most the hidden staging folder a rerun starts afresh, with no part in it.
    assert [p.name for p in Path(spec.output_dir).iterdir() if not p.name.startswith(".")] == []
    assert not [p for p in Path(spec.output_dir).rglob("*") if p.is_file()]


def test_a_scheduler_address_nothing_answers_at_is_refused_by_name():
    import socket

    from kepsilon.flows.release_dask import check_scheduler_reachable
    from kepsilon.tasks.errors import SpecError

    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(SpecError) as refused:
        check_scheduler_reachable(f"tcp://127.0.0.1:{port}", timeout=2)
    assert refused.value.parameter == "execution.scheduler"
    with pytest.raises(SpecError, match="tcp://HOST:PORT"):
        check_scheduler_reachable("tcp://no-port-here")
    with socket.socket() as listening:  # and an address something answers at passes
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        check_scheduler_reachable(f"tcp://127.0.0.1:{listening.getsockname()[1]}")


@pytest.mark.flow
@pytest.mark.usefixtures("prefect_harness")
def test_a_fine_grained_release_ships_no_large_graph_and_the_flow_never_builds_the_histogram(
    clusters, tmp_path, monkeypatch
):
    """Fine-grained k-quasis (a 5-digit ZIP: a distinct tuple for nearly every record) on 3 partitions:
    the histogram pickles to several MB, yet no task's graph comes near 1 MB (distributed's "Sending
    large graph" warning, its threshold lowered to 1 MB), and the flow's process never counts or merges
    a histogram (the engine's histogram functions, spied on in this process, are never called: the
    workers, other processes, do it)."""
    import pickle
    import warnings

    import dask

    import kepsilon.engine.anonymise as anonymise_module
    import kepsilon.engine.histogram as histogram_module
    import kepsilon.tasks.shards as shards_module
    from kepsilon.engine.anonymise import histogram_of
    from kepsilon.flows.release import governed_release

    from .conftest import capped_store

    capped_store(tmp_path, monkeypatch, "test-population")
    private_temporary_folder(tmp_path, monkeypatch)
    data = release_spec_dict(
        "paper-synthetic", release_id="dask-fine", population_id="test-population", output_dir=str(tmp_path / "out"),
        source={"path": str(SYNTHETIC / "people.csv"), "delimiter": ";"}, k=3, max_linking_risk=1.0,
        execution={"engine": "dask", "scheduler": clusters[2].scheduler_address, "partitions": 3},
    )
    data["roles"]["k_quasi"].insert(0, {"column": "ZIP", "hierarchy": {"kind": "masking", "length": 5}})
    data["roles"]["explicit"].remove("ZIP")
    spec = ReleaseSpec.model_validate(data)
    histogram = histogram_of(classify(read_source(spec.source).frame, spec).frame, spec, extremes=True)
    assert len(histogram) > 20_000 and len(pickle.dumps(histogram)) > 2_000_000  # what the old graph carried

    calls = []

    def spy(function):
        def called(*args, **kwargs):
            calls.append(function.__name__)
            return function(*args, **kwargs)
        return called

    for module, name in [(histogram_module, "tuple_histogram"), (histogram_module, "merge_histograms"),
                         (histogram_module, "merge_histograms_placing"), (anonymise_module, "tuple_histogram"),
                         (shards_module, "merge_histograms"), (shards_module, "merge_histograms_placing")]:
        monkeypatch.setattr(module, name, spy(getattr(module, name)))
    with warnings.catch_warnings(record=True) as caught, dask.config.set(
        {"distributed.admin.large-graph-warning-threshold": "1MB"}
    ):
        warnings.simplefilter("always")
        record = governed_release(spec)
    assert record["rows_published"] > 0
    assert [str(w.message) for w in caught if "large graph" in str(w.message)] == []
    assert calls == []
    # The certificate's risk rows, reduced over the shards and partitions, computed on these ~30k distinct tuples.
    for name in ("published", "predicted", "source", "special_uniques"):
        assert "computed" not in record["certificate"]["risk"][name], name
    assert record["certificate"]["risk"]["special_uniques"]["records"] == record["rows_in"]
