"""Benchmark cases for the whole (k,ε) engine: Mondrian → perturb → confidence suppression → metrics → shuffle.

Set-up of the bundled release spec (releases/paper-synthetic.yaml): k-quasis YOB, GENDER, RACE,
MARITAL_STATUS with their hierarchies, HEIGHT as the ε-quasi, k = 10, ε = 1, c = 0.99, diameter
basis. Reading the CSV and the hierarchies is not timed; everything from the loaded frame to the
shuffled released frame and its metrics is.

``engine-1m`` runs the same engine on 1,000,000 rows resampled with replacement (fixed seed) from
the sample's k-quasi columns and heights, so the table has the sample's shape at 31× its size.
"""

import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

from kepsilon.tasks.hierarchy import load_hierarchy
from kepsilon.tasks.k_anonymise import mondrian
from kepsilon.tasks.metrics import class_statistics, linking_risk, measured_relative_error, predicted_relative_error
from kepsilon.tasks.perturb import perturb, release_generators
from kepsilon.tasks.suppress import confidence_suppress

DATA = Path(__file__).resolve().parents[1] / "data" / "paper-synthetic"
K_QUASIS = ["YOB", "GENDER", "RACE", "MARITAL_STATUS"]
E_QUASI = "HEIGHT"
K = 10
EPSILON = 1.0
CONFIDENCE = 0.99
# A benchmark is not a release: a fixed seed keeps its runs comparable. Never do this for a release.
BENCH_SEED = bytes(range(32))
RESAMPLE_SEED = 20240501
LARGE_ROWS = 1_000_000


def load_sample() -> tuple[pd.DataFrame, dict]:
    """The sample's k-quasi and ε-quasi columns, and the k-quasi hierarchies."""
    frame = pd.read_csv(DATA / "people.csv", sep=";", usecols=K_QUASIS + [E_QUASI])
    hierarchies = {column: load_hierarchy(DATA / "hierarchies" / f"{column}.csv", column) for column in K_QUASIS}
    return frame, hierarchies


def resampled(frame: pd.DataFrame, n_rows: int, seed: int) -> pd.DataFrame:
    """``n_rows`` rows drawn with replacement from ``frame`` (whole rows, so the joint shape is kept)."""
    rows = np.random.default_rng(seed).integers(0, len(frame), size=n_rows)
    return frame.iloc[rows].reset_index(drop=True)


def run_engine(frame: pd.DataFrame, hierarchies: dict, seed: bytes = BENCH_SEED) -> tuple[pd.DataFrame, dict]:
    """The engine end to end on a loaded frame: the shuffled released frame and a summary."""
    partition = mondrian(frame, K_QUASIS, K, hierarchies)
    kept_frame = frame[partition.kept]
    class_ids = partition.class_ids[partition.kept]
    noise_rng, shuffle_rng = release_generators(seed)
    perturbed = perturb(
        kept_frame, class_ids, [SimpleNamespace(column=E_QUASI, lower=None, upper=None)], {E_QUASI: EPSILON}, "diameter", noise_rng
    )
    original = kept_frame[E_QUASI].to_numpy()
    noisy = perturbed.frame[E_QUASI].to_numpy()
    suppression = confidence_suppress(original, noisy, class_ids, perturbed.scales[E_QUASI], K, CONFIDENCE)
    keep = ~suppression.removed
    released = partition.released[partition.kept][keep].copy()
    released[E_QUASI] = noisy[keep]
    released = released.iloc[shuffle_rng.permutation(len(released))].reset_index(drop=True)
    n_suppressed = int((~partition.kept).sum() + suppression.removed.sum())
    summary = {
        "predicted_error": predicted_relative_error(original, class_ids, EPSILON),
        "measured_error": measured_relative_error(original[keep], noisy[keep]),
        "linking_risk": linking_risk(original[keep], noisy[keep], class_ids[keep]),
        "confidence_suppressed": int(suppression.removed.sum()),
        **class_statistics(class_ids[keep], n_suppressed),
    }
    return released, summary


def _timed_engine(frame: pd.DataFrame, hierarchies: dict) -> tuple[int, float]:
    started = time.perf_counter()
    run_engine(frame, hierarchies)
    return len(frame), time.perf_counter() - started


def engine_32k() -> tuple[int, float]:
    """Benchmark case ``engine-32k``: the engine on the 32,440-row sample."""
    frame, hierarchies = load_sample()
    return _timed_engine(frame, hierarchies)


def engine_1m() -> tuple[int, float]:
    """Benchmark case ``engine-1m``: the engine on 1,000,000 rows resampled from the sample."""
    frame, hierarchies = load_sample()
    return _timed_engine(resampled(frame, LARGE_ROWS, RESAMPLE_SEED), hierarchies)


if __name__ == "__main__":
    sample, sample_hierarchies = load_sample()
    print(run_engine(sample, sample_hierarchies)[1])
