"""Benchmark case ``mondrian-32k``: Mondrian on the paper's sample, as in its experiments.

k-quasis YOB, GENDER, RACE, MARITAL_STATUS with their hierarchies, k = 10, all 32,440 rows. Reading
the CSV and the hierarchies is not timed; only ``mondrian(...)`` is (encoding, partitioning and
building the released columns and report). Target: under 0.3 s.
"""

import time
from pathlib import Path

import pandas as pd

from kepsilon.engine.hierarchy import load_hierarchy
from kepsilon.engine.mondrian import mondrian

DATA = Path(__file__).resolve().parents[1] / "data" / "paper-synthetic"
K_QUASIS = ["YOB", "GENDER", "RACE", "MARITAL_STATUS"]
K = 10


def mondrian_32k() -> tuple[int, float]:
    """(rows, seconds) of one Mondrian run on the sample."""
    frame = pd.read_csv(DATA / "people.csv", sep=";", usecols=K_QUASIS)
    hierarchies = {column: load_hierarchy(DATA / "hierarchies" / f"{column}.csv", column) for column in K_QUASIS}
    started = time.perf_counter()
    partition = mondrian(frame, K_QUASIS, K, hierarchies)
    seconds = time.perf_counter() - started
    assert partition.report["smallest_class"] >= K
    return len(frame), seconds


if __name__ == "__main__":
    from benchmarks.harness import measure

    for _ in range(5):
        print(measure("mondrian-32k", mondrian_32k))
