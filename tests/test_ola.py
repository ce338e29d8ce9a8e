"""OLA against an independent exhaustive search, its guarantee, and its refusals.

The reference below reads the hierarchy files with pandas (not with kepsilon's loader), generalises
by dictionary lookup and counts classes with ``DataFrame.groupby``; it scores every node of the
lattice, so it shares no code path with the tagged search it checks.
"""

import functools
import itertools
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kepsilon.engine.hierarchy import Hierarchy, load_hierarchy
from kepsilon.engine.ola import METRICS, ola
from kepsilon.engine.partition import Partition
from kepsilon.tasks.errors import HierarchyError, InputError, SpecError

DATA = Path(__file__).resolve().parents[1] / "data"
SYNTHETIC_COLUMNS = ["YOB", "GENDER", "RACE", "MARITAL_STATUS"]
ADULT_SMALL = ["age", "education", "marital-status", "race"]
ADULT_MEDIUM = ["age", "education", "workclass", "occupation", "marital-status", "sex"]


def _hierarchy_path(dataset: str, column: str) -> Path:
    if dataset == "synthetic":
        return DATA / "paper-synthetic" / "hierarchies" / f"{column}.csv"
    return DATA / "adult" / f"adult_hierarchy_{column}.csv"


@functools.cache
def _frame(dataset: str) -> pd.DataFrame:
    if dataset == "synthetic":
        return pd.read_csv(DATA / "paper-synthetic" / "people.csv", sep=";")
    frame = pd.read_csv(DATA / "adult" / "adult.csv", sep=";")
    if dataset == "adult-sample":  # a fixed sample keeps the 1,080-node exhaustive search fast
        return frame.sample(n=6000, random_state=7).reset_index(drop=True)
    return frame


def _hierarchies(dataset: str, columns) -> dict[str, Hierarchy]:
    return {column: load_hierarchy(_hierarchy_path(dataset, column), column) for column in columns}


# --------------------------------------------------------------------------------------------------
# Exhaustive reference
# --------------------------------------------------------------------------------------------------


@functools.cache
def _reference_table(dataset: str, columns: tuple[str, ...], k: int) -> pd.DataFrame:
    """Every node of a bundled dataset with its suppressed count and its metrics (cached)."""
    return _reference_for(_frame(dataset), dataset, columns, k)


def _reference_for(frame: pd.DataFrame, dataset: str, columns: tuple[str, ...], k: int) -> pd.DataFrame:
    """Every node with its suppressed count and its metrics, computed the plain way."""
    n, d = len(frame), len(columns)
    labels = {}  # (column, level) -> generalised label of every record
    leaf_cost = {}  # (column, level) -> generalised loss of every record
    heights = []
    for column in columns:
        table = pd.read_csv(
            _hierarchy_path(dataset, column), sep=";", header=None, dtype=str, keep_default_na=False
        )
        heights.append(table.shape[1])
        values = frame[column].astype(str)
        for level in range(table.shape[1]):
            label_of_leaf = dict(zip(table[0], table[level]))
            leaves_under = table[level].value_counts()
            record_labels = values.map(label_of_leaf)
            labels[column, level] = pd.factorize(record_labels)[0]  # integers group faster than strings
            if len(table) > 1:
                cost = ((record_labels.map(leaves_under) - 1) / (len(table) - 1)).to_numpy(dtype=float)
            else:
                cost = np.zeros(n)
            leaf_cost[column, level] = cost
    rows = []
    for node in itertools.product(*[range(h) for h in heights]):
        generalised = pd.DataFrame({column: labels[column, level] for column, level in zip(columns, node)})
        size = generalised.groupby(list(columns), sort=False)[columns[0]].transform("size").to_numpy()
        suppressed = size < k
        per_record = sum(leaf_cost[column, level] for column, level in zip(columns, node))
        rows.append(
            {
                "node": node,
                "suppressed": int(suppressed.sum()),
                "precision": sum(level / (h - 1) for level, h in zip(node, heights) if h > 1) / d,
                "loss": (per_record[~suppressed].sum() + d * suppressed.sum()) / (n * d),
                # sum over kept classes of |ec|^2 = sum over kept records of their class size
                "discernibility": int(size[~suppressed].sum()) + n * int(suppressed.sum()),
                # DM*: every class, suppressed ones included, at its own size
                "dm_star": int(size.sum()),
            }
        )
    return pd.DataFrame(rows)


def _reference_optimum(table: pd.DataFrame, metric: str, max_suppressed: int):
    """(node, value) of least metric among nodes within budget; ties: lowest level sum, then lexicographic."""
    feasible = table[table["suppressed"] <= max_suppressed]
    best = min(feasible.itertuples(), key=lambda row: (getattr(row, metric), sum(row.node), row.node))
    return best.node, getattr(best, metric)


CASES = [
    ("synthetic", tuple(SYNTHETIC_COLUMNS), k, 0.05) for k in (2, 5, 20, 100)
] + [
    ("adult", tuple(ADULT_SMALL), 5, 0.05),
    ("adult", tuple(ADULT_SMALL), 10, 0.01),
    ("adult-sample", tuple(ADULT_MEDIUM), 5, 0.05),
    ("adult-sample", tuple(ADULT_MEDIUM), 5, 0.0),  # same table as above: budget only filters
]


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("dataset, columns, k, budget", CASES)
def test_result_equals_exhaustive_search(dataset, columns, k, budget, metric):
    frame = _frame(dataset)
    table = _reference_table(dataset, columns, k)
    expected_node, expected_value = _reference_optimum(table, metric, math.floor(budget * len(frame)))

    result = ola(frame, list(columns), k, _hierarchies(dataset, columns), budget, metric)

    chosen = tuple(result.report["node"][column] for column in columns)
    assert chosen == expected_node
    assert result.report["metric_value"] == pytest.approx(expected_value, rel=1e-12)
    assert result.report["suppressed_rows"] == table.set_index("node").loc[[chosen], "suppressed"].iloc[0]
    # The search is the point: fewer nodes grouped than the lattice holds (or it is tiny).
    assert result.report["nodes_evaluated"] <= result.report["nodes_in_lattice"]


@pytest.mark.parametrize("seed", range(6))
def test_dm_star_and_every_metric_match_exhaustive_search_on_random_small_tables(seed):
    """Small random samples of the synthetic people, random k and budget: small classes are common,
    so suppressed classes weigh in DM* and the budget binds, unlike on the full table."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(40, 400))
    frame = _frame("synthetic").sample(n=n, random_state=seed).reset_index(drop=True)
    k = int(rng.choice([2, 3, 5, 8, 13]))
    budget = float(rng.choice([0.0, 0.02, 0.05, 0.2]))
    columns = tuple(SYNTHETIC_COLUMNS)
    table = _reference_for(frame, "synthetic", columns, k)
    max_suppressed = math.floor(budget * n)
    if not (table["suppressed"] <= max_suppressed).any():
        with pytest.raises(SpecError, match="k"):
            ola(frame, list(columns), k, _hierarchies("synthetic", columns), budget, "dm_star")
        return
    for metric in METRICS:
        expected_node, expected_value = _reference_optimum(table, metric, max_suppressed)
        result = ola(frame, list(columns), k, _hierarchies("synthetic", columns), budget, metric)
        assert tuple(result.report["node"][c] for c in columns) == expected_node, metric
        assert result.report["metric_value"] == pytest.approx(expected_value, rel=1e-12)


def test_dm_star_charges_suppressed_classes_at_their_own_size(unsuppressing_lattice):
    """On the hand-made lattice the bottom node suppresses one record: DM* counts it as a class of 1
    (not n, as discernibility does), so the bottom node wins under DM* and loses under discernibility."""
    frame, hierarchies = unsuppressing_lattice
    result = ola(frame, ["X", "Y"], 2, hierarchies, 1 / len(frame), "dm_star")
    assert result.report["node"] == {"X": 0, "Y": 0}
    assert result.report["metric_value"] == 1**2 + 2**2 + 10**2
    assert result.report["suppressed_rows"] == 1


def test_search_groups_far_fewer_nodes_than_the_lattice_holds():
    frame = _frame("adult-sample")
    result = ola(frame, ADULT_MEDIUM, 5, _hierarchies("adult-sample", ADULT_MEDIUM), 0.05)
    assert result.report["nodes_in_lattice"] == 5 * 4 * 3 * 3 * 3 * 2
    assert result.report["nodes_evaluated"] < result.report["nodes_in_lattice"] / 3


@pytest.mark.parametrize("dataset, columns, k", [("synthetic", tuple(SYNTHETIC_COLUMNS), 20), ("adult", tuple(ADULT_SMALL), 5)])
def test_suppression_is_monotone_along_every_lattice_edge(dataset, columns, k):
    """Generalising one column never suppresses more records, so k-anonymity within any budget is
    inherited by every generalisation (the property predictive tagging relies on)."""
    suppressed = _reference_table(dataset, columns, k).set_index("node")["suppressed"].to_dict()
    edges = 0
    for node, count in suppressed.items():
        for c in range(len(node)):
            successor = node[:c] + (node[c] + 1,) + node[c + 1:]
            if successor in suppressed:
                assert suppressed[successor] <= count
                edges += 1
    assert edges > 100


# --------------------------------------------------------------------------------------------------
# Non-monotone metrics: a hand-made lattice where generalising lowers the loss
# --------------------------------------------------------------------------------------------------


def _write_hierarchy(tmp_path: Path, column: str, rows: list[str]) -> Hierarchy:
    path = tmp_path / f"{column}.csv"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return load_hierarchy(path, column)


@pytest.fixture
def unsuppressing_lattice(tmp_path):
    """X: a, b under 'ab', nine more leaves c1..c9 alone; Y: y1, y2 under '*'.
    Records: (a, y1) once, (b, y1) twice, (a, y2) ten times; k = 2, one suppression allowed.
    At node (0, 0) the lone (a, y1) is suppressed; generalising X to level 1 merges it into (ab, y1)."""
    x = _write_hierarchy(tmp_path, "X", ["a;ab;*", "b;ab;*"] + [f"c{i};c{i};*" for i in range(1, 10)])
    y = _write_hierarchy(tmp_path, "Y", ["y1;*", "y2;*"])
    frame = pd.DataFrame({"X": ["a"] + ["b"] * 2 + ["a"] * 10, "Y": ["y1"] * 3 + ["y2"] * 10})
    return frame, {"X": x, "Y": y}


def test_discernibility_and_loss_can_fall_when_generalising_and_the_search_still_finds_the_optimum(
    unsuppressing_lattice,
):
    frame, hierarchies = unsuppressing_lattice
    n = len(frame)
    budget = 1 / n
    # Node (0, 0): classes 2 and 10 kept, one record suppressed. Node (1, 0): classes 3 and 10.
    dm_bottom, dm_x_up = 2**2 + 10**2 + n * 1, 3**2 + 10**2
    lm_bottom = (1 * 2) / (n * 2)  # the suppressed record costs 1 in both columns
    lm_x_up = (n * (1 / 10)) / (n * 2)  # every record's X is a or b, released as 'ab' (2 of 11 leaves)
    assert dm_x_up < dm_bottom and lm_x_up < lm_bottom  # both metrics fall along the edge (0,0) -> (1,0)

    for metric, expected in [("discernibility", dm_x_up), ("loss", lm_x_up)]:
        result = ola(frame, ["X", "Y"], 2, hierarchies, budget, metric)
        assert result.report["node"] == {"X": 1, "Y": 0}
        assert result.report["metric_value"] == pytest.approx(expected)
        assert result.report["suppressed_rows"] == 0
    # Precision does not look at suppression: the bottom node is k-anonymous within budget and best.
    precise = ola(frame, ["X", "Y"], 2, hierarchies, budget, "precision")
    assert precise.report["node"] == {"X": 0, "Y": 0}
    assert precise.report["suppressed_rows"] == 1
    assert precise.report["metric_value"] == 0.0


# --------------------------------------------------------------------------------------------------
# The guarantee on the output
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k, budget", [(2, 0.05), (10, 0.02), (50, 0.05), (5, 0.0)])
def test_every_published_class_has_k_rows_and_suppression_is_within_budget(k, budget):
    frame = _frame("synthetic")
    result = ola(frame, SYNTHETIC_COLUMNS, k, _hierarchies("synthetic", SYNTHETIC_COLUMNS), budget)
    assert isinstance(result, Partition)
    published = result.released[result.kept]
    counts = published.groupby(SYNTHETIC_COLUMNS).size()
    assert counts.min() >= k
    suppressed = int((~result.kept).sum())
    assert suppressed <= math.floor(budget * len(frame))
    assert result.report["suppressed_rows"] == suppressed
    assert result.report["suppressed_fraction"] == pytest.approx(suppressed / len(frame))
    assert result.report["n_classes"] == len(counts)
    assert result.report["smallest_class"] == counts.min()
    assert result.report["mean_class_size"] == pytest.approx(counts.mean())
    # Class ids: -1 exactly for suppressed rows; dense; one id per distinct published label tuple.
    assert np.array_equal(result.class_ids < 0, ~result.kept)
    kept_ids = result.class_ids[result.kept]
    assert set(kept_ids) == set(range(len(counts)))
    labels_per_id = published.assign(_id=kept_ids).groupby("_id")[SYNTHETIC_COLUMNS].nunique()
    assert (labels_per_id == 1).all().all()
    assert published.assign(_id=kept_ids).groupby(SYNTHETIC_COLUMNS)["_id"].nunique().max() == 1
    # Numbered by first row, as Mondrian numbers its classes.
    first_seen = pd.unique(kept_ids)
    assert np.array_equal(first_seen, np.arange(len(first_seen)))
    # Released labels are the hierarchy labels at the chosen level (kept rows).
    for column in SYNTHETIC_COLUMNS:
        level = result.report["node"][column]
        table = pd.read_csv(_hierarchy_path("synthetic", column), sep=";", header=None, dtype=str)
        expected = frame[column].astype(str).map(dict(zip(table[0], table[level])))
        assert (published[column] == expected[result.kept]).all()
    assert result.released.index.equals(frame.index)


def test_suppressed_rows_hold_only_the_most_general_label():
    frame = _frame("synthetic")
    result = ola(frame, SYNTHETIC_COLUMNS, 100, _hierarchies("synthetic", SYNTHETIC_COLUMNS), 0.05)
    assert (~result.kept).any()
    assert (result.released[~result.kept] == "*").all().all()


def test_report_is_json_serialisable_and_names_the_node():
    import json

    frame = _frame("synthetic")
    result = ola(frame, SYNTHETIC_COLUMNS, 5, _hierarchies("synthetic", SYNTHETIC_COLUMNS), 0.05, "loss")
    report = json.loads(json.dumps(result.report))
    assert set(report["node"]) == set(SYNTHETIC_COLUMNS)
    assert report["metric"] == "loss" and report["algorithm"] == "ola"
    assert report["nodes_in_lattice"] == 5 * 2 * 2 * 3


def test_keeps_the_input_index():
    frame = _frame("synthetic").iloc[::3].copy()
    frame.index = frame.index * 10 + 7
    result = ola(frame, SYNTHETIC_COLUMNS, 5, _hierarchies("synthetic", SYNTHETIC_COLUMNS), 0.05)
    assert result.released.index.equals(frame.index)
    assert len(result.class_ids) == len(result.kept) == len(frame)


# --------------------------------------------------------------------------------------------------
# Refusals
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def small():
    frame = _frame("synthetic").head(500).copy()
    return frame, _hierarchies("synthetic", SYNTHETIC_COLUMNS)


def test_value_missing_from_hierarchy_is_refused_naming_the_column(small):
    frame, hierarchies = small
    frame.loc[frame.index[3], "RACE"] = "Martian-secret-value"
    with pytest.raises(HierarchyError) as raised:
        ola(frame, SYNTHETIC_COLUMNS, 5, hierarchies, 0.05)
    assert raised.value.column == "RACE"
    assert "Martian" not in str(raised.value)


def test_missing_value_is_refused_naming_the_column(small):
    frame, hierarchies = small
    frame["GENDER"] = frame["GENDER"].astype(object)
    frame.loc[frame.index[0], "GENDER"] = None
    with pytest.raises(HierarchyError) as raised:
        ola(frame, SYNTHETIC_COLUMNS, 5, hierarchies, 0.05)
    assert raised.value.column == "GENDER"


def test_column_without_hierarchy_is_refused(small):
    frame, hierarchies = small
    del hierarchies["MARITAL_STATUS"]
    with pytest.raises(HierarchyError) as raised:
        ola(frame, SYNTHETIC_COLUMNS, 5, hierarchies, 0.05)
    assert raised.value.column == "MARITAL_STATUS"


def test_unknown_column_is_refused(small):
    frame, hierarchies = small
    with pytest.raises(InputError) as raised:
        ola(frame, SYNTHETIC_COLUMNS + ["SHOE_SIZE"], 5, hierarchies, 0.05)
    assert raised.value.column == "SHOE_SIZE"


def test_non_nested_hierarchy_is_refused(tmp_path):
    crossed = _write_hierarchy(tmp_path, "X", ["a;g1;h1;*", "b;g1;h2;*", "c;g2;h2;*"])
    frame = pd.DataFrame({"X": ["a", "b", "c"] * 4})
    with pytest.raises(HierarchyError) as raised:
        ola(frame, ["X"], 2, {"X": crossed}, 0.0)
    assert raised.value.column == "X" and "nested" in str(raised.value)


@pytest.mark.parametrize(
    "kwargs, parameter",
    [
        ({"k": 1}, "k"),
        ({"k": 0}, "k"),
        ({"k": 2.5}, "k"),
        ({"k": True}, "k"),
        ({"k": 501}, "k"),
        ({"suppression_budget": -0.01}, "suppression_budget"),
        ({"suppression_budget": 1.5}, "suppression_budget"),
        ({"suppression_budget": float("nan")}, "suppression_budget"),
        ({"suppression_budget": "5%"}, "suppression_budget"),
        ({"metric": "entropy"}, "metric"),
        ({"columns": []}, "columns"),
        ({"columns": "YOB"}, "columns"),
        ({"columns": ["YOB", "YOB"]}, "columns"),
    ],
)
def test_bad_parameters_are_refused_naming_them(small, kwargs, parameter):
    frame, hierarchies = small
    arguments = {"columns": SYNTHETIC_COLUMNS, "k": 5, "suppression_budget": 0.05, "metric": "precision"} | kwargs
    with pytest.raises(SpecError) as raised:
        ola(frame, hierarchies=hierarchies, **arguments)
    assert raised.value.parameter == parameter
    assert parameter in str(raised.value)


def test_no_k_anonymous_node_even_at_the_top_is_refused_naming_k_and_budget(tmp_path):
    # A hierarchy whose most general level still separates the values: nothing can reach k.
    flat = _write_hierarchy(tmp_path, "X", ["a;A", "b;B", "c;C"])
    frame = pd.DataFrame({"X": ["a"] * 5 + ["b"] * 5 + ["c"]})
    with pytest.raises(SpecError) as raised:
        ola(frame, ["X"], 5, {"X": flat}, 0.0)
    assert raised.value.parameter == "k" and "suppression_budget" in str(raised.value)
    # With room to suppress the lone 'c', the bottom node is k-anonymous.
    result = ola(frame, ["X"], 5, {"X": flat}, 0.1)
    assert result.report["node"] == {"X": 0} and result.report["suppressed_rows"] == 1
