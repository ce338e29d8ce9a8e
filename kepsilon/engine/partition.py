"""What Mondrian and OLA share: their result, the :class:`Partition`, the checks of their
parameters, and the labels a partition publishes.

``published_labels`` is the one place a class's k-quasi labels are made, after every suppression
stage, from the published members only (so no label depends on a suppressed record).
"""

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .errors import InputError, SpecError
from .hierarchy import ClassRuns, Hierarchy, lowest_common_levels
from .sorting import unique_inverse


@dataclass
class Partition:
    """The equivalence classes of an anonymisation and the k-quasi values to publish.

    ``class_ids`` is positional (one per input row): dense ``0..n_classes-1`` for kept rows, numbered by
    the first row of each class, and ``-1`` for rows the anonymiser suppressed. ``released`` holds the
    k-quasi columns as strings, with the input frame's index. ``kept`` is ``class_ids >= 0``.
    """

    class_ids: np.ndarray
    released: pd.DataFrame
    kept: np.ndarray
    report: dict
    hierarchies: dict = field(default_factory=dict, repr=False)
    levels: dict | None = None  # OLA's node {column: level}; None: each class at its lowest common level
    criteria: list = field(default_factory=list, repr=False)  # criteria.ColumnCriteria per sensitive column


@dataclass
class TupleClasses:
    """What an anonymiser decides on a histogram of distinct k-quasi tuples (``kepsilon.engine.histogram``).

    ``class_of_tuple``: per histogram tuple, its class, dense ``0..n_classes-1`` numbered by the first
    record of each class, or ``-1`` when the anonymiser suppresses it. ``released``: per tuple, the
    k-quasi columns as the anonymiser describes its class (strings; never published, see
    :func:`published_labels`). ``report`` as in :class:`Partition`; ``levels``: OLA's node.
    """

    class_of_tuple: np.ndarray
    released: pd.DataFrame
    report: dict
    levels: dict | None = None

    def partition(self, index: pd.Index, tuple_of_record: np.ndarray) -> Partition:
        """The :class:`Partition` of the records whose tuples are ``tuple_of_record`` (``index``: theirs)."""
        class_ids = self.class_of_tuple[tuple_of_record]
        released = pd.DataFrame(
            {column: self.released[column].array.take(tuple_of_record) for column in self.released.columns},
            index=index,
        )
        return Partition(class_ids=class_ids, released=released, kept=class_ids >= 0, report=self.report, levels=self.levels)


def check_anonymiser_parameters(frame: pd.DataFrame, columns: list[str], k: int) -> None:
    """Refuse a bad k, an empty or duplicated column list, an unknown column and an empty frame.

    Shared by Mondrian and OLA: both take the same table, k-quasis and k.
    """
    _check_parameters(frame.columns, len(frame), columns, k)


def check_histogram_parameters(histogram, columns: list[str], k: int) -> None:
    """:func:`check_anonymiser_parameters` for a histogram of distinct tuples: its records are counted."""
    _check_parameters(histogram.tuples.columns, histogram.records, columns, k)


def _check_parameters(present: pd.Index, rows: int, columns: list[str], k: int) -> None:
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
        raise SpecError("k", "must be an integer")
    if k < 2:
        raise SpecError("k", "must be at least 2 (k = 1 anonymises nothing)")
    if isinstance(columns, str) or not isinstance(columns, (list, tuple)) or len(columns) == 0:
        raise SpecError("columns", "needs a non-empty list of k-quasi column names")
    if len(set(columns)) != len(columns):
        raise SpecError("columns", "lists a column more than once")
    for column in columns:
        if column not in present:
            raise InputError(column, "is not a column of the source")
    if rows == 0:
        raise InputError(None, "has no rows to anonymise")
    if k > rows:
        raise SpecError("k", f"is larger than the number of rows ({rows}); no class can reach it")


def published_labels(
    frame: pd.DataFrame, class_ids: np.ndarray, published: np.ndarray, hierarchies, levels: dict | None = None
) -> pd.DataFrame:
    """The k-quasi labels to publish, computed from the published records only.

    ``frame`` holds the k-quasi columns of the records the anonymiser kept, ``class_ids`` their
    class, ``published`` which of them survive every suppression stage. With ``levels`` (OLA's
    node) every value is generalised to its column's level; without (Mondrian) each class gets, per
    column, the lowest hierarchy level at which its *published* members agree. Either way a label is
    a node of a public hierarchy and no label depends on a suppressed record: changing a suppressed
    record's value changes nothing here. Rows not published get the top label (they are dropped).

    Raises ``SpecError`` for a column without a hierarchy: its only labels would be the class's
    true values or extremes.
    """
    codes = published_label_codes(frame, class_ids, published, hierarchies, levels)
    return pd.DataFrame({column: label_table(hierarchies[column])[1].take(codes[column]) for column in frame.columns},
                        index=frame.index)


def published_label_codes(
    frame: pd.DataFrame, class_ids: np.ndarray, published: np.ndarray, hierarchies, levels: dict | None = None,
    leaf_codes: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """:func:`published_labels` as numbers: per column, each row's label as its position among the
    hierarchy's distinct labels (:func:`label_table`). ``leaf_codes``: each column's
    ``Hierarchy.leaf_codes``, when the caller has them already (they match text: once per partition)."""
    dense_ids, n_classes = _dense(class_ids)
    published = np.asarray(published, dtype=bool)
    runs = None
    if levels is None and published.any():  # the published members by class, sorted once for every column
        members = np.flatnonzero(published)
        runs = ClassRuns.of(dense_ids[members])
    codes = {}
    for column in frame.columns:
        hierarchy = hierarchies.get(column)
        if hierarchy is None:
            raise SpecError(
                f"roles.k_quasi.{column}",
                "needs a hierarchy (a file or a builder: intervals, masking, dates); without one its labels "
                "would print the class's true values",
            )
        leaves = leaf_codes[column] if leaf_codes is not None else hierarchy.leaf_codes(frame[column])
        if levels is not None:
            class_level = np.full(n_classes, int(levels[column]), dtype=np.int64)
        else:
            class_level = np.full(n_classes, hierarchy.height - 1, dtype=np.int64)
            if runs is not None:
                found = lowest_common_levels(leaves[members], dense_ids[members], hierarchy, runs)
                class_level[:len(found)] = found  # classes past the last published one keep the top level
        row_level = np.where(published, class_level[dense_ids], hierarchy.height - 1)
        positions, _ = label_table(hierarchy)
        first = np.cumsum([0] + [len(level) for level in hierarchy.labels[:-1]], dtype=np.int64)
        codes[column] = positions[first[row_level] + leaves]
    return codes


def relabel_after_suppression(
    every: dict[str, np.ndarray], frame: pd.DataFrame, class_ids: np.ndarray, published: np.ndarray, hierarchies,
    levels: dict | None = None, leaf_codes: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """:func:`published_label_codes` for ``published``, from ``every``: the codes with every record published.

    A class's labels depend on its own published members only, so only the classes with a record not
    published can differ from ``every``; those classes' rows alone are labelled again. A partitioned release
    needs both (the certificate predicts its groups with every kept record published), and labelling twice
    cost it a pass over every row and column.
    """
    published = np.asarray(published, dtype=bool)
    class_ids = np.asarray(class_ids)
    if published.all():
        return every
    rows = np.flatnonzero(np.isin(class_ids, np.unique(class_ids[~published])))
    leaves = {column: codes[rows] for column, codes in leaf_codes.items()} if leaf_codes is not None else None
    again = published_label_codes(frame.iloc[rows], class_ids[rows], published[rows], hierarchies, levels, leaves)
    result = {}
    for column, codes in every.items():
        result[column] = codes.copy()
        result[column][rows] = again[column]
    return result


def label_table(hierarchy: Hierarchy) -> tuple[np.ndarray, pd.api.extensions.ExtensionArray]:
    """Every level's labels laid end to end (level 0's for each leaf, then level 1's, ...): per place, the
    number of its label among the distinct labels, numbered as first met; and those distinct labels, as
    text (``str``). A label shared by several leaves or levels (a top ``*``) is one number."""
    numbers, distinct = pd.factorize(pd.array(np.concatenate(hierarchy.labels), dtype=str))
    return numbers.astype(np.int64, copy=False), distinct


def _dense(class_ids: np.ndarray) -> tuple[np.ndarray, int]:
    unique, dense = unique_inverse(np.asarray(class_ids))
    return dense, len(unique)
