"""The release gate: Great Expectations checks a published table must pass before it is released.

`validate_release` runs one in-memory Great Expectations suite over the table about to be published
and answers, per check, only a name and a pass/fail boolean. The published table is private data, so
the suite runs with ``result_format="BOOLEAN_ONLY"`` (richer formats copy failing values into the
result), the custom metrics below return counts or booleans and never a cell, and no exception text
from Great Expectations (which may quote values) is kept or logged.

Checks (a failed or raising expectation counts as a failed check — the gate fails closed):

- ``k_anonymous_groups``: grouping the published rows by the k-quasi columns gives no group smaller
  than k (custom `ExpectColumnGroupsToHaveAtLeastKRows`).
- ``suppression_within_budget``: ``rows_removed / rows_in <= suppression_budget`` (data-free, plain);
  not run without a budget (``suppression_budget=None``, the DP mode: groups below k are suppressed
  whatever their number).
- ``no_explicit_identifiers``: no explicit-identifier column is present (custom
  `ExpectTableColumnsToExcludeSet`, compared case-insensitively).
- ``e_quasi_numeric_finite:<col>``, one per ε-quasi: the column has an integer or float dtype and
  every value is finite — NaN, missing, +inf and −inf fail (custom `ExpectColumnValuesToBeFiniteNumbers`).
- ``k_quasi_columns_present``: every k-quasi column exists (`ExpectTableColumnsToMatchSet`, subset).
- ``published_rows_match_accounting``: the table has exactly ``rows_in − rows_removed`` rows
  (`ExpectTableRowCountToEqual`), so the suppression check is made on the numbers actually published.
- ``l_diversity:<col>`` / ``t_closeness:<col>``, one per declared criterion: every group of the
  published rows (grouped by the k-quasi columns, counted here from the table itself, not from the
  anonymiser's classes) is ℓ-diverse / has EMD ≤ t to the whole input table's distribution (custom
  `ExpectGroupsToBeLDiverse`, `ExpectGroupsToBeTClose`; the functions of ``kepsilon.engine.criteria``).
- ``prosecutor_risk_within_limit`` (when ``max_prosecutor_risk`` is set): 1/smallest group ≤ the limit
  (custom `ExpectGroupsProsecutorRiskAtMost`).
- ``linking_risk_within_limit``: the release's linking risk ≤ ``max_linking_risk`` (data-free, plain: the
  risk needs the true values and the noise, which the published table does not hold). In bounds mode it is
  recorded with ``gates: False`` and decides nothing: it reads the true ε-quasi values, and bounds mode
  claims ε-DP for them given the partition.
- ``records_published`` (the method's mode): at least one record is published; an empty release says nothing.

Every check is ``{"name", "success"}``; the arithmetic ones add ``figure`` and ``limit`` (private figures:
the record in the audit store only, never the public manifest).
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import os
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

# Offline machines: GE otherwise tries to send usage statistics on import and on every run.
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

import great_expectations as gx  # noqa: E402
from great_expectations.core.metric_domain_types import MetricDomainTypes  # noqa: E402
from great_expectations.data_context.types.base import ProgressBarsConfig  # noqa: E402
from great_expectations.execution_engine import PandasExecutionEngine  # noqa: E402
from great_expectations.execution_engine import pandas_execution_engine as _pandas_engine  # noqa: E402
from great_expectations.expectations.expectation import (  # noqa: E402
    BatchExpectation,
    ColumnAggregateExpectation,
)
from great_expectations.expectations.metrics.column_aggregate_metric_provider import (  # noqa: E402
    ColumnAggregateMetricProvider,
    column_aggregate_value,
)
from great_expectations.expectations.metrics.metric_provider import metric_value  # noqa: E402
from great_expectations.expectations.metrics.table_metric_provider import (  # noqa: E402
    TableMetricProvider,
)

from kepsilon.engine.criteria import (  # noqa: E402
    build_criteria,
    declared,
    gate_parameters,
    groups_meet,
    load_sensitive_hierarchies,  # noqa: E402
)
from kepsilon.tasks.errors import SpecError, ValidationFailed  # noqa: E402

# Great Expectations fingerprints every pandas batch under HASH_THRESHOLD bytes before checking it: an MD5 over
# a hash of every cell, kept as the "pandas_data_fingerprint" batch marker of the validation result. The gate
# reads each check's pass or fail and nothing else, and a digest of the private records has no place in a
# result. A 500,000-record part of the fine population is checked in 0.02 s of CPU instead of 0.16-0.22 s
# (measured here, alternated runs).
_pandas_engine.HASH_THRESHOLD = 0


logger = logging.getLogger(__name__)
# GE logs at INFO/DEBUG on every run; a release log should carry our outcome, not its chatter.
logging.getLogger("great_expectations").setLevel(logging.WARNING)
logging.getLogger("great_expectations.data_context.types.base").setLevel(logging.WARNING)  # set to INFO by GE itself

K_ANONYMOUS_GROUPS = "k_anonymous_groups"
SUPPRESSION_WITHIN_BUDGET = "suppression_within_budget"
NO_EXPLICIT_IDENTIFIERS = "no_explicit_identifiers"
E_QUASI_NUMERIC_FINITE = "e_quasi_numeric_finite"
K_QUASI_COLUMNS_PRESENT = "k_quasi_columns_present"
PUBLISHED_ROWS_MATCH_ACCOUNTING = "published_rows_match_accounting"
L_DIVERSITY = "l_diversity"
T_CLOSENESS = "t_closeness"
PROSECUTOR_RISK_WITHIN_LIMIT = "prosecutor_risk_within_limit"
LINKING_RISK_WITHIN_LIMIT = "linking_risk_within_limit"
RECORDS_PUBLISHED = "records_published"

_CHECK_META_KEY = "kepsilon_check"


# --------------------------------------------------------------------------- plain computations


def smallest_group_size(frame: pd.DataFrame, columns: list[str], weight_column: str | None = None) -> int | None:
    """Size of the smallest group of rows sharing their values on `columns`; None for no rows.

    Only columns present in `frame` are grouped on: an adversary can link only on published
    columns, so this is the k the published table really offers (a missing k-quasi column is a
    separate check). Missing values form their own group (``dropna=False``) — dropping them would
    hide small groups. With no column to group on, the whole table is one group. With
    ``weight_column``, each row stands for that many records (the partitioned path's table of
    published groups and their sizes).
    """
    if len(frame) == 0:
        return None
    present = [c for c in columns if c in frame.columns and c != weight_column]
    weights = frame[weight_column] if weight_column is not None else pd.Series(1, index=frame.index)
    if not present:
        return int(weights.sum())
    sizes = weights.groupby([frame[c] for c in present], dropna=False, sort=False, observed=True).sum()
    return int(sizes.min())


def is_finite_numeric(values: pd.Series) -> bool:
    """True when `values` has an integer or float dtype and holds no NaN, missing or ±inf value.

    Booleans, complex numbers and object columns (even of numbers) are refused: the noise step
    works on real numbers and a text or mixed column means something upstream went wrong.
    """
    dtype = values.dtype
    # pandas counts neither bool nor complex as an integer or float dtype.
    if not (pd.api.types.is_integer_dtype(dtype) or pd.api.types.is_float_dtype(dtype)):
        return False
    as_float = values.to_numpy(dtype=np.float64, na_value=np.nan)
    return bool(np.isfinite(as_float).all())


# --------------------------------------------------------------------------- GE metrics


class TableMinGroupSize(TableMetricProvider):
    """Metric: the smallest group size when rows are grouped by `group_columns` (a count, no values)."""

    metric_name = "table.kepsilon_min_group_size"
    value_keys = ("group_columns", "weight_column")

    @metric_value(engine=PandasExecutionEngine)
    def _pandas(
        cls,
        execution_engine: PandasExecutionEngine,
        metric_domain_kwargs: dict,
        metric_value_kwargs: dict,
        metrics: dict[str, Any],
        runtime_configuration: dict,
    ):
        frame, _, _ = execution_engine.get_compute_domain(
            metric_domain_kwargs, domain_type=MetricDomainTypes.TABLE
        )
        return smallest_group_size(
            frame, list(metric_value_kwargs["group_columns"]), metric_value_kwargs.get("weight_column")
        )


class TableGroupsMeetCriterion(TableMetricProvider):
    """Metric: whether every group (rows sharing `group_columns`) meets a sensitive criterion on
    `column` (a boolean, no values)."""

    metric_name = "table.kepsilon_groups_meet_criterion"
    value_keys = ("group_columns", "column", "parameters", "weight_column")

    @metric_value(engine=PandasExecutionEngine)
    def _pandas(
        cls,
        execution_engine: PandasExecutionEngine,
        metric_domain_kwargs: dict,
        metric_value_kwargs: dict,
        metrics: dict[str, Any],
        runtime_configuration: dict,
    ):
        frame, _, _ = execution_engine.get_compute_domain(
            metric_domain_kwargs, domain_type=MetricDomainTypes.TABLE
        )
        return groups_meet(
            frame,
            list(metric_value_kwargs["group_columns"]),
            metric_value_kwargs["column"],
            dict(metric_value_kwargs["parameters"]),
            metric_value_kwargs.get("weight_column"),
        )


class ColumnIsFiniteNumeric(ColumnAggregateMetricProvider):
    """Metric: whether a column is numeric with only finite values (a boolean, no values)."""

    metric_name = "column.kepsilon_is_finite_numeric"
    # Nulls must reach the check: a NaN in an ε-quasi is exactly what it has to catch.
    filter_column_isnull = False

    @column_aggregate_value(engine=PandasExecutionEngine)
    def _pandas(cls, column: pd.Series, **kwargs):
        return is_finite_numeric(column)


# --------------------------------------------------------------------------- GE expectations


class ExpectColumnGroupsToHaveAtLeastKRows(BatchExpectation):
    """Expect every group of rows sharing their `group_columns` values to have at least `k` rows.

    This is k-anonymity of the published table over those columns. Group-by is on the columns
    present in the batch (see `smallest_group_size`); an empty batch passes vacuously.
    """

    group_columns: list[str]
    k: int
    weight_column: str | None = None  # rows stand for this many records (an aggregated table)

    metric_dependencies: ClassVar[tuple[str, ...]] = ("table.kepsilon_min_group_size",)
    success_keys: ClassVar[tuple[str, ...]] = ("group_columns", "k", "weight_column")
    args_keys: ClassVar[tuple[str, ...]] = ("group_columns", "k")

    def _validate(self, metrics: dict, runtime_configuration: dict | None = None, execution_engine=None):
        smallest = metrics["table.kepsilon_min_group_size"]
        return {"success": smallest is None or smallest >= self.k}


class _ExpectGroupsToMeetCriterion(BatchExpectation):
    """Expect every group of rows sharing their `group_columns` values to meet a criterion on `column`."""

    group_columns: list[str]
    column: str
    parameters: dict
    weight_column: str | None = None  # rows stand for this many records (an aggregated table)

    metric_dependencies: ClassVar[tuple[str, ...]] = ("table.kepsilon_groups_meet_criterion",)
    success_keys: ClassVar[tuple[str, ...]] = ("group_columns", "column", "parameters", "weight_column")
    args_keys: ClassVar[tuple[str, ...]] = ("group_columns", "column", "parameters")

    def _validate(self, metrics: dict, runtime_configuration: dict | None = None, execution_engine=None):
        return {"success": bool(metrics["table.kepsilon_groups_meet_criterion"])}


class ExpectGroupsToBeLDiverse(_ExpectGroupsToMeetCriterion):
    """Expect every group to be ℓ-diverse on `column` (`parameters`: l, variant, c)."""


class ExpectGroupsToBeTClose(_ExpectGroupsToMeetCriterion):
    """Expect every group's distribution of `column` to lie within EMD t of the whole input table's
    (`parameters`: t, distance, domain, reference distribution, hierarchy parents, numeric)."""


class ExpectGroupsProsecutorRiskAtMost(BatchExpectation):
    """Expect the prosecutor risk of the published groups, 1/smallest group, to be at most `max_risk`."""

    group_columns: list[str]
    max_risk: float
    weight_column: str | None = None  # rows stand for this many records (an aggregated table)

    metric_dependencies: ClassVar[tuple[str, ...]] = ("table.kepsilon_min_group_size",)
    success_keys: ClassVar[tuple[str, ...]] = ("group_columns", "max_risk", "weight_column")
    args_keys: ClassVar[tuple[str, ...]] = ("group_columns", "max_risk")

    def _validate(self, metrics: dict, runtime_configuration: dict | None = None, execution_engine=None):
        smallest = metrics["table.kepsilon_min_group_size"]
        return {"success": smallest is None or 1.0 / smallest <= self.max_risk}


class ExpectTableColumnsToExcludeSet(BatchExpectation):
    """Expect none of `column_set` to be a column of the table, compared case-insensitively.

    Case-insensitive because a renamed ``Name`` is as identifying as ``NAME``; a false alarm costs
    a rerun, a missed identifier costs a breach.
    """

    column_set: list[str]

    metric_dependencies: ClassVar[tuple[str, ...]] = ("table.columns",)
    success_keys: ClassVar[tuple[str, ...]] = ("column_set",)
    args_keys: ClassVar[tuple[str, ...]] = ("column_set",)

    def _validate(self, metrics: dict, runtime_configuration: dict | None = None, execution_engine=None):
        present = {str(c).casefold() for c in metrics["table.columns"]}
        forbidden = {c.casefold() for c in self.column_set}
        return {"success": not (present & forbidden)}


class ExpectColumnValuesToBeFiniteNumbers(ColumnAggregateExpectation):
    """Expect the column to have an integer or float dtype with every value finite (no NaN, ±inf)."""

    metric_dependencies: ClassVar[tuple[str, ...]] = ("column.kepsilon_is_finite_numeric",)
    success_keys: ClassVar[tuple[str, ...]] = ()

    def _validate(self, metrics: dict, runtime_configuration: dict | None = None, execution_engine=None):
        return {"success": bool(metrics["column.kepsilon_is_finite_numeric"])}


# --------------------------------------------------------------------------- the gate


@dataclass(frozen=True)
class ValidationReport:
    """Outcome of the release gate: per check only its name and whether it passed.

    Nothing else from Great Expectations is kept — observed values, exception texts and partial
    results may hold private data.
    """

    checks: list[dict] = field(default_factory=list)
    success: bool = False

    @property
    def failed_checks(self) -> list[str]:
        """Names of the checks that failed, in report order (for `ValidationFailed`)."""
        return [c["name"] for c in self.failures]

    @property
    def failures(self) -> list[dict]:
        """The failed checks that gate (a check with ``gates: False`` is reported only), in report order."""
        return [c for c in self.checks if not c["success"] and c.get("gates", True)]


def _figure(value: float) -> str:
    return f"{100 * value:.2f} %" if 0 < abs(value) <= 1 and value != int(value) else f"{value:g}"


def validation_failure(report: ValidationReport) -> ValidationFailed:
    """The error of a gate that failed after the noise: each failed check with its measured figure and limit
    where it has them, and the next step. Its message goes to the steward's terminal and the private record,
    never to the public manifest (nothing is published)."""
    parts = []
    for check in report.failures:
        text = check["name"]
        if "figure" in check:
            text += f" {_figure(check['figure'])}"
        if "limit" in check:
            text += f" (limit {_figure(check['limit'])})"
        parts.append(text)
    details = ", ".join(parts) + "; next: `kepsilon check SPEC` predicts the gate before any ε, `kepsilon advise SPEC` compares k and ε"
    return ValidationFailed(report.failed_checks, details)


def gated(checks: list[dict]) -> bool:
    """Whether every check that gates passed."""
    return all(c["success"] for c in checks if c.get("gates", True))


def plain_checks(rows_in: int, rows_removed: int, suppression_budget, linking_risk, max_linking_risk, linking_gates: bool) -> list[dict]:
    """The gate's arithmetic checks with their figure and limit (private record only): a release with
    records, the suppression budget, the linking risk. ``linking_gates`` False (bounds mode, where the risk
    reads the true ε-quasi values): the linking risk is recorded with its verdict but decides nothing."""
    checks = []
    if suppression_budget is not None:
        published = rows_in - rows_removed
        checks.append({"name": RECORDS_PUBLISHED, "success": published > 0, "figure": float(published), "limit": 1.0})
        checks.append({
            "name": SUPPRESSION_WITHIN_BUDGET,
            "success": bool(suppression_within_budget(rows_in, rows_removed, suppression_budget)),
            "figure": rows_removed / rows_in, "limit": float(suppression_budget),
        })
    if max_linking_risk is not None:
        risk_ok = linking_risk is not None and math.isfinite(linking_risk) and linking_risk <= max_linking_risk
        check = {"name": LINKING_RISK_WITHIN_LIMIT, "success": bool(risk_ok), "limit": float(max_linking_risk)}
        if linking_risk is not None and math.isfinite(linking_risk):
            check["figure"] = float(linking_risk)
        if not linking_gates:
            check["gates"] = False
        checks.append(check)
    return checks


def validate_release(
    published: pd.DataFrame,
    *,
    k_quasi: list[str],
    e_quasi: list[str],
    explicit: list[str],
    k: int,
    rows_in: int,
    rows_removed: int,
    suppression_budget: float | None,
    criteria: list | None = None,
    linking_risk: float | None = None,
    max_linking_risk: float | None = None,
    max_prosecutor_risk: float | None = None,
    linking_gates: bool = True,
) -> ValidationReport:
    """Check the table about to be published and report, per check, a name, a boolean and, for the
    arithmetic checks, the figure and the limit (private).

    Guarantee: ``report.success`` is True only if every check listed in the module docstring
    passed; a check whose expectation raised inside Great Expectations counts as failed, and so do
    all expectation checks if the suite run itself raises. The report, the logs and any exception
    this function raises carry no data value. Parameters are validated first (SpecError names the
    parameter).

    ``criteria``: the sensitive columns' criteria (``kepsilon.engine.criteria.ColumnCriteria``, built
    from the input table); one check per declared ℓ-diversity or t-closeness. ``linking_risk`` with
    ``max_linking_risk``: the plain risk check; ``max_prosecutor_risk``: the group-size risk check.
    """
    _check_parameters(published, k_quasi, e_quasi, explicit, k, rows_in, rows_removed, suppression_budget)
    expectations = _build_expectations(k_quasi, e_quasi, explicit, k, rows_in - rows_removed)
    expectations += _disclosure_expectations(k_quasi, criteria or [], max_prosecutor_risk)
    outcomes = _run_suite(published, expectations)
    checks = [{"name": name, "success": bool(ok)} for name, ok in outcomes.items()]
    return _with_plain_checks(checks, rows_in, rows_removed, suppression_budget, linking_risk, max_linking_risk, linking_gates)


def _with_plain_checks(checks, rows_in, rows_removed, suppression_budget, linking_risk, max_linking_risk, linking_gates):
    """The report: k-anonymity first, then the records and suppression checks, the others, the linking risk."""
    plain = plain_checks(rows_in, rows_removed, suppression_budget, linking_risk, max_linking_risk, linking_gates)
    risk = [c for c in plain if c["name"] == LINKING_RISK_WITHIN_LIMIT]
    counts = [c for c in plain if c["name"] != LINKING_RISK_WITHIN_LIMIT]
    checks = checks[:1] + counts + checks[1:] + risk
    return ValidationReport(checks=checks, success=gated(checks))


# --------------------------------------------------------------------------- the partitioned path's gate
#
# The partitioned (Dask) path never holds the published table in one place, so the gate's checks run
# where their data is, each as real Great Expectations expectations:
#
# * per published part (on the worker that wrote it): the column checks — no explicit identifier,
#   ε-quasis numeric and finite, k-quasis present (``validate_part``);
# * per bucket of published groups (on the worker that added the bucket up from the parts as written;
#   a group lies in one bucket), on a table of one row per group (its labels and its record count):
#   k-anonymity and prosecutor risk with the group expectations weighted by the count, and per declared
#   criterion, on a table of (group labels, sensitive value, records), ℓ-diversity or t-closeness, weighted
#   by the count (``validate_groups``); a check passes when it passes in every bucket;
# * in the flow, the row accounting as the sum of the buckets' counts (``ExpectColumnSumToBeBetween`` on a
#   table of one row per bucket), suppression and linking risk as in the in-memory gate (plain arithmetic).
#
# ``validate_aggregated`` puts the outcomes together under the in-memory gate's names and in its order.

_PART_CHECKS = (NO_EXPLICIT_IDENTIFIERS, E_QUASI_NUMERIC_FINITE, K_QUASI_COLUMNS_PRESENT)


def validate_part(frame: pd.DataFrame, *, k_quasi: list[str], e_quasi: list[str], explicit: list[str]) -> dict[str, bool]:
    """The gate's column checks on one published part: check name -> passed (names and booleans only)."""
    expectations = [
        (name, expectation)
        for name, expectation in _build_expectations(k_quasi, e_quasi, explicit, 1, len(frame))
        if name.split(":", 1)[0] in _PART_CHECKS
    ]
    return _run_suite(frame, expectations)


def weight_column_name(columns: list[str]) -> str:
    """A name for the record-count column of an aggregated table that no published column has."""
    name = "records"
    while name in columns:
        name = "_" + name
    return name


def validate_groups(
    groups: pd.DataFrame,
    criterion_tables: dict[str, pd.DataFrame],
    *,
    weight_column: str,
    k_quasi: list[str],
    k: int,
    criteria: list | None = None,
    max_prosecutor_risk: float | None = None,
) -> dict[str, bool]:
    """The gate's group expectations, by Great Expectations, on one set of published groups: check name ->
    passed (names and booleans only).

    ``groups``: one row per published group, its k-quasi labels and its records (``weight_column``);
    ``criterion_tables``: per declared criterion's column, (labels, value, records) rows. A partitioned
    release runs this on each bucket of groups, on the worker that added the bucket up (every group lies in
    exactly one bucket), and :func:`validate_aggregated` combines the buckets: each of these checks holds for
    every group, so it holds for all groups exactly when it holds in every bucket.
    """
    group_pairs: list[tuple[str, Any]] = [
        (K_ANONYMOUS_GROUPS, ExpectColumnGroupsToHaveAtLeastKRows(group_columns=list(k_quasi), k=int(k), weight_column=weight_column)),
    ]
    if max_prosecutor_risk is not None:
        group_pairs.append((PROSECUTOR_RISK_WITHIN_LIMIT, ExpectGroupsProsecutorRiskAtMost(
            group_columns=list(k_quasi), max_risk=float(max_prosecutor_risk), weight_column=weight_column)))
    for name, expectation in group_pairs:
        expectation.meta = {_CHECK_META_KEY: name}
    outcomes = _run_suite(groups, group_pairs)
    for name, expectation in _disclosure_expectations(k_quasi, criteria or [], None, weight_column):
        outcomes.update(_run_suite(criterion_tables[expectation.column], [(name, expectation)]))
    return outcomes


def validate_aggregated(
    group_checks: list[dict[str, bool]],
    records_written: list[int],
    part_checks: list[dict[str, bool]],
    *,
    weight_column: str,
    k_quasi: list[str],
    e_quasi: list[str],
    rows_in: int,
    rows_removed: int,
    suppression_budget: float,
    criteria: list | None = None,
    linking_risk: float | None = None,
    max_linking_risk: float | None = None,
    max_prosecutor_risk: float | None = None,
    linking_gates: bool = True,
) -> ValidationReport:
    """The release gate of a partitioned release, with the in-memory gate's checks, names and order.

    ``group_checks``: :func:`validate_groups` of every bucket of published groups (a group check passes when
    it passed on every bucket; no bucket, no pass); ``records_written``: every bucket's records (the row
    accounting is their sum, checked by Great Expectations on that small table: one row per bucket);
    ``part_checks``: ``validate_part`` of every published part (a check passes when it passed on every
    part). Fails closed like :func:`validate_release`.
    """
    rows_published = rows_in - rows_removed
    accounting = gx.expectations.ExpectColumnSumToBeBetween(
        column=weight_column, min_value=int(rows_published), max_value=int(rows_published))
    accounting.meta = {_CHECK_META_KEY: PUBLISHED_ROWS_MATCH_ACCOUNTING}
    written = pd.DataFrame({weight_column: np.asarray(records_written, dtype=np.int64)})
    outcomes = _run_suite(written, [(PUBLISHED_ROWS_MATCH_ACCOUNTING, accounting)])
    names = [K_ANONYMOUS_GROUPS] + [name for name, _ in _disclosure_expectations(k_quasi, criteria or [], max_prosecutor_risk)]
    for name in names:
        outcomes[name] = bool(group_checks) and all(checks.get(name, False) for checks in group_checks)
    part_names = [name for name, _ in _build_expectations(k_quasi, e_quasi, [], 1, 0) if name.split(":", 1)[0] in _PART_CHECKS]
    for name in part_names:
        outcomes[name] = bool(part_checks) and all(checks.get(name, False) for checks in part_checks)
    ordered = [K_ANONYMOUS_GROUPS, *part_names, PUBLISHED_ROWS_MATCH_ACCOUNTING]
    ordered += [name for name in names if name.split(":", 1)[0] in (L_DIVERSITY, T_CLOSENESS)]
    if max_prosecutor_risk is not None:
        ordered.append(PROSECUTOR_RISK_WITHIN_LIMIT)
    checks = [{"name": name, "success": bool(outcomes.get(name, False))} for name in ordered]
    return _with_plain_checks(checks, rows_in, rows_removed, suppression_budget, linking_risk, max_linking_risk, linking_gates)


def suppression_within_budget(rows_in: int, rows_removed: int, suppression_budget: float) -> bool:
    """Whether the suppressed fraction ``rows_removed / rows_in`` is at most the budget."""
    return rows_removed / rows_in <= suppression_budget


def _check_parameters(published, k_quasi, e_quasi, explicit, k, rows_in, rows_removed, suppression_budget) -> None:
    """Refuse parameters the checks cannot be meaningful with, naming the parameter."""
    if not isinstance(published, pd.DataFrame):
        raise SpecError("published", "must be a pandas DataFrame")
    for name, columns in (("k_quasi", k_quasi), ("e_quasi", e_quasi), ("explicit", explicit)):
        if isinstance(columns, str) or not all(isinstance(c, str) and c for c in columns):
            raise SpecError(name, "must be a list of non-empty column names")
    if not k_quasi:
        raise SpecError("k_quasi", "must name at least one column")
    if not _is_int(k) or k < 1:
        raise SpecError("k", "must be an integer >= 1")
    # Without a budget (the DP mode) no ratio is taken, so an empty sample is a valid input.
    if not _is_int(rows_in) or rows_in < (0 if suppression_budget is None else 1):
        raise SpecError("rows_in", "must be an integer >= 1")
    if not _is_int(rows_removed) or not 0 <= rows_removed <= rows_in:
        raise SpecError("rows_removed", "must be an integer between 0 and rows_in")
    if suppression_budget is not None and (
        isinstance(suppression_budget, bool)
        or not isinstance(suppression_budget, numbers.Real)
        or not math.isfinite(suppression_budget)
        or not 0 <= float(suppression_budget) <= 1
    ):
        raise SpecError("suppression_budget", "must be a number between 0 and 1")


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _build_expectations(k_quasi, e_quasi, explicit, k, rows_published) -> list[tuple[str, Any]]:
    """One (check name, expectation) pair per GE check, in report order (k-anonymity first)."""
    pairs: list[tuple[str, Any]] = [
        (K_ANONYMOUS_GROUPS, ExpectColumnGroupsToHaveAtLeastKRows(group_columns=list(k_quasi), k=int(k))),
        (NO_EXPLICIT_IDENTIFIERS, ExpectTableColumnsToExcludeSet(column_set=list(explicit))),
    ]
    pairs += [
        (f"{E_QUASI_NUMERIC_FINITE}:{column}", ExpectColumnValuesToBeFiniteNumbers(column=column))
        for column in e_quasi
    ]
    pairs += [
        (K_QUASI_COLUMNS_PRESENT, gx.expectations.ExpectTableColumnsToMatchSet(column_set=list(k_quasi), exact_match=False)),
        (PUBLISHED_ROWS_MATCH_ACCOUNTING, gx.expectations.ExpectTableRowCountToEqual(value=int(rows_published))),
    ]
    for name, expectation in pairs:
        expectation.meta = {_CHECK_META_KEY: name}
    return pairs


def _disclosure_expectations(k_quasi, criteria, max_prosecutor_risk, weight_column=None) -> list[tuple[str, Any]]:
    """The checks on sensitive columns and prosecutor risk, named ``l_diversity:<col>`` and so on."""
    pairs: list[tuple[str, Any]] = []
    for criterion in declared(criteria):
        parameters = gate_parameters(criterion)
        if criterion.l is not None:
            only_l = {key: parameters[key] for key in ("l", "variant", "c")}
            pairs.append((f"{L_DIVERSITY}:{criterion.column}", ExpectGroupsToBeLDiverse(
                group_columns=list(k_quasi), column=criterion.column, parameters=only_l, weight_column=weight_column)))
        if criterion.t is not None:
            only_t = {key: value for key, value in parameters.items() if key not in ("l", "variant", "c")}
            pairs.append((f"{T_CLOSENESS}:{criterion.column}", ExpectGroupsToBeTClose(
                group_columns=list(k_quasi), column=criterion.column, parameters=only_t, weight_column=weight_column)))
    if max_prosecutor_risk is not None:
        pairs.append((PROSECUTOR_RISK_WITHIN_LIMIT, ExpectGroupsProsecutorRiskAtMost(
            group_columns=list(k_quasi), max_risk=float(max_prosecutor_risk))))
    for name, expectation in pairs:
        expectation.meta = {_CHECK_META_KEY: name}
    return pairs


def _run_suite(published: pd.DataFrame, expectations: list[tuple[str, Any]]) -> dict[str, bool]:
    """Run the expectations as one in-memory suite; map each check name to pass/fail.

    Fails closed: a check whose result is missing, unsuccessful or carries a raised exception is
    False, and if the run itself raises every check is False (only the exception's type is logged,
    its text may quote data).
    """
    outcomes = {name: False for name, _ in expectations}
    definition = None
    try:
        definition = _suite_for(expectations)
        results = definition.run(
            batch_parameters={"dataframe": published},
            result_format="BOOLEAN_ONLY",
        )
    except Exception as error:  # noqa: BLE001 — any GE failure must close the gate, not open it
        logger.warning("release validation suite raised %s; every check marked failed", type(error).__name__)
        return outcomes
    finally:
        _forget_records(definition)
    passed: dict[str, bool] = {}
    for result in results.results:
        name = (result.expectation_config.meta or {}).get(_CHECK_META_KEY)
        if name not in outcomes:
            continue
        ok = bool(result.success) and not _raised(result.exception_info)
        passed[name] = passed.get(name, True) and ok
    outcomes.update(passed)
    return outcomes


_SUITES = threading.local()  # per thread: a Great Expectations context is not made to be shared
_SUITE_RUNS = 256  # a fresh context after so many runs, whatever a context keeps of each run


def _suite_for(expectations: list[tuple[str, Any]]):
    """The validation definition of these expectations, built once per thread and reused while the
    expectations' configurations are the same. A Dask worker checks every part and every bucket of a
    release against the same few suites; building a context, its data source and a suite took most of
    each check's time (about 0.08 s of a 500,000-row part's 0.17 s)."""
    key = json.dumps([(name, expectation.configuration.to_json_dict()) for name, expectation in expectations],
                     sort_keys=True, default=str)
    if getattr(_SUITES, "definitions", None) is None or _SUITES.runs >= _SUITE_RUNS:
        _SUITES.definitions, _SUITES.runs = {}, 0
    _SUITES.runs += 1
    if key not in _SUITES.definitions:
        if len(_SUITES.definitions) >= 8:
            _SUITES.definitions.clear()
        _SUITES.definitions[key] = _validation_definition(expectations)
    return _SUITES.definitions[key]


def _forget_records(definition) -> None:
    """Drop what a kept suite holds of the frame it last checked: its data source's execution engine caches
    the batch (the records), and a suite kept for the next part must not keep this part's records in the
    worker's memory after the task. The engine is made again on the next run."""
    source = getattr(definition, "data_source", None)
    if source is not None and hasattr(source, "_execution_engine"):
        source._execution_engine = None


def _validation_definition(expectations: list[tuple[str, Any]]):
    """A fresh ephemeral context with a dataframe asset, the suite and its validation definition."""
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    suffix = uuid.uuid4().hex
    batch = (
        context.data_sources.add_pandas(f"release-{suffix}")
        .add_dataframe_asset("published")
        .add_batch_definition_whole_dataframe("whole")
    )
    # Suites and definitions must be registered with the context before they can run.
    suite = context.suites.add(gx.ExpectationSuite(name=f"release-gate-{suffix}"))
    for _, expectation in expectations:
        suite.add_expectation(expectation)
    return context.validation_definitions.add(
        gx.ValidationDefinition(data=batch, suite=suite, name=f"release-gate-{suffix}")
    )


def _raised(exception_info) -> bool:
    """Whether GE recorded a raised exception; it nests the info per metric in some paths."""
    if not exception_info:
        return False
    if "raised_exception" in exception_info:
        return bool(exception_info["raised_exception"])
    return any(_raised(info) for info in exception_info.values() if isinstance(info, dict))


# --- Prefect task (thin wrapper; the functions above know nothing of Prefect) -----------------


@task(name="validate", cache_policy=NO_CACHE, persist_result=False)
def check_release(
    published: pd.DataFrame, spec, rows_in: int, rows_removed: int, source: pd.DataFrame | None = None,
    linking_risk: float | None = None,
) -> ValidationReport:
    """Prefect task: the release gate. Its report holds check names and booleans only.

    ``source``: the classified input table; the sensitive criteria's reference distributions are built
    from it here, afresh, not taken from the anonymiser.
    """
    roles = spec.roles.names()
    criteria = []
    if source is not None:
        criteria = build_criteria(spec.roles.sensitive, source, load_sensitive_hierarchies(spec.roles.sensitive))
    return validate_release(
        published,
        k_quasi=roles["k_quasi"],
        e_quasi=roles["e_quasi"],
        explicit=roles["explicit"],
        k=spec.k,
        rows_in=rows_in,
        rows_removed=rows_removed,
        suppression_budget=spec.suppression_budget,
        criteria=criteria,
        linking_risk=linking_risk,
        max_linking_risk=spec.max_linking_risk,
        max_prosecutor_risk=spec.max_prosecutor_risk,
        # Bounds mode: the linking risk reads the true ε-quasi values, so it is recorded, not gated (issue 21).
        linking_gates=spec.scale_basis == "diameter",
    )


@task(name="validate-dp", cache_policy=NO_CACHE, persist_result=False)
def check_dp_release(published: pd.DataFrame, spec, rows_sampled: int, rows_suppressed: int) -> ValidationReport:
    """Prefect task: the release gate of the DP mode, the same suite with every released column as
    the group key (so k is checked on exactly the groups the theorem speaks of) and no budget check.

    Its checks read only the published table and the stage's own counts, so its verdict is a function
    of the mechanism's output (post-processing): it cannot weaken the (ε, δ) guarantee.
    """
    roles = spec.roles.names()
    released = roles["k_quasi"] + roles["e_quasi"] + roles["sensitive"]
    return validate_release(
        published,
        k_quasi=released,
        e_quasi=[],
        explicit=roles["explicit"],
        k=spec.k,
        rows_in=rows_sampled,
        rows_removed=rows_suppressed,
        suppression_budget=None,
        max_prosecutor_risk=spec.max_prosecutor_risk,
    )
