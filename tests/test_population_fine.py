"""The fine-grained benchmark population (``benchmarks/population.py --fine``, issue 25): 5-digit ZIP texts over
3,000 codes with Zipf-like weights, distinct k-quasi tuples that keep growing with the rows, the same bytes for
the same seed, CSV and Parquet holding the same texts."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from benchmarks.population import FINE_COLUMNS, fine_chunks

ROOT = Path(__file__).resolve().parents[1]
K_QUASI = ["ZIP", "YOB", "GENDER", "RACE", "MARITAL_STATUS"]


def _frame(rows: int, seed: int = 7) -> pd.DataFrame:
    return pd.concat([table.to_pandas() for table in fine_chunks(rows, seed, chunk_rows=100_000)], ignore_index=True)


def test_zip_codes_are_five_digit_texts_over_3000_codes_with_a_zipf_like_head():
    frame = _frame(300_000)
    assert list(frame.columns) == list(FINE_COLUMNS)
    assert frame["ZIP"].str.fullmatch(r"\d{5}").all()
    shares = frame["ZIP"].value_counts(normalize=True).to_numpy()
    assert 2_900 <= len(shares) <= 3_000  # nearly every code drawn at this size
    harmonic = np.sum(1 / np.arange(1, 3_001))
    assert abs(shares[0] - 1 / harmonic) < 0.01  # the top code carries about 1/H(3000) ≈ 11.5 %
    assert abs(shares[1] - 1 / (2 * harmonic)) < 0.01
    assert frame["YOB"].astype(int).between(1930, 2005).all() and frame["ID"].is_unique


def test_distinct_tuples_keep_growing_with_the_rows():
    frame = _frame(1_000_000)
    distinct = [len(frame.iloc[:rows].drop_duplicates(K_QUASI)) for rows in (100_000, 1_000_000)]
    assert distinct[0] > 60_000 and distinct[1] > 400_000  # the resampled population stops at 1,727


def test_the_same_seed_gives_the_same_bytes_and_csv_holds_the_parquet_texts(tmp_path):
    def generate(out: Path, fmt: str) -> None:
        subprocess.run([sys.executable, "-m", "benchmarks.population", "--fine", "--rows", "50000", "--out", str(out),
                        "--format", fmt, "--seed", "3"], cwd=ROOT, check=True)

    generate(tmp_path / "a", "parquet")
    generate(tmp_path / "b", "parquet")
    generate(tmp_path / "c.csv", "csv")
    assert (tmp_path / "a" / "part-00000.parquet").read_bytes() == (tmp_path / "b" / "part-00000.parquet").read_bytes()
    parquet = pq.read_table(tmp_path / "a").to_pandas()
    csv = pd.read_csv(tmp_path / "c.csv", sep=";", dtype=str, keep_default_na=False)
    assert (parquet.astype(str).to_numpy() == csv.to_numpy()).all()
    assert (tmp_path / "c.csv").read_text(encoding="utf-8").splitlines()[0] == ";".join(FINE_COLUMNS)
