"""A release's stages on a table in memory, without governance: for notebooks, tests and benchmarks.

``preview(frame, spec)`` k-anonymises (Mondrian or OLA), then runs the release's stage sequence
(``kepsilon/engine/stages.py``, the one the in-memory flow runs as tasks: perturb, confidence
suppression, diversity suppression, labels from the published records, merge and keyed shuffle,
metrics) and returns the table a release would publish with the private metrics it would record.

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
from .partition import Partition
from .perturb import new_seed
from .randomness import RecordStreams
from .stages import release_sequence

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
    release = release_sequence(kept, class_ids, partition, spec, RecordStreams(new_seed() if seed is None else seed))
    return Preview(release.released, release.metrics, partition)
