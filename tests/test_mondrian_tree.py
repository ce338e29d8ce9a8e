"""The distributed Mondrian (``engine/mondrian_tree.py``, driven by ``tasks/shards.py``) finds the in-memory classes.

The histogram is cut into pieces (as the Dask intake does), split into hash buckets, merged into shards,
and anonymised with the top of the cut tree grown from the shards' statistics and small leaves finished
on their own. For several piece counts and several leaf sizes (so the top really cuts, down to leaves of
a few dozen tuples), the class of every tuple, the report, the class partitions, the records kept and
the certain linking share equal ``k_anonymise_histogram``'s on the whole table. Fine-grained k-quasis
(a 5-digit ZIP) and the three kinds of dimension (hierarchy, numbers, sets) with ℓ-diversity and
t-closeness are covered.
"""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kepsilon.engine.anonymise import histogram_of, k_anonymise_histogram
from kepsilon.engine.criteria import build_criteria
from kepsilon.engine.histogram import concat_disjoint, take_tuples, tuple_histogram
from kepsilon.engine.mondrian import mondrian_classes
from kepsilon.engine.mondrian_tree import (
    CutTree,
    Encoding,
    NodeStatistics,
    add_distinct_values,
    class_numbers,
    distinct_values,
    finish_subtree,
    grow_top,
    mondrian_report,
    node_statistics,
)
from kepsilon.flows.spec import ReleaseSpec
from kepsilon.tasks.errors import SpecError
from kepsilon.tasks.partitioned import certain_linking_share, class_targets
from kepsilon.tasks.scratch import Scratch
from kepsilon.tasks.shards import PARTIAL_PLACES, PIECE_CLASSES, anonymise_shards, merge_shard, write_partials

from .conftest import SYNTHETIC, release_spec_dict


def in_process(name, function, arguments):
    return [function(*a) for a in arguments]


@pytest.fixture(scope="module")
def people() -> pd.DataFrame:
    frame = pd.read_csv(SYNTHETIC / "people.csv", sep=";", dtype=str, keep_default_na=False)
    frame["HEIGHT"] = frame["HEIGHT"].astype(float)
    return frame


def spec_for(tmp_path: Path, **changes) -> ReleaseSpec:
    sensitive = changes.pop("sensitive", None)
    k_quasi = changes.pop("k_quasi", None)
    data = release_spec_dict("paper-synthetic", release_id="tree", population_id="tree", output_dir=str(tmp_path / "out"),
                             **changes)
    if sensitive is not None:
        data["roles"]["sensitive"] = sensitive
    if k_quasi is not None:
        data["roles"]["k_quasi"] = k_quasi
        data["roles"]["explicit"] = [c for c in data["roles"]["explicit"] if c not in {q["column"] for q in k_quasi}]
    return ReleaseSpec.model_validate(data)


def on_shards(frame: pd.DataFrame, spec: ReleaseSpec, pieces: int, folder: Path, max_tuples: int):
    """The Dask path's intake, merge and anonymiser on ``pieces`` contiguous pieces, in this process."""
    scratch = Scratch.new(folder / f"scratch-{pieces}-{max_tuples}")
    columns = [q.column for q in spec.roles.k_quasi]
    bounds = np.linspace(0, len(frame), pieces + 1).astype(int)
    values, offsets = [], []
    for number in range(pieces):
        piece = frame.iloc[bounds[number]:bounds[number + 1]].reset_index(drop=True)
        histogram = histogram_of(piece, spec, extremes=True)
        write_partials(scratch, histogram, columns, pieces, number)
        values.append(histogram.values)
        offsets.append(int(bounds[number]))
    summaries = [merge_shard(scratch, b, offsets, columns) for b in range(pieces)]
    totals = {c: pd.concat([v[c] for v in values]).groupby(level=0, sort=False).sum().astype(np.int64) for c in values[0]}
    # Several shards per cut-statistics task wherever there are several (their statistics added on the worker).
    result = anonymise_shards(spec, scratch, summaries, totals, in_process, max_tuples=max_tuples,
                              statistics_tasks=max(1, pieces // 2))
    tuples, classes = zip(*(shard_classes(scratch, b) for b in range(pieces)))
    return result, pd.concat(tuples, ignore_index=True), np.concatenate(classes), scratch


def shard_classes(scratch: Scratch, bucket: int) -> tuple[pd.DataFrame, np.ndarray]:
    """A shard's tuples and their classes, put back together from what its step handed the pieces (the
    distribution's input): every tuple of the shard must have reached some piece."""
    shard = scratch.read("shard", bucket)
    lengths, places = scratch.read(PARTIAL_PLACES, bucket)
    classes = np.full(len(shard), -2, dtype=np.int64)  # -2: handed to no piece (-1 is a class: suppressed)
    for piece, (end, length) in enumerate(zip(np.cumsum(lengths).tolist(), lengths.tolist())):
        if length:
            classes[places[end - length:end]] = scratch.read(PIECE_CLASSES, piece, bucket)
    assert (classes != -2).all()
    return shard.tuples, classes


FINE = [
    {"column": "ZIP", "hierarchy": {"kind": "masking", "length": 5}},
    {"column": "YOB", "hierarchy": {"kind": "intervals", "lower": 1900, "upper": 2020, "widths": [1, 5, 10, 20]}},
    {"column": "GENDER", "hierarchy": str(SYNTHETIC / "hierarchies" / "GENDER.csv")},
    {"column": "RACE", "hierarchy": str(SYNTHETIC / "hierarchies" / "RACE.csv")},
    {"column": "MARITAL_STATUS", "hierarchy": str(SYNTHETIC / "hierarchies" / "MARITAL_STATUS.csv")},
]

CASES = [
    ({}, 1, 10**9),
    ({}, 3, 40),
    ({}, 4, 30),
    ({"sensitive": [{"column": "RELIGION", "l_diversity": {"l": 2}}, "ICD"]}, 3, 25),
    ({"sensitive": ["RELIGION", {"column": "ICD", "t_closeness": {"t": 0.6}}], "k": 4}, 5, 60),
    ({"k_quasi": FINE}, 2, 3000),
    ({"k_quasi": FINE, "k": 5}, 4, 200),
    ({"k_quasi": FINE, "k": 3, "scale_basis": "bounds"}, 6, 300),
    ({"algorithm": "ola"}, 3, 100),
]


@pytest.mark.parametrize("changes, pieces, max_tuples", CASES)
def test_the_classes_on_shards_are_the_in_memory_classes(people, tmp_path, changes, pieces, max_tuples):
    spec = spec_for(tmp_path, **changes)
    whole = histogram_of(people, spec, extremes=True)
    reference = k_anonymise_histogram(whole, spec)
    result, tuples, classes, scratch = on_shards(people, spec, pieces, tmp_path, max_tuples)

    columns = [q.column for q in spec.roles.k_quasi]
    at = pd.MultiIndex.from_frame(whole.tuples[columns]).get_indexer(pd.MultiIndex.from_frame(tuples[columns]))
    assert (at >= 0).all() and len(at) == len(whole)  # every tuple once, in some shard
    expected = reference.classes.class_of_tuple
    assert np.array_equal(classes, expected[at])
    assert result.report == reference.classes.report
    assert result.levels == reference.classes.levels
    assert result.n_classes == int(expected.max()) + 1
    assert result.rows_kept == int(whole.weights[expected >= 0].sum())
    assert result.certain_share == certain_linking_share(whole, expected, spec)
    assert np.array_equal(scratch.read("targets"), class_targets(whole, expected, pieces))
    assert {c: h.sha256 for c, h in result.hierarchies.items()} == {c: h.sha256 for c, h in reference.hierarchies.items()}


def test_the_top_really_cuts_when_leaves_are_small(people, tmp_path):
    """With leaves of at most 200 tuples, the top is a tree of many leaves, not the root alone."""
    spec = spec_for(tmp_path, k_quasi=FINE, k=5)
    result, *_ = on_shards(people, spec, 1, tmp_path, 10**9)
    whole = histogram_of(people, spec, extremes=True)
    hierarchies = result.hierarchies
    columns = [q.column for q in spec.roles.k_quasi]
    encoding = Encoding.build(distinct_values(whole.tuples, columns), columns, hierarchies)
    tree = grow_top(encoding, 5, [], lambda t, nodes: node_statistics(t, nodes, encoding, whole, []), 200)
    leaves = tree.leaf_of(encoding.codes(whole.tuples))
    assert len(tree.leaves()) > 50
    assert np.median(np.bincount(leaves)[tree.leaves()]) <= 200


# --------------------------------------------------------------------------- the engine alone: numbers and sets


def fine_frame(rows: int, seed: int) -> pd.DataFrame:
    """Fine-grained k-quasis without hierarchies: a Zipf-like ZIP (a set), a birth year (numbers), text."""
    rng = np.random.default_rng(seed)
    zips = np.array([f"{z:05d}" for z in rng.choice(100_000, 400, replace=False)], dtype=object)
    weights = 1.0 / np.arange(1, len(zips) + 1)
    return pd.DataFrame({
        "ZIP": zips[rng.choice(len(zips), rows, p=weights / weights.sum())],
        "YEAR": rng.integers(1930, 2006, rows),
        "SEX": rng.choice(["F", "M"], rows),
        "CODE": rng.choice(["a", "b", "c", "d", "e"], rows, p=[0.5, 0.2, 0.15, 0.1, 0.05]),
    })


def engine_on_shards(frame: pd.DataFrame, columns: list[str], k: int, criteria: list, shards: int, max_tuples: int):
    """The engine's steps by hand: shards of a histogram, the top from their summed statistics, leaves
    finished alone, classes numbered by a reduction; returns the class of every whole-table tuple and the report."""
    whole = tuple_histogram(frame, columns, criteria)
    parts = [take_tuples(whole, np.flatnonzero(np.arange(len(whole)) % shards == s)) for s in range(shards)]
    encoding = Encoding.build(add_distinct_values([distinct_values(p.tuples, columns) for p in parts]), columns, {})
    tree = grow_top(encoding, k, criteria,
                    lambda t, nodes: NodeStatistics.add([node_statistics(t, nodes, encoding, p, criteria) for p in parts]),
                    max_tuples)
    leaf_of = tree.leaf_of(encoding.codes(whole.tuples))
    results, members = [], []
    for leaf in tree.leaves():
        positions = np.flatnonzero(leaf_of == leaf)
        pieces = [take_tuples(whole, positions[positions % shards == s]) for s in range(shards)]
        members.append(np.concatenate([positions[positions % shards == s] for s in range(shards)]))
        results.append(finish_subtree(concat_disjoint(pieces), encoding, k, criteria))
    firsts = [r.first_rows for r in results]
    class_of_tuple = np.full(len(whole), -1, dtype=np.int64)
    n = sum(len(f) for f in firsts)
    sizes, loss = np.zeros(n, dtype=np.int64), [np.zeros(n) for _ in columns]
    low, high = [np.zeros(n, dtype=np.int64) for _ in columns], [np.zeros(n, dtype=np.int64) for _ in columns]
    set_sizes = {j: np.zeros(n, dtype=np.int64) for j, d in enumerate(encoding.dimensions) if d.kind == "set"}
    for result, where in zip(results, members):
        numbers = class_numbers(result.first_rows, firsts)
        class_of_tuple[where] = numbers[result.class_of_tuple]
        sizes[numbers] = result.sizes
        for j in range(len(columns)):
            loss[j][numbers], low[j][numbers], high[j][numbers] = result.loss[j], result.low[j], result.high[j]
        for j in set_sizes:
            set_sizes[j][numbers] = result.set_sizes[j]
    report = mondrian_report(encoding, whole.records, k, sizes, loss, low, high, {}, set_sizes)
    return whole, class_of_tuple, report, tree


@pytest.mark.parametrize("shards, max_tuples, k", [(1, 10**9, 5), (2, 500, 5), (3, 60, 4), (7, 20, 3), (5, 1, 10)])
def test_numbers_and_sets_on_shards_give_the_in_memory_classes(shards, max_tuples, k):
    frame = fine_frame(6_000, seed=shards)
    columns = ["ZIP", "YEAR", "SEX"]
    whole, class_of_tuple, report, tree = engine_on_shards(frame, columns, k, [], shards, max_tuples)
    reference = mondrian_classes(whole, columns, k, {}, [])
    assert np.array_equal(class_of_tuple, reference.class_of_tuple)
    reference.report.pop("hierarchies")
    report.pop("hierarchies")
    assert report == reference.report
    if max_tuples < 100:
        assert len(tree.leaves()) > 10  # the distributed top did the cutting


@pytest.mark.parametrize("criterion", [{"l": 3}, {"t": 0.3}])
def test_criteria_decided_from_statistics_match_the_in_memory_cuts(criterion):
    from kepsilon.flows.spec import SensitiveColumn

    frame = fine_frame(6_000, seed=11)
    entry = SensitiveColumn.model_validate(
        {"column": "CODE", **({"l_diversity": {"l": criterion["l"]}} if "l" in criterion else
                              {"t_closeness": {"t": criterion["t"]}})})
    criteria = build_criteria([entry], frame)
    columns = ["ZIP", "YEAR", "SEX"]
    whole, class_of_tuple, _, tree = engine_on_shards(frame, columns, 4, criteria, 3, 30)
    reference = mondrian_classes(whole, columns, 4, {}, criteria)
    assert np.array_equal(class_of_tuple, reference.class_of_tuple)
    assert len(tree.leaves()) > 5


def test_a_whole_table_failing_its_criterion_is_refused_by_the_top():
    from kepsilon.flows.spec import SensitiveColumn

    frame = fine_frame(2_000, seed=3)
    entry = SensitiveColumn.model_validate({"column": "CODE", "l_diversity": {"l": 6}})  # only 5 values exist
    criteria = build_criteria([entry], frame)
    whole = tuple_histogram(frame, ["ZIP", "YEAR"], criteria)
    encoding = Encoding.build(distinct_values(whole.tuples, ["ZIP", "YEAR"]), ["ZIP", "YEAR"], {})
    with pytest.raises(SpecError, match="roles.sensitive.CODE"):
        grow_top(encoding, 4, criteria, lambda t, nodes: node_statistics(t, nodes, encoding, whole, criteria), 10)
    with pytest.raises(SpecError):
        mondrian_classes(whole, ["ZIP", "YEAR"], 4, {}, criteria)


def test_a_leaf_is_reached_by_its_cuts():
    tree = CutTree()
    (left, right) = tree.split(np.array([0]), np.array([1]), np.array([4]))
    tree.split(np.array([left]), np.array([0]), np.array([0]))
    codes = np.array([[0, 1, 0, 9], [4, 4, 5, 0]])
    assert tree.leaf_of(codes).tolist() == [3, 4, right, 4]
