"""Round trip of sensitive values through whole releases (issue 17, item 4), under Prefect's test harness.

A fixed corpus — the values pandas used to rewrite, quotes, delimiters, embedded line breaks, leading and
trailing spaces, non-Latin scripts, emoji, a 10,000-character string — is released from a CSV with
``,``, a CSV with ``;`` and a typed Parquet file. Every published sensitive value must occur in the
source at least as often, byte for byte, in data.csv and in data.parquet. The releases use public
bounds (no confidence suppression), so every record is published and the counts must in fact be equal.
"""

import csv
import io
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kepsilon.flows.release import governed_release
from kepsilon.flows.spec import parse_spec

from .conftest import capped_store
from .test_values_as_read import ISSUE_VALUES, TYPED, TYPED_TEXTS, csv_text

pytestmark = [pytest.mark.flow, pytest.mark.usefixtures("prefect_harness")]

CORPUS = ISSUE_VALUES + [
    'say "hi"', '""', "a,b", "a;b", ",", ";", "line1\nline2", "cr\rinside", "crlf\r\nend", "\n",
    "  lead", "trail  ", " both ", "\t tab", "a\u2028b", "\\N", "True", "1.0", "-0", "0x1F",
    "Ελληνικά", "日本語テキスト", "مرحبا بالعالم", "Жёлтый", "१२३", "😀👍🏽", "👨‍👩‍👧",
    ('ab,"\n; ' * 1250), "x" * 10_000,
    "",  # the empty cell: missing by default, published as an empty cell (a null in Parquet)
]  # fmt: skip
CODES = ["NA", "None", "007", "0123", "TRUE"]  # k-quasi categories pandas used to refuse or rewrite
COPIES = 3


@pytest.fixture
def store(tmp_path, monkeypatch):
    return capped_store(tmp_path, monkeypatch, "round-trip")


def source_rows() -> list[dict]:
    values = CORPUS * COPIES
    heights = np.random.default_rng(17).uniform(150, 190, size=len(values)).round(1)
    return [
        {"ID": f"id-{i}", "CODE": CODES[i % len(CODES)], "H": repr(float(height)), "S": value}
        for i, (value, height) in enumerate(zip(values, heights))
    ]


def release(tmp_path, source: Path, sensitive: list[str], **source_options) -> Path:
    hierarchy = tmp_path / "CODE.csv"
    hierarchy.write_text("".join(f"{code};*\n" for code in CODES), encoding="utf-8")
    spec = parse_spec(
        {
            "release_id": "round-trip",
            "population_id": "round-trip",
            "source": {"path": str(source), **source_options},
            "roles": {
                "explicit": ["ID"],
                "k_quasi": [{"column": "CODE", "hierarchy": str(hierarchy)}],
                "e_quasi": [{"column": "H", "lower": 100, "upper": 250}],
                "sensitive": sensitive,
            },
            "k": 3,
            "epsilon": 1.0,
            "scale_basis": "bounds",
            "output_dir": str(tmp_path / "out"),
        }
    )
    governed_release(spec)
    return tmp_path / "out" / "round-trip"


def published_csv(directory: Path) -> list[dict]:
    return list(csv.DictReader(io.StringIO((directory / "data.csv").read_bytes().decode("utf-8"), newline="")))


def assert_published_from_source(published: Counter, source: Counter) -> None:
    """Every published value occurs in the source at least as often (and, nothing suppressed, exactly)."""
    for value, count in published.items():
        assert source[value] >= count, f"a published value ({len(str(value))} chars) is not in the source that often"
    assert published == source


@pytest.mark.parametrize("delimiter", [",", ";"])
def test_csv_sensitive_values_round_trip_byte_for_byte(store, tmp_path, delimiter):
    rows = source_rows()
    source = tmp_path / "people.csv"
    header = ["ID", "CODE", "H", "S"]
    source.write_bytes(csv_text([header] + [[row[c] for c in header] for row in rows], delimiter).encode("utf-8"))
    directory = release(tmp_path, source, ["S"], delimiter=delimiter)

    expected = Counter(row["S"] for row in rows if row["S"] != "")
    text_rows = published_csv(directory)
    assert_published_from_source(Counter(row["S"] for row in text_rows if row["S"] != ""), expected)
    parquet = pq.read_table(directory / "data.parquet")
    values = parquet.column("S").to_pylist()
    assert_published_from_source(Counter(value for value in values if value is not None), expected)
    assert values.count(None) == COPIES  # the empty cell is the one missing value, published as missing
    assert {row["CODE"] for row in text_rows} == set(CODES)  # NA and None are categories, released as such
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["columns"] == {
        "CODE": {"role": "k_quasi", "type": "large_string"},
        "H": {"role": "e_quasi", "type": "double"},
        "S": {"role": "sensitive", "type": "large_string"},
    }


def test_typed_parquet_values_round_trip(store, tmp_path):
    rows = source_rows()[: 4 * 20]
    repeat = len(rows) // 4
    columns = {
        "ID": pa.array([row["ID"] for row in rows]),
        "CODE": pa.array([row["CODE"] for row in rows]),
        "H": pa.array([float(row["H"]) for row in rows]),
        "S": pa.array([row["S"] for row in rows], pa.large_string()),
        **{name: pa.concat_arrays([column] * repeat) for name, column in TYPED.items()},
    }
    columns["d"] = pa.concat_arrays([TYPED["d"].dictionary_decode()] * repeat).dictionary_encode()
    source = tmp_path / "people.parquet"
    pq.write_table(pa.table(columns), source)
    directory = release(tmp_path, source, ["S", *TYPED])

    parquet = pq.read_table(directory / "data.parquet")
    text_rows = published_csv(directory)
    for name in ["S", *TYPED]:
        assert parquet.schema.field(name).type == columns[name].type, name
        published = [_comparable(value) for value in parquet.column(name).to_pylist()]
        assert_published_from_source(Counter(published), Counter(_comparable(v) for v in columns[name].to_pylist()))
    assert Counter(row["S"] for row in text_rows) == Counter(row["S"] for row in rows)  # "" is a real value here
    for name, texts in TYPED_TEXTS.items():
        assert Counter(row[name] for row in text_rows) == Counter(texts * repeat), name
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["columns"]["b"] == {"role": "sensitive", "type": "binary", "csv_encoding": "base64"}
    assert manifest["columns"]["i"]["type"] == "int64" and manifest["columns"]["dec"]["type"] == "decimal128(12, 2)"


def _comparable(value):
    """NaN is not equal to itself; count it under one key (None, a null, stays None: they are distinct)."""
    return "<NaN>" if isinstance(value, float) and value != value else value
