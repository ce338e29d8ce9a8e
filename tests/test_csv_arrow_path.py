"""The Arrow parse of a plain CSV (``ingest.arrow_csv_cells``, issue 25) gives exactly the frame the pandas
parse gives — same cells, same dtype, same index — and leaves every other file to pandas, whose refusals
stay the ones reported. Values leave as they came: ``007``, ``NA``, an empty cell, spaces all stay text."""

import pandas as pd
import pytest

from kepsilon.flows.spec import SourceSpec
from kepsilon.tasks.errors import InputError
from kepsilon.tasks.ingest import arrow_csv_cells, column_names, parse_csv_text, read_source
from kepsilon.tasks.sources import plan_source, read_csv_piece

PLAIN = [
    "a;b\n007;NA\n;x\n 1 ; 2 \n",  # leading zeros, NA word, empty cell, spaces kept
    "a;b\n1;x\n\n\n2;y\n",  # empty lines between records
    "a;b\n1;x\n2;y",  # no final line break
    "a;b\n1;é ü 漢字\n2;\t\n",  # non-ASCII text, a tab cell
    "a;b\n1;x\n \t;y\n",  # spaces and a tab before a delimiter: cells
    "a;b\n-0;1e400\nnan;inf\nTrue;null\n",  # nothing converted: numbers, NaN words and booleans stay text
]


@pytest.mark.parametrize("text", PLAIN)
def test_a_plain_csv_parses_to_the_same_frame_as_with_pandas(text):
    source = SourceSpec(path="x.csv", delimiter=";")
    names = column_names(text, source)
    arrow = arrow_csv_cells(text.encode("utf-8"), source, names, skip_header=True)
    assert arrow is not None
    pandas = parse_csv_text(text, source, names, skip_header=True)
    pd.testing.assert_frame_equal(arrow, pandas)
    assert all(isinstance(value, str) for column in arrow for value in arrow[column])


@pytest.mark.parametrize(
    "text",
    [
        'a;b\n"1;2";x\n',  # a quote: pandas decides
        "a;b\r\n1;x\r\n",  # a carriage return
        "a;b\n1;2;3\n",  # a long record
        "a;b\n1\n",  # a short record
        "a;b\n",  # no record
        "a;b\n1;x\n \n2;y\n",  # a line of spaces (pandas skips it as blank)
    ],
)
def test_anything_but_a_plain_csv_is_left_to_pandas(text):
    source = SourceSpec(path="x.csv", delimiter=";")
    assert arrow_csv_cells(text.encode("utf-8"), source, ["a", "b"], skip_header=True) is None


def test_a_one_column_csv_is_left_to_pandas_which_skips_a_line_of_spaces():
    source = SourceSpec(path="x.csv", delimiter=";")
    assert arrow_csv_cells(b"a\n1\n \n2\n", source, ["a"], skip_header=True) is None
    assert parse_csv_text("a\n1\n \n2\n", source, ["a"], skip_header=True)["a"].tolist() == ["1", "2"]


@pytest.mark.parametrize(
    "content, message",
    [(b"a;b\n1;2\n3;4;5\n", "malformed CSV"), (b"a;b\n1;2\n3\n", "fewer fields"), (b"a;b\n", "no records"),
     (b"a;b\n1;\xff\n", "not UTF-8")],
)
def test_bad_plain_files_are_refused_as_before(tmp_path, content, message):
    path = tmp_path / "bad.csv"
    path.write_bytes(content)
    with pytest.raises(InputError, match=message):
        read_source(SourceSpec(path=str(path), delimiter=";"))


def test_the_pieces_of_a_plain_csv_add_up_to_the_whole_file_read_at_once(tmp_path):
    path = tmp_path / "people.csv"
    path.write_text("ID;ZIP\n" + "".join(f"P{n};{n % 997:05d}\n" for n in range(20_000)), encoding="utf-8")
    source = SourceSpec(path=str(path), delimiter=";")
    whole = read_source(source).frame
    plan = plan_source(source, 3)
    pieces = [read_csv_piece(plan, piece, source) for piece in plan.pieces]
    assert all(short == [] for _, short in pieces)
    joined = pd.concat([frame for frame, _ in pieces], ignore_index=True)
    pd.testing.assert_frame_equal(joined, whole)
    assert whole["ZIP"].iloc[1] == "00001"


def test_arrow_parses_every_plain_decimal_text_to_the_same_double_as_float():
    """The ε-quasi's texts converted by Arrow (``values.parse_numbers``) equal ``float()`` bit for bit:
    long mantissas, exponents, subnormals, signs, halfway cases; an overflow falls back to ``float()``."""
    import numpy as np

    from kepsilon.tasks.values import parse_numbers

    rng = np.random.default_rng(25)
    texts = [f"{rng.integers(0, 10**15)}.{rng.integers(0, 10**17):017d}e{rng.integers(-330, 300)}" for _ in range(20_000)]
    texts += [repr(float(x)) for x in rng.normal(170, 10, 5_000)] + [f"{x:.2f}" for x in rng.uniform(130, 210, 5_000)]
    texts += ["-0", "+1.5", ".5", "5.", "9007199254740993", "2.2250738585072011e-308", "4.9e-324", "1e-400",
              "0.1", "123456789012345678901234567890", "1.7976931348623157e308"]
    got = parse_numbers(pd.Series(texts, dtype="str"), "HEIGHT")
    expected = np.array([float(text) for text in texts])
    assert np.array_equal(got.view(np.uint64), expected.view(np.uint64))
    overflow = parse_numbers(pd.Series(["1", "1e400"], dtype="str"), "HEIGHT")
    assert overflow.tolist() == [1.0, float("inf")]
