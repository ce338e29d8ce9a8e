"""The perturbation stage as a Prefect task (the mechanism: ``kepsilon.engine.perturb``).

The seed is escrowed (sealed) in the audit store before any noise is drawn and lives only inside
this task; caching and result persistence are off, since a cached result would hand the *same*
noise to another release.
"""

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from kepsilon.engine.perturb import new_seed, perturb, source_positions
from kepsilon.engine.randomness import RecordStreams
from kepsilon.faults import fault_point


@dataclass
class PerturbOutcome:
    """What the perturb stage hands on: noisy records, scales, the release order; never the seed."""

    frame: pd.DataFrame = field(repr=False)
    scales: dict[str, np.ndarray] = field(repr=False)
    order: np.ndarray = field(repr=False)  # the published order of the records (a permutation)
    report: dict[str, Any]
    seed_commitment: str


@task(name="perturb", cache_policy=NO_CACHE, persist_result=False)
def perturb_records(frame: pd.DataFrame, class_ids: np.ndarray, spec, key: str, reservation_id: int, store: str):
    """Prefect task: draw the release's noise from its escrowed seed and charge the ε as spent."""
    from kepsilon.tasks.record import escrowed_seed, mark_spent

    seed, commitment = escrowed_seed(store, key, spec.release_id, new_seed)
    streams = RecordStreams(seed)
    del seed
    mark_spent(store, reservation_id)
    result = perturb(frame, class_ids, spec.roles.e_quasi, spec.epsilon_split(), spec.scale_basis, streams)
    order = streams.order(source_positions(frame))
    fault_point("after-noise")
    return PerturbOutcome(result.frame, result.scales, order, result.report, commitment)
