"""A synthetic population of any size with the bundled sample's columns, for the scale benchmarks.

Rows are drawn with replacement from ``data/paper-synthetic/people.csv`` (whole rows, so the joint
distribution of the quasi-identifiers and every value stays inside the sample's hierarchies), with a
fresh unique ``ID`` per row; the other direct identifiers are drawn with the row, and a release removes
them first anyway. Written a chunk at a time, so memory does not grow with the number of rows:

    python -m benchmarks.population --rows 10000000 --out /tmp/people-10m.csv
    python -m benchmarks.population --rows 10000000 --out /tmp/people-10m --format parquet

CSV: one file, ``;``-separated like the sample. Parquet: a folder of files (a dataset), one per chunk,
every column as text like the sample. The same ``--seed`` gives the same bytes. Not shipped as data.
"""

import argparse
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "paper-synthetic" / "people.csv"
CHUNK_ROWS = 1_000_000
DEFAULT_SEED = 20261123


def sample_rows() -> pd.DataFrame:
    """The bundled sample, every cell as the text it holds."""
    return pd.read_csv(SAMPLE, sep=";", dtype=str, keep_default_na=False)


def chunks(n_rows: int, seed: int, chunk_rows: int = CHUNK_ROWS):
    """Successive frames of the population: rows resampled from the sample, IDs numbered from 1."""
    sample = sample_rows()
    rng = np.random.default_rng(seed)
    for start in range(0, n_rows, chunk_rows):
        size = min(chunk_rows, n_rows - start)
        chunk = sample.iloc[rng.integers(0, len(sample), size=size)].reset_index(drop=True)
        chunk["ID"] = [f"S{number:010d}" for number in range(start + 1, start + size + 1)]
        yield chunk


def write_csv(n_rows: int, out: Path, seed: int) -> None:
    temporary = out.with_name(f".{out.name}.partial")
    with open(temporary, "w", encoding="utf-8", newline="") as handle:
        for number, chunk in enumerate(chunks(n_rows, seed)):
            chunk.to_csv(handle, sep=";", index=False, header=number == 0, lineterminator="\n")
    os.replace(temporary, out)


def write_parquet(n_rows: int, out: Path, seed: int) -> None:
    temporary = out.with_name(f".{out.name}.partial")
    temporary.mkdir(parents=True, exist_ok=False)
    for number, chunk in enumerate(chunks(n_rows, seed)):
        table = pa.Table.from_pandas(chunk.astype(object), preserve_index=False)
        table = table.cast(pa.schema([pa.field(name, pa.string()) for name in chunk.columns]))
        pq.write_table(table, temporary / f"part-{number:05d}.parquet")
    os.replace(temporary, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--format", choices=("csv", "parquet"), default="csv")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    arguments = parser.parse_args()
    if arguments.rows < 1:
        parser.error("--rows must be at least 1")
    if arguments.out.exists():
        parser.error("--out already exists")
    writer = write_csv if arguments.format == "csv" else write_parquet
    writer(arguments.rows, arguments.out, arguments.seed)


if __name__ == "__main__":
    main()
