"""The suppression stages as Prefect tasks (the algorithms: ``kepsilon.engine.suppress``)."""

import numpy as np
import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from kepsilon.engine.suppress import SuppressionResult, suppress_failing_groups, suppress_records


@task(name="diversity-suppress", cache_policy=NO_CACHE, persist_result=False)
def suppress_undiverse(
    kept: pd.DataFrame, class_ids: np.ndarray, suppression: SuppressionResult, partition, roles: dict
) -> SuppressionResult:
    """Prefect task: remove the published groups that fail a declared sensitive criterion."""
    return suppress_failing_groups(kept, class_ids, suppression, partition, roles)


@task(name="suppress", cache_policy=NO_CACHE, persist_result=False)
def suppress_linkable(
    original: pd.DataFrame, noisy: pd.DataFrame, class_ids: np.ndarray, scales: dict, spec
) -> SuppressionResult:
    """Prefect task: c-confident suppression over the spec's ε-quasis (diameter mode only; see
    :func:`kepsilon.engine.suppress.suppress_records`)."""
    return suppress_records(original, noisy, class_ids, scales, spec)
