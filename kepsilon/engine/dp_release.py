"""The DP mode's stages: plan the release (no randomness, before any ε), then sample, search and
safe-k-anonymise it (after the reservation, from the release's sealed seed).

``privacy_model: dp`` releases a table that is (ε, δ)-differentially private as a whole (the argument,
step by step, is docs/dp-mode.md): every record is sampled with probability β, the full-domain node
is fixed in the spec or chosen by the exponential mechanism on the full data (ε_search), and every
released column — k-quasis and ε-quasis at the node's level of their public hierarchy, sensitive
columns at their declared level or as read — is part of the group key; groups with fewer than k
sampled records are suppressed, whatever their number. Nothing is noised and nothing reads a value
to decide a suppression.

``plan`` loads the hierarchies, checks the node's levels against them and codes the
table; everything it can refuse (a level out of range, a value that is no leaf, a missing value at a
generalised level) it refuses before ε is reserved. ``mechanism`` is the one step that draws
randomness: search, sampling and the published order each get their own stream of the sealed seed,
so a rerun re-derives the same release byte for byte and spends nothing more.

The figures in the mechanism's report are private (the audit record only): the numbers of records
read, sampled and suppressed depend on the data and are not outputs of the mechanism. The plan's
report holds public parameters only (hierarchy heights, lattice size, the search's steps).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from .dp_quality import BALANCED_RECORDS_SHARE, QualityModel, domain_share_losses, precision_losses, records_losses
from .dp_search import (
    CodedTable,
    NodeScorer,
    dp_exhaustive_search,
    dp_search,
    lattice_height,
    lattice_size,
    precision_loss,
    sample_and_anonymise,
)
from .errors import InputError, SpecError
from .hierarchy import Hierarchy, load_hierarchy
from .hierarchy_builders import build_hierarchy
from .randomness import SEED_BYTES

if TYPE_CHECKING:
    from kepsilon.spec import ReleaseSpec  # the engine reads the spec; the model imports the engine


@dataclass
class DPPlan:
    """What the DP stage needs, prepared before any ε is spent.

    ``columns``: the generalised columns in node order; ``hierarchies``: theirs and those of the
    sensitive columns released above level 0; ``sensitive_levels``: every sensitive column's level;
    ``table``: the records coded for grouping (one row per record, source order); ``leaf_codes``:
    each hierarchy column's leaf per record (to write the labels); ``strategy``: the search's
    (None for a fixed node); ``steps``: the walk's steps (None otherwise); ``quality``: the search's
    quality model, every label's loss from the public hierarchies (None for a fixed node).
    """

    columns: list[str]
    hierarchies: dict[str, Hierarchy] = field(repr=False)
    sensitive_levels: dict[str, int]
    table: CodedTable = field(repr=False)
    leaf_codes: dict[str, np.ndarray] = field(repr=False)
    heights: tuple[int, ...]
    node: tuple[int, ...] | None
    strategy: str | None
    steps: int | None
    quality: QualityModel | None = field(default=None, repr=False)

    def report(self) -> dict:
        """The plan's public parameters (every figure here comes from the spec and the hierarchies)."""
        return {
            "generalised_columns": list(self.columns),
            "heights": dict(zip(self.columns, self.heights)),
            "lattice_nodes": lattice_size(self.heights),
            "lattice_height": lattice_height(self.heights),
            "search_strategy": self.strategy,
            "search_steps": self.steps,
            "search_quality": None if self.quality is None else self.quality.name,
            "sensitive_levels": dict(self.sensitive_levels),
        }

    def hierarchy_hashes(self) -> dict[str, str]:
        return {column: hierarchy.sha256 for column, hierarchy in self.hierarchies.items()}


def plan(frame: pd.DataFrame, spec: ReleaseSpec) -> DPPlan:
    """Load and check the hierarchies, code every released column, settle the search's steps."""
    columns = spec.generalised_columns()
    hierarchies = {column: _generalised_hierarchy(spec, frame, column) for column in columns}
    heights = tuple(hierarchies[column].height for column in columns)
    node = None
    fixed_node = spec.dp_settings().node
    if fixed_node is not None:
        node = tuple(_checked_level(f"dp.node.{c}", fixed_node[c], hierarchies[c]) for c in columns)
    sensitive_levels, sensitive_hierarchies = _sensitive_levels(spec, frame)
    hierarchies.update(sensitive_hierarchies)

    leaf_codes = {column: hierarchy.leaf_codes(frame[column]) for column, hierarchy in hierarchies.items()}
    levels = tuple(
        tuple(hierarchies[c].label_codes[level][leaf_codes[c]] for level in range(hierarchies[c].height)) for c in columns
    )
    fixed = tuple(_fixed_codes(frame, column, level, hierarchies.get(column), leaf_codes.get(column))
                  for column, level in sensitive_levels.items())
    strategy, steps = _search_plan(spec, heights)
    quality = None if spec.dp_settings().search is None else quality_model(spec, columns, hierarchies)
    return DPPlan(
        columns=columns,
        hierarchies=hierarchies,
        sensitive_levels=sensitive_levels,
        table=CodedTable(levels=levels, fixed=fixed),
        leaf_codes=leaf_codes,
        heights=heights,
        node=node,
        strategy=strategy,
        steps=steps,
        quality=quality,
    )


def quality_model(spec: ReleaseSpec, columns: list[str], hierarchies: dict[str, Hierarchy]) -> QualityModel:
    """The search's quality model (``dp.search.quality``): every label's loss, from the hierarchies.

    A hierarchy built from the data (a builder) has the data's distinct values as leaves, so its
    domain shares depend on the data: under ``granularity`` such a column's loss is its precision.
    """
    search = spec.dp_settings().search
    if search is None:
        raise SpecError("dp.search", "the quality model is the DP search's; this spec fixes its node")
    name = search.quality
    losses = []
    for column in columns:
        hierarchy = hierarchies[column]
        counts = [int(codes.max()) + 1 for codes in hierarchy.label_codes]
        if name == "records":
            losses.append(records_losses(counts))
        elif name in ("granularity", "balanced") and _from_file(spec, column):
            losses.append(domain_share_losses(hierarchy.label_codes))
        else:
            losses.append(precision_losses(counts, hierarchy.height))
    return QualityModel(name=name, losses=tuple(losses), records_share=BALANCED_RECORDS_SHARE if name == "balanced" else 0.0)


def _from_file(spec: ReleaseSpec, column: str) -> bool:
    return isinstance(spec.roles.generalised(column).hierarchy, str)


# The exhaustive search scores every node (about 0.35 ms of CPU each on Adult, rolled up layer by layer;
# 0.5 ms alone): 100,000 nodes of a larger table is minutes.
MAX_EXHAUSTIVE_NODES = 100_000
# The walk's default steps per level of the lattice's height: on Adult (height 17, so 136 steps) the
# final draw then chooses among about 700 nodes, and does about as well as the exhaustive search
# (docs/dp-mode.md, §6); the lattice's height alone (SafePub's order of steps) stays near the top.
WALK_STEPS_PER_LEVEL = 8


def _search_plan(spec: ReleaseSpec, heights) -> tuple[str | None, int | None]:
    """The search's strategy and the walk's steps (default: ``WALK_STEPS_PER_LEVEL`` × the lattice's
    height, at most its size − 1, at least one).

    Refused before any ε: the exhaustive search on a lattice too large to score node by node, and a
    walk with more steps than it can take (each step makes a new pivot, so at most lattice size − 1
    steps draw; the budget of the others would be spent on nothing).
    """
    search = spec.dp_settings().search
    if search is None:
        return None, None
    size = lattice_size(heights)
    if search.strategy == "exhaustive":
        if size > MAX_EXHAUSTIVE_NODES:
            raise SpecError(
                "dp.search.strategy",
                f"the lattice has {size} nodes, more than {MAX_EXHAUSTIVE_NODES} to score one by one; use strategy walk",
            )
        return "exhaustive", None
    steps = search.steps or max(1, min(WALK_STEPS_PER_LEVEL * lattice_height(heights), size - 1))
    if steps > size - 1:
        raise SpecError(
            "dp.search.steps",
            f"the walk can take at most {size - 1} steps on this lattice of {size} nodes (one new pivot each); "
            f"{steps} would spend part of ε_search on draws with nothing to choose",
        )
    return "walk", steps


def _generalised_hierarchy(spec: ReleaseSpec, frame: pd.DataFrame, column: str) -> Hierarchy:
    """A k-quasi's or ε-quasi's public hierarchy: its file, or built from its public definition."""
    hierarchy = spec.roles.generalised(column).hierarchy
    if hierarchy is None:  # refused by the spec's own check (``check_dp_parameters``), before any ε
        raise SpecError(column, "privacy_model dp generalises it through a public `hierarchy` (a file or a builder)")
    if isinstance(hierarchy, str):
        return load_hierarchy(hierarchy, column)
    return build_hierarchy(hierarchy, frame[column], column)


def _checked_level(parameter: str, level: int, hierarchy: Hierarchy) -> int:
    if not 0 <= level < hierarchy.height:
        raise SpecError(parameter, f"level {level} is outside its hierarchy's levels 0..{hierarchy.height - 1}")
    return int(level)


def _sensitive_levels(spec: ReleaseSpec, frame: pd.DataFrame) -> tuple[dict[str, int], dict[str, Hierarchy]]:
    """Every sensitive column's level (0: as read), and the hierarchies of those released above 0
    (such a column may not have missing values: a hierarchy cannot generalise them)."""
    levels, hierarchies = {}, {}
    for entry in spec.roles.sensitive:
        column = entry if isinstance(entry, str) else entry.column
        level = spec.dp_settings().sensitive_levels.get(column, 0)
        if level > 0:
            if isinstance(entry, str) or not entry.hierarchy:  # refused by the spec's own check, before any ε
                raise SpecError(f"dp.sensitive_levels.{column}", "a level above 0 needs the column's `hierarchy`")
            if frame[column].isna().any():
                raise InputError(column, "has missing values, which its hierarchy cannot generalise; release it at level 0")
            hierarchy = load_hierarchy(entry.hierarchy, column)
            levels[column] = _checked_level(f"dp.sensitive_levels.{column}", level, hierarchy)
            hierarchies[column] = hierarchy
        else:
            levels[column] = 0
    return levels, hierarchies


def _fixed_codes(frame: pd.DataFrame, column: str, level: int, hierarchy: Hierarchy | None, leaves) -> np.ndarray:
    """A sensitive column's group codes: its values as read (a missing value is a value of its own),
    or its labels at ``level`` of its hierarchy."""
    if hierarchy is None:
        return pd.factorize(frame[column], use_na_sentinel=False)[0].astype(np.int64)
    return hierarchy.label_codes[level][leaves]


# --- after the reservation: the mechanism ----------------------------------------------------------


def dp_generators(seed: bytes) -> tuple[np.random.Generator, np.random.Generator, np.random.Generator]:
    """The (search, sampling, order) generators of a DP release, three independent streams of ``seed``.

    Independent so that the sample does not depend on how many draws the search made (a fixed node
    and a searched one sample alike). Each generator is keyed with 256 bits drawn from its child
    sequence, not with the child, whose repr would print the seed (a child ``SeedSequence`` keeps the parent's entropy).
    """
    if not isinstance(seed, (bytes, bytearray)) or len(seed) != SEED_BYTES:
        raise SpecError("seed", f"must be exactly {SEED_BYTES} bytes")
    children = np.random.SeedSequence(int.from_bytes(bytes(seed), "big")).spawn(3)
    search, sampling, order = (np.random.Generator(np.random.PCG64(c.generate_state(4, np.uint64))) for c in children)
    return search, sampling, order


def mechanism(frame: pd.DataFrame, dp_plan: DPPlan, spec: ReleaseSpec, rngs, with_rows: bool = False):
    """Search (or take the fixed node), sample, safe-k-anonymise, label and shuffle.

    Returns the published table, the node {column: level} and the private report; ``with_rows``
    adds, fourth, each published record's source position (private: the officer's certificate aligns
    the release with its source with it, docs/certificate.md).
    """
    search_rng, sampling_rng, order_rng = rngs
    epsilon_search, _ = spec.dp_epsilons()
    report: dict[str, Any] = {"rows_in": int(len(frame))}
    if dp_plan.node is None:
        if dp_plan.quality is None:
            raise SpecError("dp.search.quality", "a search needs its quality model (the plan sets it)")
        # The score is the expected quality published at a node, on the full data (dp_quality).
        scorer = NodeScorer(dp_plan.table.compressed(), dp_plan.quality, spec.k, spec.dp_beta())
        if dp_plan.strategy == "exhaustive":
            result = dp_exhaustive_search(scorer, epsilon_search, search_rng)
        elif dp_plan.steps is None:
            raise SpecError("dp.search.steps", "a walk needs its number of steps (the plan sets it)")
        else:
            result = dp_search(scorer, epsilon_search, dp_plan.steps, search_rng)
        node = result.node
        report["search"] = {
            "path": [list(step) for step in result.path],
            "nodes_scored": result.nodes_scored,
            "quality": dp_plan.quality.name,
            "sensitivity": scorer.sensitivity,
        }
    else:
        node = dp_plan.node
    sampled, published = sample_and_anonymise(dp_plan.table, node, spec.k, spec.dp_beta(), sampling_rng)
    table, rows = published_table_and_rows(frame, dp_plan, node, published, order_rng)
    report.update(
        rows_sampled=int(sampled.sum()),
        rows_suppressed=int(sampled.sum() - published.sum()),
        rows_published=int(published.sum()),
        precision_loss=precision_loss(node, dp_plan.heights),
    )
    levels = dict(zip(dp_plan.columns, (int(level) for level in node)))
    return (table, levels, report, rows) if with_rows else (table, levels, report)


def published_table(frame: pd.DataFrame, dp_plan: DPPlan, node, published: np.ndarray, rng) -> pd.DataFrame:
    """The published records (see :func:`published_table_and_rows`)."""
    return published_table_and_rows(frame, dp_plan, node, published, rng)[0]


def published_table_and_rows(frame: pd.DataFrame, dp_plan: DPPlan, node, published: np.ndarray, rng) -> tuple[pd.DataFrame, np.ndarray]:
    """The published records in the source's column order, each column at its level, in random order.

    Generalised columns and sensitive columns above level 0 are hierarchy labels (text); a sensitive
    column at level 0 is published as read, in its type. The order is a permutation drawn from the
    release's order stream, so it says nothing about the source's order. Returns the table and, for
    each of its rows, the source position it came from (private).
    """
    level_of = dict(zip(dp_plan.columns, node)) | {c: level for c, level in dp_plan.sensitive_levels.items() if level > 0}
    rows = np.flatnonzero(published)
    columns = {}
    for column in frame.columns:
        if column in level_of:
            labels = dp_plan.hierarchies[column].labels[level_of[column]][dp_plan.leaf_codes[column][rows]]
            columns[column] = pd.array(labels, dtype=str)
        else:
            columns[column] = frame[column].array.take(rows)
    table = pd.DataFrame(columns, index=pd.RangeIndex(len(rows)))
    order = rng.permutation(len(rows))
    return table.iloc[order].reset_index(drop=True), rows[order]
