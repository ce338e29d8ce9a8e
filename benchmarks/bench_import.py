"""Benchmark case ``engine-import``: importing all of ``kepsilon.engine`` in a fresh interpreter.

The engine is meant to be imported on its own by a notebook, a test or a Dask worker; the issue's
target is under 1 s. Timed as the wall time of ``python -c "import …"`` minus that of ``python -c
pass`` (the interpreter's own start), best of five, so a busy machine's noise counts against it
as little as possible. ``rows`` is the number of engine modules imported.
"""

import subprocess
import sys
import time
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[1] / "kepsilon" / "engine"
RUNS = 5


def _best_wall_time(code: str) -> float:
    best = float("inf")
    for _ in range(RUNS):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        best = min(best, time.perf_counter() - started)
    return best


def engine_import() -> tuple[int, float]:
    modules = sorted(path.stem for path in ENGINE.glob("*.py") if path.stem != "__init__")
    statement = "import " + ", ".join(f"kepsilon.engine.{name}" for name in modules)
    return len(modules), _best_wall_time(statement) - _best_wall_time("pass")
