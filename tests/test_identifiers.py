"""Identifier detection at classification (issue 11): direct identifiers are refused unless acknowledged."""

import numpy as np
import pandas as pd
import pytest

from kepsilon.flows.spec import load_spec, parse_spec
from kepsilon.tasks.classify import classify, identifier_reasons
from kepsilon.tasks.errors import InputError
from kepsilon.tasks.ingest import read_source

from .conftest import ROOT


def _table(n: int = 200) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame({
        "AGE": rng.integers(20, 60, size=n),
        "CONTACT": [f"person{i}@example.org" for i in range(n)],
        "HEIGHT": rng.uniform(150, 200, size=n).round(2),
    })


def _spec(sensitive, e_quasi=None):
    return parse_spec({
        "release_id": "r", "population_id": "p", "source": {"path": "x.csv"}, "k": 5, "epsilon": 1.0,
        "roles": {"k_quasi": [{"column": "AGE", "hierarchy": {"kind": "intervals", "lower": 0, "upper": 120, "widths": [10]}}],
                  "e_quasi": [e_quasi or {"column": "HEIGHT", "lower": 100, "upper": 250}],
                  "sensitive": [sensitive]},
    })


def test_an_email_column_is_refused_naming_the_column_and_the_reason_but_no_value():
    frame = _table()
    with pytest.raises(InputError) as caught:
        classify(frame, _spec("CONTACT"))
    message = str(caught.value)
    assert "'CONTACT'" in message and "e-mail" in message and "acknowledge_identifier: [email]" in message
    assert "@" not in message and "example" not in message


def test_an_acknowledged_column_is_released_but_only_for_the_reasons_acknowledged():
    frame = _table()
    with pytest.raises(InputError, match="nearly unique"):
        classify(frame, _spec({"column": "CONTACT", "acknowledge_identifier": ["email"]}))
    table = classify(frame, _spec({"column": "CONTACT", "acknowledge_identifier": ["email", "near_unique"]}))
    assert "CONTACT" in table.frame.columns
    # Marked explicit, it is simply removed.
    spec = _spec("CONTACT").model_dump(mode="json")
    spec["roles"]["sensitive"], spec["roles"]["explicit"] = [], ["CONTACT"]
    assert "CONTACT" not in classify(frame, parse_spec(spec)).frame.columns


@pytest.mark.parametrize(
    "values, reason",
    [
        (["+353 1 234 5678", "(01) 234-5678", "01 234 5679"], "phone"),
        (["192.168.0.1", "10.0.0.7", "::1"], "ip_address"),
        (["https://example.org/a", "www.example.org", "http://x.ie"], "url"),
        (["123-45-6789", "AB123456C", "1234567T"], "national_id"),
    ],
)
def test_each_kind_of_direct_identifier_is_recognised(values, reason):
    assert reason in identifier_reasons(pd.Series(values))


def test_ordinary_values_are_not_taken_for_identifiers():
    for values in (["401.9", "E11.9", "V45.81"], ["1976-1977", "2020-01-15"], ["Married-civ-spouse", "Divorced"]):
        assert identifier_reasons(pd.Series(values)) == []
    # Nearly unique: above 90 % distinct values per record, judged from 100 records up; ε-quasis exempt.
    unique = pd.Series([f"code-{i}" for i in range(150)])
    assert identifier_reasons(unique) == ["near_unique"] and identifier_reasons(unique.head(99)) == []
    acknowledged = classify(_table(), _spec({"column": "CONTACT", "acknowledge_identifier": ["email", "near_unique"]}))
    assert acknowledged.roles["sensitive"] == ["CONTACT"] and "CONTACT" in acknowledged.frame.columns


@pytest.mark.parametrize("name", ["adult", "paper-synthetic"])
def test_the_shipped_specs_pass_identifier_detection(name):
    spec = load_spec(ROOT / "releases" / f"{name}.yaml")
    frame = read_source(spec.source).frame
    table = classify(frame, spec)  # raises if a released column looked like a direct identifier
    roles = spec.roles.names()
    released = [c for role in ("k_quasi", "e_quasi", "sensitive") for c in roles[role]]
    assert released and list(table.frame.columns) == [c for c in frame.columns if c not in roles["explicit"]]
    # Every released column is clear of the detector on its own (not only acknowledged).
    assert {c: identifier_reasons(frame[c]) for c in released if identifier_reasons(frame[c])} == {}
    # The sample's identifiers are caught when they are not declared explicit.
    if name == "paper-synthetic":
        assert "email" in identifier_reasons(frame["EMAIL"]) and "near_unique" in identifier_reasons(frame["ID"])
        assert {"EMAIL", "ID"} <= set(roles["explicit"])


def test_a_partitions_evidence_counts_stripped_text_per_record_as_the_whole_tables_does():
    """Typed text is counted per distinct value before stripping (tasks/classify.identifier_evidence): the
    records matched, the records present and the distinct values are those of stripping every record."""
    from kepsilon.tasks.classify import identifier_evidence

    texts = [" ann@example.org", "ann@example.org ", "ann@example.org", "bob@example.org", None, "no one", " no one"] * 30
    values = pd.Series(pd.array(texts, dtype="str"))
    exact = identifier_evidence(values, exact=True)
    partition = identifier_evidence(values, exact=False)
    assert exact.matched["email"] == partition.matched["email"] == 4 * 30
    assert exact.present == partition.present == 6 * 30
    assert exact.distinct_values() == partition.distinct_values() == 6  # distinct as written, unstripped
    as_objects = identifier_evidence(values.astype(object), exact=False)  # the per-record path
    assert as_objects.matched == partition.matched
    # A k-quasi's factorisation, made once for its evidence and its texts (classify_findings), counts the same.
    factorised = pd.factorize(values, use_na_sentinel=True)
    for exactly in (True, False):
        shared = identifier_evidence(values, exact=exactly, factorised=factorised)
        alone = identifier_evidence(values, exact=exactly)
        assert (shared.present, shared.matched, shared.distinct) == (alone.present, alone.matched, alone.distinct)
        assert shared.hashes is None if exactly else np.array_equal(shared.hashes, alone.hashes)


def test_values_that_cannot_match_are_skipped_without_changing_any_count():
    """identifier_evidence matches in Python only the values Arrow finds may match (tasks/classify._NEEDS):
    the counts equal matching every stripped value, for each text type, with digits outside ASCII (Python's
    \\d matches them) and surrounding whitespace."""
    import random

    from kepsilon.tasks.classify import _PATTERN_REASONS, _looks_like, identifier_evidence

    def every_value(values: pd.Series) -> dict[str, int]:
        stripped = values.dropna().map(lambda value: value.strip()).value_counts()
        return {reason: int(stripped[[_looks_like(reason, text) for text in stripped.index]].sum()) for reason in _PATTERN_REASONS}

    kinds = ["a@b.org", " x@y.co ", "http://e.x/a", "WWW.example.com", "ftp://q", "192.168.0.1", " 10.0.0.255\n", "::1",
             "fe80::1%eth0", "1.2.3.4.5", "999.1.1.1", "+353 1 234 5678", "(01) 234-5678", "01 234 5678", "1976-1977",
             "2020-01-02 12 34", "123-45-6789", "AB 12 34 56 C", "1234567T", "AB1234567", "١٢٣٤٥٦٧٨", "٠١ ٢٣٤ ٥٦٧٨",
             "１２３４５６７", "A01.2", "12345.67", "\t+1 (555) 123-4567\t", "K123456", "", " ", "1\n2\n3\n4\n5\n6\n7", "01.2.3.4"]
    draw = random.Random(7)
    texts = [draw.choice(kinds) for _ in range(2000)] + [str(draw.randrange(10**9)) for _ in range(300)] + [None] * 5
    expected = every_value(pd.Series(texts, dtype=object))
    assert all(expected.values()), "the sample exercises every pattern"
    for dtype in ("str", pd.ArrowDtype(__import__("pyarrow").string())):
        assert identifier_evidence(pd.Series(pd.array(texts, dtype=dtype)), exact=False).matched == expected
    assert identifier_evidence(pd.Series(texts, dtype=object), exact=True).matched == expected
