"""Classify: give every column exactly one role and remove the explicit identifiers (method.md §1).

This is the gate before any budget is touched: everything the later stages would refuse about the
*shape* of the data (unknown or unroled columns, non-numeric or non-finite ε-quasis, missing values in
a quasi-identifier, k larger than the table) is refused here, so a bad input never reserves ε.
"""

from dataclasses import dataclass

import numpy as np
import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from kepsilon.flows.spec import ReleaseSpec, Roles

from .errors import InputError, SpecError


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


def check_e_quasi_values(frame: pd.DataFrame, column: str) -> None:
    """An ε-quasi must be numeric and finite in every record: noise on NaN or text is meaningless."""
    values = frame[column]
    if not (pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values)):
        raise InputError(column, "ε-quasi values must be numeric; the column holds non-numeric values")
    array = values.to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(array)
    if bad.any():
        raise InputError(column, f"ε-quasi values must be finite; {int(bad.sum())} record(s) are missing, NaN or ±inf")


def check_e_quasi_bounds(frame: pd.DataFrame, quasi) -> None:
    """Refuse values outside the ε-quasi's public bounds unless the spec asks for them to be clamped.

    The bounds are the plausibility range the noise and the public grid are calibrated to; a value
    outside them is either an error in the data or an outlier the steward must decide about. The
    count is given, never the values.
    """
    if quasi.out_of_bounds == "clamp":
        return
    values = frame[quasi.column].to_numpy(dtype=np.float64, na_value=np.nan)
    outside = int(((values < quasi.lower) | (values > quasi.upper)).sum())
    if outside:
        raise InputError(
            quasi.column,
            f"{outside} record(s) lie outside the public bounds [{quasi.lower:g}, {quasi.upper:g}]; "
            "correct them, widen the bounds, or set out_of_bounds: clamp",
        )


def check_k_quasi_values(frame: pd.DataFrame, column: str) -> None:
    """A k-quasi may not be missing: an absent value cannot be generalised or grouped honestly."""
    missing = int(frame[column].isna().sum())
    if missing:
        raise InputError(column, f"k-quasi has {missing} missing value(s); fill or remove them before release")


def classify(frame: pd.DataFrame, spec: ReleaseSpec) -> ClassifiedTable:
    """Apply the spec's roles: validate the columns, drop the explicit identifiers."""
    check_roles([str(c) for c in frame.columns], spec.roles)
    names = spec.roles.names()
    for column in names["k_quasi"]:
        check_k_quasi_values(frame, column)
    for quasi in spec.roles.e_quasi:
        check_e_quasi_values(frame, quasi.column)
        check_e_quasi_bounds(frame, quasi)
    if spec.k > len(frame):
        raise SpecError("k", f"k = {spec.k} is larger than the table ({len(frame)} records)")
    return ClassifiedTable(frame=frame.drop(columns=names["explicit"]), roles=names)


@task(name="classify", cache_policy=NO_CACHE, persist_result=False)
def classify_attributes(frame: pd.DataFrame, spec: ReleaseSpec) -> ClassifiedTable:
    """Prefect task: validate roles and remove explicit identifiers."""
    return classify(frame, spec)
