"""Ingest and classify: the source is fingerprinted, and bad shapes are refused naming the column."""

import hashlib
import hmac

import numpy as np
import pandas as pd
import pytest

from kepsilon.flows.spec import SourceSpec, parse_spec
from kepsilon.tasks.classify import classify
from kepsilon.tasks.errors import InputError, SpecError
from kepsilon.tasks.ingest import read_source

from .conftest import SYNTHETIC


def write(tmp_path, text: str | bytes, name="data.csv"):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def test_reads_the_sample_and_fingerprints_its_bytes_with_the_installation_key(tmp_path, monkeypatch):
    monkeypatch.delenv("KEPSILON_FINGERPRINT_KEY", raising=False)
    monkeypatch.setenv("KEPSILON_FINGERPRINT_KEY_FILE", str(tmp_path / "private" / "fingerprint.key"))
    table = read_source(SourceSpec(path=str(SYNTHETIC / "people.csv"), delimiter=";"))
    assert table.rows == 32440 and len(table.frame) == 32440
    raw = (SYNTHETIC / "people.csv").read_bytes()
    key = bytes.fromhex((tmp_path / "private" / "fingerprint.key").read_text())
    assert table.sha256 == hmac.new(key, raw, hashlib.sha256).hexdigest()  # keyed: HMAC-SHA256 of the bytes
    assert table.sha256 != hashlib.sha256(raw).hexdigest()  # never the plain hash, a guessing oracle
    assert list(table.frame.columns)[:4] == ["ID", "NAME", "SURNAME", "EMAIL"]


def test_parquet_and_headerless_csv(tmp_path):
    frame = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})
    frame.to_parquet(tmp_path / "t.parquet")
    typed = read_source(SourceSpec(path=str(tmp_path / "t.parquet"))).frame
    assert typed["a"].tolist() == [1, 2] and typed["b"].tolist() == ["x", "y"]
    assert str(typed["a"].dtype.pyarrow_dtype) == "int64"  # the Arrow type as read, not a pandas guess
    path = write(tmp_path, "1;x\n2;y\n")
    read = read_source(SourceSpec(path=str(path), delimiter=";", header=False, columns=["a", "b"])).frame
    assert list(read.columns) == ["a", "b"] and read["a"].tolist() == ["1", "2"]  # CSV cells are text


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "empty"),
        (b"a;b\n", "no records"),
        (b"a;b\n1;\xff\xfe\n", "not UTF-8"),
        (b"a;a\n1;2\n", "'a'"),
        (b"a;b\n1;2\n3;4;5\n", "malformed CSV"),
    ],
)
def test_bad_files_are_refused(tmp_path, content, message):
    with pytest.raises(InputError, match=message):
        read_source(SourceSpec(path=str(write(tmp_path, content)), delimiter=";"))


def test_missing_file_is_refused(tmp_path):
    with pytest.raises(InputError, match="cannot read"):
        read_source(SourceSpec(path=str(tmp_path / "nope.csv")))


@pytest.fixture
def small(synthetic_spec_dict):
    frame = read_source(SourceSpec(path=str(SYNTHETIC / "people.csv"), delimiter=";")).frame.head(200).copy()
    return frame, synthetic_spec_dict


def test_classify_removes_explicit_identifiers(small):
    frame, spec_dict = small
    table = classify(frame, parse_spec(spec_dict))
    assert not set(spec_dict["roles"]["explicit"]) & set(table.frame.columns)
    assert len(table.frame) == 200


def test_a_column_without_role_is_an_error(small):
    frame, spec_dict = small
    spec_dict["roles"]["sensitive"].remove("ICD")
    with pytest.raises(InputError, match="'ICD'.*no role"):
        classify(frame, parse_spec(spec_dict))


def test_a_roled_column_missing_from_the_source_is_an_error(small):
    frame, spec_dict = small
    with pytest.raises(InputError, match="'ICD'.*not a column"):
        classify(frame.drop(columns=["ICD"]), parse_spec(spec_dict))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf"), "tall"])
def test_e_quasi_must_be_numeric_and_finite(small, bad):
    frame, spec_dict = small
    frame["HEIGHT"] = frame["HEIGHT"].astype(object)
    frame.loc[frame.index[3], "HEIGHT"] = bad
    if bad != "tall":
        frame["HEIGHT"] = frame["HEIGHT"].astype(float)
    with pytest.raises(InputError) as raised:
        classify(frame, parse_spec(spec_dict))
    assert raised.value.column == "HEIGHT"
    assert "tall" not in str(raised.value)


def test_missing_k_quasi_value_is_an_error(small):
    frame, spec_dict = small
    frame.loc[frame.index[0], "GENDER"] = None
    with pytest.raises(InputError, match="'GENDER'"):
        classify(frame, parse_spec(spec_dict))


def test_k_larger_than_the_table(small):
    frame, spec_dict = small
    with pytest.raises(SpecError, match="'k'.*larger than the table"):
        classify(frame, parse_spec({**spec_dict, "k": 500}))


def test_a_typed_k_quasis_codes_are_equal_exactly_where_its_texts_are():
    """classify converts a typed k-quasi to text and keeps the codes of that factorisation for the histogram
    (classify.k_quasi_texts_and_codes): two rows share a code exactly when their texts are equal, a missing
    value included, and the texts are k_quasi_texts'. CSV cells are text already: no codes."""
    import pyarrow as pa

    from kepsilon.tasks.classify import k_quasi_texts, k_quasi_texts_and_codes

    rng = np.random.default_rng(11)
    pools = {
        "integers": pa.array([1930, 1931, None, 2005, -1], type=pa.int64()),
        "floats": pa.array([0.0, -0.0, 1.5, None, 1e20, 0.1 + 0.2], type=pa.float64()),
        "text": pa.array(["10001", "10001 ", None, "", "Zoë"], type=pa.string()),
    }
    for name, pool in pools.items():
        values = pd.Series(pd.arrays.ArrowExtensionArray(pool.take(pa.array(rng.integers(0, len(pool), 3_000)))))
        texts, codes = k_quasi_texts_and_codes(values)
        assert codes is not None and codes.min() >= 0, name
        assert texts.equals(k_quasi_texts(values)), name
        as_keys = texts.astype(object).where(texts.notna(), "<missing>").to_numpy()
        same_code = codes[:, None] == codes[None, :300]
        same_text = as_keys[:, None] == as_keys[None, :300]
        assert np.array_equal(same_code, same_text), name
    cells = pd.Series(pd.array(["a", None, "b"], dtype=pd.StringDtype("python")))
    assert k_quasi_texts_and_codes(cells) == (cells, None)
