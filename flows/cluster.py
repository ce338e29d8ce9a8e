"""The local Dask cluster's size: threads per worker and each worker's memory limit (docs/performance.md).

A worker holds one partition per thread at a time (``tasks/partitioned.py`` hands a partition's memory back
before the next), so its memory is a fixed part (the interpreter and its libraries) plus one partition's
working set per thread. The memory model of the benchmarks and the documentation assumes one thread per
worker, which is the default; ``execution.threads`` overrides it.

Dask's own default would make ``cpu_count / workers`` threads per worker (8 on a 16-core machine with 2
workers, which then peaked at 2.1–2.4 GB each) and give each worker ``total memory / workers`` as its
limit, which says nothing about what a partition needs. Here the limit is computed from the partition's
estimated size, so Dask's thresholds mean something: it spills results at 60 % of the limit, pauses the
worker at 80 % and restarts it at 95 % (Dask then runs its task again; a batch that fails is retried,
``BATCH_RETRIES``). It is never set
above the machine's share (``total / workers``), nor below ``MINIMUM_LIMIT``; at the default partition
sizes the floor is what applies, and larger partitions or more threads raise it.
"""

import math

import psutil

from kepsilon.flows.spec import Execution, SourceSpec
from kepsilon.tasks.sources import partition_memory_estimate

# Measured on the fine-grained benchmark (benchmarks/scale.py --fine, docs/performance.md): a worker peaks at
# 0.47 GB over a 10,000-record release (Python, pandas, pyarrow, Prefect, distributed, one tiny partition) and
# at 0.71-0.74 GB over 500,000-record partitions of about 46 MB in Arrow: some 6 times the partition above the
# fixed part (the partition, its classified copy, what a stage writes). The base is rounded up for headroom. In the
# default million-record pieces (2026-12-04) a 30M-row release's workers peaked at 0.86-0.87 GB, under the floor.
WORKER_BASE_BYTES = 600 << 20
PARTITION_FACTOR = 6
MINIMUM_LIMIT = 3 << 29  # 1.5 GiB: twice the measured peak at the default partition size


def worker_memory_limit(execution: Execution, source: SourceSpec | None) -> int:
    """Bytes each local worker may use: the fixed part, plus ``PARTITION_FACTOR`` × a partition per thread,
    between ``MINIMUM_LIMIT`` and the machine's share."""
    share = psutil.virtual_memory().total // max(execution.workers, 1)
    partition = partition_memory_estimate(source, execution.partitions) if source is not None else 0
    wanted = WORKER_BASE_BYTES + execution.threads * PARTITION_FACTOR * partition
    return int(min(share, max(MINIMUM_LIMIT, math.ceil(wanted))))


def local_cluster_size(execution: Execution, source: SourceSpec | None) -> dict:
    """The LocalCluster's size options: worker processes, threads per worker, each worker's memory limit."""
    return {
        "n_workers": execution.workers,
        "threads_per_worker": execution.threads,
        "memory_limit": worker_memory_limit(execution, source),
    }
