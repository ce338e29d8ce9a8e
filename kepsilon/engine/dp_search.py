"""The DP mode's mechanism on a table coded as integers: full-domain nodes, their groups, the
differentially private search for a node, and sampling followed by safe k-anonymisation.

A table enters as a :class:`CodedTable`: for every *generalised* column (the k-quasis and, in the DP
mode, the ε-quasis) one array of label codes per level of its public hierarchy (level 0 the value,
the last level the most general), and for every column released at a *fixed* level (the sensitive
columns) one array of codes. A node is one level per generalised column; the released record is
its labels at the node plus its fixed columns, and records sharing every released label form a
group. The codes are the only input: this module knows neither hierarchies nor data frames, so the
same functions serve a release, a benchmark and a test.

Two searches. ``dp_exhaustive_search`` draws the node once among every node of the lattice, with all of
ε_search. ``dp_search`` (after SafePub) walks the lattice from its top: at every step the
exponential mechanism chooses among staying where it is and each direct specialisation (one column
one level lower), and a last draw chooses the output among the nodes visited; each of the
``steps + 1`` draws spends ``ε_search / (steps + 1)`` and uses the granularity score
(``kepsilon.engine.dp.granularity_score``). The score counts the records in groups of at least
``threshold`` records; adding a record raises it by at most ``threshold`` and lowers none, so the
mechanism runs with sensitivity ``threshold`` in its monotone form. Each draw is DP whatever the
draws before chose (its candidates depend only on their outputs), so the search is ε_search-DP by
sequential composition.
"""

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from .dp import _check_k, bernoulli_sample, exponential_mechanism, granularity_score, safe_k_anonymise

_KEY_LIMIT = 2**62  # mixed-radix keys stay inside int64


@dataclass(frozen=True)
class CodedTable:
    """Records as integer codes (see the module docstring).

    ``levels[c][l]``: the label code of every row in generalised column ``c`` at level ``l``;
    ``fixed[j]``: the code of every row in fixed column ``j``; ``weights``: records per row (a
    compressed table holds each distinct row once with its count), None for one record per row.
    """

    levels: tuple[tuple[np.ndarray, ...], ...]
    fixed: tuple[np.ndarray, ...] = ()
    weights: np.ndarray | None = field(default=None, repr=False)

    @property
    def heights(self) -> tuple[int, ...]:
        return tuple(len(column) for column in self.levels)

    @property
    def rows(self) -> int:
        return len(self.levels[0][0]) if self.levels else len(self.fixed[0])

    def check_node(self, node) -> tuple[int, ...]:
        """The node as a tuple of ints, refused when it has the wrong length or a level out of range."""
        node = tuple(int(level) for level in node)
        if len(node) != len(self.levels):
            raise ValueError(f"a node needs one level per generalised column ({len(self.levels)})")
        for column, (level, height) in enumerate(zip(node, self.heights)):
            if not 0 <= level < height:
                raise ValueError(f"level {level} of generalised column {column} is outside 0..{height - 1}")
        return node

    def group_ids(self, node) -> np.ndarray:
        """Dense group id (0..groups−1) of every row at ``node``: rows sharing every released code."""
        node = self.check_node(node)
        arrays = [self.levels[c][level] for c, level in enumerate(node)] + list(self.fixed)
        return combine_codes(arrays)

    def group_sizes(self, node) -> np.ndarray:
        """Records per group at ``node`` (weighted by ``weights``)."""
        ids = self.group_ids(node)
        if self.weights is None:
            return np.bincount(ids)
        return np.bincount(ids, weights=self.weights).astype(np.int64)

    def compressed(self) -> "CodedTable":
        """The same table with each distinct row once, weighted by its count (faster to group).

        Level 0 determines every other level, so rows equal at level 0 and in the fixed columns are
        equal everywhere.
        """
        ids = combine_codes([column[0] for column in self.levels] + list(self.fixed))
        first = np.unique(ids, return_index=True)[1]
        counts = np.bincount(ids, weights=self.weights)[ids[first]].astype(np.int64)
        return CodedTable(
            levels=tuple(tuple(level[first] for level in column) for column in self.levels),
            fixed=tuple(codes[first] for codes in self.fixed),
            weights=counts,
        )

    def take(self, rows: np.ndarray) -> "CodedTable":
        """The table restricted to ``rows`` (a boolean mask or positions)."""
        return CodedTable(
            levels=tuple(tuple(level[rows] for level in column) for column in self.levels),
            fixed=tuple(codes[rows] for codes in self.fixed),
            weights=None if self.weights is None else self.weights[rows],
        )


def combine_codes(arrays: list[np.ndarray]) -> np.ndarray:
    """Dense ids of the rows' code tuples: equal tuples, equal ids (mixed radix, re-densified before
    the key would leave int64)."""
    if not arrays:
        raise ValueError("at least one column is needed to form groups")
    key = np.zeros(len(arrays[0]), dtype=np.int64)
    bound = 1
    for codes in arrays:
        codes = np.asarray(codes, dtype=np.int64)
        radix = int(codes.max()) + 1 if len(codes) else 1
        if bound * radix >= _KEY_LIMIT:
            key = np.unique(key, return_inverse=True)[1].reshape(-1).astype(np.int64)
            bound = int(key.max()) + 1 if len(key) else 1
        key = key * radix + codes
        bound *= radix
    return np.unique(key, return_inverse=True)[1].reshape(-1).astype(np.int64)


def precision_loss(node, heights) -> float:
    """The node's information loss in [0, 1]: the mean over generalised columns of level/(height − 1)
    (a one-level hierarchy contributes 0). A function of the node alone, never of the records."""
    losses = [level / (height - 1) if height > 1 else 0.0 for level, height in zip(node, heights)]
    return float(np.mean(losses)) if losses else 0.0


def node_score(table: CodedTable, node, threshold: int) -> float:
    """Granularity of ``node`` on ``table``: (1 − loss) × records in groups of at least ``threshold``."""
    return granularity_score(table.group_sizes(node), threshold, precision_loss(node, table.heights))


def top_node(heights) -> tuple[int, ...]:
    """The most general node: every column at its last level."""
    return tuple(height - 1 for height in heights)


def lattice_height(heights) -> int:
    """Steps from the top node to the bottom one, one column one level at a time: Σ (height − 1)."""
    return int(sum(height - 1 for height in heights))


def lattice_size(heights) -> int:
    """Number of nodes of the lattice: Π height."""
    return int(math.prod(heights))


def specialisations(node) -> list[tuple[int, ...]]:
    """The direct specialisations of ``node``: one column one level lower, in column order."""
    return [node[:c] + (level - 1,) + node[c + 1 :] for c, level in enumerate(node) if level > 0]


@dataclass(frozen=True)
class SearchResult:
    """The node the search chose, the node after every step of the walk (each a DP output), and how
    many distinct nodes were scored."""

    node: tuple[int, ...]
    path: tuple[tuple[int, ...], ...]
    nodes_scored: int


def dp_search(table: CodedTable, threshold: int, epsilon: float, steps: int, rng: np.random.Generator) -> SearchResult:
    """Choose a node with ε-differential privacy: ``steps + 1`` exponential-mechanism draws of
    ε/(steps + 1) each (SafePub's search).

    From the top node, each step of the walk draws among the current node and its direct
    specialisations; a last draw chooses the output among every node the walk visited, the top
    included (so a walk that went too deep can still return a coarser node). Probabilities are
    ∝ exp((ε/(steps + 1)) · score / threshold), the monotone form (module docstring). The scores are
    computed on ``table`` (the full data, before any sampling) and cached per node.
    """
    _check_k(threshold)
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError("steps must be an integer of at least 1")
    scored: dict[tuple[int, ...], float] = {}
    each = epsilon / (steps + 1)

    def draw(candidates: list[tuple[int, ...]]) -> tuple[int, ...]:
        for candidate in candidates:
            if candidate not in scored:
                scored[candidate] = node_score(table, candidate, threshold)
        scores = np.array([scored[candidate] for candidate in candidates])
        return candidates[exponential_mechanism(scores, each, float(threshold), rng, monotone=True)]

    node = top_node(table.heights)
    visited = [node]
    path = []
    for _ in range(steps):
        node = draw([node, *specialisations(node)])
        path.append(node)
        if node not in visited:
            visited.append(node)
    return SearchResult(node=draw(visited), path=tuple(path), nodes_scored=len(scored))


def all_nodes(heights) -> list[tuple[int, ...]]:
    """Every node of the lattice, in lexicographic order of levels (a public order)."""
    return list(itertools.product(*(range(height) for height in heights)))


def dp_exhaustive_search(table: CodedTable, threshold: int, epsilon: float, rng: np.random.Generator) -> SearchResult:
    """Choose a node with ε-differential privacy in one exponential-mechanism draw over the whole
    lattice (all of ε on one draw; cost: one grouping per node)."""
    _check_k(threshold)
    nodes = all_nodes(table.heights)
    scores = np.array([node_score(table, node, threshold) for node in nodes])
    node = nodes[exponential_mechanism(scores, epsilon, float(threshold), rng, monotone=True)]
    return SearchResult(node=node, path=(node,), nodes_scored=len(nodes))


def sample_and_anonymise(table: CodedTable, node, k: int, beta: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Li, Qardaji and Su's mechanism at a node fixed before: Bernoulli sampling at rate β, then safe
    k-anonymisation of the sample (groups of fewer than k sampled records suppressed).

    Returns (sampled, published), boolean masks over the rows of ``table`` (one record per row).
    """
    if table.weights is not None:
        raise ValueError("sampling needs one record per row (an uncompressed table)")
    node = table.check_node(node)
    sampled = bernoulli_sample(table.rows, beta, rng)
    published = np.zeros(table.rows, dtype=bool)
    if sampled.any():
        published[sampled] = safe_k_anonymise(table.take(sampled).group_ids(node), k)
    return sampled, published
