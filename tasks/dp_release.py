"""The DP mode's stages as Prefect tasks (the mechanism: ``kepsilon.engine.dp_release``).

``plan_dp_release`` runs before any ε is reserved and refuses everything it can; ``draw_dp_release``
is the one stage that draws randomness, from the release's sealed seed, after the reservation.
"""

from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from kepsilon.engine.dp_release import DPPlan, dp_generators, mechanism, plan
from kepsilon.engine.perturb import new_seed
from kepsilon.faults import fault_point


@dataclass
class DPOutcome:
    """What the DP stage hands on: the table to publish (shuffled), the node, a private report."""

    frame: pd.DataFrame = field(repr=False)
    node: dict[str, int]
    report: dict[str, Any]
    seed_commitment: str
    rows: Any = field(default=None, repr=False)  # per published row, its source position (private, never recorded)


@task(name="plan-dp-release", cache_policy=NO_CACHE, persist_result=False)
def plan_dp_release(frame: pd.DataFrame, spec) -> DPPlan:
    """Prefect task: the DP release's plan; its refusals come before any ε is reserved."""
    return plan(frame, spec)


@task(name="dp-sample-and-anonymise", cache_policy=NO_CACHE, persist_result=False)
def draw_dp_release(frame: pd.DataFrame, dp_plan: DPPlan, spec, key: str, reservation_id: int, store: str) -> DPOutcome:
    """Prefect task: draw the DP release from its escrowed seed and charge its (ε, δ) as spent.

    The seed is sealed in the audit store before use and lives only inside this task. Caching and
    result persistence are off: a cached result would hand the same sample to another release.
    """
    from kepsilon.tasks.record import escrowed_seed, mark_spent

    seed, commitment = escrowed_seed(store, key, spec.release_id, new_seed)
    rngs = dp_generators(seed)
    del seed
    mark_spent(store, reservation_id)
    table, node, report, rows = mechanism(frame, dp_plan, spec, rngs, with_rows=True)
    fault_point("after-noise")
    return DPOutcome(frame=table, node=node, report=report, seed_commitment=commitment, rows=rows)
