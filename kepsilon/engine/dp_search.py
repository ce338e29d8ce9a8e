"""The DP mode's mechanism on a table coded as integers: full-domain nodes, their groups, the
differentially private search for a node, and sampling followed by safe k-anonymisation.

A table enters as a :class:`CodedTable`: for every *generalised* column (the k-quasis and, in the DP
mode, the ε-quasis) one array of label codes per level of its public hierarchy (level 0 the value,
the last level the most general), and for every column released at a *fixed* level (the sensitive
columns) one array of codes. A node is one level per generalised column; the released record is
its labels at the node plus its fixed columns, and records sharing every released label form a
group. The codes are the only input: this module knows neither hierarchies nor data frames, so the
same functions serve a release, a benchmark and a test.

Two searches, both scoring a node by the quality a release there publishes in expectation over the
sampling (``NodeScorer``, ``kepsilon.engine.dp_quality``: a monotone score of public sensitivity Δ, so
the exponential mechanism runs as ∝ exp(ε·u/Δ)). ``dp_exhaustive_search`` draws the node once among
every node of the lattice, with all of ε_search, every node's groups rolled up from a finer node's
(``lattice_layers``). ``dp_search`` (after SafePub) walks the lattice from its top: each of ``steps``
draws (ε_search/10/steps each) chooses the next pivot among every node seen so far, and a last draw
(9·ε_search/10) chooses the output among every node seen. Each draw's candidates depend only on
earlier draws' outputs, so the search is ε_search-DP by adaptive sequential composition.
"""

import itertools
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .dp import _check_k, bernoulli_sample, exponential_mechanism, safe_k_anonymise
from .dp_quality import QualityModel, expected_publication_sensitivity, expected_published_table

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
    """The node the search chose, the pivots of the walk in order (each a DP output; the exhaustive
    search's is the node alone), how many distinct nodes were scored, and the final draw's candidates
    in their order (a function of the pivots only; empty for the exhaustive search, whose candidates
    are the whole lattice)."""

    node: tuple[int, ...]
    path: tuple[tuple[int, ...], ...]
    nodes_scored: int
    final_candidates: tuple[tuple[int, ...], ...] = ()


class NodeScorer:
    """The search's score u(D, g): the expected quality-weighted records a release at g publishes
    (``kepsilon.engine.dp_quality``), on ``table`` (the full data, before any sampling).

    ``sensitivity`` is public: it depends on k, β and the quality model's largest weight only.
    """

    def __init__(self, table: CodedTable, quality: QualityModel, k: int, beta: float):
        _check_k(k)
        self.table = table
        self.quality = quality
        records = int(table.rows if table.weights is None else table.weights.sum())
        self.expected = expected_published_table(records, k, beta)
        self.sensitivity = expected_publication_sensitivity(k, beta) * quality.largest_weight
        self.scored: dict[tuple[int, ...], float] = {}
        self._keys = _NodeKeys.of(table)

    def score(self, node) -> float:
        """u(D, node), cached (the walk asks for a node more than once)."""
        node = self.table.check_node(node)
        if node not in self.scored:
            rows, sizes = _groups_of(self.table, node) if self._keys is None else self._keys.groups(node)
            codes = [self.table.levels[c][level][rows] for c, level in enumerate(node)]
            self.scored[node] = float((self.expected[sizes] * self.quality.group_weights(node, codes)).sum())
        return self.scored[node]

    def score_lattice(self) -> tuple[list[tuple[int, ...]], np.ndarray]:
        """Every node of the lattice (``all_nodes``' order) and its score, each node's groups rolled up
        from those of one direct specialisation instead of from the whole table (``lattice_layers``)."""
        columns = max(len(self.quality.losses), 1)
        scores: dict[tuple[int, ...], float] = {}
        for nodes, layer in lattice_layers(self.table, self.quality):
            values = self.expected[layer.sizes] * self.quality.weight(layer.losses / columns)
            scores.update(zip(nodes, np.bincount(layer.node, weights=values, minlength=len(nodes)).tolist()))
        self.scored.update(scores)
        nodes = all_nodes(self.table.heights)
        return nodes, np.array([scores[node] for node in nodes])


@dataclass(frozen=True)
class _NodeKeys:
    """Every row's group key at any node as one int64: a mixed-radix sum over the columns' codes at
    the node's levels (the fixed columns' combined code first), hashed rather than sorted. Scoring
    one node so costs a few passes over the rows, which is what a walk does hundreds of times."""

    codes: tuple[tuple[np.ndarray, ...], ...]
    fixed: np.ndarray
    strides: tuple[int, ...]
    weights: np.ndarray

    @classmethod
    def of(cls, table: CodedTable) -> "_NodeKeys | None":
        """None when the keys would not fit in an int64 (then nodes are grouped by ``combine_codes``)."""
        fixed = combine_codes(list(table.fixed)) if table.fixed else np.zeros(table.rows, dtype=np.int64)
        strides, space = [], int(fixed.max()) + 1 if table.rows else 1
        for column in table.levels:
            strides.append(space)
            space *= max(int(level.max()) + 1 if len(level) else 1 for level in column)
        if space >= _KEY_LIMIT:
            return None
        weights = np.ones(table.rows) if table.weights is None else table.weights.astype(np.float64)
        codes = tuple(tuple(np.asarray(level, dtype=np.int64) for level in column) for column in table.levels)
        return cls(codes=codes, fixed=fixed, strides=tuple(strides), weights=weights)

    def groups(self, node) -> tuple[np.ndarray, np.ndarray]:
        """(a representative row, records) of every group at ``node``."""
        key = self.fixed.copy()
        for stride, (column, level) in zip(self.strides, enumerate(node)):
            key += self.codes[column][level] * stride
        ids, uniques = pd.factorize(key)
        first = np.empty(len(uniques), dtype=np.int64)
        first[ids[::-1]] = np.arange(len(ids) - 1, -1, -1)  # the last write per group is its first row
        return first, np.bincount(ids, weights=self.weights, minlength=len(uniques)).round().astype(np.int64)


def _groups_of(table: CodedTable, node) -> tuple[np.ndarray, np.ndarray]:
    """(a representative row, records) of every group at ``node``, from every row of ``table``."""
    ids = table.group_ids(node)
    rows = np.unique(ids, return_index=True)[1]
    weights = table.weights
    sizes = np.bincount(ids) if weights is None else np.bincount(ids, weights=weights).astype(np.int64)
    return rows, sizes


@dataclass(frozen=True)
class _Layer:
    """The groups of every node of one layer, node after node: for each group its node (the index in
    the layer's node list), a representative row, its records, its key and its labels' summed loss."""

    node: np.ndarray
    rows: np.ndarray
    sizes: np.ndarray
    keys: np.ndarray
    losses: np.ndarray

    def segments(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(first group, number of groups) of each of the layer's ``count`` nodes."""
        lengths = np.bincount(self.node, minlength=count)
        return np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths


def lattice_layers(table: CodedTable, quality: QualityModel):
    """Yield (the layer's nodes, their groups as a ``_Layer``) for every layer of the lattice (the
    nodes with the same sum of levels), from the bottom up.

    A node's groups are unions of the groups of any direct specialisation, so they are found by
    re-keying that specialisation's groups (one row each; the one with the fewest groups) rather
    than every row of the table. The key is mixed-radix over every column's codes, and raising one
    column one level changes that column's term only, as it changes that column's loss only. A whole
    layer is merged at once, each key offset by its node's index, so the work is a few array
    operations per layer rather than per node. Too many labels for an int64 key: node by node.
    """
    heights = table.heights
    losses = quality.losses or tuple(tuple(np.zeros(int(level.max()) + 1) for level in column) for column in table.levels)
    radices = [max(int(level.max()) + 1 for level in column) for column in table.levels]
    fixed = combine_codes(list(table.fixed)) if table.fixed else np.zeros(table.rows, dtype=np.int64)
    strides, space = [], int(fixed.max()) + 1
    for radix in radices:
        strides.append(space)
        space *= radix
    layers: dict[int, list[tuple[int, ...]]] = {}
    for node in all_nodes(heights):
        layers.setdefault(sum(node), []).append(node)
    if space * max(len(nodes) for nodes in layers.values()) >= _KEY_LIMIT:
        for node in all_nodes(heights):
            rows, sizes = _groups_of(table, node)
            loss = sum(losses[c][level][table.levels[c][level][rows]] for c, level in enumerate(node))
            yield [node], _Layer(np.zeros(len(rows), dtype=np.int64), rows, sizes, np.zeros(len(rows), dtype=np.int64), loss)
        return
    # Every (column, level)'s codes as one table, and its labels' losses as one flat array.
    pairs = {(c, level): i for i, (c, level) in enumerate((c, level) for c, h in enumerate(heights) for level in range(h))}
    codes = np.stack([table.levels[c][level] for c, level in pairs]).astype(np.int64)
    loss_start = np.concatenate([[0], np.cumsum([len(losses[c][level]) for c, level in pairs])[:-1]])
    flat_losses = np.concatenate([losses[c][level] for c, level in pairs])
    sizes = np.ones(table.rows, dtype=np.int64) if table.weights is None else table.weights.astype(np.int64)
    bottom = [tuple(0 for _ in heights)]
    keys = fixed.astype(np.int64) + sum(codes[pairs[c, 0]] * strides[c] for c in range(len(heights)))
    loss = sum(flat_losses[loss_start[pairs[c, 0]] + codes[pairs[c, 0]]] for c in range(len(heights)))
    previous = _merge(np.zeros(table.rows, dtype=np.int64), np.arange(table.rows), sizes, keys, loss, space)
    previous_nodes = bottom
    yield bottom, previous
    for height in range(1, lattice_height(heights) + 1):
        nodes = layers[height]
        index = {node: i for i, node in enumerate(previous_nodes)}
        starts, lengths = previous.segments(len(previous_nodes))
        child, column = np.array(
            [min(((index[node[:c] + (level - 1,) + node[c + 1 :]], c) for c, level in enumerate(node) if level > 0),
                 key=lambda pair: lengths[pair[0]]) for node in nodes]
        ).T
        level = np.array([node[c] for node, c in zip(nodes, column)])
        counts = lengths[child]
        # The child's groups, node after node, and per group the node and the column it raises.
        offsets = np.repeat(starts[child] - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
        take = offsets + np.arange(counts.sum())
        node_of = np.repeat(np.arange(len(nodes)), counts)
        raised_pair = np.repeat([pairs[c, l] for c, l in zip(column, level)], counts)
        lower_pair = np.repeat([pairs[c, l - 1] for c, l in zip(column, level)], counts)
        rows = previous.rows[take]
        raised, lower = codes[raised_pair, rows], codes[lower_pair, rows]
        keys = previous.keys[take] + (raised - lower) * np.repeat(np.array(strides)[column], counts)
        loss = (previous.losses[take] + flat_losses[loss_start[raised_pair] + raised]
                - flat_losses[loss_start[lower_pair] + lower])
        previous = _merge(node_of, rows, previous.sizes[take], keys, loss, space)
        previous_nodes = nodes
        yield nodes, previous


_MERGE_CHUNK = 1 << 15  # keys hashed per call: a hash table this size stays in cache


def _merge(node: np.ndarray, rows: np.ndarray, sizes: np.ndarray, keys: np.ndarray, losses: np.ndarray, space: int) -> _Layer:
    """Merge the groups of the same node that share a key (and so every label, and so the loss).

    Hashing (pandas' factorize), a chunk of whole nodes at a time: one call per node costs more in
    overhead than in work, one call per layer thrashes the cache. Groups come out in order of first
    appearance, so node after node, as they went in.
    """
    tagged = keys + node * space
    boundaries = np.flatnonzero(np.diff(node)) + 1  # where a node's groups start
    cuts, start = [], 0
    for boundary in boundaries:
        if boundary - start >= _MERGE_CHUNK:
            cuts.append(int(boundary))
            start = int(boundary)
    codes, offset = np.empty(len(tagged), dtype=np.int64), 0
    for lo, hi in zip([0, *cuts], [*cuts, len(tagged)]):
        chunk, _ = pd.factorize(tagged[lo:hi])
        codes[lo:hi] = chunk + offset
        offset += int(chunk.max()) + 1 if hi > lo else 0
    first = np.empty(offset, dtype=np.int64)
    first[codes[::-1]] = np.arange(len(codes) - 1, -1, -1)  # the last write per group is its first row
    return _Layer(node[first], rows[first], np.bincount(codes, weights=sizes, minlength=offset).astype(np.int64),
                  keys[first], losses[first])


def all_nodes(heights) -> list[tuple[int, ...]]:
    """Every node of the lattice, in lexicographic order of levels (a public order)."""
    return list(itertools.product(*(range(height) for height in heights)))


def dp_exhaustive_search(scorer: NodeScorer, epsilon: float, rng: np.random.Generator) -> SearchResult:
    """Choose a node with ε-differential privacy in one exponential-mechanism draw over the whole
    lattice, probabilities ∝ exp(ε·u/Δ) (a monotone score: no factor 2)."""
    nodes, scores = scorer.score_lattice()
    node = nodes[exponential_mechanism(scores, epsilon, scorer.sensitivity, rng, monotone=True)]
    return SearchResult(node=node, path=(node,), nodes_scored=len(nodes))


# The walk's final draw keeps this share of ε_search whatever the step count; the steps share the rest.
WALK_FINAL_SHARE = 0.9


def walk_budget(epsilon: float, steps: int) -> tuple[float, float]:
    """(ε of each step, ε of the final draw): a tenth of ε over the steps, nine tenths on the final draw."""
    return epsilon * (1 - WALK_FINAL_SHARE) / steps, epsilon * WALK_FINAL_SHARE


def dp_search(scorer: NodeScorer, epsilon: float, steps: int, rng: np.random.Generator) -> SearchResult:
    """Choose a node with ε-differential privacy by a walk that keeps every node it has seen.

    From the top node (the first pivot), each of ``steps`` draws chooses the next pivot among every
    node seen so far that is not a pivot yet (the direct specialisations of all pivots: SafePub's
    candidate set), with ε/10/steps each; a last draw, with 9ε/10, chooses the output among *every
    node seen* (the pivots and the candidates left). Each draw is an exponential mechanism over a
    candidate set that depends only on earlier draws' outputs, so the walk, path and output
    together, is ε-DP by adaptive sequential composition. A step with no candidate left (the whole
    lattice visited) draws nothing.
    """
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError("steps must be an integer of at least 1")
    each, final = walk_budget(epsilon, steps)

    pivot = top_node(scorer.table.heights)
    pivots, seen = [pivot], [pivot]
    known = {pivot}
    # The candidates, in an order that depends only on earlier outputs (a removed one's place is
    # taken by the last), with their scores alongside for the draws.
    candidates: list[tuple[int, ...]] = []
    scores = np.empty(lattice_size(scorer.table.heights))
    for _ in range(steps):
        for node in specialisations(pivot):
            if node not in known:
                known.add(node)
                seen.append(node)
                scores[len(candidates)] = scorer.score(node)
                candidates.append(node)
        if not candidates:
            break
        chosen = exponential_mechanism(scores[: len(candidates)], each, scorer.sensitivity, rng, monotone=True)
        pivot = candidates[chosen]
        candidates[chosen], scores[chosen] = candidates[-1], scores[len(candidates) - 1]
        candidates.pop()
        pivots.append(pivot)
    # Every node seen, in the order first seen (a function of the earlier draws' outputs only).
    seen_scores = np.array([scorer.score(node) for node in seen])
    node = seen[exponential_mechanism(seen_scores, final, scorer.sensitivity, rng, monotone=True)]
    return SearchResult(node=node, path=tuple(pivots[1:]), nodes_scored=len(scorer.scored), final_candidates=tuple(seen))


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
