"""A synthetic population of any size with the bundled sample's columns, for the scale benchmarks.

Rows are drawn with replacement from ``data/paper-synthetic/people.csv`` (whole rows, so the joint
distribution of the quasi-identifiers and every value stays inside the sample's hierarchies), with a
fresh unique ``ID`` per row; the other direct identifiers are drawn with the row, and a release removes
them first anyway. Written a chunk at a time, so memory does not grow with the number of rows:

    python -m benchmarks.population --rows 10000000 --out /tmp/people-10m.csv
    python -m benchmarks.population --rows 10000000 --out /tmp/people-10m --format parquet

CSV: one file, ``;``-separated like the sample. Parquet: a folder of files (a dataset), one per chunk,
every column as text like the sample. The same ``--seed`` gives the same bytes. Not shipped as data.

``--fine``: a population whose quasi-identifiers keep growing with the rows, which the resampled one
cannot (it has the sample's 1,727 distinct k-quasi tuples at any size). Its k-quasis are a 5-digit
``ZIP`` over ``--zip-codes`` codes (3,000 by default) with Zipf-like weights (the code of rank r drawn
with weight 1/r), the year of birth ``YOB`` (1930-2005, uniform), ``GENDER``, ``RACE`` and
``MARITAL_STATUS`` (the sample's shares): about 0.42M distinct tuples at 1M rows and 1.8M at 10M.
``HEIGHT`` (the ε-quasi), ``RELIGION`` and ``ICD`` (sensitive) are drawn together from one sample row,
``ID`` is unique. Each chunk is built column by column in Arrow (codes drawn with numpy, then taken
from small dictionaries of texts), so 10M rows take seconds and memory stays at one chunk:

    python -m benchmarks.population --fine --rows 10000000 --out /tmp/fine-10m --format parquet
"""

import argparse
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pa_csv
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


# --------------------------------------------------------------------------- the fine-grained population

FINE_ZIP_CODES = 3_000
FINE_YEARS = (1930, 2005)
FINE_CATEGORIES = ("GENDER", "RACE", "MARITAL_STATUS")  # drawn with the sample's shares
FINE_FROM_SAMPLE = ("HEIGHT", "RELIGION", "ICD")  # drawn together, as one sample row
FINE_COLUMNS = ("ID", "ZIP", "YOB", *FINE_CATEGORIES, *FINE_FROM_SAMPLE)


def zip_codes(count: int, rng: np.random.Generator) -> tuple[pa.Array, np.ndarray]:
    """``count`` distinct 5-digit codes (texts, leading zeros kept) and their cumulative Zipf weights.

    The code of popularity rank r has weight 1/r; ranks are shuffled over the codes, so the popular
    codes are not the smallest numbers (a masking hierarchy would otherwise meet them together).
    """
    numbers = np.sort(rng.choice(100_000, size=count, replace=False))
    texts = pa.array([f"{number:05d}" for number in numbers], pa.string())
    weights = 1.0 / np.arange(1, count + 1)
    weights = weights[rng.permutation(count)]
    return texts, np.cumsum(weights) / weights.sum()


def draw(cumulative: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """Codes 0..len-1 drawn with the weights whose cumulative shares are ``cumulative``."""
    codes = np.searchsorted(cumulative, rng.random(size), side="right")
    return np.minimum(codes, len(cumulative) - 1).astype(np.int32)


def shares(values: pd.Series) -> tuple[pa.Array, np.ndarray]:
    """A column's distinct texts and their cumulative shares in the sample."""
    counts = values.value_counts(sort=False).sort_index()
    return pa.array(counts.index.tolist(), pa.string()), np.cumsum(counts.to_numpy()) / counts.sum()


def numbered_ids(prefix: str, start: int, size: int) -> pa.Array:
    """``prefix`` + 10-digit numbers from ``start``, as an Arrow string array built from its buffers."""
    width = len(prefix) + 10
    numbers = np.arange(start, start + size, dtype=np.int64)
    digits = (numbers[:, None] // 10 ** np.arange(9, -1, -1, dtype=np.int64)) % 10
    text = np.empty((size, width), dtype=np.uint8)
    text[:, : len(prefix)] = np.frombuffer(prefix.encode("ascii"), dtype=np.uint8)
    text[:, len(prefix):] = digits + ord("0")
    offsets = np.arange(0, (size + 1) * width, width, dtype=np.int32)
    return pa.StringArray.from_buffers(size, pa.py_buffer(offsets), pa.py_buffer(text.tobytes()))


def fine_chunks(n_rows: int, seed: int, chunk_rows: int = CHUNK_ROWS, zip_count: int = FINE_ZIP_CODES):
    """Successive Arrow tables of the fine-grained population (module docstring), IDs numbered from 1."""
    sample = sample_rows()
    rng = np.random.default_rng(seed)
    zips, zip_weights = zip_codes(zip_count, rng)
    years = pa.array([str(year) for year in range(FINE_YEARS[0], FINE_YEARS[1] + 1)], pa.string())
    categories = {name: shares(sample[name]) for name in FINE_CATEGORIES}
    drawn_with_row = {name: pa.array(sample[name].tolist(), pa.string()) for name in FINE_FROM_SAMPLE}
    for start in range(0, n_rows, chunk_rows):
        size = min(chunk_rows, n_rows - start)
        columns = {
            "ID": numbered_ids("F", start + 1, size),
            "ZIP": zips.take(pa.array(draw(zip_weights, size, rng))),
            "YOB": years.take(pa.array(rng.integers(0, len(years), size=size, dtype=np.int32))),
        }
        for name, (texts, cumulative) in categories.items():
            columns[name] = texts.take(pa.array(draw(cumulative, size, rng)))
        row = pa.array(rng.integers(0, len(sample), size=size, dtype=np.int32))
        for name, values in drawn_with_row.items():
            columns[name] = values.take(row)
        yield pa.table(columns)


# --------------------------------------------------------------------------- writers


def resampled_tables(n_rows: int, seed: int):
    """The resampled population's chunks as Arrow tables, every column as text."""
    for chunk in chunks(n_rows, seed):
        table = pa.Table.from_pandas(chunk.astype(object), preserve_index=False)
        yield table.cast(pa.schema([pa.field(name, pa.string()) for name in chunk.columns]))


def write_csv(tables, out: Path) -> None:
    """One ``;``-separated file, unquoted like the sample (Arrow's writer refuses a cell that would need
    quotes; pandas writes the resampled population, whose cells it quotes only where needed)."""
    temporary = out.with_name(f".{out.name}.partial")
    with open(temporary, "wb") as handle:
        for number, table in enumerate(tables):
            if isinstance(table, pd.DataFrame):
                handle.write(table.to_csv(sep=";", index=False, header=number == 0, lineterminator="\n").encode("utf-8"))
                continue
            if number == 0:  # Arrow's writer would quote the names
                handle.write((";".join(table.column_names) + "\n").encode("utf-8"))
            options = pa_csv.WriteOptions(include_header=False, delimiter=";", quoting_style="none")
            pa_csv.write_csv(table, handle, write_options=options)
    os.replace(temporary, out)


FINE_ROW_GROUP = 100_000  # a piece reads the row groups it touches whole: small ones waste little


def write_parquet(tables, out: Path, row_group_size: int | None = None) -> None:
    """A folder of Parquet files, one per chunk, written under a hidden name and renamed when complete."""
    temporary = out.with_name(f".{out.name}.partial")
    temporary.mkdir(parents=True, exist_ok=False)
    for number, table in enumerate(tables):
        pq.write_table(table, temporary / f"part-{number:05d}.parquet", row_group_size=row_group_size)
    os.replace(temporary, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--format", choices=("csv", "parquet"), default="csv")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--fine", action="store_true", help="the fine-grained population (5-digit ZIP, Zipf-like)")
    parser.add_argument("--zip-codes", type=int, default=FINE_ZIP_CODES, help="--fine: how many ZIP codes")
    arguments = parser.parse_args()
    if arguments.rows < 1:
        parser.error("--rows must be at least 1")
    if not 1 <= arguments.zip_codes <= 100_000:
        parser.error("--zip-codes must be between 1 and 100000")
    if arguments.out.exists():
        parser.error("--out already exists")
    if arguments.fine:
        tables = fine_chunks(arguments.rows, arguments.seed, zip_count=arguments.zip_codes)
    elif arguments.format == "csv":
        tables = chunks(arguments.rows, arguments.seed)
    else:
        tables = resampled_tables(arguments.rows, arguments.seed)
    if arguments.format == "csv":
        write_csv(tables, arguments.out)
    else:
        write_parquet(tables, arguments.out, FINE_ROW_GROUP if arguments.fine else None)


if __name__ == "__main__":
    main()
