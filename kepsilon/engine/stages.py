"""A release's stage sequence on reserved budget, written once for every caller.

After k-anonymisation the method runs, in this order:

1. ``perturb`` — Laplace noise per class on every ε-quasi, keyed by (seed, source position, column);
2. ``suppress`` — confidence suppression (a record whose noisy values link back to it within its class);
3. ``diversity-suppress`` — the published groups that fail a declared sensitive criterion go;
4. ``merge`` — the k-quasi labels from the published records only, the columns merged in the source's
   order, the records in the release's keyed order, without the suppressed ones;
5. ``metrics`` — the release's private figures.

Steps 1 and 2 need one class at a time and nothing else: :func:`noise_and_suppress` runs them on
whole classes. Steps 3 to 5 need every class: a published group can span classes of several
partitions, and the order and the figures are the whole table's. :func:`release_table` runs them on a
table in memory, and :func:`release_sequence` runs all five.

The callers: ``preview()`` (``kepsilon/engine/preview.py``) calls :func:`release_sequence` plainly; the
in-memory flow (``flows/release.py``) calls it with a ``run`` hook that runs each step as its Prefect
task (``tasks/perturb.py``, ``tasks/suppress.py``, ``tasks/publish.py``, ``tasks/metrics.py``, same
arguments) and reports the progress stages; the partitioned path (``tasks/partitioned.py``, one class
partition per task) calls :func:`noise_and_suppress` plainly and does steps 3 to 5 by its own
reductions over every partition — the groups' counts decide which groups fail, the records are
sorted by their order keys, the figures are summed — since no process holds the whole table. Its
labels come from the records that pass step 2: diversity suppression removes whole published
groups, so it changes no other group's labels.

Governance stays outside: the caller brings the release's ``RecordStreams`` (the flows draw them
from the seed sealed in the audit store, ``tasks/perturb.release_streams``; ``preview()`` from the
seed it is given).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pandas as pd

from .assemble import assemble_release
from .metrics import release_metrics
from .partition import Partition, published_labels
from .perturb import PerturbResult, perturb, source_positions
from .randomness import RecordStreams
from .suppress import SuppressionResult, suppress_failing_groups, suppress_records

if TYPE_CHECKING:
    from kepsilon.spec import ReleaseSpec  # the engine reads the spec; the model imports the engine

Run = Callable[..., Any]
"""``run(step_name, function, *args)``: how a caller runs each step (see :func:`call`)."""


def call(name: str, function: Callable[..., Any], *args: Any) -> Any:
    """The plain ``run`` hook: call the step's function (``name`` is for a hook that reports it)."""
    return function(*args)


class ClassStages(NamedTuple):
    """Steps 1 and 2 on whole classes: the noisy records, their scales and report, and what confidence removes."""

    perturbed: PerturbResult
    suppression: SuppressionResult


class Release(NamedTuple):
    """All five steps: the table to publish (in its order), the noise, the final suppression, the private figures."""

    released: pd.DataFrame
    perturbed: PerturbResult
    suppression: SuppressionResult  # confidence, then diversity
    metrics: dict


def perturb_classes(kept: pd.DataFrame, class_ids: np.ndarray, spec: ReleaseSpec, streams: RecordStreams) -> PerturbResult:
    """Step 1: the spec's noise on ``kept`` (records with their source positions as index), per class."""
    return perturb(kept, class_ids, spec.roles.e_quasi, spec.epsilon_split(), spec.scale_basis, streams)


def published_table(
    partition: Partition, kept: pd.DataFrame, class_ids: np.ndarray, noisy: pd.DataFrame, removed: np.ndarray,
    order: np.ndarray, roles: dict[str, list[str]],
) -> pd.DataFrame:
    """Step 4: the k-quasi labels from the published records only (so no label depends on a suppressed
    record), merged with the noisy ε-quasis and the other columns, in ``order``, without ``removed``."""
    labels = published_labels(kept[roles["k_quasi"]], class_ids, ~removed, partition.hierarchies, partition.levels)
    return assemble_release(labels, kept, noisy, removed, order, roles)


def noise_and_suppress(
    kept: pd.DataFrame, class_ids: np.ndarray, spec: ReleaseSpec, streams: RecordStreams, run: Run = call
) -> ClassStages:
    """Steps 1 and 2 on whole classes (the whole table, or one class partition)."""
    perturbed = run("perturb", perturb_classes, kept, class_ids, spec, streams)
    suppression = run("suppress", suppress_records, kept, perturbed.frame, class_ids, perturbed.scales, spec)
    return ClassStages(perturbed, suppression)


def release_table(
    kept: pd.DataFrame, class_ids: np.ndarray, partition: Partition, spec: ReleaseSpec, streams: RecordStreams,
    stages: ClassStages, run: Run = call,
) -> tuple[pd.DataFrame, SuppressionResult]:
    """Steps 3 and 4 on every class: the table to publish and the suppression after diversity."""
    roles = spec.roles.names()
    suppression = run("diversity-suppress", suppress_failing_groups, kept, class_ids, stages.suppression, partition, roles)
    order = streams.order(source_positions(kept))
    released = run("merge", published_table, partition, kept, class_ids, stages.perturbed.frame, suppression.removed,
                   order, roles)
    return released, suppression


def release_sequence(
    kept: pd.DataFrame, class_ids: np.ndarray, partition: Partition, spec: ReleaseSpec, streams: RecordStreams,
    run: Run = call,
) -> Release:
    """All five steps on the records the anonymiser kept (``kept``, their ``class_ids``, its ``partition``)."""
    stages = noise_and_suppress(kept, class_ids, spec, streams, run)
    released, suppression = release_table(kept, class_ids, partition, spec, streams, stages, run)
    perturbed = stages.perturbed
    metrics = run("metrics", release_metrics, kept, perturbed.frame, class_ids, partition, suppression, spec,
                  perturbed.scales)
    return Release(released, perturbed, suppression, metrics)
