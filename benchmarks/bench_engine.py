"""Benchmark cases for the whole (k,ε) engine: k-anonymise → perturb → confidence and diversity
suppression → merge and shuffle → metrics, through the same plain stage functions a release's tasks call.

Set-up: the bundled release spec (releases/paper-synthetic.yaml): k-quasis YOB, GENDER, RACE,
MARITAL_STATUS with their hierarchies, HEIGHT as the ε-quasi, k = 10, ε = 1, c = 0.99, diameter basis,
Mondrian. Reading and classifying the CSV is not timed; everything from the loaded frame to the shuffled release and
its metrics is, including reading the four small hierarchy files, as a release does.

``engine-1m`` runs the same engine on 1,000,000 rows resampled with replacement (fixed seed) from
the sample's classified records (k-quasis, height, sensitive columns), so the table has the sample's shape at 31× its size.
"""

import time
from pathlib import Path

import numpy as np
import pandas as pd

from kepsilon.engine.preview import Preview, preview
from kepsilon.flows.spec import ReleaseSpec, load_spec
from kepsilon.tasks.classify import classify
from kepsilon.tasks.ingest import read_source

SPEC = Path(__file__).resolve().parents[1] / "releases" / "paper-synthetic.yaml"
# A benchmark is not a release: a fixed seed keeps its runs comparable. Never do this for a release.
BENCH_SEED = bytes(range(32))
RESAMPLE_SEED = 20240501
LARGE_ROWS = 1_000_000


def load_sample() -> tuple[pd.DataFrame, ReleaseSpec]:
    """The sample as a release hands it to the engine (read as text and classified, untimed), and its spec."""
    spec = load_spec(SPEC)
    return classify(read_source(spec.source).frame, spec).frame, spec


def resampled(frame: pd.DataFrame, n_rows: int, seed: int) -> pd.DataFrame:
    """``n_rows`` rows drawn with replacement from ``frame`` (whole rows, so the joint shape is kept)."""
    rows = np.random.default_rng(seed).integers(0, len(frame), size=n_rows)
    return frame.iloc[rows].reset_index(drop=True)


def run_engine(frame: pd.DataFrame, spec: ReleaseSpec, seed: bytes = BENCH_SEED) -> Preview:
    """The engine end to end on a loaded frame, stage for stage as a release runs it (``kepsilon.engine.preview``)."""
    return preview(frame, spec, seed)


def _timed_engine(frame: pd.DataFrame, spec: ReleaseSpec) -> tuple[int, float]:
    started = time.perf_counter()
    run_engine(frame, spec)
    return len(frame), time.perf_counter() - started


def engine_32k() -> tuple[int, float]:
    """Benchmark case ``engine-32k``: the engine on the 32,440-row sample."""
    return _timed_engine(*load_sample())


def engine_1m() -> tuple[int, float]:
    """Benchmark case ``engine-1m``: the engine on 1,000,000 rows resampled from the sample."""
    frame, spec = load_sample()
    return _timed_engine(resampled(frame, LARGE_ROWS, RESAMPLE_SEED), spec)


if __name__ == "__main__":
    print(run_engine(*load_sample()).metrics)
