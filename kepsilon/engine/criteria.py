"""Disclosure criteria on sensitive attributes: ℓ-diversity and t-closeness, on group value counts.

k-anonymity hides *who* is in a group, not what the group says about them: a group whose members
share one sensitive value discloses it (homogeneity attack). The criteria here bound that:

* **ℓ-diversity** (Machanavajjhala et al. 2007), per group: ``distinct`` — at least ℓ distinct values;
  ``entropy`` — entropy of the group's value distribution at least log ℓ; ``recursive`` (c,ℓ) —
  with the value counts sorted decreasingly r_1 ≥ r_2 ≥ … ≥ r_m, ``r_1 < c · (r_ℓ + … + r_m)``.
* **t-closeness** (Li, Li and Venkatasubramanian 2007): the Earth Mover's Distance between a group's
  value distribution P and the distribution Q of the whole input table is at most t. Ground distances
  as in the paper: ``equal`` (nominal; every two values at distance 1, EMD = ½ Σ|p_i − q_i|),
  ``ordered`` (ordinal, in a declared order of m values; |i − j|/(m − 1), EMD = Σ_i |Σ_{j≤i} (p_j − q_j)|
  / (m − 1)), ``numeric`` (ordered distance over the sorted distinct values of the whole table) and
  ``hierarchical`` (when the column has a hierarchy: two leaves are at height(lowest common ancestor)/H;
  EMD = Σ_N height(N)/H · min(pos_extra(N), neg_extra(N)) over internal nodes N).

Every function takes a count matrix ``counts`` of shape (groups, m), ``counts[g, v]`` the number of
records of group g holding domain value v, and answers per group. Nothing here imports Prefect: the
anonymisers (OLA, Mondrian), the suppression stage, the Great Expectations gate and the reporting all
call the same plain functions on counts they compute themselves.

Monotonicity (what OLA's predictive tagging may rely on): with classes that fail a criterion suppressed,
a node's suppressed set shrinks along generalisation only if a kept class stays kept when merged with
*any* other class. That holds for k and ℓ-distinct (size and the distinct count only grow), not for
entropy or recursive ℓ-diversity nor for t-closeness (merging a diverse class with a suppressed
homogeneous one can fail): see :func:`monotone_under_suppression`.
"""

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .errors import HierarchyError, InputError, SpecError
from .hierarchy import Hierarchy, load_hierarchy

L_VARIANTS = ("distinct", "entropy", "recursive")
DISTANCES = ("equal", "ordered", "numeric", "hierarchical")

# Floating-point slack for the entropy and EMD comparisons: far below any meaningful ℓ or t.
_SLACK = 1e-9


# --------------------------------------------------------------------------- ℓ-diversity


def distinct_l(counts: np.ndarray) -> np.ndarray:
    """Distinct sensitive values per group (the achieved distinct ℓ)."""
    return (np.asarray(counts) > 0).sum(axis=1)


def entropy_l(counts: np.ndarray) -> np.ndarray:
    """exp(entropy) per group: the largest ℓ for which the group is entropy ℓ-diverse (0 for no rows)."""
    counts = np.asarray(counts, dtype=np.float64)
    totals = counts.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(totals > 0, counts / totals, 0.0)
        terms = np.where(p > 0, -p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    return np.where(totals[:, 0] > 0, np.exp(terms.sum(axis=1)), 0.0)


def recursive_cl(counts: np.ndarray, c: float, l: int) -> np.ndarray:
    """Whether each group is recursive (c,ℓ)-diverse: r_1 < c · (r_ℓ + … + r_m), counts sorted decreasingly.

    A group with fewer than ℓ distinct values fails (its tail sum is 0).
    """
    ordered = -np.sort(-np.asarray(counts, dtype=np.float64), axis=1)
    if ordered.shape[1] < l:
        return np.zeros(ordered.shape[0], dtype=bool)
    tail = ordered[:, l - 1 :].sum(axis=1)
    return ordered[:, 0] < c * tail


def l_diverse(counts: np.ndarray, l: int, variant: str, c: float | None = None) -> np.ndarray:
    """Whether each group is ℓ-diverse in the given variant (see the module docstring)."""
    if variant == "distinct":
        return distinct_l(counts) >= l
    if variant == "entropy":
        # H >= log ℓ  ⇔  exp(H) >= ℓ; the slack absorbs the rounding of a uniform group at exactly ℓ.
        return entropy_l(counts) >= l * (1 - _SLACK)
    if variant == "recursive":
        if c is None:
            raise SpecError("l_diversity.c", "recursive (c,ℓ)-diversity needs c")
        return recursive_cl(counts, c, l)
    raise SpecError("l_diversity.variant", f"must be one of {', '.join(L_VARIANTS)}")


# --------------------------------------------------------------------------- t-closeness


def _distributions(counts: np.ndarray) -> np.ndarray:
    counts = np.asarray(counts, dtype=np.float64)
    totals = counts.sum(axis=1, keepdims=True)
    return np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)


def emd_equal(counts: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """EMD under equal ground distance: ½ Σ_i |p_i − q_i| (the variational distance)."""
    return 0.5 * np.abs(_distributions(counts) - reference).sum(axis=1)


def emd_ordered(counts: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """EMD under ordered ground distance |i − j|/(m − 1): Σ_i |Σ_{j≤i} (p_j − q_j)| / (m − 1)."""
    m = len(reference)
    if m <= 1:
        return np.zeros(np.asarray(counts).shape[0])
    cumulative = np.cumsum(_distributions(counts) - reference, axis=1)
    return np.abs(cumulative[:, :-1]).sum(axis=1) / (m - 1)


def emd_hierarchical(counts: np.ndarray, reference: np.ndarray, parents: list[np.ndarray]) -> np.ndarray:
    """EMD under hierarchical ground distance (Li et al. 2007, §4.3).

    ``parents[L - 1][i]`` is the node at level L holding node i of level L − 1 (level 0: the domain's
    leaves), for L = 1..H, the top level holding a single node. A node's extra is Σ (p − q) over its
    leaves; its cost is L/H · min(Σ positive child extras, Σ |negative child extras|).
    """
    height = len(parents)
    extra = _distributions(counts) - reference
    total = np.zeros(extra.shape[0])
    for level, parent in enumerate(parents, start=1):
        n_parents = int(parent.max()) + 1 if len(parent) else 0
        membership = np.zeros((len(parent), n_parents))
        membership[np.arange(len(parent)), parent] = 1.0
        positive = np.maximum(extra, 0.0) @ membership
        negative = np.maximum(-extra, 0.0) @ membership
        total += level / height * np.minimum(positive, negative).sum(axis=1)
        extra = positive - negative
    return total


def hierarchy_parents(hierarchy: Hierarchy) -> list[np.ndarray]:
    """``parents`` for :func:`emd_hierarchical` from a loaded hierarchy (domain = its leaves, file order).

    Refuses a hierarchy whose top level holds more than one label: the distance between two roots
    would be undefined.
    """
    if len(np.unique(hierarchy.label_codes[-1])) != 1:
        raise HierarchyError(hierarchy.column, "a t-closeness hierarchy needs a single top label (such as *)")
    parents = []
    below = np.arange(len(hierarchy.leaves))
    for level in range(1, hierarchy.height):
        codes = hierarchy.label_codes[level]
        parent = np.zeros(int(below.max()) + 1, dtype=np.int64)
        parent[below] = codes
        parents.append(parent)
        below = codes
    return parents


# --------------------------------------------------------------------------- one sensitive column


@dataclass(frozen=True)
class ColumnCriteria:
    """A sensitive column's domain, its declared criteria, and the whole table's distribution Q.

    ``domain`` are the column's values as strings, in the distance's order (equal: sorted; ordered: as
    declared; numeric: by value; hierarchical: the hierarchy's leaves). ``reference`` is Q over the
    domain, from every record of the input table (before any suppression). ``l``/``variant``/``c`` and
    ``t``/``distance`` are None when not declared; ``distance`` always names the distance the reported
    maximum EMD uses (``equal`` when t-closeness is not declared).
    """

    column: str
    domain: tuple[str, ...]
    reference: np.ndarray
    distance: str = "equal"
    parents: tuple = ()
    l: int | None = None
    variant: str | None = None
    c: float | None = None
    t: float | None = None
    numeric: bool = False
    index: pd.Index = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "index", pd.Index(self.domain))

    @property
    def declared(self) -> bool:
        return self.l is not None or self.t is not None

    @property
    def monotone(self) -> bool:
        """Whether a class kept under this column's criteria stays kept when merged with any class."""
        return self.t is None and (self.l is None or self.variant == "distinct")

    def codes(self, values: pd.Series) -> np.ndarray:
        """Domain code of every value; refuses a value outside the domain (named by column, not value)."""
        codes = domain_codes(values, self.numeric, self.index)
        if (codes < 0).any():
            raise InputError(self.column, f"{int((codes < 0).sum())} value(s) are outside the sensitive column's domain")
        return codes.astype(np.int64)

    def emd(self, counts: np.ndarray) -> np.ndarray:
        """EMD of each group's distribution to the whole table's, with this column's distance."""
        if self.distance == "equal":
            return emd_equal(counts, self.reference)
        if self.distance in ("ordered", "numeric"):
            return emd_ordered(counts, self.reference)
        return emd_hierarchical(counts, self.reference, list(self.parents))

    def satisfied(self, counts: np.ndarray) -> np.ndarray:
        """Whether each group meets every criterion declared for this column (True if none is)."""
        ok = np.ones(np.asarray(counts).shape[0], dtype=bool)
        if self.l is not None:
            if self.variant is None:
                raise SpecError("l_diversity.variant", f"must be one of {', '.join(L_VARIANTS)}")
            ok &= l_diverse(counts, self.l, self.variant, self.c)
        if self.t is not None:
            ok &= self.emd(counts) <= self.t + _SLACK
        return ok

    def achieved(self, counts: np.ndarray) -> dict:
        """What the groups achieve (private figures): smallest distinct and entropy ℓ, largest EMD,
        homogeneous groups (one value only) and groups failing the declared criteria."""
        if not len(counts):
            return {"l_distinct_min": None, "l_entropy_min": None, "t_max": None, "homogeneous_groups": 0,
                    "groups_failing": 0, "distance": self.distance}
        distinct = distinct_l(counts)
        return {
            "l_distinct_min": int(distinct.min()),
            "l_entropy_min": float(entropy_l(counts).min()),
            "t_max": float(self.emd(counts).max()),
            "homogeneous_groups": int((distinct == 1).sum()),
            "groups_failing": int((~self.satisfied(counts)).sum()),
            "distance": self.distance,
        }


MISSING = "\u2400"  # a missing sensitive value is a value of its own (the published file shows it empty)


def _distinct_strings(values: pd.Series, numeric: bool) -> tuple[np.ndarray, list[str]]:
    """Each value's code (-1 when missing) and the distinct values' strings, in order of first appearance:
    numbers by value (``1`` and ``1.0`` agree) when numeric. The strings are made once per distinct value."""
    if numeric:
        values = pd.to_numeric(values, errors="coerce").astype(np.float64)
    codes, uniques = pd.factorize(values, use_na_sentinel=True)
    return codes, [repr(float(v)) if numeric else str(v) for v in uniques]


def value_strings(values: pd.Series, numeric: bool = False) -> pd.Series:
    """Values as the strings the domain holds; numbers by value (``1`` and ``1.0`` agree) when numeric;
    missing values as ``MISSING``. Converted once per distinct value."""
    codes, text = _distinct_strings(values, numeric)
    return pd.Series(np.array(text + [MISSING], dtype=object)[codes], index=values.index)


def domain_codes(values: pd.Series, numeric: bool, domain: pd.Index) -> np.ndarray:
    """Each value's position in ``domain`` (a domain of value strings; -1 if absent), matched once per
    distinct value: ``domain.get_indexer(value_strings(values, numeric))`` without a string per row."""
    codes, text = _distinct_strings(values, numeric)
    return domain.get_indexer(pd.Index(text + [MISSING], dtype=object))[codes]


def group_value_counts(groups: np.ndarray, codes: np.ndarray, n_groups: int, m: int, weights=None) -> np.ndarray:
    """Count matrix (n_groups, m) of domain codes per group; ``weights`` per item (default 1)."""
    flat = np.bincount(
        np.asarray(groups, dtype=np.int64) * m + codes, weights=weights, minlength=n_groups * m
    )
    return flat.reshape(n_groups, m).astype(np.int64)


def is_numeric_entry(entry) -> bool:
    """Whether a sensitive column's values are compared as numbers (t-closeness with numeric distance)."""
    tclose = None if isinstance(entry, str) else entry.t_closeness
    return tclose is not None and tclose.distance == "numeric"


def value_counts(values: pd.Series, numeric: bool = False) -> pd.Series:
    """Records per value string (``value_strings``): what a criterion needs of a column, and what partial
    counts of a partitioned table add up to. Indexed by the strings, in order of first appearance."""
    # Counted on codes, each distinct value turned into its string once (not a string per record); the
    # missing values' string goes where their first record is, as in order of first appearance.
    codes, text = _distinct_strings(values, numeric)
    counts = np.bincount(codes[codes >= 0], minlength=len(text)).astype(np.int64)
    missing = np.flatnonzero(codes < 0)
    if len(missing):
        place = int(codes[:missing[0]].max()) + 1 if missing[0] else 0
        text.insert(place, MISSING)
        counts = np.insert(counts, place, len(missing))
    counted = pd.Series(counts, index=pd.Index(text), name="count")
    if not counted.index.is_unique:  # distinct values written alike (``1`` and ``"1"`` in an object column)
        counted = counted.groupby(level=0, sort=False).sum()
    return counted


def build_column_criteria(entry, values: pd.Series, hierarchy: Hierarchy | None = None) -> ColumnCriteria:
    """The criteria of one sensitive column from its spec entry and its values in the whole input table.

    ``entry``: a plain column name (no criterion; t reported with equal distance) or a spec
    ``SensitiveColumn``. Errors name the column or the parameter, never a value.
    """
    return criteria_from_counts(entry, value_counts(values, is_numeric_entry(entry)), hierarchy)


def criteria_from_counts(entry, counts: pd.Series, hierarchy: Hierarchy | None = None) -> ColumnCriteria:
    """:func:`build_column_criteria` from the column's value counts (:func:`value_counts`), which the
    in-memory path counts on the whole column and the partitioned path adds up over its partitions:
    the domain, the reference distribution and every refusal depend on the counts only."""
    column = entry if isinstance(entry, str) else entry.column
    ldiv = None if isinstance(entry, str) else entry.l_diversity
    tclose = None if isinstance(entry, str) else entry.t_closeness
    distance = tclose.distance if tclose is not None else "equal"
    where = f"roles.sensitive.{column}"
    numeric = distance == "numeric"
    strings = np.asarray(counts.index, dtype=object)
    records = counts.to_numpy(dtype=np.int64)
    if numeric and MISSING in counts.index:
        raise InputError(column, "t-closeness with numeric distance needs numbers in every record")
    parents: tuple = ()
    if distance == "hierarchical":
        if hierarchy is None:
            raise SpecError(f"{where}.hierarchy", "hierarchical distance needs the column's hierarchy")
        outside = pd.Index(strings).difference(hierarchy.leaves)
        if len(outside):  # as Hierarchy.leaf_codes refuses them: by count, never by value
            raise HierarchyError(column, f"{len(outside)} distinct value(s) of the data are not leaves of its hierarchy")
        domain = tuple(str(v) for v in hierarchy.leaves)
        parents = tuple(hierarchy_parents(hierarchy))
    elif distance == "ordered":
        assert tclose is not None  # "ordered" comes only from a declared t-closeness
        domain = tuple(str(v) for v in tclose.order or ())
        if not domain:
            raise SpecError(f"{where}.t_closeness.order", "ordered distance needs the values' order")
        if len(set(domain)) != len(domain):
            raise SpecError(f"{where}.t_closeness.order", "lists a value more than once")
    elif numeric:
        domain = tuple(sorted(strings, key=float))
    else:
        domain = tuple(sorted(strings))
    index = pd.Index(domain)
    codes = index.get_indexer(strings)
    if (codes < 0).any():
        raise InputError(column, f"{int(records[codes < 0].sum())} record(s) hold a value missing from the declared order")
    reference = np.bincount(codes, weights=records, minlength=len(domain)) / max(int(records.sum()), 1)
    return ColumnCriteria(
        column=column,
        domain=domain,
        reference=reference,
        distance=distance,
        parents=parents,
        l=ldiv.l if ldiv is not None else None,
        variant=ldiv.variant if ldiv is not None else None,
        c=ldiv.c if ldiv is not None else None,
        t=tclose.t if tclose is not None else None,
        numeric=numeric,
    )


def build_criteria(sensitive: list, frame: pd.DataFrame, hierarchies: dict | None = None) -> list[ColumnCriteria]:
    """One :class:`ColumnCriteria` per sensitive column (declared or not), from the whole input table.

    ``hierarchies`` maps a sensitive column to its loaded hierarchy (for the hierarchical distance).
    """
    counts = {}
    for entry in sensitive:
        column = entry if isinstance(entry, str) else entry.column
        counts[column] = value_counts(frame[column], is_numeric_entry(entry))
    return criteria_from_value_counts(sensitive, counts, hierarchies)


def criteria_from_value_counts(sensitive: list, counts: dict, hierarchies: dict | None = None) -> list[ColumnCriteria]:
    """:func:`build_criteria` from each sensitive column's value counts (column → :func:`value_counts`)."""
    hierarchies = hierarchies or {}
    result = []
    for entry in sensitive:
        column = entry if isinstance(entry, str) else entry.column
        result.append(criteria_from_counts(entry, counts[column], hierarchies.get(column)))
    return result


def load_sensitive_hierarchies(sensitive: list) -> dict[str, Hierarchy]:
    """The hierarchy file of every sensitive column that declares one."""
    return {
        entry.column: load_hierarchy(entry.hierarchy, entry.column)
        for entry in sensitive
        if not isinstance(entry, str) and entry.hierarchy is not None
    }


def monotone_under_suppression(criteria: list[ColumnCriteria]) -> bool:
    """Whether suppressing failing classes keeps OLA's suppressed set shrinking along generalisation.

    True when every declared criterion is ℓ-distinct (or none is declared): a kept class merged with
    any other class keeps at least k records and at least ℓ distinct values. Entropy and recursive
    ℓ-diversity and t-closeness can fail when a kept class absorbs a suppressed one.
    """
    return all(c.monotone for c in criteria)


def declared(criteria: list[ColumnCriteria]) -> list[ColumnCriteria]:
    """The columns that declare at least one criterion (the ones the anonymisers enforce)."""
    return [c for c in criteria if c.declared]


def groups_satisfy(criteria: list[ColumnCriteria], groups: np.ndarray, n_groups: int, codes: list[np.ndarray],
                   weights=None) -> np.ndarray:
    """Whether each group meets every declared criterion of every column (``codes`` aligned with ``criteria``)."""
    ok = np.ones(n_groups, dtype=bool)
    for criterion, column_codes in zip(criteria, codes):
        if criterion.declared:
            counts = group_value_counts(groups, column_codes, n_groups, len(criterion.domain), weights)
            ok &= criterion.satisfied(counts)
    return ok


def published_group_ids(frame: pd.DataFrame, group_columns: list[str]) -> tuple[np.ndarray, int]:
    """Dense group id of every row when rows are grouped by their values in ``group_columns``."""
    if len(frame) == 0:
        return np.zeros(0, dtype=np.int64), 0
    if not group_columns:
        return np.zeros(len(frame), dtype=np.int64), 1
    ids = frame.groupby(list(group_columns), sort=False, dropna=False, observed=True).ngroup().to_numpy()
    return ids.astype(np.int64), int(ids.max()) + 1


def disclosure_report(frame: pd.DataFrame, group_columns: list[str], criteria: list[ColumnCriteria]) -> dict:
    """Achieved figures of the published groups (private): per sensitive column and overall.

    Overall: ``l_diversity_min`` the fewest distinct sensitive values in any group of any column,
    ``t_closeness_max`` the largest EMD of any group of any column, ``homogeneous_groups`` the groups
    holding a single value of at least one sensitive column, ``prosecutor_risk`` 1/smallest group.
    """
    groups, n_groups = published_group_ids(frame, group_columns)
    counts = [
        group_value_counts(groups, criterion.codes(frame[criterion.column]), n_groups, len(criterion.domain))
        for criterion in criteria
    ]
    return disclosure_figures(np.bincount(groups, minlength=n_groups), counts, criteria)


def disclosure_figures(sizes: np.ndarray, counts: list[np.ndarray], criteria: list[ColumnCriteria]) -> dict:
    """:func:`disclosure_report` from the published groups' sizes and, per criterion, their value count
    matrix (groups × domain), in any group order: what a partitioned release adds up."""
    n_groups = len(sizes)
    per_column, homogeneous = {}, np.zeros(n_groups, dtype=bool)
    for criterion, matrix in zip(criteria, counts):
        per_column[criterion.column] = criterion.achieved(matrix)
        homogeneous |= distinct_l(matrix) == 1
    figures = [f for f in per_column.values() if f["l_distinct_min"] is not None]
    return {
        "l_diversity_min": min((f["l_distinct_min"] for f in figures), default=None),
        "t_closeness_max": max((f["t_max"] for f in figures), default=None),
        "homogeneous_groups": int(homogeneous.sum()),
        "prosecutor_risk": float(1.0 / sizes.min()) if n_groups else None,
        "per_column": per_column,
    }


def add_disclosure_figures(parts: list[dict]) -> dict:
    """:func:`disclosure_figures` of the union of disjoint sets of groups, from each set's figures: smallest
    ℓ and largest EMD and risk over the parts, counts summed (every figure is a minimum, a maximum or a
    count over groups, so the sum over parts is exact). ``parts``: at least one, same criteria in each."""
    per_column = {}
    for column, first in parts[0]["per_column"].items():
        figures = [part["per_column"][column] for part in parts]
        per_column[column] = {
            "l_distinct_min": _extreme(min, [f["l_distinct_min"] for f in figures]),
            "l_entropy_min": _extreme(min, [f["l_entropy_min"] for f in figures]),
            "t_max": _extreme(max, [f["t_max"] for f in figures]),
            "homogeneous_groups": sum(f["homogeneous_groups"] for f in figures),
            "groups_failing": sum(f["groups_failing"] for f in figures),
            "distance": first["distance"],
        }
    figures = [f for f in per_column.values() if f["l_distinct_min"] is not None]
    return {
        "l_diversity_min": min((f["l_distinct_min"] for f in figures), default=None),
        "t_closeness_max": max((f["t_max"] for f in figures), default=None),
        "homogeneous_groups": sum(part["homogeneous_groups"] for part in parts),
        "prosecutor_risk": _extreme(max, [part["prosecutor_risk"] for part in parts]),
        "per_column": per_column,
    }


def _extreme(pick, values: list):
    """``pick`` (min or max) of the values that are not None; None if all are (no group in any part)."""
    present = [value for value in values if value is not None]
    return pick(present) if present else None



def failing_group_rows(labels: pd.DataFrame, sensitive: pd.DataFrame, published: np.ndarray,
                       criteria: list[ColumnCriteria]) -> np.ndarray:
    """Rows of the published groups that fail a declared criterion (a mask over all rows).

    ``labels``: the k-quasi labels each row would be published with; ``sensitive``: the rows'
    sensitive values; ``published``: which rows are still to be published. Groups are the published
    rows sharing all their labels, as in the published file.
    """
    published = np.asarray(published, dtype=bool)
    failing = np.zeros(len(labels), dtype=bool)
    if not published.any():
        return failing
    rows = np.flatnonzero(published)
    groups, n_groups = published_group_ids(labels.iloc[rows], list(labels.columns))
    codes = [c.codes(sensitive[c.column].iloc[rows]) for c in criteria]
    ok = groups_satisfy(criteria, groups, n_groups, codes)
    failing[rows] = ~ok[groups]
    return failing


def criterion_from_parameters(column: str, parameters: dict) -> ColumnCriteria:
    """A :class:`ColumnCriteria` from the JSON parameters a gate expectation carries (see
    :func:`gate_parameters`). ℓ-diversity needs no domain: the published values are their own."""
    return ColumnCriteria(
        column=column,
        domain=tuple(parameters.get("domain") or ()),
        reference=np.asarray(parameters.get("reference") or (), dtype=np.float64),
        distance=parameters.get("distance") or "equal",
        parents=tuple(np.asarray(p, dtype=np.int64) for p in parameters.get("parents") or ()),
        l=parameters.get("l"),
        variant=parameters.get("variant"),
        c=parameters.get("c"),
        t=parameters.get("t"),
        numeric=bool(parameters.get("numeric")),
    )


def gate_parameters(criterion: ColumnCriteria) -> dict:
    """JSON parameters of a column's declared criteria, for the gate's expectations (in memory only:
    the gate's report keeps check names and booleans, never these)."""
    parameters: dict[str, object] = {}
    if criterion.l is not None:
        parameters.update(l=int(criterion.l), variant=criterion.variant, c=criterion.c)
    if criterion.t is not None:
        parameters.update(
            t=float(criterion.t),
            distance=criterion.distance,
            domain=list(criterion.domain),
            reference=[float(q) for q in criterion.reference],
            parents=[[int(x) for x in p] for p in criterion.parents],
            numeric=criterion.numeric,
        )
    return parameters


def groups_meet(
    frame: pd.DataFrame, group_columns: list[str], column: str, parameters: dict, weight_column: str | None = None
) -> bool:
    """Whether every group of ``frame`` (rows sharing their ``group_columns`` values) meets the
    criteria in ``parameters`` on ``column``. Computed from the frame alone: the groups, their value
    counts and their distributions are counted here, not taken from any anonymiser. With
    ``weight_column``, each row stands for that many records (a table aggregated by group and value)."""
    if len(frame) == 0:
        return True
    if column not in frame.columns:
        return False
    criterion = criterion_from_parameters(column, parameters)
    if not criterion.domain:  # ℓ-diversity only: the published values are the domain
        strings = value_strings(frame[column])
        criterion = criterion_from_parameters(column, {**parameters, "domain": sorted(strings.unique())})
    groups, n_groups = published_group_ids(frame, [c for c in group_columns if c in frame.columns and c != weight_column])
    try:
        codes = criterion.codes(frame[column])
    except InputError:
        return False  # a published value outside the input's domain: fail closed
    weights = None if weight_column is None else frame[weight_column].to_numpy(dtype=np.float64)
    counts = group_value_counts(groups, codes, n_groups, len(criterion.domain), weights)
    return bool(criterion.satisfied(counts).all())
