"""A release's stages on a table in memory, without governance: for notebooks, tests and benchmarks.

``preview(frame, spec)`` runs exactly the stage functions a release's tasks call, in the release's
order — k-anonymise (Mondrian or OLA), perturb, confidence suppression, diversity suppression,
labels from the published records, merge and keyed shuffle, metrics — and returns the table a
release would publish with the private metrics it would record.

What it does not do is everything that makes a release governed: no ε is reserved or spent, no
approval is checked, no seed is sealed, the Great Expectations gate does not run, nothing is written
and nothing is recorded. Its output is for the person at the keyboard only: it was computed from
private data and its noise is real, so treat it as the data itself. A release goes through the
flow (``kepsilon release SPEC.yaml`` or the ``release`` deployment).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import pandas as pd

from .anonymise import k_anonymise
from .assemble import assemble_release
from .metrics import release_metrics
from .partition import Partition, published_labels
from .perturb import new_seed, perturb, source_positions
from .randomness import RecordStreams
from .suppress import suppress_failing_groups, suppress_records

if TYPE_CHECKING:
    from kepsilon.spec import ReleaseSpec  # the engine reads the spec; the model imports the engine


class Preview(NamedTuple):
    """The table a release would publish (shuffled), its private metrics, and the partition."""

    released: pd.DataFrame
    metrics: dict
    partition: Partition


def preview(frame: pd.DataFrame, spec: ReleaseSpec, seed: bytes | None = None) -> Preview:
    """Run the engine's stages on ``frame`` (records as classified, source positions as index).

    ``spec`` is a release spec (``kepsilon.spec.load_spec``); ``seed`` (32 bytes) fixes the
    noise and the order for a reproducible run — a fresh random seed by default. The same seed gives
    the values a release with that seed would publish.
    """
    partition = k_anonymise(frame, spec)
    kept = frame[partition.kept]
    class_ids = partition.class_ids[partition.kept]
    streams = RecordStreams(new_seed() if seed is None else seed)
    perturbed = perturb(kept, class_ids, spec.roles.e_quasi, spec.epsilon_split(), spec.scale_basis, streams)
    suppression = suppress_records(kept, perturbed.frame, class_ids, perturbed.scales, spec)
    roles = spec.roles.names()
    suppression = suppress_failing_groups(kept, class_ids, suppression, partition, roles)
    labels = published_labels(
        kept[roles["k_quasi"]], class_ids, ~suppression.removed, partition.hierarchies, partition.levels
    )
    order = streams.order(source_positions(kept))
    released = assemble_release(labels, kept, perturbed.frame, suppression.removed, order, roles)
    metrics = release_metrics(kept, perturbed.frame, class_ids, partition, suppression, spec, perturbed.scales)
    return Preview(released, metrics, partition)
