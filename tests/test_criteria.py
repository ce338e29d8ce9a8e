"""ℓ-diversity and t-closeness (issue 11): the formulas, the anonymisers that enforce them, the gate.

Every property is checked by an independent computation: EMD by solving the transport problem with
scipy's linear programme, groups and value counts with pandas on the anonymiser's output, OLA's node
against an exhaustive search written here.
"""

import itertools
import math

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import linprog

from kepsilon.engine.anonymise import k_anonymise
from kepsilon.engine.criteria import (
    build_criteria,
    emd_equal,
    emd_hierarchical,
    emd_ordered,
    entropy_l,
    l_diverse,
    monotone_under_suppression,
    recursive_cl,
    value_counts,
    value_strings,
)
from kepsilon.engine.hierarchy import load_hierarchy
from kepsilon.engine.ola import ola
from kepsilon.flows.spec import load_spec, parse_spec
from kepsilon.tasks.errors import SpecError
from kepsilon.tasks.validate import validate_release

from .conftest import ADULT, ROOT


def _transport_emd(p: np.ndarray, q: np.ndarray, distance: np.ndarray) -> float:
    """EMD by linear programming: the cheapest flow moving p onto q under ``distance``."""
    m = len(p)
    equalities = []
    for i in range(m):  # everything leaves i
        row = np.zeros((m, m))
        row[i, :] = 1
        equalities.append(row.ravel())
    for j in range(m):  # everything arrives at j
        row = np.zeros((m, m))
        row[:, j] = 1
        equalities.append(row.ravel())
    result = linprog(distance.ravel(), A_eq=np.array(equalities), b_eq=np.concatenate([p, q]), bounds=(0, None))
    return float(result.fun)


@pytest.mark.parametrize("seed", range(5))
def test_emd_formulas_equal_the_transport_problem(seed, tmp_path):
    rng = np.random.default_rng(seed)
    m = 6
    counts = rng.integers(0, 5, size=(3, m))
    counts[:, 0] += 1
    q = rng.random(m)
    q /= q.sum()
    p = counts / counts.sum(axis=1, keepdims=True)
    equal = 1.0 - np.eye(m)
    ordered = np.abs(np.subtract.outer(np.arange(m), np.arange(m))) / (m - 1)
    # A 3-level tree over 6 leaves: {a,b,c} {d,e} {f} under *, heights 1/2 and 2/2.
    path = tmp_path / "h.csv"
    path.write_text("a;ABC;*\nb;ABC;*\nc;ABC;*\nd;DE;*\ne;DE;*\nf;F;*\n")
    hierarchy = load_hierarchy(path, "x")
    group = np.array([0, 0, 0, 1, 1, 2])
    tree = np.where(np.equal.outer(group, group), 0.5, 1.0)
    np.fill_diagonal(tree, 0.0)
    from kepsilon.engine.criteria import hierarchy_parents

    parents = hierarchy_parents(hierarchy)
    for g in range(3):
        assert emd_equal(counts, q)[g] == pytest.approx(_transport_emd(p[g], q, equal), abs=1e-9)
        assert emd_ordered(counts, q)[g] == pytest.approx(_transport_emd(p[g], q, ordered), abs=1e-9)
        assert emd_hierarchical(counts, q, parents)[g] == pytest.approx(_transport_emd(p[g], q, tree), abs=1e-9)


def test_l_diversity_variants_on_hand_counted_groups():
    counts = np.array([[5, 0, 0], [3, 1, 0], [2, 2, 2], [6, 3, 1]])
    assert list(l_diverse(counts, 2, "distinct")) == [False, True, True, True]
    assert list(l_diverse(counts, 3, "distinct")) == [False, False, True, True]
    # Entropy: uniform over 3 values is exactly 3-diverse; 6/3/1 has exp(H) ≈ 2.45.
    assert entropy_l(counts)[2] == pytest.approx(3.0)
    assert list(l_diverse(counts, 3, "entropy")) == [False, False, True, False]
    # Recursive (c=2, ℓ=2): r1 < 2·(r2 + r3): 3 < 2 fails, 2 < 8 holds, 6 < 8 holds.
    assert list(recursive_cl(counts, 2.0, 2)) == [False, False, True, True]


def test_only_distinct_l_diversity_is_treated_as_monotone():
    frame = pd.DataFrame({"s": list("aabbc")})
    spec = lambda entry: parse_spec(  # noqa: E731
        {"release_id": "r", "population_id": "p", "source": {"path": "x.csv"}, "k": 2, "epsilon": 1.0,
         "roles": {"k_quasi": [{"column": "q", "hierarchy": "h.csv"}], "sensitive": [entry]}}
    )
    distinct = build_criteria(spec({"column": "s", "l_diversity": {"l": 2}}).roles.sensitive, frame)
    entropy = build_criteria(spec({"column": "s", "l_diversity": {"l": 2, "variant": "entropy"}}).roles.sensitive, frame)
    close = build_criteria(spec({"column": "s", "t_closeness": {"t": 0.3}}).roles.sensitive, frame)
    assert monotone_under_suppression(distinct)
    assert not monotone_under_suppression(entropy) and not monotone_under_suppression(close)


# --------------------------------------------------------------------------- the anonymisers on Adult


def _adult_spec(algorithm: str, salary: dict):
    data = load_spec(ROOT / "releases" / "adult.yaml").model_dump(mode="json")
    data["algorithm"] = algorithm
    data["roles"]["sensitive"] = ["native-country", "workclass", "occupation", {"column": "salary-class", **salary}]
    return parse_spec(data)


def _independent_salary_groups(frame: pd.DataFrame, partition) -> tuple[pd.Series, pd.Series]:
    """Per kept class, counted with pandas: distinct salary classes and EMD (equal distance) to the table."""
    kept = frame[partition.kept]
    classes = kept.groupby(partition.class_ids[partition.kept])["salary-class"]
    q = frame["salary-class"].value_counts(normalize=True)
    emd = classes.apply(lambda v: 0.5 * (v.value_counts(normalize=True).reindex(q.index, fill_value=0) - q).abs().sum())
    return classes.nunique(), emd


@pytest.fixture(scope="module")
def adult():
    return pd.read_csv(ADULT / "adult.csv", sep=";")


@pytest.mark.parametrize("algorithm", ["mondrian", "ola"])
def test_anonymisers_leave_no_homogeneous_class_with_l2_and_no_class_beyond_t(adult, algorithm):
    plain = k_anonymise(adult, _adult_spec(algorithm, {}))
    distinct, _ = _independent_salary_groups(adult, plain)
    assert (distinct == 1).sum() > 50  # without the criterion, the homogeneity the issue reports

    diverse = k_anonymise(adult, _adult_spec(algorithm, {"l_diversity": {"l": 2, "variant": "distinct"}}))
    distinct, _ = _independent_salary_groups(adult, diverse)
    assert distinct.min() >= 2
    assert np.bincount(diverse.class_ids[diverse.kept]).min() >= 5

    close = k_anonymise(adult, _adult_spec(algorithm, {"t_closeness": {"t": 0.2, "distance": "equal"}}))
    _, emd = _independent_salary_groups(adult, close)
    assert emd.max() <= 0.2 + 1e-12
    assert np.bincount(close.class_ids[close.kept]).min() >= 5
    if algorithm == "ola":
        assert (~close.kept).sum() <= math.floor(0.05 * len(adult))


def test_mondrian_refuses_a_criterion_the_whole_table_cannot_meet(adult):
    with pytest.raises(SpecError, match="salary-class"):
        k_anonymise(adult, _adult_spec("mondrian", {"l_diversity": {"l": 3}}))


# --------------------------------------------------------------------------- OLA stays optimal


def _random_table(seed: int, tmp_path):
    """A small random table with two k-quasis (3-level hierarchies) and a 3-valued sensitive column."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(40, 90))
    leaves = {"a": ["a1", "a2", "a3", "a4"], "b": ["b1", "b2", "b3", "b4", "b5", "b6"]}
    hierarchies = {}
    for column, values in leaves.items():
        path = tmp_path / f"{column}{seed}.csv"
        path.write_text("".join(f"{v};{column}-{i // 2};*\n" for i, v in enumerate(values)))
        hierarchies[column] = load_hierarchy(path, column)
    frame = pd.DataFrame({c: rng.choice(v, size=n) for c, v in leaves.items()})
    skew = rng.dirichlet([0.5, 0.5, 0.5])
    frame["s"] = rng.choice(["x", "y", "z"], size=n, p=skew)
    frame.loc[frame["a"] == "a1", "s"] = "x"  # a homogeneous corner, so criteria bite
    return frame, hierarchies


def _exhaustive(frame, hierarchies, k, budget, passes):
    """The node of least precision (ties: level sum, then lexicographic) whose suppressed records —
    classes smaller than k or failing ``passes`` — fit the budget; grouped with pandas."""
    heights = [hierarchies[c].height for c in ("a", "b")]
    best = None
    for node in itertools.product(*(range(h) for h in heights)):
        labels = [pd.Series(hierarchies[c].labels[level][hierarchies[c].leaf_codes(frame[c])]) for c, level in zip("ab", node)]
        grouped = frame.assign(ga=labels[0].to_numpy(), gb=labels[1].to_numpy()).groupby(["ga", "gb"])
        suppressed = sum(len(g) for _, g in grouped if len(g) < k or not passes(g["s"]))
        if suppressed > math.floor(budget * len(frame)):
            continue
        precision = np.mean([level / (h - 1) for level, h in zip(node, heights)])
        key = (precision, sum(node), node)
        if best is None or key < best:
            best = key
    return None if best is None else best[2]


def _entropy_ok(values: pd.Series, l: float) -> bool:
    p = values.value_counts(normalize=True)
    return float(-(p * np.log(p)).sum()) >= math.log(l) - 1e-9


def _t_ok(reference: pd.Series, t: float):
    def passes(values: pd.Series) -> bool:
        p = values.value_counts(normalize=True).reindex(reference.index, fill_value=0)
        return 0.5 * float((p - reference).abs().sum()) <= t + 1e-9
    return passes


@pytest.mark.parametrize("seed", range(6))
def test_ola_is_optimal_against_exhaustive_search_with_the_criteria(seed, tmp_path):
    frame, hierarchies = _random_table(seed, tmp_path)
    reference = frame["s"].value_counts(normalize=True)
    cases = [
        ({"l_diversity": {"l": 2}}, lambda v: v.nunique() >= 2),
        ({"l_diversity": {"l": 2, "variant": "entropy"}}, lambda v: _entropy_ok(v, 2)),
        ({"t_closeness": {"t": 0.25}}, _t_ok(reference, 0.25)),
    ]
    for declared, passes in cases:
        spec = parse_spec(
            {"release_id": "r", "population_id": "p", "source": {"path": "x.csv"}, "k": 3, "epsilon": 1.0,
             "roles": {"k_quasi": [{"column": "a", "hierarchy": "h"}, {"column": "b", "hierarchy": "h"}],
                       "sensitive": [{"column": "s", **declared}]}}
        )
        criteria = build_criteria(spec.roles.sensitive, frame)
        expected = _exhaustive(frame, hierarchies, 3, 0.1, passes)
        if expected is None:
            with pytest.raises(SpecError):
                ola(frame, ["a", "b"], 3, hierarchies, 0.1, "precision", criteria)
            continue
        result = ola(frame, ["a", "b"], 3, hierarchies, 0.1, "precision", criteria)
        assert tuple(result.report["node"].values()) == expected, declared
        kept = frame[result.kept]
        assert kept.groupby(result.class_ids[result.kept])["s"].apply(passes).all()


# --------------------------------------------------------------------------- the gate


def _gate(frame, spec, source, **risk):
    criteria = build_criteria(spec.roles.sensitive, source)
    return validate_release(
        frame, k_quasi=["q"], e_quasi=[], explicit=[], k=2, rows_in=len(frame), rows_removed=0,
        suppression_budget=0.0, criteria=criteria, **risk,
    )


def _gate_spec(entry):
    return parse_spec(
        {"release_id": "r", "population_id": "p", "source": {"path": "x.csv"}, "k": 2, "epsilon": 1.0,
         "roles": {"k_quasi": [{"column": "q", "hierarchy": "h"}], "sensitive": [entry]}}
    )


def test_gate_fails_a_homogeneous_group_and_a_group_far_from_the_table():
    frame = pd.DataFrame({"q": ["A", "A", "B", "B", "B", "B"], "s": ["x", "x", "x", "y", "y", "y"]})
    report = _gate(frame, _gate_spec({"column": "s", "l_diversity": {"l": 2}}), frame)
    assert {c["name"]: c["success"] for c in report.checks}["l_diversity:s"] is False
    # Group A is all "x" (table: half x), EMD 0.5; group B: EMD 1/4 · … = 0.25.
    report = _gate(frame, _gate_spec({"column": "s", "t_closeness": {"t": 0.3}}), frame)
    assert {c["name"]: c["success"] for c in report.checks}["t_closeness:s"] is False
    diverse = pd.DataFrame({"q": ["A", "A", "B", "B"], "s": ["x", "y", "x", "y"]})
    for entry in ({"column": "s", "l_diversity": {"l": 2}}, {"column": "s", "t_closeness": {"t": 0.3}}):
        assert _gate(diverse, _gate_spec(entry), diverse).success


def test_gate_checks_linking_and_prosecutor_risk():
    frame = pd.DataFrame({"q": ["A", "A", "B", "B", "B"], "s": list("xyxyx")})
    spec = _gate_spec("s")
    checks = lambda report: {c["name"]: c["success"] for c in report.checks}  # noqa: E731
    over = _gate(frame, spec, frame, linking_risk=0.106, max_linking_risk=0.10, max_prosecutor_risk=0.4)
    assert checks(over)["linking_risk_within_limit"] is False and not over.success
    assert checks(over)["prosecutor_risk_within_limit"] is False  # smallest group 2: risk 0.5
    fine = _gate(frame, spec, frame, linking_risk=0.03, max_linking_risk=0.10, max_prosecutor_risk=0.5)
    assert checks(fine)["linking_risk_within_limit"] and checks(fine)["prosecutor_risk_within_limit"] and fine.success


def test_diversity_suppression_removes_a_group_confidence_suppression_left_homogeneous(tmp_path):
    """Class a: s = x, x, x, y; confidence suppression took the y. Its published group (labels from the three
    records left) holds only x, so the whole group goes; class b, still diverse, stays untouched."""
    from kepsilon.engine.partition import Partition
    from kepsilon.engine.suppress import SuppressionResult, suppress_failing_groups

    hierarchy_file = tmp_path / "q.csv"
    hierarchy_file.write_text("".join(f"{g}{i};{g}*;*\n" for g in "ab" for i in range(1, 5)), encoding="utf-8")
    kept = pd.DataFrame({"q": ["a1", "a2", "a3", "a4", "b1", "b2", "b3", "b4"], "s": list("xxxyxyxy")})
    criteria = build_criteria(
        parse_spec(
            {"release_id": "r", "population_id": "p", "source": {"path": "x.csv"}, "k": 2, "epsilon": 1.0,
             "roles": {"k_quasi": [{"column": "q", "hierarchy": "h.csv"}],
                       "sensitive": [{"column": "s", "l_diversity": {"l": 2}}]}}
        ).roles.sensitive,
        kept,
    )
    class_ids = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    partition = Partition(class_ids=class_ids, released=kept[["q"]], kept=np.ones(8, dtype=bool), report={},
                          hierarchies={"q": load_hierarchy(hierarchy_file, "q")}, criteria=criteria)
    removed = np.array([False, False, False, True, False, False, False, False])  # the y of class a
    confidence = SuppressionResult(record_rule=removed, class_rule=np.zeros(8, dtype=bool), removed=removed, report={})

    result = suppress_failing_groups(kept, class_ids, confidence, partition, {"k_quasi": ["q"]})

    assert result.criteria_rule.tolist() == [True, True, True, False, False, False, False, False]
    assert result.removed.tolist() == [True, True, True, True, False, False, False, False]
    assert result.report["removed_by_criteria"] == 3
    published = kept[~result.removed]
    assert published.groupby(published["q"].str[0])["s"].nunique().min() >= 2  # independent count


@pytest.mark.parametrize("numeric", [False, True])
def test_value_counts_counted_on_codes_equal_the_counts_of_every_records_string(numeric):
    """``value_counts`` turns each distinct value into its string once; the counts, their order (first
    appearance, the missing values' string where their first record is) and the index must be those of
    counting every record's string."""
    import pyarrow as pa

    rng = np.random.default_rng(3)
    columns = [
        pd.Series(pd.array(rng.choice(["b", "a", None, "c"], 5000).tolist(), dtype=pd.ArrowDtype(pa.string()))),
        pd.Series([None, "a", "b", "a"], dtype=object),
        pd.Series([1, "1", None, np.nan, "x", 2.0], dtype=object),  # two values written alike
        pd.Series([1.0, np.nan, 2.5, 1.0, 1]),
        pd.Series([3, 1, 3, 2]),
        pd.Series(["x", None, "y", "x"], dtype="str"),
        pd.Series(pd.Categorical(["u", "v", None, "u"])),
        pd.Series([None, None], dtype=object),
        pd.Series([], dtype=object),
    ]
    for values in columns:
        every_record = value_strings(values, numeric).value_counts(sort=False).astype(np.int64)
        pd.testing.assert_series_equal(value_counts(values, numeric), every_record)
