"""What a release's private figures are drawn from, in a form whose size does not grow with the groups.

``tasks/figures.release_figures`` draws two figures: the published groups' sizes (a histogram on log bins)
and each anonymiser class's measured against predicted relative error (one point per class up to
``SCATTER_LIMIT`` classes shown, above that how many classes fall in each hexagonal cell). Both read every
group or class, which the partitioned (Dask) release never gathers in one process; so they are drawn from
reductions that are exact for what the figures show, and that partitions add up:

* the group sizes as a **frequency of frequencies** (``SizeCounts``: each distinct size and how many groups
  have it, as many entries as distinct sizes: a few hundred at most, whatever the rows) — the histogram of the
  distinct sizes weighted by their counts is the histogram of every group's size;
* the errors' **extremes** and the number of classes shown (``ErrorExtremes``), added up first; then, with
  them known, either the points themselves (at most ``SCATTER_LIMIT`` in all) or the **counts per hexagon**
  of the grid ``hexbin`` lays over those extremes (``ErrorCells``: matplotlib's own assignment of a point to
  a cell, so counts added over partitions are those ``hexbin`` counts over every point).

The in-memory path builds the same object from its arrays (``FigureInputs.of_arrays``), so both engines
draw with one code. Numpy only: the workers compute their parts without importing matplotlib.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Above this many classes a scatter is a blot: the error figure shows how many classes fall in each cell instead.
SCATTER_LIMIT = 2000
GRIDSIZE = 35  # hexagons across the error figure (``hexbin``'s ``gridsize``)

Extent = tuple[float, float, float, float]  # log10 bounds (x low, x high, y low, y high), as hexbin's ``extent``


@dataclass(frozen=True)
class SizeCounts:
    """A frequency of frequencies: ``counts[i]`` groups of ``values[i]`` records (values increasing, counts > 0)."""

    values: np.ndarray
    counts: np.ndarray

    @classmethod
    def of(cls, sizes: np.ndarray) -> SizeCounts:
        values, counts = np.unique(np.asarray(sizes, dtype=np.int64), return_counts=True)
        return cls(values.astype(np.int64), counts.astype(np.int64))

    @classmethod
    def add(cls, parts: list[SizeCounts]) -> SizeCounts:
        """The frequency of frequencies of the union of disjoint sets of groups."""
        values = np.concatenate([np.zeros(0, np.int64), *(p.values for p in parts)])
        counts = np.concatenate([np.zeros(0, np.int64), *(p.counts for p in parts)])
        unique, inverse = np.unique(values, return_inverse=True)
        total = np.bincount(inverse.reshape(-1), weights=counts, minlength=len(unique))
        return cls(unique.astype(np.int64), total.astype(np.int64))

    @property
    def groups(self) -> int:
        return int(self.counts.sum())

    @property
    def records(self) -> int:
        return int((self.values * self.counts).sum())

    @property
    def squares(self) -> int:
        """The sum of the squared sizes (discernibility), in Python integers (no overflow)."""
        return sum(v * v * c for v, c in zip(self.values.tolist(), self.counts.tolist()))

    @property
    def smallest(self) -> int:
        return int(self.values[0]) if len(self.values) else 0

    @property
    def largest(self) -> int:
        return int(self.values[-1]) if len(self.values) else 0


def shown_errors(predicted: np.ndarray, measured: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The classes the error figure shows, in their order: both errors positive (a log–log plot)."""
    predicted = np.asarray(predicted, dtype=np.float64)
    measured = np.asarray(measured, dtype=np.float64)
    shown = (predicted > 0) & (measured > 0)
    return predicted[shown], measured[shown]


@dataclass(frozen=True)
class ErrorExtremes:
    """Classes' errors as the error figure's frame needs them: how many are shown, and each error's extremes."""

    shown: int
    predicted: tuple[float, float]  # (smallest, largest); (inf, -inf) for none shown
    measured: tuple[float, float]

    @classmethod
    def of(cls, predicted: np.ndarray, measured: np.ndarray) -> ErrorExtremes:
        predicted, measured = shown_errors(predicted, measured)
        return cls(len(predicted), _extremes(predicted), _extremes(measured))

    @classmethod
    def add(cls, parts: list[ErrorExtremes]) -> ErrorExtremes:
        """The extremes of the union of disjoint sets of classes."""
        return cls(sum(p.shown for p in parts), _union([p.predicted for p in parts]), _union([p.measured for p in parts]))

    @property
    def as_points(self) -> bool:
        """Whether the figure draws one point per class (else counts per hexagon)."""
        return self.shown <= SCATTER_LIMIT

    def extent(self) -> Extent:
        """``hexbin``'s own extent over these classes (it makes it when given none): log10 of the extremes,
        widened when they (nearly) coincide."""
        return (*_nonsingular(math.log10(self.predicted[0]), math.log10(self.predicted[1])),
                *_nonsingular(math.log10(self.measured[0]), math.log10(self.measured[1])))


def _nonsingular(low: float, high: float, expander: float = 0.1, tiny: float = 1e-15) -> tuple[float, float]:
    """Matplotlib's ``transforms._nonsingular`` with ``hexbin``'s expander (0.1), for ``low <= high``: an
    interval too narrow to bin is widened by ``expander`` × its ends (or made ±``expander`` about 0). Copied
    rather than imported: the public alias is deprecated since matplotlib 3.11, and workers need no matplotlib."""
    largest = max(abs(low), abs(high))
    if largest < (1e6 / tiny) * np.finfo(float).tiny:
        return -expander, expander
    if high - low <= largest * tiny:
        if high == 0 and low == 0:
            return -expander, expander
        return low - expander * abs(low), high + expander * abs(high)
    return low, high


def _extremes(values: np.ndarray) -> tuple[float, float]:
    return (float(values.min()), float(values.max())) if len(values) else (math.inf, -math.inf)


def _union(ranges: list[tuple[float, float]]) -> tuple[float, float]:
    return (min((r[0] for r in ranges), default=math.inf), max((r[1] for r in ranges), default=-math.inf))


@dataclass(frozen=True)
class _Grid:
    """``hexbin``'s hexagon grid over an extent (matplotlib 3.x, ``Axes.hexbin``): two lattices of centres,
    ``(nx+1)·(ny+1)`` at integer and ``nx·ny`` at half-integer positions, in steps of ``sx`` and ``sy``."""

    nx: int
    ny: int
    xmin: float
    ymin: float
    sx: float
    sy: float

    @classmethod
    def over(cls, extent: Extent, gridsize: int = GRIDSIZE) -> _Grid:
        nx, ny = gridsize, int(gridsize / math.sqrt(3))
        xmin, xmax, ymin, ymax = extent
        padding = 1.0e-9 * (xmax - xmin)  # hexbin's padding against round-off at the edges
        xmin, xmax = xmin - padding, xmax + padding
        return cls(nx, ny, xmin, ymin, (xmax - xmin) / nx, (ymax - ymin) / ny)

    @property
    def cells(self) -> int:
        return (self.nx + 1) * (self.ny + 1) + self.nx * self.ny


@dataclass(frozen=True)
class ErrorCells:
    """Classes per hexagon of the error figure's grid, sparse: ``counts[i]`` classes in cell ``cells[i]``."""

    cells: np.ndarray
    counts: np.ndarray

    @classmethod
    def of(cls, predicted: np.ndarray, measured: np.ndarray, extent: Extent) -> ErrorCells:
        """The shown classes counted per cell with ``hexbin``'s rule: the nearer centre of the two lattices."""
        predicted, measured = shown_errors(predicted, measured)
        grid = _Grid.over(extent)
        nx, ny = grid.nx, grid.ny
        ix = (np.log10(predicted) - grid.xmin) / grid.sx
        iy = (np.log10(measured) - grid.ymin) / grid.sy
        ix1, iy1 = np.round(ix).astype(np.int64), np.round(iy).astype(np.int64)
        ix2, iy2 = np.floor(ix).astype(np.int64), np.floor(iy).astype(np.int64)
        first = (ix - ix1) ** 2 + 3.0 * (iy - iy1) ** 2 < (ix - ix2 - 0.5) ** 2 + 3.0 * (iy - iy2 - 0.5) ** 2
        inside1 = (0 <= ix1) & (ix1 < nx + 1) & (0 <= iy1) & (iy1 < ny + 1)
        inside2 = (0 <= ix2) & (ix2 < nx) & (0 <= iy2) & (iy2 < ny)
        flat = np.where(first, ix1 * (ny + 1) + iy1, (nx + 1) * (ny + 1) + ix2 * ny + iy2)
        kept = np.where(first, inside1, inside2)  # hexbin drops a point outside its lattice (none, over the extremes)
        dense = np.bincount(flat[kept], minlength=grid.cells)
        return cls.of_dense(dense)

    @classmethod
    def of_dense(cls, dense: np.ndarray) -> ErrorCells:
        cells = np.flatnonzero(dense)
        return cls(cells.astype(np.int64), np.asarray(dense)[cells].astype(np.int64))

    @classmethod
    def add(cls, parts: list[ErrorCells], extent: Extent) -> ErrorCells:
        cells = np.concatenate([np.zeros(0, np.int64), *(p.cells for p in parts)])
        counts = np.concatenate([np.zeros(0, np.int64), *(p.counts for p in parts)])
        return cls.of_dense(np.bincount(cells, weights=counts, minlength=_Grid.over(extent).cells).astype(np.int64))

    def centres(self, extent: Extent) -> tuple[np.ndarray, np.ndarray]:
        """The centres of the non-empty cells, in data units (not logs), in ``cells``' order."""
        grid = _Grid.over(extent)
        nx, ny = grid.nx, grid.ny
        x = np.concatenate([np.repeat(np.arange(nx + 1), ny + 1), np.repeat(np.arange(nx) + 0.5, ny)])
        y = np.concatenate([np.tile(np.arange(ny + 1), nx + 1), np.tile(np.arange(ny), nx) + 0.5])
        return 10.0 ** (x[self.cells] * grid.sx + grid.xmin), 10.0 ** (y[self.cells] * grid.sy + grid.ymin)


@dataclass(frozen=True)
class FigureInputs:
    """What ``release_figures`` draws: the published groups' sizes and the classes' errors, reduced.

    The errors as ``points`` (predicted, measured; in class order) when at most ``SCATTER_LIMIT`` classes are
    shown, else as ``cells`` over ``extent`` (``errors.extent()``)."""

    group_sizes: SizeCounts
    errors: ErrorExtremes
    points: tuple[np.ndarray, np.ndarray] | None = None
    extent: Extent | None = None
    cells: ErrorCells | None = None

    @classmethod
    def of_arrays(cls, group_sizes: np.ndarray, predicted: np.ndarray, measured: np.ndarray) -> FigureInputs:
        """From every group's size and every class's errors (the in-memory path, or a test)."""
        errors = ErrorExtremes.of(predicted, measured)
        if errors.as_points:
            return cls(SizeCounts.of(group_sizes), errors, points=shown_errors(predicted, measured))
        extent = errors.extent()
        return cls(SizeCounts.of(group_sizes), errors, extent=extent, cells=ErrorCells.of(predicted, measured, extent))
