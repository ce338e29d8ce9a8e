"""Per-class Laplace perturbation of the ε-quasi columns (method.md §4 and §7).

What is computed
----------------
Every ε-quasi column ``a`` declares public bounds ``[lower, upper]`` and gets a record budget share
``ε_a`` (the record's ε split across its ε-quasis, ``Σ_a ε_a = ε``: sequential composition inside the
record, because the ε-quasis of one record are one query). In **both** scale bases the values are
first clamped to ``[lower, upper]`` (the release stage before refuses values outside unless the spec
says clamp; the number clamped is counted in the private report only). Then, for every record ``i``
of equivalence class ``ec``:

- ``scale_basis="diameter"`` (the paper's method): ``b = diam_a(ec) / ε_a`` with
  ``diam_a(ec) = max − min`` of the clamped column over the class. A class with zero diameter gets
  no noise and is published exactly (its members are already indistinguishable on that column; the
  method prescribes it, and it does reveal that the class's values are all equal).
- ``scale_basis="bounds"``: ``b = (upper − lower) / ε_a`` for every record.

The noisy value is ``v + Lap(0, b)`` drawn independently per record and column, then *snapped*.

Public snapping grid (against the floating-point low-bit channel, Mironov 2012)
-------------------------------------------------------------------------------
A textbook float Laplace sample ``v + Lap(b)`` leaks ``v`` through which floats are reachable. Each
noisy value is therefore rounded (half to even) to the grid ``Λ_a·ℤ`` of its column, with

    Λ_a = 2^(ceil(log2((upper − lower) / ε_a)) − 10)          (:func:`public_grid`)

a power of two (so ``x/Λ`` and ``round(x/Λ)·Λ`` are exact in binary floating point) that depends on
the public bounds and ε_a only, never on a private value: it is the same for every class and in both
scale bases, so it can be published and the published values reveal nothing through their grid (an
earlier grid tied to each class's scale gave away every class's diameter within a factor of two).
Since clamped values lie in the bounds, every scale satisfies ``b ≤ (upper − lower)/ε_a ≤ 1024·Λ_a``;
for the bounds scale ``Λ_a < b/512``, so rounding moves a value by at most ``Λ_a/2 < b/1024``.
In diameter mode a class with a small diameter may have ``b`` below ``Λ_a``: its published values are
then mostly ``v`` rounded to the grid (still post-processing of ``v + Lap(b)``).
``ceil(log2 ·)`` is taken exactly from the binary exponent (``np.frexp``), not from a rounded
logarithm. The release is refused (``SpecError('epsilon')``) if ``Λ_a`` is less than
``2**SPACING_MARGIN_BITS`` times the float spacing (``np.spacing``) at the magnitude of any noised
record's original or raw noisy value: then every grid cell spans at least 2^20 floats and the
reachable-float pattern inside a cell is not visible in the output. In both scale bases the noisy value
is finally clamped to the bounds rounded inwards to the grid, ``[L', U']``, so every output lies on the
grid *and* inside ``[lower, upper]`` (clamping is post-processing: it costs no ε, and the expected
error of the clamped value is what the release predicts, ``metrics.expected_absolute_error``).
Zero-diameter classes are published unchanged (their values, clamped to the bounds), not snapped.

This is the snapping *idea*, not Mironov's mechanism with its proof: the Laplace draw is numpy's
(inverse-CDF on a 53-bit uniform), whose own rounding is not analysed here.

Guarantee
---------
- ``diameter``: indistinguishability of the records *inside* each equivalence class on each ε-quasi,
  under the paper's threat model (the adversary already knows everyone's quasi-identifiers). This is
  **not** ε-differential privacy in the standard sense: ``b`` is computed from the private values
  (the class diameter), zero-diameter classes are published exactly, and the partition itself is
  data-dependent.
- ``bounds``: ε-differential privacy for the ε-quasi values **given the partition** (the partition
  and everything else released are not covered): each record's clamped ε-quasis are perturbed with a
  scale and grid from public bounds, records are disjoint (parallel composition), the ε-quasis of a
  record compose sequentially to ``Σ_a ε_a = ε``, and snapping and output clamping are
  post-processing (up to the floating-point caveat above). It holds for the whole release only
  because confidence suppression is switched off in bounds mode (see ``suppress.py``).
- Randomness comes from a 256-bit seed drawn with ``secrets``, through
  :class:`~kepsilon.engine.randomness.RecordStreams`: the draw of record ``i`` on column ``a`` is a
  function of (seed, i, a) only, so the same seed re-derives the same release byte for byte however
  the table is partitioned. The seed is as sensitive as the data: it is never logged, put in a
  report or a repr here.

The report (``PerturbResult.report``) is private: it holds mean scales, clamped counts and the number
of zero-diameter classes, all computed from private values. Only each column's ``grid`` in it is public.
"""

import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd

from .errors import InputError, SpecError
from .randomness import SEED_BYTES, STREAMS_VERSION, RecordStreams
from .sorting import unique_inverse

GRID_BITS_BELOW_SCALE = 10  # Λ = 2^(ceil(log2((upper − lower)/ε)) − 10)
SPACING_MARGIN_BITS = 20  # Λ must span ≥ 2^20 floats at the value's magnitude
SCALE_BASES = ("diameter", "bounds")


def new_seed() -> bytes:
    """A fresh 256-bit release seed from the operating system's CSPRNG (``secrets``)."""
    return secrets.token_bytes(SEED_BYTES)


def record_noise(noise, column: str, positions: np.ndarray) -> np.ndarray:
    """Standard Laplace draws for ``positions`` on ``column``.

    A release passes its :class:`RecordStreams` (the draw is keyed per record, so it does not depend
    on partitioning); a simulation that publishes nothing (the advisor, the test of a formula) may
    pass a numpy ``Generator`` instead, drawn sequentially.
    """
    if isinstance(noise, RecordStreams):
        return noise.laplace(column, positions)
    if isinstance(noise, np.random.Generator):
        return noise.laplace(0.0, 1.0, size=len(positions))
    raise SpecError("noise", "must be the release's RecordStreams or, for a simulation, a numpy Generator")


@dataclass
class PerturbResult:
    """Outcome of :func:`perturb`.

    ``frame``: copy of the input with the ε-quasi columns replaced by their noisy values (same index).
    ``scales``: Laplace scale ``b`` per record, per ε-quasi column (0 where no noise was added); the
    confidence suppression and the predicted error need it, and it is private (in diameter mode it is
    each class's diameter over ε). ``report``: JSON-serialisable private summary, no data values.
    """

    frame: pd.DataFrame = field(repr=False)
    scales: dict[str, np.ndarray] = field(repr=False)
    report: dict[str, Any]


def source_positions(frame: pd.DataFrame) -> np.ndarray:
    """Each row's position in the source table: the frame's index, which every stage keeps.

    The noise of a record is keyed by it, so it must be a unique non-negative integer per row.
    """
    index = frame.index
    if len(index) and (not pd.api.types.is_integer_dtype(index.dtype) or not index.is_unique or index.min() < 0):
        raise SpecError("frame", "needs its source positions as index (unique non-negative integers)")
    return np.asarray(index, dtype=np.int64)


def dense_class_ids(class_ids: np.ndarray, n_rows: int) -> tuple[np.ndarray, int]:
    """Validate per-row class ids and renumber them densely 0..n_classes-1 (order preserved)."""
    class_ids = np.asarray(class_ids)
    if class_ids.ndim != 1 or len(class_ids) != n_rows:
        raise SpecError("class_ids", f"needs one class id per row ({n_rows})")
    if not np.issubdtype(class_ids.dtype, np.integer):
        raise SpecError("class_ids", "must be integers")
    if n_rows and class_ids.min() < 0:
        raise SpecError("class_ids", "negative ids (suppressed rows) must be dropped before this step")
    if n_rows and int(class_ids.max()) < 4 * n_rows:
        # Ids from the anonymisers are small: a count per id renumbers in linear time, where a sort
        # (np.unique) dominated the advisor's many calls on large stacked tables. Same ids, same order.
        present = np.bincount(class_ids.astype(np.int64, copy=False), minlength=1) > 0
        renumber = np.cumsum(present) - 1
        return renumber[class_ids].astype(np.int64), int(present.sum())
    unique, dense = unique_inverse(class_ids)
    return dense, len(unique)


def numeric_column(frame: pd.DataFrame, column: str) -> np.ndarray:
    """The column as finite float64 values; refuses a missing, non-numeric or non-finite column.

    Errors name the column and count the bad values, never quote them.
    """
    if column not in frame.columns:
        raise InputError(column, "ε-quasi column is missing from the data")
    series = frame[column]
    if pd.api.types.is_bool_dtype(series) or not pd.api.types.is_numeric_dtype(series):
        raise InputError(column, "ε-quasi column must be numeric")
    values = series.to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(values)
    if bad.any():
        raise InputError(column, f"{int(bad.sum())} value(s) are missing or infinite")
    return values


def _checked_epsilon(column: str, epsilon_split: dict[str, float]) -> float:
    if column not in epsilon_split:
        raise SpecError("epsilon", f"no share of ε for ε-quasi column {column!r}")
    value = epsilon_split[column]
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise SpecError("epsilon", f"ε for column {column!r} must be a number")
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise SpecError("epsilon", f"ε for column {column!r} must be positive and finite")
    return value


def _checked_bounds(quasi: Any) -> tuple[float, float]:
    column = quasi.column
    lower, upper = getattr(quasi, "lower", None), getattr(quasi, "upper", None)
    where = f"roles.e_quasi.{column}"
    if lower is None or upper is None:
        raise SpecError(where, f"ε-quasi column {column!r} needs public lower and upper bounds")
    lower, upper = float(lower), float(upper)
    if not (math.isfinite(lower) and math.isfinite(upper) and lower < upper):
        raise SpecError(where, f"bounds of column {column!r} must be finite with lower < upper")
    return lower, upper


def public_grid(lower: float, upper: float, epsilon: float) -> float:
    """The public snapping grid ``Λ = 2^(ceil(log2((upper − lower)/ε)) − 10)`` of one ε-quasi.

    Depends only on the column's public bounds and its ε share, so it may be published in the
    manifest. The exponent is exact (see :func:`grid_exponents`). Refuses (``SpecError``)
    non-finite or inverted bounds and a non-positive or non-finite ε.
    """
    for name, value in (("lower", lower), ("upper", upper), ("epsilon", epsilon)):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise SpecError(name, "must be a number")
    lower, upper, epsilon = float(lower), float(upper), float(epsilon)
    if not (math.isfinite(lower) and math.isfinite(upper) and lower < upper):
        raise SpecError("bounds", "must be finite with lower < upper")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise SpecError("epsilon", "must be positive and finite")
    width_over_epsilon = (upper - lower) / epsilon
    if not (math.isfinite(width_over_epsilon) and width_over_epsilon > 0):
        raise SpecError("epsilon", "(upper − lower)/ε must be positive and finite")
    return float(np.ldexp(1.0, int(grid_exponents(np.array([width_over_epsilon]))[0])))


def grid_bounds(lower: float, upper: float, grid: float) -> tuple[float, float]:
    """The bounds rounded inwards to the grid, ``[L', U']``: where bounds-mode outputs are clamped."""
    return math.ceil(lower / grid) * grid, math.floor(upper / grid) * grid


def class_diameters(values: np.ndarray, dense_ids: np.ndarray, n_classes: int) -> np.ndarray:
    """max − min of ``values`` per class (dense ids), one entry per class."""
    low = np.full(n_classes, np.inf)
    high = np.full(n_classes, -np.inf)
    np.minimum.at(low, dense_ids, values)
    np.maximum.at(high, dense_ids, values)
    return high - low


def noise_scales(
    clamped: np.ndarray, dense_ids: np.ndarray, n_classes: int, lower: float, upper: float, epsilon: float, scale_basis: str
) -> np.ndarray:
    """The Laplace scale ``b`` per row of one ε-quasi, from values already clamped to the bounds.

    ``diameter``: the class diameter over ε (0 for a zero-diameter class); ``bounds``:
    ``(upper − lower)/ε`` for every row. The one definition :func:`perturb` draws its noise with.
    """
    if scale_basis == "diameter":
        return class_diameters(clamped, dense_ids, n_classes)[dense_ids] / epsilon
    return np.full(len(clamped), (upper - lower) / epsilon)


def grid_exponents(scales: np.ndarray) -> np.ndarray:
    """Exponent ``g = ceil(log2 s) − 10`` for positive ``s`` (``s = (upper − lower)/ε`` for the grid).

    Exact: ``frexp`` gives ``b = m·2^e`` with ``m ∈ [0.5, 1)``, so ``ceil(log2 b)`` is ``e − 1`` when
    ``b`` is a power of two (``m = 0.5``) and ``e`` otherwise.
    """
    mantissa, exponent = np.frexp(scales)
    ceil_log2 = exponent - (mantissa == 0.5)
    return (ceil_log2 - GRID_BITS_BELOW_SCALE).astype(np.int64)


def snap(raw: np.ndarray, grid) -> np.ndarray:
    """Round each value to the nearest multiple of the power-of-two grid (exact in binary floats)."""
    return np.round(raw / grid) * grid


NOISE_TAIL_SCALES = 64  # P(|Laplace(b)| > 64·b) = e^−64: the reach of a noisy value checked before any noise


def check_noise_grid(e_quasis: Sequence[Any], epsilon_split: dict[str, float]) -> None:
    """Refuse (``SpecError('epsilon')``), before any ε is reserved, an ε at which the noise of some ε-quasi
    could not be published: its public grid wider than its bounds (ε too small), or finer than
    ``2**SPACING_MARGIN_BITS`` float steps at the largest magnitude a value in the bounds plus its noise
    reaches (``NOISE_TAIL_SCALES`` public scales; ε too large). Reads the spec only, never a value, so the
    check that :func:`perturb` repeats on the drawn values passes whenever this one did (but for noise beyond
    64 scales, probability e^−64)."""
    for quasi in e_quasis:
        column = quasi.column
        epsilon = _checked_epsilon(column, epsilon_split)
        lower, upper = _checked_bounds(quasi)
        grid = public_grid(lower, upper, epsilon)
        too_fine = SpecError(
            "epsilon",
            f"column {column!r}: ε is so large that the noise grid is finer than the values' float precision "
            f"(under 2^{SPACING_MARGIN_BITS} float steps); use a smaller ε",
        )
        # An ε near the float maximum makes the grid subnormal (or 0): bounds / grid overflow before any
        # comparison could say so.
        if grid == 0 or not (math.isfinite(lower / grid) and math.isfinite(upper / grid)):
            raise too_fine
        inner_low, inner_high = grid_bounds(lower, upper, grid)
        if inner_low > inner_high:
            raise SpecError(
                "epsilon",
                f"column {column!r}: ε is so small that the noise grid is wider than the bounds; use a larger ε "
                "(or wider public bounds)",
            )
        reach = max(abs(lower), abs(upper)) + NOISE_TAIL_SCALES * (upper - lower) / epsilon
        if grid < np.ldexp(np.spacing(reach), SPACING_MARGIN_BITS):
            raise too_fine


def _check_grid_resolution(column: str, grid: float, *magnitudes: np.ndarray) -> None:
    if not len(magnitudes[0]):
        return
    # The float spacing grows with the magnitude, so the largest magnitude decides whether any is too fine;
    # the per-value check runs only then, for the count in the message.
    largest = max(float(np.fmax.reduce(np.abs(m), initial=0.0)) for m in magnitudes)  # fmax: past any NaN
    if grid < np.ldexp(np.spacing(largest), SPACING_MARGIN_BITS):
        magnitude = np.maximum.reduce([np.abs(m) for m in magnitudes])
        too_fine = grid < np.ldexp(np.spacing(magnitude), SPACING_MARGIN_BITS)
        raise SpecError(
            "epsilon",
            f"column {column!r}: noise is too small for the values' float precision in "
            f"{int(too_fine.sum())} record(s) (snapping grid under 2^{SPACING_MARGIN_BITS} float steps); "
            "use a smaller ε or a coarser partition",
        )


def perturb(
    frame: pd.DataFrame,
    class_ids: np.ndarray,
    e_quasis: Sequence[Any],
    epsilon_split: dict[str, float],
    scale_basis: Literal["diameter", "bounds"],
    noise: "RecordStreams | np.random.Generator",
) -> PerturbResult:
    """Add snapped Laplace noise to every ε-quasi of every record, calibrated per equivalence class.

    ``class_ids``: one non-negative integer per row (not necessarily dense); rows suppressed by the
    anonymiser must already be dropped. ``e_quasis``: objects with ``column``, ``lower``, ``upper``
    (the spec's ``EQuasi``); the bounds are required in both scale bases, since they set the clamp
    and the public grid. ``epsilon_split``: ε per ε-quasi column (``spec.epsilon_split()``).
    ``noise``: the release's :class:`~kepsilon.engine.randomness.RecordStreams`, which key each draw by
    the record's position in the source (the frame's index) and the column, so the values do not
    depend on how the table is partitioned; see :func:`record_noise`. See the module docstring for
    the grid and for the guarantee of each ``scale_basis``.

    Returns the noisy frame, the scale ``b`` each record's noise was drawn with (0 for zero-diameter
    classes), and a private report; each column's ``grid`` in the report is :func:`public_grid`.
    """
    if scale_basis not in SCALE_BASES:
        raise SpecError("scale_basis", f"must be one of {list(SCALE_BASES)}")
    dense_ids, n_classes = dense_class_ids(class_ids, len(frame))
    # A simulation's sequential generator needs no positions (and its frames may repeat an index).
    positions = source_positions(frame) if isinstance(noise, RecordStreams) else np.arange(len(frame))
    out = frame.copy()
    scales: dict[str, np.ndarray] = {}
    columns_report: dict[str, dict] = {}
    # Validate every column before drawing any noise, so a bad input costs no randomness.
    prepared = []
    for quasi in e_quasis:
        column = quasi.column
        epsilon = _checked_epsilon(column, epsilon_split)
        values = numeric_column(frame, column)
        lower, upper = _checked_bounds(quasi)
        grid = public_grid(lower, upper, epsilon)
        inner_low, inner_high = grid_bounds(lower, upper, grid)
        if inner_low > inner_high:
            raise SpecError("epsilon", f"column {column!r}: ε is so small that the noise grid is wider than the bounds")
        prepared.append((column, epsilon, values, lower, upper, grid, inner_low, inner_high))

    for column, epsilon, values, lower, upper, grid, inner_low, inner_high in prepared:
        # Clamping first in both bases keeps every scale within the public one, b ≤ (upper − lower)/ε,
        # which is what lets one public grid serve every class.
        clamped = np.clip(values, lower, upper)
        n_clamped_inputs = int((clamped != values).sum())
        values = clamped
        scale = noise_scales(values, dense_ids, n_classes, lower, upper, epsilon, scale_basis)
        zero_diameter_classes = (
            int(n_classes - np.count_nonzero(np.bincount(dense_ids[scale > 0], minlength=n_classes)))
            if scale_basis == "diameter" else 0)

        # One draw per row whatever the scale, keyed by the record's position in the source.
        raw = values + record_noise(noise, column, positions) * scale
        noisy = values.copy()
        noised = scale > 0
        _check_grid_resolution(column, grid, values[noised], raw[noised])
        # Clamped to the bounds rounded inwards to the grid in both bases (post-processing): every
        # published value lies on the grid and inside the public bounds.
        noisy[noised] = np.clip(snap(raw[noised], grid), inner_low, inner_high)
        out[column] = pd.Series(noisy, index=frame.index, name=column)
        scales[column] = scale
        columns_report[column] = {
            "epsilon": epsilon,
            "scale_basis": scale_basis,
            "grid": grid,
            "zero_diameter_classes": zero_diameter_classes,
            "noised_records": int(noised.sum()),
            "clamped_inputs": n_clamped_inputs,
            "mean_scale": float(scale.mean()) if len(scale) else 0.0,
        }

    report = {
        "scale_basis": scale_basis,
        "epsilon_split": {p[0]: p[1] for p in prepared},
        "epsilon_total": float(sum(p[1] for p in prepared)),
        "records": int(len(frame)),
        "noise_streams": STREAMS_VERSION if isinstance(noise, RecordStreams) else "simulation",
        "classes": int(n_classes),
        "grid": f"per column 2^(ceil(log2((upper - lower)/ε_a)) - {GRID_BITS_BELOW_SCALE}), "
        f"≥ 2^{SPACING_MARGIN_BITS} float spacings",
        "columns": columns_report,
    }
    return PerturbResult(frame=out, scales=scales, report=report)
