"""Values leave as they came (issue 17): CSV cells are text, Parquet keeps its Arrow types, only the spec
decides what is missing or numeric, and the manifest names each published column's role and type.

The stage functions are tested directly; ``tests/test_round_trip.py`` runs whole releases.
"""

import base64
import csv
import datetime
import decimal
import io

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kepsilon.engine.anonymise import k_anonymise
from kepsilon.engine.assemble import assemble_release
from kepsilon.engine.partition import published_labels
from kepsilon.flows.spec import SourceSpec, load_spec, parse_spec
from kepsilon.tasks.classify import classify
from kepsilon.tasks.errors import HierarchyError, InputError
from kepsilon.tasks.ingest import read_source
from kepsilon.tasks.publish import csv_bytes, parquet_bytes, published_columns

# The values the issue found rewritten, dropped or refused.
ISSUE_VALUES = [
    "None", "NA", "N/A", "null", "NULL", "nan", "#N/A", "n/a", "<NA>",
    "250.00", "007", "0123", "1e5", "+5", "TRUE", "false", "9007199254740993",
]  # fmt: skip


def csv_text(rows: list[list[str]], delimiter: str) -> str:
    """A CSV written independently of kepsilon: quoted where a reader would otherwise split a cell."""

    def field(text: str) -> str:
        if any(special in text for special in (delimiter, '"', "\n", "\r")):
            return '"' + text.replace('"', '""') + '"'
        return text

    return "".join(delimiter.join(field(cell) for cell in row) + "\n" for row in rows)


def read_published_csv(content: bytes) -> list[dict]:
    return list(csv.DictReader(io.StringIO(content.decode("utf-8"), newline="")))


def hierarchy_file(tmp_path, leaves: list[str]):
    path = tmp_path / "CODE.csv"
    path.write_text("".join(f"{leaf};*\n" for leaf in leaves), encoding="utf-8")
    return str(path)


def spec_for(path, hierarchy: str, **source) -> dict:
    return {
        "release_id": "values",
        "population_id": "values-people",
        "source": {"path": str(path), **source},
        "roles": {
            "explicit": ["ID"],
            "k_quasi": [{"column": "CODE", "hierarchy": hierarchy}],
            "e_quasi": [{"column": "H", "lower": 0, "upper": 200000}],
            "sensitive": ["S"],
        },
        "k": 2,
        "epsilon": 1.0,
    }


def release_frame(frame: pd.DataFrame, spec) -> pd.DataFrame:
    """classify → k-anonymise → labels → merge, with no noise and nothing suppressed (the ε-quasi is
    copied): what the publish step receives, for the columns this file is about."""
    table = classify(frame, spec)
    partition = k_anonymise(table.frame, spec)
    kept = table.frame[partition.kept]
    ids = partition.class_ids[partition.kept]
    everyone = np.ones(len(kept), dtype=bool)
    labels = published_labels(kept[table.roles["k_quasi"]], ids, everyone, partition.hierarchies, partition.levels)
    order = np.arange(len(kept))
    return assemble_release(labels, kept, kept, ~everyone, order, table.roles)


def test_csv_cells_are_read_and_published_as_their_exact_text(tmp_path):
    """Every value pandas used to guess at is published byte for byte, in data.csv and data.parquet;
    k-quasi codes 007, 0123, TRUE, NA, None match their hierarchy's leaves as text."""
    codes = ["007", "0123", "TRUE", "NA", "None"]
    rows = [["ID", "CODE", "H", "S"]]
    for i, value in enumerate(ISSUE_VALUES * 2):
        rows.append([str(i), codes[i % len(codes)], "170", value])
    path = tmp_path / "people.csv"
    path.write_text(csv_text(rows, ","), encoding="utf-8")
    spec = parse_spec(spec_for(path, hierarchy_file(tmp_path, codes)))
    frame = release_frame(read_source(spec.source).frame, spec)

    published = read_published_csv(csv_bytes(frame))
    assert sorted(row["S"] for row in published) == sorted(ISSUE_VALUES * 2)
    assert {row["CODE"] for row in published} <= set(codes) | {"*"}
    parquet = pq.read_table(io.BytesIO(parquet_bytes(frame)))
    assert sorted(parquet.column("S").to_pylist()) == sorted(ISSUE_VALUES * 2)
    assert parquet.schema.field("S").type == pa.large_string()


def test_what_is_missing_is_the_specs_choice_per_role(tmp_path):
    """Default: only the empty cell is missing (a sensitive one is published as an empty cell / null).
    Widened to NA: a k-quasi NA is refused as missing, a sensitive NA is published as missing."""
    rows = [["ID", "CODE", "H", "S"]] + [[str(i), "NA", "170", ["", "NA", "x"][i % 3]] for i in range(6)]
    path = tmp_path / "people.csv"
    path.write_text(csv_text(rows, ";"), encoding="utf-8")
    hierarchy = hierarchy_file(tmp_path, ["NA"])
    spec = parse_spec(spec_for(path, hierarchy, delimiter=";"))
    frame = release_frame(read_source(spec.source).frame, spec)
    assert frame["CODE"].tolist() == ["NA"] * 6
    assert pq.read_table(io.BytesIO(parquet_bytes(frame))).column("S").to_pylist() == [None, "NA", "x"] * 2
    assert [row["S"] for row in read_published_csv(csv_bytes(frame))] == ["", "NA", "x"] * 2

    widened = parse_spec(spec_for(path, hierarchy, delimiter=";", missing=["", "NA"]))
    with pytest.raises(InputError, match="'CODE'.*6 missing"):
        classify(read_source(widened.source).frame, widened)
    widened_sensitive_only = {**spec_for(path, hierarchy, delimiter=";", missing=["", "NA"])}
    rows_ok = [["ID", "CODE", "H", "S"]] + [[str(i), "007", "170", ["", "NA", "x"][i % 3]] for i in range(6)]
    path.write_text(csv_text(rows_ok, ";"), encoding="utf-8")
    widened_sensitive_only["roles"]["k_quasi"][0]["hierarchy"] = hierarchy_file(tmp_path, ["007"])
    spec = parse_spec(widened_sensitive_only)
    frame = release_frame(read_source(spec.source).frame, spec)
    assert pq.read_table(io.BytesIO(parquet_bytes(frame))).column("S").to_pylist() == [None, None, "x"] * 2


@pytest.mark.parametrize("bad", ["1,5", " 5", "5 ", "nan", "inf", "1_000", "0x10", "٣", "five"])
def test_an_e_quasi_is_parsed_strictly_and_refused_by_column_and_count(tmp_path, bad):
    rows = [["ID", "CODE", "H", "S"]] + [[str(i), "a", "170", "s"] for i in range(4)]
    rows[2][2] = bad
    rows[3][2] = bad
    path = tmp_path / "people.csv"
    path.write_text(csv_text(rows, ";"), encoding="utf-8")
    spec = parse_spec(spec_for(path, hierarchy_file(tmp_path, ["a"]), delimiter=";"))
    with pytest.raises(InputError) as raised:
        classify(read_source(spec.source).frame, spec)
    message = str(raised.value)
    assert raised.value.column == "H" and "2 record(s)" in message and bad.strip() not in message.replace("'H'", "")


def test_plain_decimal_numbers_parse_as_e_quasi_values(tmp_path):
    texts = ["250.00", "007", "+5", "1e5", "-0.5", ".5", "5."]
    rows = [["ID", "CODE", "H", "S"]] + [[str(i), "a", text, "s"] for i, text in enumerate(texts)]
    path = tmp_path / "people.csv"
    path.write_text(csv_text(rows, ","), encoding="utf-8")
    spec_dict = spec_for(path, hierarchy_file(tmp_path, ["a"]))
    spec_dict["roles"]["e_quasi"][0]["lower"] = -1
    spec = parse_spec(spec_dict)
    table = classify(read_source(spec.source).frame, spec)
    assert table.frame["H"].tolist() == [250.0, 7.0, 5.0, 100000.0, -0.5, 0.5, 5.0]
    assert table.frame["H"].dtype == np.float64


def test_a_utf8_byte_order_mark_is_not_part_of_the_first_column_name(tmp_path):
    path = tmp_path / "excel.csv"
    path.write_bytes("\ufeffID;CODE\n1;a\n".encode("utf-8"))
    table = read_source(SourceSpec(path=str(path), delimiter=";"))
    assert list(table.frame.columns) == ["ID", "CODE"] and table.frame["ID"].tolist() == ["1"]
    hierarchy = tmp_path / "h.csv"
    hierarchy.write_bytes("\ufeffa;*\n".encode("utf-8"))
    from kepsilon.engine.hierarchy import load_hierarchy

    assert list(load_hierarchy(hierarchy, "CODE").leaves) == ["a"]


def test_every_relative_path_of_a_spec_file_is_relative_to_the_spec_file(tmp_path, monkeypatch):
    folder = tmp_path / "specs"
    folder.mkdir()
    (folder / "spec.yaml").write_text(
        "release_id: r\npopulation_id: p\nsource: {path: data/people.csv}\noutput_dir: published\n"
        "roles: {k_quasi: [{column: A, hierarchy: h/A.csv}]}\nk: 2\nepsilon: 1\n",
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)  # a working directory other than the spec's folder
    spec = load_spec(folder / "spec.yaml")
    assert spec.output_dir == str(folder / "published")
    assert spec.source.path == str(folder / "data" / "people.csv")
    assert spec.roles.k_quasi[0].hierarchy == str(folder / "h" / "A.csv")


def test_csv_quoting_keeps_carriage_returns_and_empty_single_cells():
    frame = pd.DataFrame({"S": pd.array(["a\rb", "", 'q"q', " x ", "a,b"], dtype=str)})
    content = csv_bytes(frame)
    assert content == b'S\n"a\rb"\n""\n"q""q"\n x \n"a,b"\n'
    assert [row["S"] for row in read_published_csv(content)] == ["a\rb", "", 'q"q', " x ", "a,b"]


def test_csv_records_are_each_cells_text_quoted_as_an_independent_writer_quotes_it():
    """``csv_records`` quotes and joins in Arrow, and takes a float's digits from Arrow's cast where that cast
    writes NumPy's text: every cell equals Python's own text of it (``repr`` of a float, the string itself),
    quoted by ``csv_text``, over floats whose text is integral, exponent-formed, at the edges of the positional
    range or not finite, text with every special character, categories, and missing values."""
    from kepsilon.tasks.publish import csv_records

    rng = np.random.default_rng(7)
    rows = 4000
    floats = np.concatenate([
        rng.normal(170, 10, 1000),  # positional, as heights are
        np.exp(rng.uniform(-25, 60, 1000)) * rng.choice([-1, 1], 1000),  # both forms, 17 digits and fewer
        rng.integers(0, 2**64, 1000, dtype=np.uint64).view(np.float64),  # any bit pattern: NaN, subnormals, huge
        np.resize([0.0, -0.0, np.inf, -np.inf, 1e-4, 9.9999e-5, 1e16, 9999999999999998.0, 170.0, 5e-324], 1000),
    ])
    floats[::37] = np.nan  # missing: an empty cell
    specials = ["a\rb", "", 'q"q', " x ", "a,b", "é 漢", "two\nlines", "plain", '"', "\r\n"]
    texts = rng.choice(specials + [None], rows)
    labels = rng.choice(["[1930, 1935)", "19**", "M"], rows)
    frame = pd.DataFrame({"F": floats, "S": pd.Series(texts, dtype=str), "C": pd.Categorical(labels),
                          "I": rng.integers(-(10**12), 10**12, rows)})
    frame = pd.concat([frame.iloc[:1500], frame.iloc[1500:]], ignore_index=True)  # text stored in two chunks

    def text(value) -> str:
        if value is None or (isinstance(value, float) and np.isnan(value)):
            return ""
        return repr(float(value)) if isinstance(value, float) else str(value)

    expected = csv_text([[text(frame[column].iloc[row]) for column in frame.columns] for row in range(rows)], ",")
    assert csv_records(frame).decode("utf-8") == expected
    assert csv_records(frame[["S"]]).decode("utf-8") == "".join(f"{csv_text([[text(v)]], ',')[:-1] or chr(34) * 2}\n"
                                                              for v in frame["S"])


TYPED = {
    "i": pa.array([7, None, 2**53 + 1, 0], pa.int64()),
    "f": pa.array([0.1, float("nan"), None, -2.5], pa.float64()),
    "d": pa.array(["b", "a", None, "b"]).dictionary_encode(),
    "dec": pa.array([decimal.Decimal("1234567890.12"), None, decimal.Decimal("0.10"), decimal.Decimal("-3.00")],
                    pa.decimal128(12, 2)),
    "dt": pa.array([datetime.date(2020, 1, 2), None, datetime.date(1999, 12, 31), datetime.date(2020, 1, 2)], pa.date32()),
    "ts": pa.array([datetime.datetime(2020, 1, 2, 3, 4, 5, 6, tzinfo=datetime.UTC), None,
                    datetime.datetime(2020, 6, 1, tzinfo=datetime.UTC), None], pa.timestamp("us", tz="Europe/Dublin")),
    "b": pa.array([b"\x00\xff", None, b"", b"caf\xc3\xa9"], pa.binary()),
}  # fmt: skip
# How data.csv writes them (docs/release.md, "What a release publishes").
TYPED_TEXTS = {
    "i": ["7", "", "9007199254740993", "0"],
    "f": ["0.1", "nan", "", "-2.5"],
    "d": ["b", "a", "", "b"],
    "dec": ["1234567890.12", "", "0.10", "-3.00"],
    "dt": ["2020-01-02", "", "1999-12-31", "2020-01-02"],
    "ts": ["2020-01-02 03:04:05.000006+0000", "", "2020-06-01 01:00:00.000000+0100", ""],
    "b": ["AP8=", "", "", base64.b64encode(b"caf\xc3\xa9").decode()],
}


def typed_source(tmp_path, extra: dict | None = None):
    columns = {"ID": pa.array(["1", "2", "3", "4"]), "CODE": pa.array([1977, 1977, 1978, 1978], pa.int64()),
               "H": pa.array([170, 171, 172, 173], pa.int32()), **TYPED, **(extra or {})}  # fmt: skip
    path = tmp_path / "typed.parquet"
    pq.write_table(pa.table(columns), path)
    spec = spec_for(path, hierarchy_file(tmp_path, ["1977", "1978"]))
    spec["roles"]["sensitive"] = list(TYPED) + list(extra or {})
    return parse_spec(spec)


def test_parquet_types_are_published_as_read(tmp_path):
    spec = typed_source(tmp_path)
    frame = release_frame(read_source(spec.source).frame, spec)
    published = pq.read_table(io.BytesIO(parquet_bytes(frame)))
    for name, column in TYPED.items():
        assert published.schema.field(name).type == column.type, name
        assert published.column(name).to_pylist() == column.to_pylist() or name == "f", name
    floats = published.column("f").to_pylist()
    assert floats[0] == 0.1 and np.isnan(floats[1]) and floats[2] is None  # NaN is not null
    assert published.column("i").to_pylist()[2] == 2**53 + 1
    rows = read_published_csv(csv_bytes(frame))
    for name, texts in TYPED_TEXTS.items():
        assert [row[name] for row in rows] == texts, name
    assert [row["CODE"] for row in rows] == ["1977", "1977", "1978", "1978"]  # typed k-quasi matched as text
    columns = published_columns(frame, spec.roles.names())
    assert columns["b"] == {"role": "sensitive", "type": "binary", "csv_encoding": "base64"}
    assert columns["dec"] == {"role": "sensitive", "type": "decimal128(12, 2)"}
    assert columns["ts"]["type"] == "timestamp[us, tz=Europe/Dublin]"
    assert columns["CODE"] == {"role": "k_quasi", "type": "large_string"}
    assert columns["H"] == {"role": "e_quasi", "type": "double"}
    assert "ID" not in columns


def test_a_type_csv_cannot_carry_is_refused_by_column(tmp_path):
    spec = typed_source(tmp_path, {"L": pa.array([[1], [2, 3], None, []], pa.list_(pa.int64()))})
    with pytest.raises(InputError, match="'L'.*list<.*cannot carry") as raised:
        classify(read_source(spec.source).frame, spec)
    assert "2, 3" not in str(raised.value)
    as_k_quasi = spec.model_dump(mode="json")
    as_k_quasi["roles"]["sensitive"].remove("L")
    as_k_quasi["roles"]["k_quasi"].append({"column": "L", "hierarchy": as_k_quasi["roles"]["k_quasi"][0]["hierarchy"]})
    with pytest.raises(InputError, match="'L'.*cannot carry"):
        classify(read_source(spec.source).frame, parse_spec(as_k_quasi))


def test_a_dictionary_lists_only_published_values_and_types_do_not_depend_on_records():
    """A value held only by a suppressed record leaves no trace: not in the dictionary, not in the type."""
    kept = pd.DataFrame(
        {
            "K": pd.array(["a", "a", "a"], dtype=str),
            "D": pd.Series(pd.array(pa.array(["secret", "x", "y"]).dictionary_encode(), dtype=pd.ArrowDtype(
                pa.dictionary(pa.int32(), pa.string())))),
            "T": pd.array(["gone", None, None], dtype=str),
        }
    )  # fmt: skip
    roles = {"explicit": [], "k_quasi": ["K"], "e_quasi": [], "sensitive": ["D", "T"]}
    removed = np.array([True, False, False])
    frame = assemble_release(kept[["K"]], kept, kept, removed, np.array([2, 0, 1]), roles)
    dictionary = pq.read_table(io.BytesIO(parquet_bytes(frame))).column("D").chunk(0).dictionary.to_pylist()
    assert dictionary == ["y", "x"]  # first appearance in the published order, not the source's
    assert published_columns(frame, roles)["T"]["type"] == "large_string"  # though every published T is null
    ordered = pa.DictionaryArray.from_arrays(pa.array([2, 0, 1], pa.int8()), pa.array(["lo", "mid", "hi"]), ordered=True)
    kept["D"] = pd.Series(pd.array(ordered, dtype=pd.ArrowDtype(ordered.type)))
    frame = assemble_release(kept[["K"]], kept, kept, np.array([False, True, False]), np.arange(3), roles)
    column = pq.read_table(io.BytesIO(parquet_bytes(frame))).column("D").chunk(0)
    assert column.type == ordered.type and column.dictionary.to_pylist() == ["mid", "hi"]  # declared order kept
    assert column.to_pylist() == ["hi", "mid"]


def test_a_k_quasi_value_missing_from_the_hierarchy_is_still_refused_as_text(tmp_path):
    rows = [["ID", "CODE", "H", "S"]] + [[str(i), "7", "170", "s"] for i in range(3)]
    path = tmp_path / "people.csv"
    path.write_text(csv_text(rows, ","), encoding="utf-8")
    spec = parse_spec(spec_for(path, hierarchy_file(tmp_path, ["007"])))  # 7 is not 007
    with pytest.raises(HierarchyError, match="'CODE'.*1 distinct value"):
        release_frame(read_source(spec.source).frame, spec)
