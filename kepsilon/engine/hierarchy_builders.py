"""Generalisation hierarchies built from a public definition in the spec, instead of read from a file.

A k-quasi released as its class's true ``[min-max]`` range, or as its exact set of values, tells an
adversary the extreme values present in each class ("the richest person is in this group, and this is
their net worth": Li, Qardaji and Su). A hierarchy avoids that because its labels are fixed before the
data is seen. These builders (in the manner of ARX's hierarchy builders) describe such a hierarchy in
a few spec parameters::

    hierarchy: {kind: intervals, lower: 0, upper: 120, widths: [5, 10, 20]}
    hierarchy: {kind: masking, length: 5}
    hierarchy: {kind: dates, format: "%Y-%m-%d", levels: [month, year]}
    hierarchy: {kind: categories}                                   # each value, then *
    hierarchy: {kind: categories, groups: {adult: ["18-64"], older: ["65-79", "80+"]}}   # value, group, *

``build_hierarchy`` materialises a definition over the distinct values of a column and returns the
same ``Hierarchy`` that ``load_hierarchy`` returns for a file, so Mondrian and OLA use it unchanged.
Only values present in the data become leaves, but every label is a function of the definition and
the one value it generalises: no label, and not the hierarchy's SHA-256 (taken over the definition
alone), depends on any other record.

Numbers in an interval definition are taken as the decimals they are written as (``0.1`` means one
tenth, not the binary float nearest to it), and data values likewise, so bin edges and bin membership
are exact: ``0.3`` falls in ``[0.3, 0.4)``, not in ``[0.2, 0.3)``.
"""

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation, localcontext
from fractions import Fraction
from typing import Annotated, Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema

from .errors import HierarchyError
from .hierarchy import Hierarchy, _as_strings

TOP = "*"

_STRICT = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------------------------------
# Definitions (the spec's side)
# --------------------------------------------------------------------------------------------------


class IntervalHierarchy(BaseModel):
    """Numeric values binned into fixed-width intervals anchored at a public lower bound.

    Level 0 is the value itself; level i (1..len(widths)) is the bin of width ``widths[i-1]``
    holding it, ``[lower + j*w, lower + (j+1)*w)``, the last bin capped at ``upper`` and closed
    (``[80, 90]``); the top level is ``*``. Each width is a whole multiple of the one before, so
    every bin lies inside one bin of the next level (OLA requires that nesting).
    """

    model_config = _STRICT

    kind: Literal["intervals"] = Field(description="selects fixed-width numeric intervals")
    lower: float = Field(description="public lower bound of the column; bins are anchored here")
    upper: float = Field(description="public upper bound of the column, included in the last bin")
    widths: list[float] = Field(
        description="bin width per level, finest first; each a whole multiple of the one before"
    )

    @field_validator("lower", "upper")
    @classmethod
    def _finite(cls, bound: float, info) -> float:
        if not math.isfinite(bound):
            raise ValueError(f"{info.field_name} must be a finite number")
        return bound

    @field_validator("widths")
    @classmethod
    def _nested_widths(cls, widths: list[float]) -> list[float]:
        if not widths:
            raise ValueError("widths needs at least one bin width")
        if not all(math.isfinite(width) and width > 0 for width in widths):
            raise ValueError("widths must be finite and greater than 0")
        exact = [_exact(width) for width in widths]
        for level, (finer, coarser) in enumerate(zip(exact, exact[1:]), start=1):
            if coarser <= finer:
                raise ValueError(f"widths must be strictly increasing (width {level + 1} is not above width {level})")
            if (coarser / finer).denominator != 1:
                raise ValueError(
                    f"widths must each be a whole multiple of the previous one (width {level + 1} is not "
                    f"a multiple of width {level}), otherwise the levels do not nest"
                )
        return widths

    @model_validator(mode="after")
    def _ordered_bounds(self):
        if self.lower >= self.upper:
            raise ValueError("lower must be below upper")
        # Bin indices are kept as int64 and decided in floating point when clearly inside a bin.
        if (_exact(self.upper) - _exact(self.lower)) / _exact(self.widths[0]) >= 2**53:
            raise ValueError("widths: the first width cuts lower..upper into 2**53 bins or more")
        return self


class MaskingHierarchy(BaseModel):
    """Fixed-length codes (ZIP, postcode district) masked from the right, one character per level.

    Level l (0..length) replaces the last l characters with ``mask``: ``02139``, ``0213*``, …,
    and the last level, everything masked, is ``*``.
    """

    model_config = _STRICT

    kind: Literal["masking"] = Field(description="selects right-to-left masking of fixed-length codes")
    length: int = Field(ge=1, description="number of characters of every value of the column")
    mask: str = Field(default="*", min_length=1, max_length=1, description="character replacing a masked one")


_DATE_LEVELS = ("month", "year", "decade")


class DateHierarchy(BaseModel):
    """Dates truncated to month, year or decade.

    Level 0 is the value as written; then one level per entry of ``levels`` (``2020-03``, ``2020``,
    ``2020s``), from finest to coarsest; the top level is ``*``.
    """

    model_config = _STRICT

    kind: Literal["dates"] = Field(description="selects truncation of dates")
    format: str = Field(
        default="%Y-%m-%d", min_length=1, description="strptime format every value of the column must match"
    )
    levels: list[Literal["month", "year", "decade"]] = Field(
        description="truncations from finest to coarsest, each at most once: month, year, decade"
    )

    @field_validator("levels")
    @classmethod
    def _coarsening(cls, levels: list[str]) -> list[str]:
        ranks = [_DATE_LEVELS.index(level) for level in levels]
        if any(later <= earlier for earlier, later in zip(ranks, ranks[1:])):
            raise ValueError("levels must coarsen (month, then year, then decade), each at most once")
        return levels


def _no_null_default(schema: dict[str, Any]) -> None:
    """Drop a field's ``default: null`` from its JSON schema (see ``CategoryHierarchy.groups``)."""
    if schema.get("default", 0) is None:
        del schema["default"]


class CategoryHierarchy(BaseModel):
    """Categories (sex, blood group, region): each value as it is, then ``*``; or value, its group, ``*``.

    Without ``groups`` the hierarchy has two levels, the value and ``*``: a category is published as
    read or not at all. With ``groups`` (``{group label: [values]}``) it has three: the value, the
    label of the one group that lists it, and ``*``. Values are matched as text, exactly as written.

    A value of the column that no group lists is **refused** (the column is named and the records
    counted, never the value) rather than sent to ``*`` or to a catch-all group: a declared grouping
    that misses a value is most likely a typo or a new code, and a label chosen silently for it
    would be published under a definition that does not say so.
    """

    model_config = _STRICT

    kind: Literal["categories"] = Field(description="selects categories: each value, then its declared group, then *")
    groups: dict[str, list[str]] | SkipJsonSchema[None] = Field(
        default=None,
        description="optional grouping {group label: [values]}; every value of the column in exactly one group",
        # A run form fills a field from its schema's default: a null default would be sent as null, which
        # the field's schema (null hidden) refuses. Left out, the field is simply absent from the payload.
        json_schema_extra=_no_null_default,
    )

    @field_validator("groups", mode="before")
    @classmethod
    def _texts_only(cls, groups: Any) -> Any:
        # YAML reads yes, no, 1 or null as booleans, numbers or None: matched as text they would silently
        # never match the data's cells, so they must be quoted.
        if not isinstance(groups, Mapping):
            return groups
        for label, members in groups.items():
            if not isinstance(label, str):
                raise ValueError("every group label must be text (quote it in YAML: \"1\", \"yes\")")
            if not isinstance(members, (list, tuple)) or not all(isinstance(member, str) for member in members):
                raise ValueError(f"group {label!r}: its values must be a list of texts (quote numbers, yes/no, null)")
        return groups

    @field_validator("groups")
    @classmethod
    def _one_group_per_value(cls, groups: dict[str, list[str]] | None) -> dict[str, list[str]] | None:
        if groups is None:
            return None
        if not groups:
            raise ValueError("groups needs at least one group (or leave groups out: each value, then *)")
        seen: dict[str, str] = {}
        for label, members in groups.items():
            if not label or label == TOP:
                raise ValueError(f"a group label must be non-empty and not {TOP!r} (the top level)")
            if not members:
                raise ValueError(f"group {label!r} lists no value")
            for member in members:
                if member in seen:
                    raise ValueError(f"a value is listed in two groups ({seen[member]!r} and {label!r})")
                seen[member] = label
        for label, members in groups.items():
            # A published label must say one thing: "A" may not be both a value and a wider group.
            if label in seen and members != [label]:
                raise ValueError(f"group label {label!r} is also a value of the grouping; rename the group")
        return groups


HierarchyBuilder = Annotated[
    IntervalHierarchy | MaskingHierarchy | DateHierarchy | CategoryHierarchy, Field(discriminator="kind")
]
Definition = IntervalHierarchy | MaskingHierarchy | DateHierarchy | CategoryHierarchy

_BUILDER = TypeAdapter(HierarchyBuilder)


def parse_builder(definition: Mapping[str, Any], column: str) -> Definition:
    """Validate a definition given as a mapping (as read from YAML).

    Raises ``HierarchyError`` naming the column and each faulty parameter.
    """
    try:
        return _BUILDER.validate_python(definition)
    except ValidationError as exc:
        # The parameters are public, but pydantic's default text is long; keep the location and the reason.
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or 'hierarchy'}: {error['msg']}" for error in exc.errors()
        )
        raise HierarchyError(column, f"invalid hierarchy definition ({problems})") from None


def definition_sha256(definition: Definition) -> str:
    """SHA-256 of the definition's canonical JSON (sorted keys, no spaces, defaults filled in).

    This is the hierarchy's identity in release reports; it depends on the definition only, never
    on the data it was materialised over.
    """
    canonical = json.dumps(definition.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------------------------------
# Materialising a definition over a column
# --------------------------------------------------------------------------------------------------


def build_hierarchy(
    definition: Definition | Mapping[str, Any],
    values: pd.Series,
    column: str,
    weights: np.ndarray | None = None,
) -> Hierarchy:
    """The hierarchy ``definition`` describes, over the distinct values of ``values``.

    ``weights``: records per value when ``values`` lists distinct tuples rather than records (a
    histogram, ``kepsilon.engine.histogram``); the hierarchy depends on the distinct values only, the
    counts in refusals on the records.

    Leaves are the distinct values in the text form ``Hierarchy.leaf_codes`` matches on, so the
    result covers the column whether it holds text or numbers. Leaves are ordered by number
    (intervals), by date (dates) or as text (masking), because Mondrian cuts along leaf order.
    ``leaf_numbers`` holds each leaf's number or day ordinal (``None`` for masking).

    Raises ``HierarchyError`` for an invalid definition, an empty column, missing values, or values
    the definition cannot place (outside the public bounds, not a finite number, wrong length, not
    a date in the format). Messages name the column and count the records; they never quote a value.
    """
    if not isinstance(definition, (IntervalHierarchy, MaskingHierarchy, DateHierarchy, CategoryHierarchy)):
        definition = parse_builder(definition, column)
    value_codes, uniques = pd.factorize(values, use_na_sentinel=True)
    missing = int((value_codes < 0).sum())
    if missing:
        absent = missing if weights is None else int(np.asarray(weights)[value_codes < 0].sum())
        raise HierarchyError(column, f"{absent} value(s) are missing; a k-quasi with a hierarchy must be complete")
    if len(uniques) == 0:
        raise HierarchyError(column, "has no values to build a hierarchy over")
    # Distinct values can share a text form (1 and "1" in an object column); leaves are texts.
    text_codes, texts = pd.factorize(_as_strings(pd.Series(uniques)).to_numpy(dtype=object))
    texts = np.asarray(texts, dtype=object)
    records_per_text = np.bincount(text_codes[value_codes], weights=weights, minlength=len(texts))
    first_unique_of_text = np.unique(text_codes, return_index=True)[1]

    if isinstance(definition, IntervalHierarchy):
        built = _intervals(definition, texts, uniques[first_unique_of_text])
    elif isinstance(definition, MaskingHierarchy):
        built = _masking(definition, texts)
    elif isinstance(definition, CategoryHierarchy):
        built = _categories(definition, texts)
    else:
        built = _dates(definition, texts)

    problems = [
        f"{int(records_per_text[bad].sum())} value(s) {reason}" for bad, reason in built.problems if bad.any()
    ]
    if problems:
        raise HierarchyError(column, "; ".join(problems))

    order = built.order()
    labels = tuple(np.asarray(level, dtype=object)[order] for level in built.labels())
    return Hierarchy(
        column=column,
        leaves=pd.Index(texts[order]),
        labels=labels,
        label_codes=tuple(pd.factorize(level)[0].astype(np.int64) for level in labels),
        sha256=definition_sha256(definition),
        leaf_numbers=None if built.numbers is None else np.asarray(built.numbers, dtype=np.float64)[order],
    )


@dataclass
class _Built:
    """A definition applied to the distinct texts of a column, in the order given.

    ``problems`` holds, per reason, a mask of the texts the definition refuses. ``labels()`` (one
    array per level) and ``order()`` (the leaf order, a permutation) are only asked for once there
    are no problems, so they need not cope with refused values.
    """

    problems: list[tuple[np.ndarray, str]]
    labels: Callable[[], list[np.ndarray]]
    order: Callable[[], np.ndarray]
    numbers: np.ndarray | None


def _intervals(definition: IntervalHierarchy, texts: np.ndarray, uniques: pd.Index) -> _Built:
    lower, upper = _exact(definition.lower), _exact(definition.upper)
    widths = [_exact(width) for width in definition.widths]
    finest = widths[0]
    # Coarser bins are the finest bin index divided by a whole multiple, never recomputed from the
    # value, so every bin lies inside one bin of the next level by construction.
    multiples = [int(width / finest) for width in widths]
    finest_bins = -((lower - upper) // finest)  # ceil((upper - lower) / finest); the last is capped

    n = len(texts)
    finest_index = np.zeros(n, dtype=np.int64)
    numbers = np.zeros(n, dtype=np.float64)
    not_number = np.zeros(n, dtype=bool)
    outside = np.zeros(n, dtype=bool)
    exact_numbers: dict[int, Fraction] = {}

    numeric = pd.api.types.is_numeric_dtype(uniques.dtype) and not pd.api.types.is_bool_dtype(uniques.dtype)
    if numeric:
        # Floating point decides every value that is clearly inside one bin; values within rounding
        # distance of a bin edge or a bound are decided exactly below, so the result is exact.
        numbers = uniques.to_numpy(dtype=np.float64, copy=True)
        finite = np.isfinite(numbers)
        not_number = ~finite
        with np.errstate(invalid="ignore", over="ignore"):
            position = (numbers - float(lower)) / float(finest)
            tolerance = 1e-9 * (1.0 + np.abs(position) + (np.abs(numbers) + abs(float(lower))) / float(finest))
            span = float((upper - lower) / finest)
            floor = np.floor(position)
            near_edge = (position - floor < tolerance) | (floor + 1 - position < tolerance)
            doubtful = finite & (near_edge | (np.abs(position - span) < tolerance))
            decided = finite & ~doubtful
            outside = decided & ((position < 0) | (position > span))
            inside = decided & ~outside
        finest_index[inside] = np.minimum(floor[inside], finest_bins - 1).astype(np.int64)
        undecided = np.flatnonzero(doubtful)
    else:
        undecided = np.arange(n)

    for at in undecided:
        number = _parse_number(texts[at])
        if number is None:
            not_number[at] = True
        elif not lower <= number <= upper:
            outside[at] = True
        else:
            exact_numbers[int(at)] = number
            numbers[at] = float(number)
            finest_index[at] = min(int((number - lower) // finest), finest_bins - 1)

    def labels() -> list[np.ndarray]:
        levels = [texts]
        for width, multiple in zip(widths, multiples):
            bins = -(-finest_bins // multiple)
            present, bin_of_text = np.unique(finest_index // multiple, return_inverse=True)
            names = np.array([_bin_label(lower, upper, width, int(index), bins) for index in present], dtype=object)
            levels.append(names[bin_of_text])
        levels.append(np.full(n, TOP, dtype=object))
        return levels

    def order() -> np.ndarray:
        if numeric:
            # The column's own numbers: int64 beyond 2**53 keeps its exact order, and distinct floats
            # order as their shortest decimal texts do (each text lies in its own float's rounding
            # interval, and those intervals are disjoint and ordered).
            own_dtype = getattr(uniques.dtype, "numpy_dtype", uniques.dtype)  # nullable Int64 → int64
            return np.argsort(uniques.to_numpy(dtype=own_dtype), kind="stable")
        keys = [(exact_numbers[at], texts[at]) for at in range(n)]
        return np.array(sorted(range(n), key=keys.__getitem__), dtype=np.int64)

    bounds = f"[{_number_text(lower)}, {_number_text(upper)}]"
    return _Built(
        problems=[(not_number, "are not finite numbers"), (outside, f"are outside the public bounds {bounds}")],
        labels=labels,
        order=order,
        numbers=numbers,
    )


def _bin_label(lower: Fraction, upper: Fraction, width: Fraction, index: int, bins: int) -> str:
    start = lower + index * width
    if index == bins - 1:
        return f"[{_number_text(start)}, {_number_text(upper)}]"
    return f"[{_number_text(start)}, {_number_text(start + width)})"


def _masking(definition: MaskingHierarchy, texts: np.ndarray) -> _Built:
    length, mask = definition.length, definition.mask
    wrong_length = np.array([len(text) != length for text in texts], dtype=bool)

    def labels() -> list[np.ndarray]:
        levels = [texts]
        for masked in range(1, length):
            levels.append(np.array([text[: length - masked] + mask * masked for text in texts], dtype=object))
        levels.append(np.full(len(texts), TOP, dtype=object))
        return levels

    return _Built(
        problems=[(wrong_length, f"do not have length {length}")],
        labels=labels,
        order=lambda: np.argsort(texts, kind="stable"),
        numbers=None,
    )


def _categories(definition: CategoryHierarchy, texts: np.ndarray) -> _Built:
    """Each text, then its group (when groups are declared), then ``*``; leaves in group order."""
    if definition.groups is None:
        return _Built(
            problems=[],
            labels=lambda: [texts, np.full(len(texts), TOP, dtype=object)],
            order=lambda: np.argsort(texts, kind="stable"),
            numbers=None,
        )
    # Leaves follow the declaration (group by group, each group's values in their order), so the
    # members of one group are adjacent and Mondrian's cuts along leaf order tend to keep them together.
    rank = {member: at for at, member in enumerate(m for members in definition.groups.values() for m in members)}
    group_of = {member: label for label, members in definition.groups.items() for member in members}
    ungrouped = np.array([text not in group_of for text in texts], dtype=bool)

    def labels() -> list[np.ndarray]:
        groups = np.array([group_of[text] for text in texts], dtype=object)
        return [texts, groups, np.full(len(texts), TOP, dtype=object)]

    return _Built(
        problems=[(ungrouped, "are in no declared group; add them to one of the hierarchy's groups")],
        labels=labels,
        order=lambda: np.array(sorted(range(len(texts)), key=lambda at: rank[str(texts[at])]), dtype=np.int64),
        numbers=None,
    )


def _dates(definition: DateHierarchy, texts: np.ndarray) -> _Built:
    unparsed = np.zeros(len(texts), dtype=bool)
    moments: list[datetime] = []
    for position, text in enumerate(texts):
        try:
            moments.append(datetime.strptime(text, definition.format))
        except ValueError:
            unparsed[position] = True
            moments.append(datetime.min)
    truncate = {
        "month": lambda moment: f"{moment.year:04d}-{moment.month:02d}",
        "year": lambda moment: f"{moment.year:04d}",
        "decade": lambda moment: f"{moment.year // 10 * 10:04d}s",
    }

    def labels() -> list[np.ndarray]:
        levels = [texts]
        levels.extend(
            np.array([truncate[level](moment) for moment in moments], dtype=object) for level in definition.levels
        )
        levels.append(np.full(len(texts), TOP, dtype=object))
        return levels

    def order() -> np.ndarray:
        return np.array(sorted(range(len(texts)), key=lambda at: (moments[at], texts[at])), dtype=np.int64)

    midnight = datetime.min.time()
    numbers = np.array(
        [
            moment.toordinal() + (moment - datetime.combine(moment.date(), midnight)).total_seconds() / 86400
            for moment in moments
        ],
        dtype=np.float64,
    )
    return _Built(
        problems=[(unparsed, f"do not parse as dates in the format {definition.format!r}")],
        labels=labels,
        order=order,
        numbers=numbers,
    )


# --------------------------------------------------------------------------------------------------
# Exact decimal arithmetic
# --------------------------------------------------------------------------------------------------


def _exact(number: float) -> Fraction:
    """The decimal a spec number was written as (its shortest repr), exactly."""
    return Fraction(repr(number))


def _parse_number(text: str) -> Fraction | None:
    """A data value as an exact number, or None if it is not a finite decimal number."""
    try:
        number = Decimal(text)
    except (InvalidOperation, ValueError):
        return None
    return Fraction(number) if number.is_finite() else None


def _number_text(number: Fraction) -> str:
    """Shortest exact text: integers without ``.0``, otherwise the float repr when it is exact."""
    if number.denominator == 1:
        return str(number.numerator)
    shortest = repr(float(number))
    if Fraction(shortest) == number:
        return shortest
    # Not representable as a double: print the exact (finite) decimal instead of a rounded one.
    with localcontext() as context:
        context.prec = 2000
        return format((Decimal(number.numerator) / Decimal(number.denominator)).normalize(), "f")
