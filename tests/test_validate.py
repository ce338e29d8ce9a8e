"""Tests of the release gate: each check passes on a good table and fails alone on a table that
violates exactly it, and the report never carries a data value."""

import dataclasses
import json
import logging
from collections import Counter
from typing import Any

import numpy as np
import pandas as pd
import pytest

from kepsilon.tasks.errors import SpecError, ValidationFailed
from kepsilon.tasks.validate import ValidationReport, smallest_group_size, validate_release

K = 3
# Unique canaries planted in the data: none of them may ever appear in a report or a log.
CANARY_BANDS = ["QZXband20s", "QZXband30s", "QZXband40s"]
CANARY_TEXT = "QZXdiagnosis"
CANARY_DIGITS = "987654321"

ALL_CHECKS = [
    "k_anonymous_groups",
    "records_published",
    "suppression_within_budget",
    "no_explicit_identifiers",
    "e_quasi_numeric_finite:height",
    "e_quasi_numeric_finite:weight",
    "k_quasi_columns_present",
    "published_rows_match_accounting",
]


def good_frame() -> pd.DataFrame:
    """15 published rows in four (band, sex) groups of sizes 3, 3, 4, 5 — 3-anonymous, groups of exactly k included."""
    band = [CANARY_BANDS[0]] * 6 + [CANARY_BANDS[1]] * 4 + [CANARY_BANDS[2]] * 5
    sex = ["F"] * 3 + ["M"] * 3 + ["F"] * 4 + ["*"] * 5
    rows = np.arange(15)
    return pd.DataFrame(
        {
            "band": band,
            "sex": sex,
            "height": 150.0 + rows + 0.987654321,
            "weight": 60 + rows,  # an integer ε-quasi is fine too
            "diagnosis": [f"{CANARY_TEXT}{i:02d}" for i in rows],
        }
    )


def run(frame, **overrides) -> ValidationReport:
    params: dict[str, Any] = dict(
        k_quasi=["band", "sex"],
        e_quasi=["height", "weight"],
        explicit=["NAME", "SSN"],
        k=K,
        rows_in=16,
        rows_removed=1,
        suppression_budget=0.1,
    )
    params.update(overrides)
    return validate_release(frame, **params)


def failed(report: ValidationReport) -> list[str]:
    return [c["name"] for c in report.checks if not c["success"]]


def assert_no_data_values(report: ValidationReport) -> None:
    text = json.dumps(dataclasses.asdict(report))
    for canary in CANARY_BANDS + [CANARY_TEXT, CANARY_DIGITS, "QZXname", "QZXtext"]:
        assert canary not in text


# --------------------------------------------------------------------------- good table


def test_good_frame_passes_every_check():
    report = run(good_frame())
    assert [c["name"] for c in report.checks] == ALL_CHECKS
    assert failed(report) == []
    assert report.success is True
    assert report.failed_checks == []


def test_report_holds_names_booleans_and_only_the_arithmetic_checks_figures():
    """The contract with the officers' queries: each check is {name, success}, and the arithmetic checks
    add their figure and limit (private record only): no value of the table anywhere."""
    report = run(good_frame())
    assert [f.name for f in dataclasses.fields(report)] == ["checks", "success"]
    with_figures = {"records_published", "suppression_within_budget", "linking_risk_within_limit"}
    for check in report.checks:
        expected = {"name", "success", "figure", "limit"} if check["name"] in with_figures else {"name", "success"}
        assert set(check) == expected
        assert type(check["success"]) is bool
    budget = next(c for c in report.checks if c["name"] == "suppression_within_budget")
    assert type(budget["figure"]) is float and type(budget["limit"]) is float
    json.dumps(dataclasses.asdict(report))  # plain JSON, no numpy scalars


# --------------------------------------------------------------------------- each check alone


def test_group_of_k_minus_one_rows_fails_k_anonymity_only():
    frame = good_frame()
    # Split the group of 5 into 3 + 2: one group of k − 1 rows.
    frame.loc[13:14, "band"] = "QZXband50s"
    report = run(frame)
    assert failed(report) == ["k_anonymous_groups"]
    assert report.success is False
    assert_no_data_values(report)


def test_missing_values_in_a_k_quasi_form_their_own_group():
    frame = good_frame()
    frame.loc[13:14, "sex"] = np.nan  # a group of 2 that groupby's default dropna would hide
    assert failed(run(frame)) == ["k_anonymous_groups"]


def test_larger_k_than_the_smallest_group_fails_k_anonymity_only():
    assert failed(run(good_frame(), k=4)) == ["k_anonymous_groups"]


def test_suppression_over_budget_fails_only_that_check():
    # 2 of 17 removed is 11.8% > 10%; 15 rows published matches the accounting.
    report = run(good_frame(), rows_in=17, rows_removed=2, suppression_budget=0.1)
    assert failed(report) == ["suppression_within_budget"]
    assert report.failed_checks == ["suppression_within_budget"]


def test_suppression_exactly_at_budget_passes():
    assert run(good_frame(), rows_in=20, rows_removed=5, suppression_budget=0.25).success is True


@pytest.mark.parametrize("column", ["NAME", "SSN", "ssn"])
def test_explicit_identifier_present_fails_only_that_check(column):
    frame = good_frame()
    frame[column] = [f"QZXname{i}" for i in range(len(frame))]
    report = run(frame)
    assert failed(report) == ["no_explicit_identifiers"]
    assert_no_data_values(report)


@pytest.mark.parametrize(
    "bad_value", [np.nan, np.inf, -np.inf, "QZXtext"], ids=["nan", "plus-inf", "minus-inf", "text"]
)
def test_non_finite_or_text_e_quasi_fails_only_its_check(bad_value):
    frame = good_frame()
    heights = frame["height"].astype(object)
    heights.iloc[7] = bad_value
    frame["height"] = heights if isinstance(bad_value, str) else heights.astype(float)
    report = run(frame)
    assert failed(report) == ["e_quasi_numeric_finite:height"]
    assert_no_data_values(report)


@pytest.mark.parametrize(
    "column",
    [
        pd.Series([True, False] * 7 + [True]),
        pd.Series([1.0] * 14 + [None], dtype="Float64"),
        pd.Series([float(i) for i in range(15)], dtype=object),
    ],
    ids=["bool", "nullable-with-NA", "object-of-floats"],
)
def test_e_quasi_must_have_a_real_numeric_dtype(column):
    frame = good_frame()
    frame["weight"] = column
    assert failed(run(frame)) == ["e_quasi_numeric_finite:weight"]


def test_missing_e_quasi_column_fails_its_check():
    report = run(good_frame(), e_quasi=["height", "weight", "bmi"])
    assert failed(report) == ["e_quasi_numeric_finite:bmi"]


def test_missing_k_quasi_column_fails_only_that_check():
    # Without `sex` the bands alone group 6, 4 and 5 rows: still 3-anonymous on what is published.
    report = run(good_frame().drop(columns="sex"))
    assert failed(report) == ["k_quasi_columns_present"]


def test_row_count_not_matching_the_accounting_fails_only_that_check():
    frame = good_frame().drop(index=9)  # groups still >= 3, but 14 rows published for 16 − 1
    assert failed(run(frame)) == ["published_rows_match_accounting"]


def test_several_violations_are_all_reported():
    frame = good_frame()
    frame["NAME"] = "QZXname"
    frame.loc[0, "height"] = np.inf
    report = run(frame, k=4)
    assert failed(report) == ["k_anonymous_groups", "no_explicit_identifiers", "e_quasi_numeric_finite:height"]
    error = ValidationFailed(report.failed_checks)
    assert "k_anonymous_groups" in str(error)


# --------------------------------------------------------------------------- privacy of reports and logs


def test_failing_run_logs_no_data_values(caplog):
    frame = good_frame()
    frame.loc[13:14, "band"] = "QZXband50s"
    frame["NAME"] = [f"QZXname{i}" for i in range(len(frame))]
    frame["height"] = frame["height"].astype(object)
    frame.loc[3, "height"] = "QZXtext"
    with caplog.at_level(logging.DEBUG):
        report = run(frame, e_quasi=["height", "weight", "bmi"])
    assert report.success is False
    assert_no_data_values(report)
    for canary in CANARY_BANDS + [CANARY_TEXT, CANARY_DIGITS, "QZXname", "QZXtext"]:
        assert canary not in caplog.text


def test_suite_that_raises_fails_closed_without_leaking(monkeypatch, caplog):
    import kepsilon.tasks.validate as validate_module

    class Exploding:
        def run(self, **kwargs):
            raise RuntimeError("QZXsecret value in an exception")

    monkeypatch.setattr(validate_module, "_validation_definition", lambda expectations: Exploding())
    monkeypatch.setattr(validate_module, "_SUITES", __import__("threading").local())  # no suite built before
    with caplog.at_level(logging.WARNING):
        report = run(good_frame())
    assert [c["name"] for c in report.checks if c["success"]] == ["records_published", "suppression_within_budget"]
    assert report.success is False
    assert "RuntimeError" in caplog.text
    assert "QZXsecret" not in caplog.text
    assert "QZXsecret" not in json.dumps(dataclasses.asdict(report))


def test_the_checked_records_are_not_fingerprinted(monkeypatch):
    """Great Expectations would hash every cell of a checked frame into an MD5 batch marker (most of a large
    part's checking time, and a digest of private records in the result); the gate turns that off."""
    import pandas.util

    hashed: list = []
    real = pandas.util.hash_pandas_object

    def spy(obj, *args, **kwargs):
        hashed.append(obj)
        return real(obj, *args, **kwargs)

    monkeypatch.setattr(pandas.util, "hash_pandas_object", spy)
    frame = good_frame()
    assert run(frame).success is True
    assert not [obj for obj in hashed if isinstance(obj, pd.DataFrame) and list(obj.columns) == list(frame.columns)]


# --------------------------------------------------------------------------- the group-size metric


def test_smallest_group_size_matches_an_independent_count():
    rng = np.random.default_rng(7)
    frame = pd.DataFrame(
        {"a": rng.integers(0, 4, 500), "b": rng.choice(["x", "y", "z"], 500), "c": rng.integers(0, 5, 500)}
    )
    counts = Counter(zip(frame["a"], frame["b"], frame["c"]))
    assert smallest_group_size(frame, ["a", "b", "c"]) == min(counts.values())
    assert smallest_group_size(frame, ["b"]) == min(Counter(frame["b"]).values())


def test_smallest_group_size_edge_cases():
    frame = pd.DataFrame({"a": [1, 1, 2]})
    assert smallest_group_size(frame, ["missing"]) == 3  # no published column to link on: one group
    assert smallest_group_size(frame.iloc[:0], ["a"]) is None


# --------------------------------------------------------------------------- parameters


@pytest.mark.parametrize(
    "overrides, parameter",
    [
        ({"k": 0}, "k"),
        ({"k": True}, "k"),
        ({"k": 2.5}, "k"),
        ({"rows_in": 0, "rows_removed": 0}, "rows_in"),
        ({"rows_removed": -1}, "rows_removed"),
        ({"rows_removed": 17}, "rows_removed"),
        ({"suppression_budget": 1.5}, "suppression_budget"),
        ({"suppression_budget": float("nan")}, "suppression_budget"),
        ({"suppression_budget": "0.05"}, "suppression_budget"),
        ({"k_quasi": []}, "k_quasi"),
        ({"k_quasi": "band"}, "k_quasi"),
        ({"e_quasi": [""]}, "e_quasi"),
        ({"explicit": [None]}, "explicit"),
    ],
)
def test_bad_parameters_are_refused_by_name(overrides, parameter):
    with pytest.raises(SpecError) as caught:
        run(good_frame(), **overrides)
    assert caught.value.parameter == parameter
    assert repr(parameter) in str(caught.value)


def test_published_must_be_a_dataframe():
    with pytest.raises(SpecError) as caught:
        run(good_frame().to_dict())
    assert caught.value.parameter == "published"


def test_a_threads_part_checks_build_their_suite_once_and_judge_each_frame_afresh(monkeypatch):
    """validate_part reuses its validation definition (tasks/validate._suite_for) across parts: one build,
    and each part's verdict is its own frame's."""
    import threading

    import kepsilon.tasks.validate as validate_module

    builds = []
    build = validate_module._validation_definition
    monkeypatch.setattr(validate_module, "_SUITES", threading.local())
    monkeypatch.setattr(validate_module, "_validation_definition", lambda expectations: builds.append(1) or build(expectations))
    columns = {"k_quasi": ["age"], "e_quasi": ["income"], "explicit": ["name"]}
    good = pd.DataFrame({"age": ["30-39"] * 4, "income": [1.0, 2.0, 3.0, 4.0]})
    infinite = good.assign(income=[1.0, np.inf, 3.0, 4.0])
    verdicts = [validate_module.validate_part(frame, **columns) for frame in (good, infinite, good.drop(columns="age"), good)]
    assert [sorted(name for name, passed in verdict.items() if not passed) for verdict in verdicts] == [
        [], ["e_quasi_numeric_finite:income"], ["k_quasi_columns_present"], []]
    assert len(builds) == 1
    # The suite is kept; the records it last checked are not.
    import gc
    import weakref

    last = good.copy()
    kept = weakref.ref(last)
    validate_module.validate_part(last, **columns)
    del last
    gc.collect()
    assert kept() is None
