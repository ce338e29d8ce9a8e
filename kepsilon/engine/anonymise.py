"""The k-anonymisation stage driven by a release spec: hierarchies loaded or built, then Mondrian or OLA.

This is the glue a notebook and the flow share: the spec says which algorithm, which k-quasis and
hierarchies, which sensitive criteria; the algorithms themselves take plain arguments. Both paths of a
release go through :func:`k_anonymise_histogram`: the in-memory path on the histogram of its frame
(:func:`k_anonymise`), the partitioned path on the histogram its partitions add up.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .criteria import ColumnCriteria, criteria_from_value_counts, load_sensitive_hierarchies
from .hierarchy import Hierarchy, load_hierarchy
from .hierarchy_builders import build_hierarchy
from .histogram import TupleHistogram, tuple_histogram
from .mondrian import mondrian_classes
from .ola import ola_classes
from .partition import Partition, TupleClasses

if TYPE_CHECKING:
    from kepsilon.spec import ReleaseSpec  # the engine reads the spec; the model imports the engine


def load_hierarchies(spec: ReleaseSpec, frame: pd.DataFrame, weights: np.ndarray | None = None) -> dict[str, Hierarchy]:
    """The spec's hierarchies by column: a hierarchy file, or one built from a public definition.

    A built hierarchy is materialised over the column's values (``build_hierarchy``), but its labels
    and its SHA-256 come from the definition alone, so they are as public as a file's. ``frame``
    holds the records, or a histogram's distinct tuples with their record counts as ``weights``.
    """
    return hierarchies_from_values(spec, lambda column: (frame[column], weights))


def hierarchies_from_values(spec: ReleaseSpec, values_of) -> dict[str, Hierarchy]:
    """:func:`load_hierarchies` where ``values_of(column)`` gives a column's values and their record counts
    (None: one record each), e.g. each column's distinct values added up over the shards of a histogram."""
    hierarchies = {}
    for quasi in spec.roles.k_quasi:
        if quasi.hierarchy is None:
            continue
        if isinstance(quasi.hierarchy, str):
            hierarchies[quasi.column] = load_hierarchy(quasi.hierarchy, quasi.column)
        else:
            values, weights = values_of(quasi.column)
            hierarchies[quasi.column] = build_hierarchy(quasi.hierarchy, values, quasi.column, weights)
    return hierarchies


@dataclass
class AnonymisedTuples:
    """The anonymiser's classes of a histogram's tuples, with the hierarchies and criteria it used."""

    classes: TupleClasses
    hierarchies: dict[str, Hierarchy]
    criteria: list[ColumnCriteria]


def histogram_of(
    frame: pd.DataFrame, spec, positions: np.ndarray | None = None, extremes: bool = False,
    codes: Mapping[str, np.ndarray] | None = None,
) -> TupleHistogram:
    """The histogram the spec's anonymiser needs of ``frame``: its k-quasi tuples, every sensitive
    column's value counts and the declared criteria's pairs; with ``extremes``, the ε-quasis' clamped
    extremes per tuple too (the frame's ε-quasis must then be numbers, as classify leaves them).
    ``codes``: k-quasis' row codes already made (``tuple_histogram``)."""
    columns = [q.column for q in spec.roles.k_quasi]
    e_quasis = spec.roles.e_quasi if extremes else []
    return tuple_histogram(frame, columns, spec.roles.sensitive, e_quasis, positions, codes)


def k_anonymise_histogram(histogram: TupleHistogram, spec: ReleaseSpec) -> AnonymisedTuples:
    """Classes of the histogram's tuples with the spec's algorithm (Mondrian or OLA); hierarchy hashes
    go in the report. The criteria are built from the histogram's value counts (the whole table's)."""
    hierarchies = load_hierarchies(spec, histogram.tuples, histogram.weights)
    columns = [q.column for q in spec.roles.k_quasi]
    criteria = criteria_from_value_counts(
        spec.roles.sensitive, histogram.values, load_sensitive_hierarchies(spec.roles.sensitive)
    )
    if spec.algorithm == "ola":
        classes = ola_classes(histogram, columns, spec.k, hierarchies, spec.suppression_budget, spec.ola_metric, criteria)
    else:
        classes = mondrian_classes(histogram, columns, spec.k, hierarchies, criteria)
    classes.report["hierarchies"] = {column: h.sha256 for column, h in hierarchies.items()}
    return AnonymisedTuples(classes, hierarchies, criteria)


def k_anonymise(frame: pd.DataFrame, spec: ReleaseSpec) -> Partition:
    """Partition the records with the spec's algorithm (Mondrian or OLA); hierarchy hashes go in the report."""
    histogram = histogram_of(frame, spec)
    anonymised = k_anonymise_histogram(histogram, spec)
    partition = anonymised.classes.partition(frame.index, histogram.tuple_of_record())
    partition.criteria = anonymised.criteria
    partition.hierarchies = anonymised.hierarchies
    return partition
