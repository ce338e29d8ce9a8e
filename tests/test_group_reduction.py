"""The partitioned release's group checks and figures by reduction (``tasks/group_reduction.py``) give the
whole-table answers, and what they hand the flow's process does not grow with the groups.

The stages run in this process (no Prefect, no Dask), over the bundled sample: the groups of the class
partitions and of the published parts are shuffled by bucket of group keys through the scratch, as the flow
does, and the reductions are compared with the whole-table functions (``combine_outcome``, ``failing_groups``,
``disclosure_figures``, ``groups_from_sizes``) and the gate with the in-memory gate (``validate_release``) on
the published table — including a group that fails, which must be caught in whichever bucket it lies.
"""

import pickle
from dataclasses import fields, is_dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from kepsilon.engine.criteria import disclosure_figures
from kepsilon.engine.randomness import RecordStreams
from kepsilon.flows.manifest import groups_from_size_counts, groups_from_sizes
from kepsilon.flows.spec import ReleaseSpec
from kepsilon.tasks.figure_inputs import SCATTER_LIMIT, ErrorCells, ErrorExtremes, SizeCounts
from kepsilon.tasks.group_reduction import (
    check_groups,
    class_figures,
    gate_groups,
    group_buckets,
    perturb_and_hand_over,
    publish_and_hand_over,
    split_groups,
)
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
    outcome_metrics,
    perturb_and_suppress,
    publish_part,
)
from kepsilon.tasks.sources import plan_source
from kepsilon.tasks.validate import validate_aggregated, validate_groups, validate_release, weight_column_name

from .conftest import SYNTHETIC, release_spec_dict
from .test_dask_release import anonymise_in_shards

SEED = bytes(range(32))
SAMPLE = {"path": str(SYNTHETIC / "people.csv"), "delimiter": ";"}
DIVERSE = [{"column": "RELIGION", "l_diversity": {"l": 2}}, {"column": "ICD", "t_closeness": {"t": 0.6}}]


def make_spec(tmp_path: Path, zip_code: bool = False, **changes) -> ReleaseSpec:
    """The sample's spec; with ``zip_code``, a 5-digit ZIP among the k-quasis (a group for nearly every few records)."""
    sensitive = changes.pop("sensitive", None)
    data = release_spec_dict("paper-synthetic", release_id="reduce-test", population_id="test-population", source=SAMPLE,
                             output_dir=str(tmp_path / "out"), **changes)
    if sensitive is not None:
        data["roles"]["sensitive"] = sensitive
    if zip_code:
        data["roles"]["k_quasi"].insert(0, {"column": "ZIP", "hierarchy": {"kind": "masking", "length": 5}})
        data["roles"]["explicit"].remove("ZIP")
    return ReleaseSpec.model_validate(data)


def prepared(spec: ReleaseSpec, partitions: int, folder: Path):
    """Stages A and B and the anonymiser, in this process: the scratch ready for stage C."""
    folder.mkdir(parents=True, exist_ok=True)
    root = Scratch.new(folder / "scratch")
    plan = plan_source(spec.source, partitions)
    pieces = len(plan.pieces)
    table = combine_intakes([intake(plan, piece, spec, root) for piece in plan.pieces], spec,
                            lambda number: distinct_count(root, number, pieces))
    anonymised, classes = anonymise_in_shards(spec, plan, table, root)
    for piece, offset in zip(plan.pieces, table.offsets):
        distribute(piece.index, offset, root, [q.column for q in spec.roles.e_quasi])
    coder = GroupCoder.build(spec, anonymised.hierarchies, anonymised.criteria)
    return root, pieces, table, anonymised, classes, coder


def reduced(spec: ReleaseSpec, partitions: int, folder: Path):
    """The flow's order of ``_spend_check_stage`` with the stage functions of ``group_reduction``: what the
    flow's process receives, and the published table."""
    root, pieces, table, anonymised, classes, coder = prepared(spec, partitions, folder)
    criteria = anonymised.criteria
    parts = [perturb_and_hand_over(j, pieces, root, spec, RecordStreams(SEED), anonymised.hierarchies, classes.levels,
                                   coder, pieces) for j in range(pieces)]
    checked = [check_groups(root, bucket, pieces, criteria) for bucket in range(pieces)]
    errors = ErrorExtremes.add([part.error_extremes for part in parts if part.error_extremes is not None])
    extent = None if errors.as_points else errors.extent()
    outcomes = [class_figures(root, j, pieces, spec, extent) for j in range(pieces)]
    meta = next(part.meta for part in parts if part.meta is not None)
    staging = folder / "staging"
    (staging / DATASET).mkdir(parents=True)
    published = [publish_and_hand_over(q, pieces, root, str(staging), spec, meta, False, len(coder.sensitive), pieces)
                 for q in range(pieces)]
    gates = [gate_groups(root, bucket, pieces, spec, coder, criteria) for bucket in range(pieces)]
    received = {"perturb-suppress": parts, "check-groups": checked, "class-figures": outcomes, "publish-part": published,
                "gate-groups": gates}
    return received, errors, extent, classes, criteria, pq.read_table(staging / DATASET).to_pandas(), root


def whole(spec: ReleaseSpec, partitions: int, folder: Path):
    """The same stages with every group and class gathered in this process (the reference)."""
    root, pieces, table, anonymised, classes, coder = prepared(spec, partitions, folder)
    criteria = anonymised.criteria
    parts = [perturb_and_suppress(j, pieces, root, spec, RecordStreams(SEED), anonymised.hierarchies, classes.levels,
                                  coder, pieces) for j in range(pieces)]
    groups = GroupCounts.add([part.groups for part in parts])
    failing = failing_groups(groups, criteria)
    outcome = combine_outcome(parts, failing, groups, classes.report, spec, criteria)
    meta = next(part.meta for part in parts if part.meta is not None)
    staging = folder / "staging"
    (staging / DATASET).mkdir(parents=True)
    written = GroupCounts.add([publish_part(q, pieces, root, str(staging), failing, spec, meta, False, len(coder.sensitive)).groups
                               for q in range(pieces)])
    return outcome, written, criteria, coder


def _largest_table(value) -> int:
    """The longest array, frame, list or series anywhere inside ``value`` (dataclasses, dicts, tuples walked)."""
    if isinstance(value, (np.ndarray, pd.DataFrame, pd.Series, pd.Index)):
        return len(value)
    if is_dataclass(value) and not isinstance(value, type):
        return max((_largest_table(getattr(value, f.name)) for f in fields(value)), default=0)
    if isinstance(value, dict):
        return max((_largest_table(v) for v in value.values()), default=0)
    if isinstance(value, (list, tuple)):
        return max([len(value), *(_largest_table(v) for v in value)])
    return 0


@pytest.mark.parametrize("partitions, changes", [
    (1, {}),
    (3, {"sensitive": DIVERSE}),
    (4, {"sensitive": DIVERSE, "algorithm": "ola"}),
    (5, {"k": 3, "sensitive": [{"column": "RELIGION", "l_diversity": {"l": 3}}, "ICD"]}),
])
def test_the_reductions_record_what_the_whole_tables_give(tmp_path, partitions, changes):
    """Metrics, groups, disclosure figures, the figures' inputs and the certificate's written groups: identical."""
    spec = make_spec(tmp_path, **changes)
    received, errors, extent, classes, criteria, _, root = reduced(spec, partitions, tmp_path / "reduced")
    outcome, written, _, _ = whole(spec, partitions, tmp_path / "whole")

    metrics = outcome_metrics(received["perturb-suppress"], received["class-figures"], classes.report, spec, criteria)
    assert metrics == outcome.metrics
    sizes = SizeCounts.add([gate.sizes for gate in received["gate-groups"]])
    assert groups_from_size_counts(sizes.values, sizes.counts, 32_000) == groups_from_sizes(written.sizes, 32_000)
    from kepsilon.engine.criteria import add_disclosure_figures

    assert add_disclosure_figures([gate.disclosure for gate in received["gate-groups"]]) == disclosure_figures(
        written.sizes, written.matrices(criteria), criteria)
    from kepsilon.tasks.certificate_dask import read_written_sizes

    # The certificate's written groups (keys and sizes, gathered from the buckets): the whole table's, in its order.
    gathered = read_written_sizes(root, partitions)
    assert np.array_equal(gathered.keys, written.keys) and np.array_equal(gathered.sizes, written.sizes)
    assert gathered.keys.dtype == written.keys.dtype and gathered.sizes.dtype == written.sizes.dtype

    final = SizeCounts.add([check.sizes for check in received["check-groups"]])
    expected = outcome.figure_inputs
    assert np.array_equal(final.values, expected.group_sizes.values) and np.array_equal(final.counts, expected.group_sizes.counts)
    assert errors == expected.errors and extent == expected.extent
    if extent is None:
        for axis in (0, 1):
            assert np.array_equal(np.concatenate([o.points[axis] for o in received["class-figures"]]), expected.points[axis])
    else:
        cells = ErrorCells.add([o.cells for o in received["class-figures"]], extent)
        assert np.array_equal(cells.cells, expected.cells.cells) and np.array_equal(cells.counts, expected.cells.counts)


def test_what_reaches_the_flow_does_not_grow_with_the_groups(tmp_path):
    """Two populations of very different group counts (the same records with a 5-digit ZIP and k = 3, and
    without it and k = 40): no result the flow's process receives holds a table of groups or classes, and the
    results pickle to about the same size."""
    sizes, groups = {}, {}
    for k in (3, 40):
        spec = make_spec(tmp_path / f"k{k}", zip_code=k == 3, k=k, max_linking_risk=1.0, sensitive=DIVERSE)
        received, *_ = reduced(spec, 3, tmp_path / f"k{k}")
        groups[k] = sum(gate.sizes.groups for gate in received["gate-groups"])
        for stage, results in received.items():
            # Frequency-of-frequencies arrays (distinct sizes) and check names; the error figure's points (at most
            # SCATTER_LIMIT over all partitions) or non-empty hexagons (at most the grid's 1,456 cells).
            bound = SCATTER_LIMIT if stage == "class-figures" else 200
            assert max(_largest_table(result) for result in results) <= bound, (k, stage)
        sizes[k] = {stage: max(len(pickle.dumps(r)) for r in results) for stage, results in received.items()}
    assert groups[3] > 8 * groups[40]
    for stage in sizes[3]:
        if stage == "class-figures":  # points for few classes, cells for many: bounded either way
            assert max(sizes[3][stage], sizes[40][stage]) < 40_000, sizes
        else:
            assert sizes[3][stage] < 1.5 * sizes[40][stage] + 4_000, (stage, sizes)


def _published_with(frame: pd.DataFrame, coder: GroupCoder, key: int, change) -> pd.DataFrame:
    """The published table with the rows of group ``key`` changed by ``change`` (a frame -> frame)."""
    mine = coder.keys(frame[list(coder.columns)]) == key
    return pd.concat([frame[~mine], change(frame[mine])], ignore_index=True)


@pytest.mark.parametrize("broken", ["none", "small group", "one religion"])
def test_the_gate_by_bucket_is_the_whole_table_gate(tmp_path, broken):
    """The gate's checks (names, order, outcomes) from per-bucket Great Expectations runs equal the in-memory
    gate's on the published table, for 1, 2, 3 and 5 buckets (and an empty one) — also when one group, lying in a bucket other
    than the first, is too small or not ℓ-diverse."""
    spec = make_spec(tmp_path, sensitive=DIVERSE, max_prosecutor_risk=0.5)
    received, _, _, _, criteria, published, _ = reduced(spec, 2, tmp_path / "run")
    _, _, _, coder = whole(spec, 2, tmp_path / "whole")
    keys = coder.keys(published[list(coder.columns)])
    # A group in bucket 2 of 3 and in bucket 3 of 5, none of them the first.
    candidates = [key for key in np.unique(keys) if group_buckets(np.array([key]), 3)[0] == 2
                  and group_buckets(np.array([key]), 5)[0] == 3 and (keys == key).sum() >= 4]
    key = candidates[0]
    if broken == "small group":
        published = _published_with(published, coder, key, lambda rows: rows.iloc[: spec.k - 1])
    elif broken == "one religion":
        published = _published_with(published, coder, key, lambda rows: rows.assign(RELIGION=rows["RELIGION"].iloc[0]))
    roles = spec.roles.names()
    rows_in = len(published) + 100
    settings = dict(rows_in=rows_in, rows_removed=100, suppression_budget=spec.suppression_budget, criteria=criteria,
                    linking_risk=0.01, max_linking_risk=spec.max_linking_risk, max_prosecutor_risk=spec.max_prosecutor_risk)
    expected = validate_release(published, k_quasi=roles["k_quasi"], e_quasi=roles["e_quasi"], explicit=roles["explicit"],
                                k=spec.k, **settings)
    assert expected.success == (broken == "none")

    from kepsilon.tasks.partitioned import gate_tables

    codes = [coder.value_codes(n, published[column]) for n, column in enumerate(coder.sensitive)]
    groups = GroupCounts.count(keys if broken == "none" else coder.keys(published[list(coder.columns)]), codes)
    weight = weight_column_name([*roles["k_quasi"], *roles["sensitive"]])
    part_checks = [part.checks for part in received["publish-part"]]
    for buckets in (1, 2, 3, 5):
        checks, records = [], []
        # With more buckets than groups some are empty: one more, empty, must pass vacuously.
        extra = [GroupCounts.empty(len(coder.sensitive))] if buckets == 5 else []
        for bucket in [*split_groups(groups, buckets), *extra]:
            table, per_criterion = gate_tables(bucket, coder, criteria, weight)
            checks.append(validate_groups(table, per_criterion, weight_column=weight, k_quasi=roles["k_quasi"], k=spec.k,
                                          criteria=[c for c in criteria if c.declared],
                                          max_prosecutor_risk=spec.max_prosecutor_risk))
            records.append(int(bucket.sizes.sum()))
        report = validate_aggregated(checks, records, part_checks, weight_column=weight, k_quasi=roles["k_quasi"],
                                     e_quasi=roles["e_quasi"], **{**settings, "criteria": [c for c in criteria if c.declared]})
        assert report.checks == expected.checks, buckets
        assert report.success == expected.success


@pytest.mark.parametrize("buckets", [1, 2, 7, 60])
def test_the_written_sizes_gathered_from_the_buckets_are_the_whole_tables(buckets):
    """``GroupSizes.gather`` over the buckets' keys and sizes: exactly the keys and sizes ``GroupCounts.add`` gives
    over the published parts' recounts, whatever the number of buckets (some of them empty)."""
    from kepsilon.tasks.certificate_dask import GroupSizes

    rng = np.random.default_rng(buckets)
    parts = []
    for _ in range(3):  # three published parts, their groups overlapping
        keys = rng.integers(0, 5_000, size=2_000)
        parts.append(GroupCounts.count(keys, [rng.integers(0, 4, size=len(keys))]))
    whole = GroupCounts.add(parts)
    by_bucket = [GroupCounts.add([split_groups(part, buckets)[bucket] for part in parts]) for bucket in range(buckets)]
    gathered = GroupSizes.gather([GroupSizes(bucket.keys, bucket.sizes) for bucket in by_bucket])
    assert np.array_equal(gathered.keys, whole.keys) and np.array_equal(gathered.sizes, whole.sizes)
    assert gathered.keys.dtype == whole.keys.dtype and gathered.sizes.dtype == whole.sizes.dtype
    assert GroupSizes.gather([]).keys.dtype == np.int64


def test_a_partitions_group_counts_are_pandas_counts_of_its_keys_and_codes():
    """``GroupCounts.count`` (pairs as one integer, counted after a sort) gives pandas' counts of the
    (key, code) pairs, sorted by key then code, and ``np.unique``'s keys and sizes."""
    rng = np.random.default_rng(5)
    keys = rng.integers(-2**40, 2**40, size=300)[rng.integers(0, 300, size=20_000)]  # mixed-radix keys: large
    codes = [rng.integers(0, 3, size=len(keys)), rng.integers(0, 700, size=len(keys))]
    counted = GroupCounts.count(keys, codes)
    unique, sizes = np.unique(keys, return_counts=True)
    assert np.array_equal(counted.keys, unique) and np.array_equal(counted.sizes, sizes)
    for table, column in zip(counted.values, codes):
        expected = (pd.DataFrame({"key": keys, "code": column}).value_counts().rename("records").reset_index()
                    .sort_values(["key", "code"]).reset_index(drop=True))
        pd.testing.assert_frame_equal(table, expected)
    empty = GroupCounts.count(np.zeros(0, np.int64), [np.zeros(0, np.int64)])
    assert len(empty.keys) == 0 and list(empty.values[0].columns) == ["key", "code", "records"]


@pytest.mark.parametrize("cells_per_record", [0, 8, 10**9], ids=["by-sort", "as-configured", "by-table"])
def test_group_counts_by_a_table_of_cells_and_by_a_sort_are_the_same(monkeypatch, cells_per_record):
    """Pairs counted in a (groups × domain) table or after a sort of their cells: the same rows, order and types,
    whichever of the two ``PAIR_CELLS_PER_RECORD`` picks (0: always the sort; 10⁹: always the table)."""
    import kepsilon.tasks.partitioned as partitioned

    rng = np.random.default_rng(11)
    keys = rng.integers(-2**40, 2**40, size=500)[rng.integers(0, 500, size=30_000)]
    codes = [rng.integers(0, 2, size=len(keys)), rng.integers(0, 48, size=len(keys)), rng.integers(0, 900, size=len(keys))]
    codes[1][codes[1] == 7] = 8  # a code no record has, inside the domain
    monkeypatch.setattr(partitioned, "PAIR_CELLS_PER_RECORD", cells_per_record)
    counted = GroupCounts.count(keys, codes)
    for table, column in zip(counted.values, codes):
        expected = (pd.DataFrame({"key": keys, "code": column}).value_counts().rename("records").reset_index()
                    .sort_values(["key", "code"]).reset_index(drop=True))
        pd.testing.assert_frame_equal(table, expected, check_exact=True)
        assert table["records"].sum() == len(keys) and (table["records"] > 0).all()
    one = GroupCounts.count(np.array([4], np.int64), [np.array([0], np.int64)])
    assert one.values[0].to_dict("list") == {"key": [4], "code": [0], "records": [1]}
    empty = GroupCounts.count(np.zeros(0, np.int64), [np.zeros(0, np.int64)])
    assert len(empty.values[0]) == 0 and list(empty.values[0].dtypes) == [np.int64] * 3
