"""What a task costs a Dask worker beside its work (issue 25): the C heap under Dask's nanny, and the collections
after each partition."""

import os
import subprocess
import sys

_FAULTS_SCRIPT = """
import resource, numpy as np
from kepsilon.tasks.partitioned import allocate_from_the_heap
def faults_of_temporaries():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(200):
        np.ones(1 << 17).sum()  # a 1 MiB temporary, made and freed
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults_of_temporaries()
mapped = faults_of_temporaries()
allocate_from_the_heap()
faults_of_temporaries()
print(mapped, faults_of_temporaries())
"""


def test_a_dask_workers_temporaries_come_from_the_heap_once_a_partition_task_starts():
    """Under Dask's nanny (``MALLOC_TRIM_THRESHOLD_`` set) each 1 MiB temporary is a fresh mapping,
    faulted in page by page (256 faults); after ``allocate_from_the_heap`` the heap serves it again."""
    environment = {**os.environ, "MALLOC_TRIM_THRESHOLD_": "65536"}
    printed = subprocess.run([sys.executable, "-c", _FAULTS_SCRIPT], env=environment, capture_output=True, text=True,
                             check=True).stdout
    mapped, from_heap = (int(word) for word in printed.split())
    assert mapped >= 200 * 200  # about 256 page faults per temporary
    assert from_heap < 2_000


_RELEASE_SCRIPT = """
import gc
import sys
from kepsilon.tasks import partitioned

def refuse():
    raise AssertionError("gc.get_freeze_count walks every frozen object")

calls = {"collect": 0, "freeze": 0}
collect, freeze = gc.collect, gc.freeze
gc.get_freeze_count = refuse
gc.collect = lambda *a: calls.__setitem__("collect", calls["collect"] + 1) or collect(*a)
gc.freeze = lambda: calls.__setitem__("freeze", calls["freeze"] + 1) or freeze()
partitioned.release_memory()  # the first: collects and freezes the survivors
partitioned.release_memory()  # little made since: nothing to hand back
kept = b"x" * (128 << 20)  # a partition's worth held (written, so resident): collected again, not frozen again
partitioned.release_memory()
import wave  # a later stage's imports (Great Expectations' checks at publication): frozen in turn
more = b"y" * (128 << 20)
partitioned.release_memory()
print(calls["collect"], calls["freeze"], "wave" in sys.modules)
"""


def test_a_worker_freezes_its_libraries_as_it_imports_them_and_never_counts_them_again():
    """``release_memory`` after each partition: the first collects and freezes what survived (the libraries), a
    later one collects only when the task left 64 MB more and freezes again only when modules were imported since
    (a worker that froze before publication's imports spent 0.2-0.3 s on each later collection), and none asks
    ``gc.get_freeze_count`` (which walks every frozen object: 46 ms for 360k of them, after every partition)."""
    printed = subprocess.run([sys.executable, "-c", _RELEASE_SCRIPT], capture_output=True, text=True, check=True).stdout
    assert printed.split() == ["3", "2", "True"]
