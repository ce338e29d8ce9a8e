"""The metrics stage as a Prefect task (the measures: ``kepsilon.engine.metrics``).

Every figure it returns is computed from private values and belongs in the private audit record only.
"""

from typing import cast

import numpy as np
import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from kepsilon.engine.metrics import release_metrics
from kepsilon.record import ReleaseMetrics


@task(name="metrics", cache_policy=NO_CACHE, persist_result=False)
def measure_release(
    original: pd.DataFrame, noisy: pd.DataFrame, class_ids: np.ndarray, partition, suppression, spec, scales=None
) -> ReleaseMetrics:
    """Prefect task: information loss, linking risk and class statistics of the release (private)."""
    # The engine builds them (``metrics_summary``) in the record's shape; it does not import the record's types.
    return cast(ReleaseMetrics, release_metrics(original, noisy, class_ids, partition, suppression, spec, scales))
