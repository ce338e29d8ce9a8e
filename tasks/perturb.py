"""The perturbation stage's governance and its Prefect task (the mechanism: ``kepsilon.engine.perturb``,
run in the engine's stage sequence, ``kepsilon.engine.stages``).

The seed is escrowed (sealed) in the audit store before any noise is drawn (``release_streams``, called by
both flows in their own process, beside the store) and leaves that function only as the release's
``RecordStreams`` (keys derived from the seed, which its ``repr`` withholds); caching and result
persistence are off, since a cached result would hand the *same* noise to another release.
"""

from typing import NamedTuple

import numpy as np
import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from kepsilon.engine.perturb import PerturbResult, new_seed
from kepsilon.engine.randomness import RecordStreams
from kepsilon.engine.stages import perturb_classes
from kepsilon.faults import fault_point


class SealedStreams(NamedTuple):
    """The release's draws and the commitment to the seed they come from (for the record); never the seed."""

    streams: RecordStreams
    commitment: str


def release_streams(spec, key: str, reservation_id: int, store: str) -> SealedStreams:
    """The release's draws from its escrowed seed (sealed in the store first, or unsealed on a rerun),
    with the ε charged as spent before any noise is drawn."""
    from kepsilon.tasks.record import escrowed_seed, mark_spent

    seed, commitment = escrowed_seed(store, key, spec.release_id, new_seed)
    streams = RecordStreams(seed)
    del seed
    mark_spent(store, reservation_id)
    return SealedStreams(streams, commitment)


@task(name="perturb", cache_policy=NO_CACHE, persist_result=False)
def perturb_records(frame: pd.DataFrame, class_ids: np.ndarray, spec, streams: RecordStreams) -> PerturbResult:
    """Prefect task: the stage sequence's ``perturb`` step (``kepsilon.engine.stages.perturb_classes``)."""
    result = perturb_classes(frame, class_ids, spec, streams)
    fault_point("after-noise")
    return result
