"""Classify: give every column exactly one role and remove the explicit identifiers (method.md §1).

This is the gate before any budget is touched: everything the later stages would refuse about the
*shape* of the data (unknown or unroled columns, non-numeric or non-finite ε-quasis, missing values in
a quasi-identifier, a type data.csv cannot carry, k larger than the table) is refused here, so a bad
input never reserves ε.

Every check counts first and refuses afterwards (``classify_findings``, then ``refuse_findings``), so a
table processed in partitions (``tasks/partitioned.py``) adds up each partition's counts with
``Findings.add`` and refuses exactly what ``classify`` would refuse on the whole table, in the same order
and with the same counts.

It is also where the spec, not a parser, decides what the values mean, role by role. A value is
missing when it is a CSV cell whose exact text is listed in ``source.missing`` (default: the empty
cell) or a Parquet null. Then:

* k-quasi: missing values are refused; every other value is its exact text (a typed Parquet value
  its ``data.csv`` text), matched against the hierarchy's leaves as text and generalised as text;
* ε-quasi: missing values are refused; the values are parsed as numbers, strictly (``parse_numbers``),
  and become float64 — the only column ever converted (in the DP mode, ``privacy_model: dp``, an
  ε-quasi is generalised through its hierarchy and treated as a k-quasi: text);
* sensitive: published as read; a missing CSV cell becomes a null (an empty cell in data.csv, a null
  in data.parquet), a Parquet column keeps its type.
"""

import ipaddress
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE
from pyarrow import types as pa_types

from kepsilon.spec import ReleaseSpec, Roles, SourceFormat

from .errors import InputError, SpecError
from .values import arrow_type, cell_texts, parse_numbers, read_numbers, refuse_non_numbers, unpublishable_reason


@dataclass(frozen=True)
class ClassifiedTable:
    """The source without its explicit identifiers, with the roles that were applied."""

    frame: pd.DataFrame
    roles: dict[str, list[str]]


def check_roles(columns: list[str], roles: Roles) -> None:
    """Every column has a role and every roled column exists; errors name the column."""
    roled = {column for names in roles.names().values() for column in names}
    for column in roles.names().values():
        for name in column:
            if name not in columns:
                raise InputError(name, "is named in the spec's roles but is not a column of the source")
    for name in columns:
        if name not in roled:
            raise InputError(
                name, "has no role; give it one of explicit, k_quasi, e_quasi or sensitive (nothing is released unroled)"
            )


_NON_NUMERIC = "ε-quasi values must be numeric; the column holds non-numeric values"


def check_e_quasi_values(frame: pd.DataFrame, column: str) -> None:
    """An ε-quasi must be numeric and finite in every record: noise on NaN or text is meaningless."""
    refuse_non_finite(column, non_finite_count(frame[column], column))


def non_finite_count(values: pd.Series, column: str) -> int:
    """Records of a numeric column that are missing, NaN or ±inf; a non-numeric column is refused."""
    if not (pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values)):
        raise InputError(column, _NON_NUMERIC)
    return int((~np.isfinite(values.to_numpy(dtype=np.float64, na_value=np.nan))).sum())


def refuse_non_finite(column: str, count: int) -> None:
    if count:
        raise InputError(column, f"ε-quasi values must be finite; {count} record(s) are missing, NaN or ±inf")


def check_e_quasi_bounds(frame: pd.DataFrame, quasi) -> None:
    """Refuse values outside the ε-quasi's public bounds unless the spec asks for them to be clamped.

    The bounds are the plausibility range the noise and the public grid are calibrated to; a value
    outside them is either an error in the data or an outlier the steward must decide about. The
    count is given, never the values.
    """
    refuse_outside_bounds(quasi, outside_bounds_count(frame[quasi.column], quasi))


def outside_bounds_count(values: pd.Series, quasi) -> int:
    """Records outside the ε-quasi's public bounds (0 when the spec clamps them)."""
    if quasi.out_of_bounds == "clamp":
        return 0
    numbers = values.to_numpy(dtype=np.float64, na_value=np.nan)
    return int(((numbers < quasi.lower) | (numbers > quasi.upper)).sum())


def refuse_outside_bounds(quasi, count: int) -> None:
    if count:
        raise InputError(
            quasi.column,
            f"{count} record(s) lie outside the public bounds [{quasi.lower:g}, {quasi.upper:g}]; "
            "correct them, widen the bounds, or set out_of_bounds: clamp",
        )


def check_k_quasi_values(frame: pd.DataFrame, column: str, missing: np.ndarray | None = None) -> None:
    """A k-quasi may not be missing: an absent value cannot be generalised or grouped honestly."""
    absent = frame[column].isna().to_numpy(dtype=bool) if missing is None else missing
    refuse_k_quasi_missing(column, int(absent.sum()))


def refuse_k_quasi_missing(column: str, count: int) -> None:
    if count:
        raise InputError(column, f"k-quasi has {count} missing value(s); fill or remove them before release")


def missing_values(values: pd.Series, missing_texts: list[str] | None) -> np.ndarray:
    """Which values are missing: a null, or (CSV) a cell whose exact text the spec lists as missing."""
    absent = values.isna().to_numpy(dtype=bool, copy=True)
    if missing_texts is not None and not isinstance(values.dtype, pd.ArrowDtype):
        absent |= values.isin(missing_texts).to_numpy(dtype=bool)
    return absent


def k_quasi_texts(values: pd.Series) -> pd.Series:
    """A k-quasi as text: CSV cells as they are, typed (Parquet) values as data.csv writes them."""
    return k_quasi_texts_and_codes(values)[0]


def k_quasi_texts_and_codes(values: pd.Series, factorised: tuple | None = None) -> tuple[pd.Series, np.ndarray | None]:
    """:func:`k_quasi_texts`, and a code per row that is equal exactly when the rows' texts are (a missing
    value's code its own), from the same factorisation: the histogram numbers its tuples from these codes
    instead of factorising the texts again (``tuple_histogram``'s ``codes``). None where the column is
    already text (CSV cells), which is returned as it is. ``factorised``: ``pd.factorize(values)``, where
    the caller made it already (:func:`needs_texts`).

    Converted once per distinct value (a k-quasi repeats its values): the distinct values' texts, then
    one take.
    """
    if not needs_texts(values):
        return values, None
    codes, distinct = pd.factorize(values, use_na_sentinel=True) if factorised is None else factorised
    texts = pd.array(cell_texts(pd.Series(distinct, dtype=values.dtype)), dtype=str)
    texts = pd.array([*texts, None], dtype=str)  # code -1 (a missing value) takes the last: missing
    # Two distinct values may be written alike: the codes follow the texts, not the values.
    text_codes, _ = pd.factorize(texts, use_na_sentinel=False)
    return pd.Series(texts.take(codes), index=values.index, name=values.name), text_codes[codes]


def needs_texts(values: pd.Series) -> bool:
    """Whether :func:`k_quasi_texts` converts the column (it factorises it then): all but CSV cells."""
    return not (arrow_type(values.dtype) is None and isinstance(values.dtype, pd.StringDtype))


def e_quasi_numbers(values: pd.Series, column: str) -> pd.Series:
    """An ε-quasi as float64: text parsed strictly, a numeric (not boolean) column converted.

    The caller has refused missing values. Non-finite numbers are left for ``check_e_quasi_values``.
    """
    if isinstance(values.dtype, pd.StringDtype) or values.dtype == object or _is_arrow_text(values.dtype):
        return pd.Series(parse_numbers(values, column), index=values.index, name=values.name)
    if pd.api.types.is_bool_dtype(values.dtype) or not pd.api.types.is_numeric_dtype(values.dtype):
        raise InputError(column, "ε-quasi values must be numeric; the column holds non-numeric values")
    return pd.Series(values.to_numpy(dtype=np.float64, na_value=np.nan), index=values.index, name=values.name)


def _is_arrow_text(dtype) -> bool:
    data_type = arrow_type(dtype)
    return data_type is not None and (pa_types.is_string(data_type) or pa_types.is_large_string(data_type))


# --- identifier detection --------------------------------------------------------------------------
#
# A column released under any role but ``explicit`` must not be a direct identifier. Two signals:
# its values look like one (a share of at least IDENTIFIER_SHARE of the non-missing records matches a
# pattern), or it is nearly unique (more than NEAR_UNIQUE_RATIO distinct values per non-missing record,
# judged only with at least NEAR_UNIQUE_MIN_ROWS of them: in a few records a ratio says little).
# ε-quasis are exempt from near-uniqueness: they are numbers the method expects to be continuous (a
# height to the millimetre is unique in small tables), it perturbs them per class, and the linking-risk
# gate (max_linking_risk) measures exactly how often their noisy values still single a record out.

IDENTIFIER_SHARE = 0.5
NEAR_UNIQUE_RATIO = 0.9
NEAR_UNIQUE_MIN_ROWS = 100

_PATTERNS = {
    "email": re.compile(r"^[^@\s]+@[^@\s]+\.[A-Za-z]{2,}$"),
    "url": re.compile(r"^(?:(?:https?|ftp)://|www\.)\S+$", re.IGNORECASE),
    # 7–15 digits with a leading +, an area code in parentheses, or at least two separated digit groups
    # ("+353 1 234 5678", "(01) 234-5678", "01 234 5678"); a year range such as 1976-1977 has one.
    "phone": re.compile(
        r"^(?=(?:\D*\d){7,15}\D*$)(?:\+\d[\d ().-]*|\(\d+\)[\d ().-]*|\d+[ .-]\d+[ .-]\d[\d ().-]*)$"
    ),
    # US SSN, UK NINO, Irish PPSN, and letter-prefixed or bare codes of 6–12 digits (passport, tax ids).
    "national_id": re.compile(
        r"^(?:\d{3}-\d{2}-\d{4}|[A-CEGHJ-PR-TW-Z]{2}\s?\d{2}\s?\d{2}\s?\d{2}\s?[A-D]|\d{7}[A-W][A-IW]?"
        r"|[A-Z]{0,3}\d{6,12}[A-Z]{0,2})$",
        re.IGNORECASE,
    ),
}
_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}")


def _looks_like(reason: str, value: str) -> bool:
    """Whether one distinct value looks like a direct identifier of the given kind."""
    if reason == "ip_address":
        if "." not in value and ":" not in value:  # an IPv4 address has dots, an IPv6 one colons: nothing to parse
            return False
        try:
            ipaddress.ip_address(value)
        except ValueError:
            return False
        return True
    if reason == "phone" and (_ISO_DATE.match(value) or _looks_like("ip_address", value)):
        return False
    return bool(_PATTERNS[reason].match(value))


_PATTERN_REASONS = ("email", "url", "ip_address", "national_id", "phone")


@dataclass
class IdentifierEvidence:
    """What identifier detection needs of a column, in counts that add up over partitions.

    ``present``: non-missing records; ``matched``: per pattern, the records whose value matches it;
    ``distinct``: distinct non-missing values (one table), or ``hashes``: the distinct values' 64-bit
    hashes (a partition; their union counts the table's distinct values, up to a hash collision,
    probability about d²/2⁶⁵ for d distinct values).
    """

    present: int
    matched: dict[str, int]
    distinct: int | None = None
    hashes: np.ndarray | None = field(default=None, repr=False)

    def add(self, other: "IdentifierEvidence") -> "IdentifierEvidence":
        """The evidence of two disjoint parts of a column. With hashes, their union counts the distinct
        values; with distinct counts only, their sum is an **upper bound** of the distinct values (a value
        in both parts counts twice), enough to clear a column that is far from near-unique."""
        hashes = None
        if self.hashes is not None and other.hashes is not None:
            hashes = np.union1d(self.hashes, other.hashes)
        distinct = None
        if hashes is None and self.distinct is not None and other.distinct is not None:
            distinct = self.distinct + other.distinct
        return IdentifierEvidence(
            self.present + other.present,
            {reason: self.matched[reason] + other.matched[reason] for reason in self.matched},
            distinct,
            hashes,
        )

    def distinct_values(self) -> int:
        if self.distinct is not None:
            return self.distinct
        if self.hashes is None:
            raise ValueError("identifier evidence needs a distinct count or the distinct values' hashes")
        return len(self.hashes)

    def reasons(self, near_unique: bool = True) -> list[str]:
        """The reasons the evidence gives (see :func:`identifier_reasons`)."""
        if self.present == 0:
            return []
        reasons = [reason for reason in _PATTERN_REASONS if self.matched[reason] >= IDENTIFIER_SHARE * self.present]
        if near_unique and self.present >= NEAR_UNIQUE_MIN_ROWS and self.distinct_values() > NEAR_UNIQUE_RATIO * self.present:
            reasons.append("near_unique")
        return reasons


def identifier_evidence(values: pd.Series, exact: bool = True, factorised: tuple | None = None) -> IdentifierEvidence:
    """The column's :class:`IdentifierEvidence`: its distinct count when ``exact`` (a whole table), else
    the hashes of its distinct values (a partition). Text columns are matched against the patterns.
    ``factorised``: ``pd.factorize(values)``, where the caller made it already (a k-quasi's conversion
    to text uses the same): a text column's records per value are then counted from its codes."""
    present = values.dropna()
    text = isinstance(present.dtype, pd.StringDtype) or _is_arrow_text(present.dtype)
    # Typed text is counted per distinct value first (in Arrow), then each distinct value that may match is
    # stripped and matched once: the records per stripped value are the same as stripping every record first.
    distinct = _records_per_value(present, factorised) if text else None
    if distinct is not None:
        matched = _matched_records(pd.Series(distinct.index.array), distinct.to_numpy())
    else:
        texts = _texts(present)
        counts = texts.value_counts(sort=False) if texts is not None else pd.Series([], dtype=np.int64)
        matched = _matched_records(pd.Series(counts.index.array), counts.to_numpy())
    if exact:  # text has its distinct values counted already
        return IdentifierEvidence(len(present), matched, distinct=len(distinct) if distinct is not None else int(present.nunique()))
    # Text is equal exactly when it is the same text, so hashing its distinct values (found in Arrow)
    # gives the same set as hashing every record, at a fraction of the work; other types hash every value.
    hashed = pd.Series(distinct.index.array) if distinct is not None else present
    hashes = np.unique(pd.util.hash_pandas_object(hashed, index=False).to_numpy(dtype=np.uint64))
    return IdentifierEvidence(len(present), matched, hashes=hashes)


def _records_per_value(present: pd.Series, factorised: tuple | None) -> pd.Series:
    """The records per distinct value of a column's ``present`` (non-missing) values, indexed by the values:
    counted in Arrow, or from the column's codes where it was factorised already (a missing value is code -1)."""
    if factorised is None:
        return present.value_counts(sort=False)
    codes, distinct = factorised
    return pd.Series(np.bincount(codes[codes >= 0], minlength=len(distinct)), index=pd.Index(distinct))


def _matched_records(texts: pd.Series, records: np.ndarray) -> dict[str, int]:
    """Per pattern, the records whose value, stripped, looks like it (:func:`_looks_like`). ``texts``: a
    column's text values, each once as written; ``records``: how many records hold each.

    Only values that pass :func:`_may_look_like` (checked in Arrow, over every value at once) are
    stripped and matched in Python; the others cannot match, so the counts are those of matching all."""
    matched = dict.fromkeys(_PATTERN_REASONS, 0)
    if not len(texts):
        return matched
    possible = _may_look_like(texts)
    rows = np.flatnonzero(np.logical_or.reduce(list(possible.values())))
    stripped = [str(value).strip() for value in texts.iloc[rows]]
    for reason in _PATTERN_REASONS:
        hits = [row for row, value, may in zip(rows, stripped, possible[reason][rows]) if may and _looks_like(reason, value)]
        matched[reason] = int(records[hits].sum())
    return matched


# A character Python's ``\d`` may match (ASCII digits; every other decimal digit lies above U+007F).
_MAYBE_DIGIT = r"[0-9\x{80}-\x{10FFFF}]"
# What each pattern needs of a value, whatever whitespace surrounds it: searched by Arrow (RE2), each is
# met by every value the pattern matches once stripped (a superset, never a subset).
_NEEDS = {
    "email": r"@",  # ^[^@\s]+@...
    "url": r"://|[wW][wW][wW]\.",  # a scheme, or www. (no other character folds to w under IGNORECASE)
    "ip_address": r":|[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}",  # IPv6 has colons, IPv4 four ASCII octets
    "national_id": rf"(?s)(?:.*?{_MAYBE_DIGIT}){{6}}",  # each form has at least 6 digits
    "phone": rf"(?s)(?:.*?{_MAYBE_DIGIT}){{7}}",  # 7-15 digits
}


def _may_look_like(texts: pd.Series) -> dict[str, np.ndarray]:
    """Per pattern, which values may look like it (:data:`_NEEDS`), searched in Arrow."""
    import pyarrow as pa
    import pyarrow.compute as pc

    array = pa.array(texts.array, type=pa.large_string())  # text already (Arrow, or str from _texts)
    return {reason: pc.fill_null(pc.match_substring_regex(array, pattern), False).to_numpy(zero_copy_only=False)
            for reason, pattern in _NEEDS.items()}


def identifier_reasons(values: pd.Series, near_unique: bool = True) -> list[str]:
    """Why a column looks like a direct identifier: pattern kinds matched by at least IDENTIFIER_SHARE of
    its non-missing records, and ``near_unique`` (when asked). Text columns are matched against the
    patterns. Returns reasons only, never a value."""
    return identifier_evidence(values).reasons(near_unique)


def _texts(values: pd.Series) -> pd.Series | None:
    """The column's values as text when they are text (CSV cells, Arrow strings); None for typed columns.

    Numbers, booleans, dates and bytes are not matched against the patterns: they are not written the
    way an e-mail address or a phone number is, and bytes need not even be valid UTF-8.
    """
    if isinstance(values.dtype, pd.StringDtype) or _is_arrow_text(values.dtype):
        return values.astype(str)
    if values.dtype == object:
        return values[values.map(lambda value: isinstance(value, str))].astype(str)
    return None


_REASON_TEXT = {
    "email": "its values look like e-mail addresses",
    "url": "its values look like URLs",
    "ip_address": "its values look like IP addresses",
    "phone": "its values look like phone numbers",
    "national_id": "its values look like national identification numbers",
    "near_unique": f"it is nearly unique (more than {NEAR_UNIQUE_RATIO:.0%} distinct values per record)",
}


def check_identifiers(frame: pd.DataFrame, roles: Roles) -> None:
    """Refuse a released column (any role but explicit) that looks like a direct identifier, unless the
    spec acknowledges that reason for it (``acknowledge_identifier``). The error names the column and the
    reason, never a value."""
    names = roles.names()
    columns = names["k_quasi"] + names["e_quasi"] + names["sensitive"]
    refuse_identifiers({column: identifier_evidence(frame[column]) for column in columns}, roles)


def refuse_identifiers(evidence: dict[str, IdentifierEvidence], roles: Roles) -> None:
    """:func:`check_identifiers` on each released column's evidence (ε-quasis exempt from near-uniqueness)."""
    acknowledged = roles.acknowledged_identifiers()
    names = roles.names()
    for column in names["k_quasi"] + names["e_quasi"] + names["sensitive"]:
        reasons = evidence[column].reasons(near_unique=column not in names["e_quasi"])
        unacknowledged = [r for r in reasons if r not in acknowledged.get(column, set())]
        if unacknowledged:
            reason = unacknowledged[0]
            raise InputError(
                column,
                f"looks like a direct identifier: {_REASON_TEXT[reason]}; make it explicit (removed), or "
                f"acknowledge it in the spec with `acknowledge_identifier: [{reason}]` on the column",
            )


@dataclass
class Findings:
    """Everything ``classify`` refuses a table for, as counts: of a whole table, or of a partition
    (partitions' findings add up with :meth:`add`). Nothing in it is a data value."""

    rows: int
    unpublishable: dict[str, str]  # column -> reason its type cannot be published
    identifiers: dict[str, IdentifierEvidence]
    k_missing: dict[str, int]
    e_missing: dict[str, int]
    e_non_numeric: dict[str, bool]  # the column's type is not a number (nor text to parse)
    e_not_numbers: dict[str, int]  # texts that are not plain decimal numbers
    e_non_finite: dict[str, int]
    e_outside: dict[str, int]

    def add(self, other: "Findings") -> "Findings":
        def total(a: dict, b: dict) -> dict:
            return {key: a.get(key, 0) + b.get(key, 0) for key in {**a, **b}}

        return Findings(
            rows=self.rows + other.rows,
            unpublishable={**other.unpublishable, **self.unpublishable},
            identifiers={
                column: self.identifiers[column].add(other.identifiers[column]) if column in other.identifiers
                else self.identifiers[column]
                for column in self.identifiers
            } | {column: e for column, e in other.identifiers.items() if column not in self.identifiers},
            k_missing=total(self.k_missing, other.k_missing),
            e_missing=total(self.e_missing, other.e_missing),
            e_non_numeric={key: self.e_non_numeric.get(key, False) or other.e_non_numeric.get(key, False)
                           for key in {**self.e_non_numeric, **other.e_non_numeric}},
            e_not_numbers=total(self.e_not_numbers, other.e_not_numbers),
            e_non_finite=total(self.e_non_finite, other.e_non_finite),
            e_outside=total(self.e_outside, other.e_outside),
        )


def classify_findings(frame: pd.DataFrame, spec: ReleaseSpec, exact: bool = True,
                      codes: dict[str, np.ndarray] | None = None) -> tuple[pd.DataFrame, Findings]:
    """Apply the spec's roles to ``frame`` (a table or a partition of one) and count what ``classify``
    refuses, without refusing: the frame without its explicit identifiers, its k-quasis as text, its
    ε-quasis as float64 and its missing sensitive cells as nulls — as far as the counts allow (a column
    that will be refused is left as it came) — and the :class:`Findings`. ``exact``: count distinct
    values exactly (a whole table) or by hash (a partition). ``codes``: when given, it receives the row
    codes of each generalised column converted to text (:func:`k_quasi_texts_and_codes`), for the
    histogram. The roles must be checked first (``check_roles``)."""
    names = spec.roles.names()
    missing_texts = list(spec.source.missing) if _is_csv(spec) else None
    frame = frame.drop(columns=names["explicit"])
    findings = Findings(len(frame), {}, {}, {}, {}, {}, {}, {}, {})
    generalised, noised = _generalised_and_noised(spec)
    for column in [*generalised, *names["sensitive"]]:
        reason = unpublishable_reason(frame[column].dtype)
        if reason:
            findings.unpublishable[column] = reason
    # A generalised column converted to text is factorised once, for its identifier evidence and its texts.
    factorised = {column: pd.factorize(frame[column], use_na_sentinel=True) for column in generalised
                  if column not in findings.unpublishable and needs_texts(frame[column])}
    for column in names["k_quasi"] + names["e_quasi"] + names["sensitive"]:
        if column not in findings.unpublishable:
            findings.identifiers[column] = identifier_evidence(frame[column], exact, factorised.get(column))
    for column in generalised:
        absent = missing_values(frame[column], missing_texts)
        findings.k_missing[column] = int(absent.sum())
        if column not in findings.unpublishable:
            frame[column], column_codes = k_quasi_texts_and_codes(frame[column], factorised.pop(column, None))
            if codes is not None and column_codes is not None:
                codes[column] = column_codes
    for quasi in noised:
        _count_e_quasi(frame, quasi, missing_texts, findings)
    for column in names["sensitive"]:
        if missing_texts is not None and isinstance(frame[column].dtype, pd.StringDtype):
            frame[column] = frame[column].mask(missing_values(frame[column], missing_texts))
    return frame, findings


def _generalised_and_noised(spec: ReleaseSpec) -> tuple[list[str], list]:
    """The columns generalised through a hierarchy (as text) and the ε-quasis noised (as numbers).

    The DP mode generalises its ε-quasis through a hierarchy, as text, like the k-quasis.
    """
    names = spec.roles.names()
    if spec.privacy_model == "dp":
        return [*names["k_quasi"], *names["e_quasi"]], []
    return list(names["k_quasi"]), list(spec.roles.e_quasi)


def _count_e_quasi(frame: pd.DataFrame, quasi, missing_texts, findings: Findings) -> None:
    """Count one ε-quasi's missing, non-number, non-finite and out-of-bounds records, converting it to
    float64 when it has no missing value and no text that is not a number."""
    column = quasi.column
    values = frame[column]
    findings.e_missing[column] = int(missing_values(values, missing_texts).sum())
    findings.e_non_numeric[column] = False
    if findings.e_missing[column]:
        return
    if _is_text(values):
        numbers, findings.e_not_numbers[column] = read_numbers(values)
        if numbers is None:
            return
        values = pd.Series(numbers, index=values.index, name=values.name)  # matched once: not parsed again below
    try:
        frame[column] = e_quasi_numbers(values, column)
        findings.e_non_finite[column] = non_finite_count(frame[column], column)
    except InputError:  # a type that is neither a number nor text
        findings.e_non_numeric[column] = True
        return
    findings.e_outside[column] = outside_bounds_count(frame[column], quasi)


def _is_text(values: pd.Series) -> bool:
    return isinstance(values.dtype, pd.StringDtype) or values.dtype == object or _is_arrow_text(values.dtype)


def refuse_findings(findings: Findings, spec: ReleaseSpec) -> None:
    """Raise the first error ``classify`` raises for a table with these findings (none if it passes)."""
    names = spec.roles.names()
    generalised, noised = _generalised_and_noised(spec)
    for column in [*generalised, *names["sensitive"]]:
        if column in findings.unpublishable:
            raise InputError(
                column, f"{findings.unpublishable[column]}; release it in another type or remove it (role explicit)"
            )
    refuse_identifiers(findings.identifiers, spec.roles)
    for column in generalised:
        refuse_k_quasi_missing(column, findings.k_missing.get(column, 0))
    for quasi in noised:
        column = quasi.column
        if findings.e_missing.get(column, 0):
            raise InputError(column, f"ε-quasi values must be finite; {findings.e_missing[column]} record(s) are missing")
        refuse_non_numbers(column, findings.e_not_numbers.get(column, 0))
        if findings.e_non_numeric.get(column):
            raise InputError(column, _NON_NUMERIC)
        refuse_non_finite(column, findings.e_non_finite.get(column, 0))
        refuse_outside_bounds(quasi, findings.e_outside.get(column, 0))
    if spec.k > findings.rows:
        raise SpecError("k", f"k = {spec.k} is larger than the table ({findings.rows} records)")


def classify(frame: pd.DataFrame, spec: ReleaseSpec) -> ClassifiedTable:
    """Apply the spec's roles: validate the columns, refuse direct identifiers, decide what is missing and
    what is a number per role (module docstring), drop the explicit identifiers."""
    check_roles([str(c) for c in frame.columns], spec.roles)
    classified, findings = classify_findings(frame, spec)
    refuse_findings(findings, spec)
    return ClassifiedTable(frame=classified, roles=spec.roles.names())


def _is_csv(spec: ReleaseSpec) -> bool:
    try:
        return spec.source.resolved_format() is SourceFormat.csv
    except SpecError:
        return True


@task(name="classify", cache_policy=NO_CACHE, persist_result=False)
def classify_attributes(frame: pd.DataFrame, spec: ReleaseSpec) -> ClassifiedTable:
    """Prefect task: validate roles and remove explicit identifiers."""
    return classify(frame, spec)
