"""The partitioned release's group checks and private figures by reduction: the flow receives sizes, not groups.

After the noise (``tasks/partitioned.py``, stage C) every class partition has counted its published groups
(``GroupCounts``: per group key its records and sensitive value counts) and its classes (a row per class);
after publishing (stage D) every order-key range has counted again the groups it wrote. Diversity suppression,
the outcome figures, the gate's group checks, the disclosure figures and the private figures need those
tables whole — every group's counts added over all partitions — and they grow with the groups (28k groups and
53k classes at 1M fine-grained rows, 350k classes at 10M). So they never reach the flow's process:

* **A group spans partitions.** The anonymiser's classes lie whole in one class partition, but a published
  group is every record sharing its labels, and two classes (in two partitions) can publish the same labels;
  and an order-key range holds records of nearly every group (the order is random). So a per-partition check
  would be wrong: the counts are first **shuffled by bucket of group keys** through the scratch (a hash of the
  key, as ``tasks/shards.py`` buckets tuples: even loads whatever the labels' codes), each partition writing
  one piece per bucket, and each bucket added up by one task. A group lies in exactly one bucket.
* ``check_groups`` (per bucket, after stage C): the bucket's groups added up, those failing a declared
  criterion found (``failing_groups``, the in-memory rule) and written to the scratch; returns the published
  groups' sizes as a frequency of frequencies.
* ``class_figures`` (per class partition): its class table, the failing groups removed, reduced to
  ``tasks/partitioned.ClassOutcome`` — class sizes as a frequency of frequencies, counts, and the error
  figure's points (at most ``SCATTER_LIMIT`` in all) or counts per hexagon over the extent the flow sends.
* stage D reads the failing keys from the scratch (not from the task graph) and writes its groups' recount
  per bucket.
* ``gate_groups`` (per bucket, after stage D): the written groups added up, their keys and sizes kept in the
  scratch for the certificate (``WRITTEN_SIZES``); the disclosure figures of the bucket (``disclosure_figures``: minima, maxima and counts over
  groups, so they add up exactly, ``add_disclosure_figures``); the gate's group expectations run by Great
  Expectations on the bucket's table (``validate.validate_groups``); the sizes as a frequency of frequencies.

What reaches the flow: per task a few counts, frequency-of-frequencies arrays (as long as the distinct sizes:
a few hundred), check booleans, the disclosure figures, the error figure's extremes, points (at most
``SCATTER_LIMIT`` over all partitions) or non-empty hexagon cells (at most ~1,500). The failing groups' keys
stay in the scratch. The certificate's task, on a worker, still reads every written group's key and size
(16 bytes a group, ``certificate_dask.GroupSizes``), never their sensitive values' counts: those are some 50
times larger (a row per group and value), and gathering them in one task (as a ``written-groups`` task did)
took a worker past its memory limit at 30M fine-grained rows (docs/performance.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from kepsilon.engine.criteria import declared, disclosure_figures
from kepsilon.engine.randomness import RecordStreams
from kepsilon.flows.spec import ReleaseSpec

from .certificate_dask import WRITTEN_SIZES, GroupSizes
from .counting import slices_by_target
from .errors import ValidationFailed
from .figure_inputs import ErrorExtremes, Extent, SizeCounts
from .partitioned import (
    ClassOutcome,
    ClassPartition,
    GroupCoder,
    GroupCounts,
    PublishedPart,
    class_outcome,
    failing_groups,
    gate_tables,
    perturb_and_suppress,
    publish_part,
)
from .scratch import Scratch

GROUPS = "groups"  # scratch: (bucket, class partition) the groups a class partition publishes, counted
CLASSES = "class-rows"  # scratch: (class partition) its per-class table (``ClassPartition.classes``)
FAILING = "failing"  # scratch: (bucket) keys of the bucket's groups that fail a declared criterion
WRITTEN = "written"  # scratch: (bucket, published part) the groups a part wrote, counted again
STAGES = ("check-groups", "class-figures", "gate-groups")  # the stages this module adds, each once per partition


# --------------------------------------------------------------------------- buckets of group keys


def group_buckets(keys: np.ndarray, buckets: int) -> np.ndarray:
    """The bucket (0..buckets-1) of each group key: a mix of its bits (splitmix64's finaliser), so that the
    buckets are even whatever the keys' spread (keys are mixed-radix label codes: clustered)."""
    if buckets == 1:
        return np.zeros(len(keys), dtype=np.int64)
    mixed = np.asarray(keys, dtype=np.int64).astype(np.uint64)
    with np.errstate(over="ignore"):  # multiplication modulo 2⁶⁴ is the point
        mixed = (mixed ^ (mixed >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        mixed = (mixed ^ (mixed >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        mixed = mixed ^ (mixed >> np.uint64(31))
    return (mixed % np.uint64(buckets)).astype(np.int64)


def split_groups(groups: GroupCounts, buckets: int) -> list[GroupCounts]:
    """``groups`` cut into one ``GroupCounts`` per bucket of keys (keys still sorted within each): the groups
    and each value table sorted by bucket once, each bucket a slice of them."""
    order, slices = _bucket_slices(groups.keys, buckets)
    keys, sizes = groups.keys[order], groups.sizes[order]
    tables = []
    for table in groups.values:
        table_order, table_slices = _bucket_slices(table["key"].to_numpy(dtype=np.int64), buckets)
        tables.append((table.iloc[table_order].reset_index(drop=True), table_slices))
    return [
        GroupCounts(keys[slices[bucket]], sizes[slices[bucket]],
                    [table.iloc[rows[bucket]].reset_index(drop=True) for table, rows in tables])
        for bucket in range(buckets)
    ]


def _bucket_slices(keys: np.ndarray, buckets: int) -> tuple[np.ndarray, list[slice]]:
    """The rows of ``keys`` sorted by bucket (stably), and each bucket's slice of that order (empty for a
    bucket none of the keys falls in)."""
    return slices_by_target(group_buckets(keys, buckets), buckets)


def write_by_bucket(scratch: Scratch, groups: GroupCounts, name: str, index: int, buckets: int) -> None:
    """A partition's group counts to the scratch, one piece per bucket (``name``/bucket/``index``)."""
    for bucket, piece in enumerate(split_groups(groups, buckets)):
        scratch.write(piece, name, bucket, index)


def add_bucket(scratch: Scratch, name: str, bucket: int, parts: int, sensitive_columns: int) -> GroupCounts:
    """One bucket's groups added up over the partitions that wrote a piece of it."""
    pieces = scratch.read_present(name, bucket, count=parts)
    return GroupCounts.add(pieces) if pieces else GroupCounts.empty(sensitive_columns)


# --------------------------------------------------------------------------- C. after the noise


def perturb_and_hand_over(index: int, pieces: int, scratch: Scratch, spec: ReleaseSpec, streams: RecordStreams, hierarchies: dict,
                          levels: dict | None, coder: GroupCoder, parts: int) -> ClassPartition:
    """Stage C on one class partition (``perturb_and_suppress``), its groups and class table then moved to
    the scratch (groups by bucket of keys): the result keeps counts, error sums, reports and the error
    figure's extremes, none of which grows with the classes."""
    part = perturb_and_suppress(index, pieces, scratch, spec, streams, hierarchies, levels, coder, parts)
    write_by_bucket(scratch, part.groups, GROUPS, index, parts)
    extremes = ErrorExtremes.of(np.zeros(0), np.zeros(0))
    if len(part.classes):
        scratch.write(part.classes, CLASSES, index)
        extremes = ErrorExtremes.of(part.classes["predicted"].to_numpy(), part.classes["measured"].to_numpy())
    return replace(part, groups=GroupCounts.empty(len(coder.sensitive)), classes=pd.DataFrame(), error_extremes=extremes)


@dataclass
class GroupCheck:
    """One bucket's published groups after diversity suppression: their sizes, and how many groups failed."""

    sizes: SizeCounts
    failing: int


def check_groups(scratch: Scratch, bucket: int, parts: int, criteria: list) -> GroupCheck:
    """The bucket's groups added up over the class partitions; those failing a declared criterion (the
    in-memory rule, ``failing_groups``) written to the scratch for the class figures and the publishing."""
    groups = add_bucket(scratch, GROUPS, bucket, parts, len(criteria))
    failing = failing_groups(groups, criteria)
    scratch.write(failing, FAILING, bucket)
    return GroupCheck(SizeCounts.of(groups.without(failing).sizes), len(failing))


def failing_keys(scratch: Scratch, buckets: int) -> np.ndarray:
    """Every bucket's failing group keys, sorted (few: the groups diversity suppression removes)."""
    return np.sort(np.concatenate([np.zeros(0, np.int64), *(scratch.read(FAILING, b) for b in range(buckets))]))


def class_figures(scratch: Scratch, index: int, buckets: int, spec: ReleaseSpec, extent: Extent | None) -> ClassOutcome:
    """One class partition's part of the outcome figures (``partitioned.class_outcome``), the failing groups
    removed; the error figure's points, or with ``extent`` its counts per hexagon over it."""
    classes = scratch.read(CLASSES, index) if scratch.exists(CLASSES, index) else pd.DataFrame()
    return class_outcome(classes, failing_keys(scratch, buckets), spec, extent)


# --------------------------------------------------------------------------- D. after publishing


def publish_and_hand_over(index: int, pieces: int, scratch: Scratch, staging: str, spec: ReleaseSpec, meta: pd.DataFrame,
                          write_csv: bool, sensitive_columns: int, buckets: int) -> PublishedPart:
    """Stage D on one order-key range (``publish_part``, the failing groups read from the scratch), its
    groups' recount then moved to the scratch by bucket of keys."""
    part = publish_part(index, pieces, scratch, staging, failing_keys(scratch, buckets), spec, meta, write_csv,
                        sensitive_columns)
    write_by_bucket(scratch, part.groups, WRITTEN, index, buckets)
    return replace(part, groups=GroupCounts.empty(sensitive_columns))


@dataclass
class GroupGate:
    """One bucket of written groups as the record and the gate need it: sizes, disclosure figures, checks."""

    sizes: SizeCounts
    disclosure: dict
    checks: dict[str, bool]


def load_gate_checks() -> None:
    """On a worker, before ε: load the gate's checks (Great Expectations, ``tasks/validate.py``), so that an install
    that cannot run them is refused before anything is spent. The workers run every check of a Dask release; the
    flow's process never loads them."""
    import kepsilon.tasks.validate  # noqa: F401 - by its full name: asked of sys.modules, not of the package


def release_gate(spec: ReleaseSpec, gates: list[GroupGate], part_checks: list[dict[str, bool]], rows_in: int,
                 rows_removed: int, linking_risk: float | None, criteria: list) -> tuple[list[dict], ValidationFailed | None]:
    """On a worker: the release gate from the buckets' group checks and records and the parts' column checks
    (``validate.validate_aggregated``): the report's checks, and the error to raise when it failed. Plain data
    only: a ``ValidationReport`` would load Great Expectations in the flow's process as it is unpickled there
    (about 6 s of CPU, which a 10,000-record release waited for before ε)."""
    from .validate import validate_aggregated, validation_failure, weight_column_name

    roles = spec.roles.names()
    report = validate_aggregated(
        [gate.checks for gate in gates],
        [gate.sizes.records for gate in gates],
        part_checks,
        weight_column=weight_column_name([*roles["k_quasi"], *roles["sensitive"]]),
        k_quasi=roles["k_quasi"],
        e_quasi=roles["e_quasi"],
        rows_in=rows_in,
        rows_removed=rows_removed,
        suppression_budget=spec.suppression_budget,
        criteria=declared(criteria),
        linking_risk=linking_risk,
        max_linking_risk=spec.max_linking_risk,
        max_prosecutor_risk=spec.max_prosecutor_risk,
        linking_gates=spec.scale_basis == "diameter",  # bounds mode: recorded, not gated (issue 21)
    )
    return report.checks, (None if report.success else validation_failure(report))


def gate_groups(scratch: Scratch, bucket: int, parts: int, spec: ReleaseSpec, coder: GroupCoder, criteria: list) -> GroupGate:
    """The bucket's written groups added up (their keys and sizes kept in the scratch for the certificate),
    their disclosure figures, and the gate's group expectations on them by Great Expectations (``validate_groups``)."""
    from .validate import validate_groups, weight_column_name  # Great Expectations: loaded where it runs

    written = add_bucket(scratch, WRITTEN, bucket, parts, len(coder.sensitive))
    scratch.write(GroupSizes(written.keys, written.sizes), WRITTEN_SIZES, bucket)
    roles = spec.roles.names()
    weight = weight_column_name([*roles["k_quasi"], *roles["sensitive"]])
    table, per_criterion = gate_tables(written, coder, criteria, weight)
    checks = validate_groups(table, per_criterion, weight_column=weight, k_quasi=roles["k_quasi"], k=spec.k,
                             criteria=declared(criteria), max_prosecutor_risk=spec.max_prosecutor_risk)
    disclosure = disclosure_figures(written.sizes, written.matrices(criteria), criteria)
    return GroupGate(SizeCounts.of(written.sizes), disclosure, checks)
