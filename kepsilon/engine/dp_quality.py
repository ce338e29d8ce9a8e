"""What the DP search scores: the *expected* quality of what a release at a node will publish.

A node g, fixed, is released by sampling every record with probability β and suppressing every
sampled group of fewer than k records. A group of n records of the full data D therefore publishes
X·1[X ≥ k] records, X ~ Binomial(n, β), and in expectation

    f(n) = E[X·1[X ≥ k]] = n·β·P[Binomial(n − 1, β) ≥ k − 1].

Each published record carries its group's labels; a *quality model* gives every label a loss in
[0, 1] (a function of the public hierarchy only) and a record the weight w = 1 − the mean of its
labels' losses. The search's score of g on D is the expected total weight published,

    u(D, g) = Σ over the groups G of D at g of f(|G|) · w(G),

so that it ranks nodes by what the release will publish, sampling and suppression included, instead
of by the records of the full data in groups of at least k (most of which a sample at rate β
suppresses). It is computed on the full data, before the sampling, as a deterministic function of
D: the search and the sampling stay independent and compose by the textbook theorem.

**Sensitivity.** Adding one record x to D adds it to exactly one group at g (a group of its own if
none had its labels), changing u by (f(n + 1) − f(n))·w, n the group's size before. For Y ~
Bernoulli(β) independent of X ~ Binomial(n, β),

    f(n + 1) − f(n) = β·(P[X ≥ k − 1] + (k − 1)·P[X = k − 1])  ≥ 0,

so 0 ≤ u(D ∪ {x}, g) − u(D, g) ≤ Δ = β·max over n of (P[X ≥ k − 1] + (k − 1)·P[X = k − 1]) ·
max w, for every g: the score is monotone with sensitivity Δ. ``expected_publication_sensitivity``
computes the maximum over n exactly up to a bound and bounds the rest (the increment is at most
β·(1 + (k − 1)·P[X = k − 1]), and P[X = k − 1] falls once n passes (k − 1)/β). On UCI Adult
(k = 73, β = 0.593) Δ ≈ 3.46 for records, against k = 73 for the count of records in groups of
at least k: the same ε_search separates nodes about twenty times more sharply.

Quality models (``QUALITY_MODELS``):

- ``granularity``: a label's loss is its share of the hierarchy's leaves (leaves under the label /
  leaves), ARX's "Loss" model and its Granularity measure; the score is, up to a constant factor,
  the expected ARX Granularity of the release. A hierarchy built from the data's distinct values
  (a builder) has data-dependent leaves: its column uses the precision loss instead.
- ``precision``: a label's loss is its level / (height − 1) (ARX's "Precision").
- ``records``: no loss: the expected number of published records.
- ``balanced`` (the default): a quarter records, three quarters granularity (weight 0.25 + 0.75·(1 −
  mean share)). The share was chosen on UCI Adult, where it is the only one of the four that beats
  SafePub on both records published and ARX Granularity (docs/dp-mode.md, §6).
"""

import math
from dataclasses import dataclass

import numpy as np

QUALITY_MODELS = ("balanced", "granularity", "precision", "records")
BALANCED_RECORDS_SHARE = 0.25  # chosen on UCI Adult (docs/dp-mode.md, §6): beats SafePub on both measures there


@dataclass(frozen=True)
class QualityModel:
    """Per generalised column, per level, the loss of every label code (``losses[c][l][code]``),
    each in [0, 1] and a function of the public hierarchy alone; a record's weight is
    ``records_share + (1 − records_share)·(1 − the mean of its labels' losses)``, in [0, 1]."""

    name: str
    losses: tuple[tuple[np.ndarray, ...], ...]
    records_share: float = 0.0

    @property
    def largest_weight(self) -> float:
        """The largest weight a record can have: its labels' losses at their smallest."""
        if not self.losses:
            return 1.0
        smallest = float(np.mean([min(float(level.min()) for level in column) for column in self.losses]))
        return self.weight(smallest)

    def weight(self, mean_loss):
        """A record's weight from the mean of its labels' losses."""
        return self.records_share + (1.0 - self.records_share) * (1.0 - mean_loss)

    def group_weights(self, node, label_codes) -> np.ndarray:
        """Weight of every group at ``node``: ``label_codes[c]`` holds each group's label code in column c."""
        if not self.losses:
            return np.ones(len(label_codes[0]) if label_codes else 0)
        loss = sum(self.losses[c][level][codes] for c, (level, codes) in enumerate(zip(node, label_codes)))
        return self.weight(loss / len(self.losses))


def precision_losses(label_counts: list[int], height: int) -> tuple[np.ndarray, ...]:
    """Level l of an h-level hierarchy: every label loses l / (h − 1) (0 for a one-level hierarchy)."""
    return tuple(np.full(count, level / (height - 1) if height > 1 else 0.0) for level, count in enumerate(label_counts))


def domain_share_losses(label_codes: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """Every label's share of the hierarchy's leaves: ``label_codes[l][leaf]`` is the leaf's label code
    at level l, so a label's share is how many leaves carry it over the number of leaves."""
    leaves = len(label_codes[0])
    return tuple(np.bincount(codes).astype(np.float64) / leaves for codes in label_codes)


def records_losses(label_counts: list[int]) -> tuple[np.ndarray, ...]:
    return tuple(np.zeros(count) for count in label_counts)


def expected_published(sizes: np.ndarray, k: int, beta: float) -> np.ndarray:
    """f(n) = E[X·1[X ≥ k]], X ~ Binomial(n, β), for every n in ``sizes``: the records a group of n
    publishes on average after sampling at β and suppressing samples below k."""
    from scipy.stats import binom

    sizes = np.asarray(sizes, dtype=np.int64)
    tail = binom.sf(k - 2, np.maximum(sizes - 1, 0), beta)  # P[Binomial(n − 1, β) ≥ k − 1]
    return np.where(sizes > 0, sizes * beta * tail, 0.0)


def expected_published_table(largest: int, k: int, beta: float) -> np.ndarray:
    """f(0), f(1), …, f(largest): looked up by group size while scoring nodes."""
    return expected_published(np.arange(largest + 1), k, beta)


def expected_publication_sensitivity(k: int, beta: float) -> float:
    """An upper bound on max over n of f(n + 1) − f(n) = β·(P[X ≥ k − 1] + (k − 1)·P[X = k − 1]).

    The maximum is taken exactly over n up to well past (k − 1)/β, where P[X = k − 1] peaks; beyond,
    P[X = k − 1] only falls, so every later increment is at most β·(1 + (k − 1)·P[X = k − 1]) at the
    last n evaluated, which is added as a bound. For k = 1 the increment is β at every n.
    """
    from scipy.stats import binom

    if k <= 1:
        return float(beta)
    last = int(math.ceil(4 * (k - 1) / beta)) + 200
    n = np.arange(last + 1)
    increments = beta * (binom.sf(k - 2, n, beta) + (k - 1) * binom.pmf(k - 1, n, beta))
    tail_bound = beta * (1.0 + (k - 1) * float(binom.pmf(k - 1, last, beta)))
    return float(max(increments.max(), tail_bound))
