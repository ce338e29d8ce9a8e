"""Measure one benchmark case in a fresh process: wall time of the measured stage and peak RSS.

Each case runs in a spawned child so that its peak resident memory is its own, not the sum of every
case before it. A case is a function ``() -> (rows, seconds)``: it prepares its inputs untimed and
returns the wall time of the work being measured.
"""

import multiprocessing
import resource
from collections.abc import Callable


def _child(case: Callable[[], tuple[int, float]], queue) -> None:
    rows, seconds = case()
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    queue.put((rows, seconds, peak_kib / 1024))


def measure(name: str, case: Callable[[], tuple[int, float]]) -> dict:
    """Run ``case`` in a spawned process; return ``{name, rows, seconds, peak_rss_mb}``."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(case, queue))
    process.start()
    rows, seconds, peak_mb = queue.get()
    process.join()
    if process.exitcode != 0:
        raise RuntimeError(f"benchmark {name} exited with {process.exitcode}")
    return {"name": name, "rows": rows, "seconds": round(seconds, 4), "peak_rss_mb": round(peak_mb, 1)}
