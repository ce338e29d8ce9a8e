"""Generalisation hierarchies: loading, validation, generalising a column, precision.

File format (the common one of anonymisation tools): one row per leaf value, one column per level,
`;`-separated, no header. Level 0 is the raw value, level h-1 is usually `*`:
``1977;1976-1977;1976-1979;1976-1983;*``.

The file is read as text, exactly as a CSV source is (a UTF-8 byte-order mark is dropped, quoted
entries may hold ``;`` or line breaks): values are matched to leaves as text, so the leaves ``007``,
``NA`` and ``TRUE`` match the data cells ``007``, ``NA`` and ``TRUE`` and nothing else. ``classify``
hands every k-quasi on as text; a typed value (an integer from Parquet, or one given to the engine
directly) is matched by its string form, so the integer 1977 matches the leaf ``1977``.

Leaves keep the order of the file; that order is what Mondrian and OLA use to encode a
categorical column as integers (siblings are adjacent in well-made hierarchies, so median cuts on
the order tend to respect the hierarchy).
"""

import csv
import hashlib
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .errors import HierarchyError
from .sorting import stable_argsort


@dataclass(frozen=True)
class Hierarchy:
    """A loaded hierarchy for one column.

    ``labels[level][leaf_code]`` is the label of leaf ``leaf_code`` at ``level``;
    ``label_codes[level][leaf_code]`` is that label's integer code at that level (codes are dense,
    0..n_labels-1, in order of first appearance), so grouping on codes equals grouping on labels.

    ``leaf_numbers[leaf_code]``, when present, is the leaf's position on a number line (the value
    itself for an interval hierarchy, a day ordinal for a date hierarchy) so that a partitioner can
    measure widths in the column's own units instead of counting leaves. Hierarchies read from a
    file, and masking hierarchies, have none: their leaves are just an order.
    """

    column: str
    leaves: pd.Index  # leaf values as strings, in file order; position = leaf code
    labels: tuple[np.ndarray, ...]  # one object array of labels per level
    label_codes: tuple[np.ndarray, ...]  # one int array per level
    sha256: str
    leaf_numbers: np.ndarray | None = None  # float per leaf code, or None (see above)

    @property
    def height(self) -> int:
        """Number of levels h (level 0 = raw value, level h-1 = most general)."""
        return len(self.labels)

    def leaf_codes(self, values: pd.Series) -> np.ndarray:
        """Integer leaf code of every value; raises if any value is not a leaf.

        The values are factorised first, so the text matching runs once per distinct value.
        """
        value_codes, distinct = pd.factorize(values, use_na_sentinel=False)
        distinct = pd.Series(distinct, name=values.name)
        check_covers(self, distinct)
        return self.leaves.get_indexer(_as_strings(distinct)).astype(np.int64)[value_codes]


def _as_strings(values: pd.Series) -> pd.Series:
    return values.astype(str) if values.dtype != object else values.map(str)


def load_hierarchy(path: str | Path, column: str) -> Hierarchy:
    """Read and validate a hierarchy file for ``column``.

    Refuses: an unreadable or non-UTF-8 file, an empty file, rows with different numbers of levels,
    empty labels, and a leaf listed twice. Errors name the column, never a value.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise HierarchyError(column, f"cannot read hierarchy file {str(path)!r} ({exc.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise HierarchyError(column, f"hierarchy file {str(path)!r} is not UTF-8 text") from None
    text = text.removeprefix("\ufeff")  # spreadsheet programs write a byte-order mark
    rows = [row for row in csv.reader(io.StringIO(text, newline=""), delimiter=";") if row]
    if not rows:
        raise HierarchyError(column, f"hierarchy file {str(path)!r} is empty")
    widths = {len(row) for row in rows}
    if len(widths) != 1:
        raise HierarchyError(
            column, f"hierarchy file {str(path)!r} has rows with different numbers of levels {sorted(widths)}"
        )
    table = np.array(rows, dtype=object)
    if (table == "").any():
        raise HierarchyError(column, f"hierarchy file {str(path)!r} has an empty label")
    leaves = pd.Index(table[:, 0])
    if leaves.has_duplicates:
        raise HierarchyError(column, f"hierarchy file {str(path)!r} lists a leaf value more than once")
    labels = tuple(table[:, level] for level in range(table.shape[1]))
    label_codes = tuple(pd.factorize(level_labels)[0].astype(np.int64) for level_labels in labels)
    return Hierarchy(
        column=column,
        leaves=leaves,
        labels=labels,
        label_codes=label_codes,
        sha256=hashlib.sha256(raw).hexdigest(),
    )


def check_covers(hierarchy: Hierarchy, values: pd.Series) -> None:
    """Raise if some value of the column has no leaf in the hierarchy.

    The message counts the missing values but does not quote them: they are private data.
    """
    distinct = pd.Index(_as_strings(values).unique())
    missing = distinct.difference(hierarchy.leaves)
    if len(missing):
        raise HierarchyError(
            hierarchy.column,
            f"{len(missing)} distinct value(s) of the data are not leaves of its hierarchy",
        )


def generalise(values: pd.Series, hierarchy: Hierarchy, level: int) -> pd.Series:
    """The column's values generalised to ``level`` (0 = unchanged labels, h-1 = most general)."""
    if not 0 <= level < hierarchy.height:
        raise HierarchyError(hierarchy.column, f"level {level} is outside 0..{hierarchy.height - 1}")
    codes = hierarchy.leaf_codes(values)
    return pd.Series(hierarchy.labels[level][codes], index=values.index, name=values.name)


def categorical_precision(level: "int | np.ndarray", height: int) -> "float | np.ndarray":
    """Information loss of a value generalised to ``level`` of an h-level hierarchy: l/(h-1) (per element
    for an array of levels)."""
    if height <= 1:
        return 0.0
    return level / (height - 1)


@dataclass(frozen=True)
class ClassRuns:
    """Members grouped by class without moving them: ``order`` lists the members class by class (stably),
    ``starts`` where each class's run begins in that order, ``classes`` the class of each run.

    Sorting once and reducing over runs (``np.minimum.reduceat``) costs a fraction of a scatter per
    member (``np.minimum.at``), and one sort serves every column and level of a class partition.
    """

    order: np.ndarray
    starts: np.ndarray
    classes: np.ndarray

    @classmethod
    def of(cls, class_ids: np.ndarray) -> "ClassRuns":
        order = stable_argsort(class_ids)
        grouped = class_ids[order]
        starts = np.flatnonzero(np.concatenate([[True], grouped[1:] != grouped[:-1]])) if len(grouped) else \
            np.zeros(0, dtype=np.int64)
        return cls(order, starts, grouped[starts])


def lowest_common_levels(
    leaf_codes: np.ndarray, class_ids: np.ndarray, hierarchy: Hierarchy, runs: ClassRuns | None = None
) -> np.ndarray:
    """For each class, the lowest level at which all its members share one label.

    ``class_ids`` must be dense integers 0..n_classes-1 (a class without members gets the top level).
    Vectorised: per level, a class is uniform when the minimum and maximum label code over its members
    agree, reduced over the members' runs by class (``runs``: ``ClassRuns.of(class_ids)``, computed here
    when not given, so that a caller with several columns sorts once).
    """
    n_classes = int(class_ids.max()) + 1 if len(class_ids) else 0
    result = np.full(n_classes, hierarchy.height - 1, dtype=np.int64)
    if not n_classes:
        return result
    runs = runs if runs is not None else ClassRuns.of(class_ids)
    grouped_leaves = leaf_codes[runs.order]
    settled = np.zeros(len(runs.starts), dtype=bool)
    for level in range(hierarchy.height):
        codes = hierarchy.label_codes[level][grouped_leaves]
        uniform = (np.minimum.reduceat(codes, runs.starts) == np.maximum.reduceat(codes, runs.starts)) & ~settled
        result[runs.classes[uniform]] = level
        settled |= uniform
        if settled.all():
            break
    return result
