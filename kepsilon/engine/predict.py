"""What a release would publish, predicted before any ε is reserved (the checks of "refuse before you spend").

Two figures decide, before the noise, whether a release would pass its gate:

- the **predicted relative error** of every ε-quasi, exact given the partition:
  :func:`kepsilon.engine.metrics.expected_relative_errors` on the scales the noise would be drawn with
  (the clamps included), the release's own prediction;
- the **linking risk** and the records **confidence suppression** would leave, by Monte-Carlo over noise
  drawn here from a throw-away generator and never used for a release (the advisor's method,
  ``tasks/advise.py``): ``draws`` copies of the kept records are stacked, copy d of class c a class of its
  own, and perturbed, suppressed and linked at once.

The draws cost what they stack, so a prediction stacks about ``STACKED_ROWS`` records whatever the table's
size (:func:`design_for`): 10 draws of every class on small tables, fewer draws on larger ones (at least 2),
and above ``STACKED_ROWS / 2`` kept records 2 draws each of a random sample of **whole classes** (each class
in each draw with probability ``share``, from the same throw-away generator) holding about ``STACKED_ROWS / 2``
records. The figures are then ratios read on the sampled classes: the linking risk (records linked over records
published) and the share of the drawn records published, times the kept records. So a table of
10M records is predicted from as many record-draws as one of 1M: the estimates' spread is that of a 1M-record
table's (the predicted errors stay exact: they need no noise).

Everything is kept as sums (:class:`Prediction` adds up), so a partitioned release predicts partition by
partition and adds the parts. Every figure is computed from private values (the steward's, never public).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .errors import SpecError
from .metrics import expected_relative_errors, linked_records
from .perturb import dense_class_ids, noise_scales, perturb
from .suppress import suppress_records

if TYPE_CHECKING:
    from kepsilon.spec import ReleaseSpec  # the engine reads the spec; the model imports the engine

MAX_DRAWS = 10
STACKED_ROWS = 2_000_000  # rows of the stacked draws a prediction may hold at once


def draws_for(records: int) -> int:
    """Throw-away draws for a table of ``records`` kept records: 10, fewer for large tables (at least 2)."""
    return int(min(MAX_DRAWS, max(2, STACKED_ROWS // max(int(records), 1))))


@dataclass(frozen=True)
class Design:
    """How a prediction draws: ``draws`` throw-away draws, each of a share ``share`` of the classes (1: all)."""

    draws: int
    share: float = 1.0


def design_for(records: int) -> Design:
    """The prediction's design for ``records`` kept records: :func:`draws_for` draws, each of every class while
    they stack at most ``STACKED_ROWS`` records, else of a sample of classes holding about that many in all."""
    draws = draws_for(records)
    return Design(draws, min(1.0, STACKED_ROWS / (draws * max(int(records), 1))))


@dataclass
class Prediction:
    """Sums over kept records, added over partitions. Per ε-quasi: the expected relative errors and the
    records with a non-zero value; per draw: the records drawn (every kept record, or those of the classes
    sampled: ``share`` < 1), how many of them would be published and, per ε-quasi, published records linked."""

    draws: int
    share: float = 1.0
    records: int = 0
    error_sums: dict[str, float] = field(default_factory=dict)
    error_counts: dict[str, int] = field(default_factory=dict)
    published: np.ndarray | None = None
    linked: dict[str, np.ndarray] = field(default_factory=dict)
    drawn: np.ndarray | None = None

    def add(self, other: Prediction) -> Prediction:
        """The prediction of both sets of records (disjoint classes)."""
        if (self.draws, self.share) != (other.draws, other.share):
            raise ValueError("predictions with different draw counts or shares of classes cannot be added")
        columns = set(self.error_sums) | set(other.error_sums)
        zero = np.zeros(self.draws)
        return Prediction(
            draws=self.draws,
            share=self.share,
            records=self.records + other.records,
            error_sums={c: self.error_sums.get(c, 0.0) + other.error_sums.get(c, 0.0) for c in columns},
            error_counts={c: self.error_counts.get(c, 0) + other.error_counts.get(c, 0) for c in columns},
            published=(self.published if self.published is not None else zero)
            + (other.published if other.published is not None else zero),
            linked={c: self.linked.get(c, zero) + other.linked.get(c, zero) for c in set(self.linked) | set(other.linked)},
            drawn=(self.drawn if self.drawn is not None else zero) + (other.drawn if other.drawn is not None else zero),
        )

    def relative_errors(self) -> dict[str, float]:
        """Per ε-quasi, the predicted mean relative error (0 when no record has a non-zero value)."""
        return {c: (self.error_sums[c] / self.error_counts[c] if self.error_counts[c] else 0.0) for c in self.error_sums}

    def linking_risk_per_draw(self) -> np.ndarray:
        """Per draw, the release's figure: the largest share, over ε-quasis, of published records linked."""
        published = self.published if self.published is not None else np.zeros(self.draws)
        shares = [linked / np.maximum(published, 1) for linked in self.linked.values()]
        return np.max(shares, axis=0) if shares else np.zeros(self.draws)

    def linking_risk(self) -> float:
        """The mean over the draws of the linking risk: the figure the pre-ε gate compares with its limit."""
        return float(self.linking_risk_per_draw().mean())

    def published_records(self) -> float:
        """The mean over the draws of the records confidence suppression would leave: counted where every class
        was drawn; where a sample was, the kept records times the share of the drawn records left. A ratio, because
        the sampled classes' sizes vary: over 8 predictions of 4M records in classes of 10 to 29 (share 0.25), the
        published count divided by the share spread by 8,612 records (standard deviation), the ratio by 330, and
        the count of every class's draws by 228."""
        if self.published is None:
            return 0.0
        if self.share >= 1:
            return float(self.published.mean())
        drawn = self.drawn if self.drawn is not None else np.zeros(self.draws)
        some = drawn > 0
        return float((self.records * self.published[some] / drawn[some]).mean()) if some.any() else 0.0


def predict(kept: pd.DataFrame, class_ids: np.ndarray, spec: ReleaseSpec, draws: int, rng: np.random.Generator,
            share: float = 1.0) -> Prediction:
    """The prediction for ``kept`` (the anonymiser's kept records, ε-quasi columns at least) in ``class_ids``.

    ``spec``: the release's (``roles.e_quasi``, ``epsilon_split()``, ``scale_basis``, ``k``, ``confidence``).
    ``rng``: a generator of throw-away noise (a fresh ``secrets`` seed in a release; fixed in a test).
    ``share``: of the classes each draw perturbs, drawn by ``rng`` (``design_for``; 1: every class, and then
    ``rng`` draws the noise only). A class partition of a larger table gets the table's design, not its own.
    """
    if isinstance(draws, bool) or not isinstance(draws, (int, np.integer)) or draws < 1:
        raise SpecError("draws", "must be a positive whole number")
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
        raise SpecError("share", "must be in (0, 1]")
    columns = [q.column for q in spec.roles.e_quasi]
    split = spec.epsilon_split()
    dense, n_classes = dense_class_ids(class_ids, len(kept))
    prediction = Prediction(draws=draws, share=float(share), records=len(kept), published=np.zeros(draws))
    for quasi in spec.roles.e_quasi:
        values = kept[quasi.column].to_numpy(dtype=np.float64)
        lower, upper = quasi.bounds()
        clamped = np.clip(values, lower, upper)
        epsilon = split[quasi.column]
        scales = noise_scales(clamped, dense, n_classes, lower, upper, epsilon, spec.scale_basis)
        expected = expected_relative_errors(values, scales, lower=lower, upper=upper, epsilon=epsilon, scale_basis=spec.scale_basis)
        nonzero = values != 0
        prediction.error_sums[quasi.column] = float(expected[nonzero].sum())
        prediction.error_counts[quasi.column] = int(nonzero.sum())
        prediction.linked[quasi.column] = np.zeros(draws)
    m = len(kept)
    if m == 0:
        return prediction
    rows, stacked_ids, draw_of_row = _stacked_rows(dense, n_classes, draws, share, rng)
    prediction.drawn = np.bincount(draw_of_row, minlength=draws).astype(np.float64)
    if not len(rows):
        return prediction  # no class sampled in any draw: nothing drawn, nothing counted
    stacked = pd.DataFrame({c: kept[c].to_numpy()[rows] for c in columns})
    noisy = perturb(stacked, stacked_ids, spec.roles.e_quasi, split, spec.scale_basis, rng)
    published = ~suppress_records(stacked, noisy.frame, stacked_ids, noisy.scales, spec).removed
    prediction.published = np.bincount(draw_of_row[published], minlength=draws).astype(np.float64)
    for column in columns:
        linked = linked_records(
            stacked[column].to_numpy(dtype=np.float64)[published],
            noisy.frame[column].to_numpy(dtype=np.float64)[published],
            stacked_ids[published],
        )
        prediction.linked[column] = np.bincount(draw_of_row[published][linked], minlength=draws).astype(np.float64)
    return prediction


def _stacked_rows(dense: np.ndarray, n_classes: int, draws: int, share: float,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The stacked draws' rows (indices into the kept records), their classes (copy d of class c a class of its
    own, numbered densely) and their draws: every class in every draw, or (``share`` < 1) in each draw the classes
    ``rng`` samples, each with probability ``share``."""
    m = len(dense)
    if share >= 1:
        draw_of_row = np.repeat(np.arange(draws), m)
        return np.tile(np.arange(m), draws), np.tile(dense, draws) + draw_of_row * n_classes, draw_of_row
    rows, ids, of_draw, numbered = [], [], [], 0
    for draw in range(draws):
        chosen = rng.random(n_classes) < share
        number = np.cumsum(chosen) - 1 + numbered  # the sampled classes numbered on from the previous draws'
        picked = np.flatnonzero(chosen[dense])
        rows.append(picked)
        ids.append(number[dense[picked]])
        of_draw.append(np.full(len(picked), draw))
        numbered += int(chosen.sum())
    return np.concatenate(rows), np.concatenate(ids), np.concatenate(of_draw)
