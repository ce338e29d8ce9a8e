"""Text carried as codes between stages C and D (tasks/text_codes.py): what comes back is what went in,
value for value and type for type, across pieces that saw different values."""
import numpy as np
import pandas as pd
import pandas.testing as pdt
import pytest

from kepsilon.tasks.text_codes import concat_encoded, decode_text, encode_text


def _pieces() -> list[pd.DataFrame]:
    return [
        pd.DataFrame({"zip": pd.array(["10001", None, "10002"], dtype="str"), "height": [1.5, 2.5, np.nan],
                      "kind": pd.Categorical(["b", "a", "b"], categories=["b", "a"])}),
        pd.DataFrame({"zip": pd.array(["10003", "10001"], dtype="str"), "height": [3.5, 4.5],
                      "kind": pd.Categorical(["a", "a"], categories=["b", "a"])}),
        pd.DataFrame({"zip": pd.array([None, None], dtype="str"), "height": [5.5, 6.5],
                      "kind": pd.Categorical(["b", "b"], categories=["b", "a"])}),
    ]


def test_only_text_columns_are_encoded_and_come_back_as_they_were():
    piece = _pieces()[0]
    encoded, names = encode_text(piece)
    assert names == ("zip",)  # the float and the source's own categorical are left alone
    assert isinstance(encoded["zip"].dtype, pd.CategoricalDtype)
    assert encoded["kind"].dtype == piece["kind"].dtype
    assert encoded["zip"].array.codes.tolist() == [0, -1, 1]  # a missing value has no code
    pdt.assert_frame_equal(decode_text(encoded, names), piece)


def test_pieces_with_different_values_join_gather_and_decode_to_the_plain_result():
    pieces = _pieces()
    plain = pd.concat(pieces, ignore_index=True)
    encodings = [encode_text(piece) for piece in pieces]
    joined, names = concat_encoded([frame for frame, _ in encodings], [own for _, own in encodings])
    assert names == ("zip",)
    assert sorted(joined["zip"].cat.categories) == ["10001", "10002", "10003"]  # each value once
    order = np.array([6, 0, 3, 2, 5, 1, 4])
    pdt.assert_frame_equal(decode_text(joined.iloc[order].reset_index(drop=True), names),
                           plain.iloc[order].reset_index(drop=True))


def test_pieces_that_disagree_on_what_they_encoded_are_decoded_first():
    pieces = _pieces()
    first, first_names = encode_text(pieces[0])
    joined, names = concat_encoded([first, pieces[1]], [first_names, ()])
    assert names == ()
    pdt.assert_frame_equal(joined, pd.concat(pieces[:2], ignore_index=True))


def test_a_frame_without_text_is_returned_as_it_is():
    frame = pd.DataFrame({"height": [1.0, 2.0]})
    encoded, names = encode_text(frame)
    assert names == () and encoded is frame
    with pytest.raises(ValueError, match="at least one piece"):
        concat_encoded([], [])


def test_columns_are_named_as_the_frame_names_them():
    frame = pd.DataFrame({0: pd.array(["a", "b", "a"], dtype="str"), "n": [1, 2, 3]})
    encoded, names = encode_text(frame)
    assert names == (0,)
    pdt.assert_frame_equal(decode_text(encoded.iloc[[2, 0]], names), frame.iloc[[2, 0]])


def test_arrow_text_is_encoded_and_given_back_in_its_arrow_type():
    """A CSV's sensitive column is read as Arrow ``string``: it is carried as codes too, and comes back as
    the same Arrow type, nulls included, across pieces with the same and with different values."""
    import pyarrow as pa

    text = pd.ArrowDtype(pa.string())
    pieces = [pd.DataFrame({"icd": pd.array(values, dtype=text), "n": range(len(values))})
              for values in (["A01.2", None, "B20"], ["B20", "A01.2"], ["C30", None])]
    encodings = [encode_text(piece) for piece in pieces]
    assert [names for _, names in encodings] == [("icd",)] * 3
    joined, names = concat_encoded([frame for frame, _ in encodings], [own for _, own in encodings])
    order = np.array([4, 0, 6, 2, 5, 1, 3])
    plain = pd.concat(pieces, ignore_index=True)
    decoded = decode_text(joined.iloc[order].reset_index(drop=True), names)
    assert decoded["icd"].dtype == text
    pdt.assert_frame_equal(decoded, plain.iloc[order].reset_index(drop=True))
    same = [encode_text(pieces[1]), encode_text(pieces[1])]  # the same categories: codes joined as they are
    joined, names = concat_encoded([frame for frame, _ in same], [own for _, own in same])
    pdt.assert_frame_equal(decode_text(joined, names), pd.concat([pieces[1]] * 2, ignore_index=True))


def test_known_codes_and_categories_are_used_as_they_are_and_join_without_a_merge():
    """Stage C hands encode_text a source k-quasi's leaf codes and its hierarchy's leaves (``known``): the
    column is not factorised again, comes back as it was in its type, and pieces sharing the leaves join
    on their codes alone."""
    leaves = pd.Index(["10001", "10002", "10003", "99999"], dtype="str")  # more leaves than values present
    pieces = [p.dropna(subset=["zip"]).reset_index(drop=True) for p in _pieces()[:2]]
    encodings = []
    for piece in pieces:
        codes = leaves.get_indexer(piece["zip"])
        encoded, names = encode_text(piece, known={"zip": (codes, leaves)})
        assert names == ("zip",) and encoded["zip"].cat.categories.equals(leaves)
        assert encoded["zip"].array.codes.tolist() == codes.tolist()
        pdt.assert_frame_equal(decode_text(encoded, names), piece)
        encodings.append((encoded, names))
    joined, names = concat_encoded([frame for frame, _ in encodings], [own for _, own in encodings])
    assert joined["zip"].cat.categories.equals(leaves)  # the shared categories, not a union made again
    pdt.assert_frame_equal(decode_text(joined, names), pd.concat(pieces, ignore_index=True))


def test_known_text_codes_give_back_the_texts_their_codes_were_made_from():
    """Intake's k-quasis: codes equal exactly when the texts are, a missing text with a code of its own, and
    codes no row holds; encoded with known_text_codes, the column comes back as it was, missing values too."""
    from kepsilon.tasks.text_codes import known_text_codes

    texts = pd.Series(pd.array(["1950", None, "1960", "1950", None, "1970"], dtype="str"), name="yob")
    row_codes = np.array([3, 0, 5, 3, 0, 1])  # code 0: the missing text; codes 2 and 4: no row
    codes, categories = known_text_codes(texts, row_codes)
    assert codes.tolist() == [1, -1, 2, 1, -1, 0]  # renumbered in code order, the missing text's as -1
    assert list(categories) == ["1970", "1950", "1960"]
    frame = texts.to_frame()
    encoded, names = encode_text(frame, known={"yob": (codes, categories)})
    assert names == ("yob",)
    pdt.assert_frame_equal(decode_text(encoded, names), frame)


def test_a_class_partitions_pieces_keep_their_positions_and_the_chosen_codes():
    """Stage C reads its pieces (records, classes, encoded) with concat_shuffled: the source positions stay
    the index, the columns it keeps as codes stay codes, the others come back as text."""
    from kepsilon.tasks.text_codes import concat_shuffled

    pieces = _pieces()
    for piece, first in zip(pieces, (40, 7, 100)):
        piece.index = pd.RangeIndex(first, first + len(piece))
        piece["note"] = pd.array([f"n{i}" for i in range(len(piece))], dtype="str")
    shuffled = [(*encode_text(piece), np.arange(len(piece)) + 10 * number) for number, piece in enumerate(pieces)]
    shuffled = [(frame, ids, names) for frame, names, ids in shuffled]
    frame, class_ids, encoded = concat_shuffled(shuffled, {"zip"})
    plain = pd.concat(pieces)
    assert frame.index.tolist() == plain.index.tolist() == [40, 41, 42, 7, 8, 100, 101]
    assert class_ids.tolist() == [0, 1, 2, 10, 11, 20, 21]
    assert encoded == ("zip",) and isinstance(frame["zip"].dtype, pd.CategoricalDtype)
    assert frame["note"].dtype == plain["note"].dtype
    pdt.assert_frame_equal(decode_text(frame, encoded), plain)


def test_per_distinct_answers_and_refuses_as_the_text_itself_would():
    """A k-quasi's leaf codes and a sensitive column's domain codes are asked of its distinct values (the ones
    held, a missing one included) and read back per row: the text's own answers, and the same refusal."""
    from kepsilon.tasks.text_codes import per_distinct

    values = pd.Series(pd.array(["b", None, "c", "b", "a"], dtype="str"), name="zip")
    encoded, names = encode_text(values.to_frame())
    column = encoded["zip"]
    column = pd.Series(pd.Categorical.from_codes(column.array.codes, dtype=pd.CategoricalDtype(
        column.array.categories.append(pd.Index(["unheld"], dtype=column.array.categories.dtype)))), name="zip")
    asked: list[list] = []

    def answer(texts: pd.Series) -> np.ndarray:
        asked.append(texts.tolist())
        if (texts == "z").any():
            raise ValueError("not a leaf")
        return np.array([{"a": 10, "b": 11, "c": 12}.get(text, -1) if isinstance(text, str) else 99 for text in texts])

    expected = answer(values)
    assert per_distinct(column, names, answer).tolist() == expected.tolist() == [11, 99, 12, 11, 10]
    held = asked[-1]  # once each, the one no row holds not asked
    assert sorted(t for t in held if isinstance(t, str)) == ["a", "b", "c"] and sum(not isinstance(t, str) for t in held) == 1
    assert per_distinct(values, (), answer).tolist() == expected.tolist()  # a column not encoded: asked as it is
    stranger = pd.Series(pd.Categorical(["z", "a"]), name="zip")
    with pytest.raises(ValueError, match="not a leaf"):
        per_distinct(stranger, ("zip",), answer)
