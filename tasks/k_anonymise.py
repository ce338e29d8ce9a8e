"""The k-anonymisation stage as a Prefect task (the algorithms: ``kepsilon.engine.mondrian``, ``.ola``)."""

import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from kepsilon.engine.anonymise import k_anonymise
from kepsilon.engine.partition import Partition


@task(name="k-anonymise", cache_policy=NO_CACHE, persist_result=False)
def k_anonymise_records(frame: pd.DataFrame, spec) -> Partition:
    """Prefect task: generalise the k-quasis until every class has at least k records."""
    return k_anonymise(frame, spec)
