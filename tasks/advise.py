"""The parameter advisor: what k and ε would do to this data, before any ε is spent.

For every cell of a grid of k and ε it reports, from the release's own stage functions (never a copy
of them):

- exact, from the anonymiser (``k_anonymise``, once per k: neither Mondrian nor OLA looks at ε): the
  records the anonymiser suppresses and its number of classes;
- exact, from the formula: the predicted relative error per ε-quasi
  (:func:`kepsilon.engine.metrics.expected_relative_errors` on the scales of
  :func:`kepsilon.engine.perturb.noise_scales`, the numbers a release's own prediction uses);
- by Monte-Carlo over noise that is drawn here and thrown away: the measured error, the confidence
  suppression and the linking risk, each as a mean and a standard deviation over ``draws`` draws.

Vectorised: the ``draws`` copies of the anonymised table are stacked into one table in which copy d
of class c is a class of its own, so one call of ``perturb``, ``suppress_records`` and
``linked_records`` per cell does every draw at once; classes never interact in any of them, so each
copy is exactly one independent release's noise, suppression and linking.

Common random numbers: every ε of one k gets the same standard Laplace draws (scaled by its own b), so
the curves against ε are smooth and differences between cells are not noise between draws.

Everything here is computed from private values: the figures are for the steward only, and choosing
parameters from them is itself a data-dependent choice (docs/advise.md). This module draws no ε from
any ledger and writes nothing; recording the advice and writing figures is the caller's job.
No Prefect import here: the flow (``flows/advise.py``) and the CLI wrap it.
"""

import math
import secrets
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from kepsilon.engine.anonymise import k_anonymise
from kepsilon.engine.metrics import expected_relative_errors, linked_records, measured_relative_error
from kepsilon.engine.perturb import dense_class_ids, noise_scales, perturb
from kepsilon.engine.suppress import suppress_records

from .classify import classify
from .errors import KepsilonError, SpecError

DEFAULT_K = (2, 5, 10, 20, 50, 100)
DEFAULT_EPSILON = (0.05, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
DEFAULT_DRAWS = 10
MAX_DRAWS = 200


@dataclass
class Spread:
    """A Monte-Carlo figure: mean and standard deviation (ddof 1) over the draws, and the draws' count."""

    mean: float
    sd: float
    draws: int

    @classmethod
    def of(cls, values: np.ndarray) -> "Spread":
        values = np.asarray(values, dtype=np.float64)
        sd = float(values.std(ddof=1)) if len(values) > 1 else 0.0
        return cls(float(values.mean()), sd, int(len(values)))

    def upper(self) -> float:
        """Upper end of the mean's ~95 % interval, mean + 2·sd/√draws: a conservative reading."""
        return self.mean + 2 * self.sd / math.sqrt(self.draws)


@dataclass
class Cell:
    """One (k, ε) of the grid. Fractions are of the records in; ``refused`` says why a k has no figures."""

    k: int
    epsilon: float
    anonymiser_suppressed: int = 0
    anonymiser_suppressed_fraction: float = 0.0
    classes: int = 0
    predicted_error: dict[str, float] = field(default_factory=dict)
    measured_error: dict[str, Spread] = field(default_factory=dict)
    confidence_suppression: Spread | None = None
    linking_risk: Spread | None = None
    refused: str | None = None

    @property
    def predicted_mean(self) -> float:
        """Mean over the ε-quasis, as the release reports its predicted error."""
        return float(np.mean(list(self.predicted_error.values()))) if self.predicted_error else math.nan


@dataclass
class Advice:
    """The advisor's whole answer. Private: every figure comes from the private data."""

    population_id: str
    spec_hash: str
    source_sha256: str
    rows: int
    algorithm: str
    scale_basis: str
    suppression_budget: float
    e_quasis: list[str]
    k_values: list[int]
    epsilon_values: list[float]
    draws: int
    cells: list[Cell]
    nodes: dict[int, dict] = field(default_factory=dict)  # OLA: the chosen node per k

    def cell(self, k: int, epsilon: float) -> Cell:
        return next(c for c in self.cells if c.k == k and c.epsilon == epsilon)

    def to_dict(self) -> dict:
        return asdict(self)


MAX_GRID_EPSILON = 1e9  # the audit ledger's largest ε (kepsilon.audit.ledger.MAX_AMOUNT)


def check_grid(k_values, epsilon_values, draws: int) -> tuple[list[int], list[float]]:
    """Sorted, de-duplicated grid; refuses k < 2, ε not positive and finite, draws outside 2..MAX_DRAWS."""
    ks = sorted({int(k) for k in k_values})
    epsilons = sorted({float(e) for e in epsilon_values})
    if not ks or ks[0] < 2:
        raise SpecError("k", "the grid needs k values of at least 2")
    if not epsilons or not all(math.isfinite(e) and e > 0 for e in epsilons):
        raise SpecError("epsilon", "the grid needs positive, finite ε values")
    if epsilons[-1] > MAX_GRID_EPSILON:  # no release could reserve it (the ledger's range), and its noise grid overflows
        raise SpecError("epsilon", f"the grid's ε values must be at most {MAX_GRID_EPSILON:g}, the most a release can reserve")
    if not 2 <= int(draws) <= MAX_DRAWS:
        raise SpecError("draws", f"must be between 2 and {MAX_DRAWS} (a spread needs two draws)")
    return ks, epsilons


def check_targets(target_error: float | None, max_linking_risk: float | None) -> None:
    """Refuse targets that are not fractions: an error target in (0, 1] (a predicted error above 100 % meets
    no purpose, and an absurd one overflows the figures' log scale); a linking-risk target in [0, 1]."""
    if target_error is not None and not (math.isfinite(target_error) and 0 < target_error <= 1):
        raise SpecError("target_error", "must be a fraction above 0 and at most 1 (0.05 is 5 %)")
    if max_linking_risk is not None and not (math.isfinite(max_linking_risk) and 0 <= max_linking_risk <= 1):
        raise SpecError("max_linking_risk", "must be a fraction between 0 and 1 (0.1 is 10 %)")


def advise(
    frame: pd.DataFrame,
    spec,
    source_sha256: str,
    k_values=DEFAULT_K,
    epsilon_values=DEFAULT_EPSILON,
    draws: int = DEFAULT_DRAWS,
    seed: int | None = None,
) -> Advice:
    """Compute the grid for the source table ``frame`` under ``spec`` (a ``ReleaseSpec``).

    ``seed``: only for reproducible tests; by default the noise comes from a fresh ``secrets`` seed
    that is never stored or shown (the draws are thrown away, but a seed re-derives them).
    A k that the anonymiser refuses (k larger than the table, no OLA node within the budget) gets
    cells with ``refused`` set instead of figures.
    """
    ks, epsilons = check_grid(k_values, epsilon_values, draws)
    table = classify(frame, spec.model_copy(update={"k": ks[0]}))
    root = np.random.SeedSequence(secrets.randbits(256) if seed is None else seed)
    cells, nodes = [], {}
    for k, child in zip(ks, root.spawn(len(ks))):
        spec_k = spec.model_copy(update={"k": k})
        try:
            partition = k_anonymise(table.frame, spec_k)
        except KepsilonError as refusal:
            cells += [Cell(k=k, epsilon=e, refused=str(refusal)) for e in epsilons]
            continue
        if spec.algorithm == "ola":
            nodes[k] = dict(partition.report["node"])
        state = child.generate_state(4, np.uint64)
        for epsilon in epsilons:
            rng = np.random.Generator(np.random.PCG64(state))  # same unit draws for every ε of this k
            cells.append(_cell(table.frame, partition, spec_k.model_copy(update={"epsilon": epsilon}), draws, rng))
    return Advice(
        population_id=spec.population_id,
        spec_hash=spec.spec_hash(),
        source_sha256=source_sha256,
        rows=len(frame),
        algorithm=spec.algorithm,
        scale_basis=spec.scale_basis,
        suppression_budget=spec.suppression_budget,
        e_quasis=[q.column for q in spec.roles.e_quasi],
        k_values=ks,
        epsilon_values=epsilons,
        draws=int(draws),
        cells=cells,
        nodes=nodes,
    )


def _cell(frame: pd.DataFrame, partition, spec, draws: int, rng: np.random.Generator) -> Cell:
    """One cell: exact anonymiser and formula figures, then the Monte-Carlo ones."""
    n = len(frame)
    kept = frame.loc[partition.kept, [q.column for q in spec.roles.e_quasi]]
    class_ids = partition.class_ids[partition.kept]
    dense, n_classes = dense_class_ids(class_ids, len(kept))
    suppressed = int((~partition.kept).sum())
    cell = Cell(
        k=spec.k,
        epsilon=spec.epsilon,
        anonymiser_suppressed=suppressed,
        anonymiser_suppressed_fraction=suppressed / n,
        classes=int(n_classes),
    )
    cell.predicted_error = predicted_errors(kept, dense, n_classes, spec)
    _monte_carlo(cell, kept, dense, n_classes, n, spec, draws, rng)
    return cell


def predicted_errors(kept: pd.DataFrame, dense_ids: np.ndarray, n_classes: int, spec) -> dict[str, float]:
    """Per ε-quasi, the predicted mean relative error of the kept records in classes ``dense_ids``.

    Exact, before any noise: :func:`kepsilon.engine.metrics.expected_relative_errors` on the scales
    :func:`kepsilon.engine.perturb.noise_scales` gives at ``spec.epsilon``, as a release predicts its own.
    ``kept``: the kept records' ε-quasi columns; records with a zero value have no relative error and are
    left out of the mean (0 when every value is zero).
    """
    split = spec.epsilon_split()
    errors = {}
    for quasi in spec.roles.e_quasi:
        values = kept[quasi.column].to_numpy(dtype=np.float64)
        clamped = np.clip(values, quasi.lower, quasi.upper)
        scales = noise_scales(clamped, dense_ids, n_classes, quasi.lower, quasi.upper, split[quasi.column], spec.scale_basis)
        expected = expected_relative_errors(
            values, scales, lower=quasi.lower, upper=quasi.upper, epsilon=split[quasi.column], scale_basis=spec.scale_basis
        )
        errors[quasi.column] = float(np.nanmean(expected)) if (values != 0).any() else 0.0
    return errors


def _monte_carlo(cell: Cell, kept: pd.DataFrame, dense, n_classes: int, n: int, spec, draws: int, rng) -> None:
    """``draws`` releases' noise, suppression and linking at once (see the module docstring)."""
    m = len(kept)
    stacked = pd.DataFrame({c: np.tile(kept[c].to_numpy(), draws) for c in kept.columns})
    draw_of_row = np.repeat(np.arange(draws), m)
    stacked_ids = np.tile(dense, draws) + draw_of_row * n_classes
    noisy = perturb(stacked, stacked_ids, spec.roles.e_quasi, spec.epsilon_split(), spec.scale_basis, rng)
    suppression = suppress_records(stacked, noisy.frame, stacked_ids, noisy.scales, spec)
    published = ~suppression.removed
    removed_per_draw = np.bincount(draw_of_row[suppression.removed], minlength=draws)
    cell.confidence_suppression = Spread.of(removed_per_draw / n)
    published_per_draw = np.bincount(draw_of_row[published], minlength=draws)
    risk = np.zeros(draws)
    for column in kept.columns:
        original = stacked[column].to_numpy(dtype=np.float64)
        changed = noisy.frame[column].to_numpy(dtype=np.float64)
        linked = linked_records(original[published], changed[published], stacked_ids[published])
        linked_per_draw = np.bincount(draw_of_row[published][linked], minlength=draws)
        # The release reports the worst ε-quasi's risk; so does each draw here.
        risk = np.maximum(risk, linked_per_draw / np.maximum(published_per_draw, 1))
        nonzero = original[:m] != 0
        errors = [
            measured_relative_error(original[d * m : (d + 1) * m][nonzero], changed[d * m : (d + 1) * m][nonzero], column)
            for d in range(draws)
        ]
        cell.measured_error[column] = Spread.of(np.array(errors))
    cell.linking_risk = Spread.of(risk)


# --- Answers to "the smallest ε / k that meets this" -------------------------------------------------


def smallest_epsilon_for_error(advice: Advice, target: float) -> dict[int, dict]:
    """Per k, the smallest ε of the grid whose predicted error (mean over ε-quasis) is at most ``target``.

    Only the grid answer: the published values are clamped to the public bounds in both scale bases, so
    the predicted error is not proportional to 1/ε and no closed-form smallest ε exists (``exact`` is
    kept, always None, for the callers' shape). The error decreases with ε, so the grid answer is safe.
    """
    answers = {}
    for k in advice.k_values:
        cells = [c for c in advice.cells if c.k == k and c.refused is None]
        if not cells:
            continue
        meeting = [c.epsilon for c in cells if c.predicted_mean <= target]
        exact = None
        answers[k] = {"grid": min(meeting) if meeting else None, "exact": exact}
    return answers


def smallest_k_for_linking_risk(advice: Advice, limit: float) -> dict[float, int | None]:
    """Per ε, the smallest k of the grid whose linking risk is at most ``limit``, read conservatively:
    the upper end of the Monte-Carlo mean's ~95 % interval (:meth:`Spread.upper`)."""
    answers = {}
    for epsilon in advice.epsilon_values:
        cells = [c for c in advice.cells if c.epsilon == epsilon and c.refused is None]
        meeting = [c.k for c in cells if c.linking_risk is not None and c.linking_risk.upper() <= limit]
        answers[epsilon] = min(meeting) if meeting else None
    return answers


def recommendation(advice: Advice, target_error: float | None, max_linking_risk: float | None) -> Cell | None:
    """The cell meeting every given target with the smallest ε (the least budget), then the smallest k.

    Cells whose expected suppression exceeds the spec's budget are left out: a release there would most
    likely spend its ε and then fail its suppression check.
    """
    cells = [
        c for c in advice.cells
        if c.refused is None
        and c.confidence_suppression is not None
        and c.anonymiser_suppressed_fraction + c.confidence_suppression.mean <= advice.suppression_budget
    ]
    if target_error is not None:
        cells = [c for c in cells if c.predicted_mean <= target_error]
    if max_linking_risk is not None:
        cells = [c for c in cells if c.linking_risk is not None and c.linking_risk.upper() <= max_linking_risk]
    return min(cells, key=lambda c: (c.epsilon, c.k), default=None)


# --- Running it: read, record the read, compute, draw -------------------------------------------------


@dataclass
class AdviceRun:
    """One recorded run of the advisor: the advice, its audit event id, its private figures and folder."""

    advice: Advice
    event_id: int
    report_dir: Path
    figures: dict = field(repr=False)  # name -> kepsilon.tasks.figures.Figure (page- and card-size PNGs)


def advise_and_record(
    spec,
    *,
    operator: str,
    via: str,
    k_values=DEFAULT_K,
    epsilon_values=DEFAULT_EPSILON,
    draws: int = DEFAULT_DRAWS,
    target_error: float | None = None,
    max_linking_risk: float | None = None,
    flow_run_id: str | None = None,
    store: str | Path | None = None,
    seed: int | None = None,
) -> AdviceRun:
    """Read the source, record the read as an advice event, compute the grid, write the private figures.

    The store is verified first (an event is not appended to a chain that does not verify) and the event is
    recorded as soon as the source has been read, before any figure exists, so a crash later still leaves
    the read on record. Nothing is reserved or spent, and nothing is written under ``spec.output_dir``:
    the figures go to :func:`kepsilon.tasks.figures.private_report_dir`.
    """
    from kepsilon.audit.advice import record_advice
    from kepsilon.audit.integrity import check_store
    from kepsilon.audit.store import open_store

    from .figures import advice_figures, private_report_dir, write_figures
    from .ingest import read_source

    ks, epsilons = check_grid(k_values, epsilon_values, draws)
    check_targets(target_error, max_linking_risk)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    report_dir = private_report_dir(f"advice-{spec.population_id}-{stamp}", spec.output_dir)
    db = open_store(store)
    try:
        check_store(db)
        source = read_source(spec.source)
        event_id = record_advice(
            db,
            population_id=spec.population_id,
            spec_hash=spec.spec_hash(),
            source_sha256=source.sha256,
            source_rows=source.rows,
            actor=operator,
            via=via,
            flow_run_id=flow_run_id,
            k_values=ks,
            epsilon_values=epsilons,
            draws=draws,
            report_dir=str(report_dir),
        )
    finally:
        db.close()
    advice = advise(source.frame, spec, source.sha256, ks, epsilons, draws, seed)
    figures = advice_figures(advice, max_linking_risk=max_linking_risk, target_error=target_error)
    write_figures(figures, report_dir)
    (report_dir / "advice.md").write_text(advice_markdown(advice, target_error, max_linking_risk), encoding="utf-8")
    return AdviceRun(advice, event_id, report_dir, figures)


# --- Presenting it ----------------------------------------------------------------------------------------


DATA_DEPENDENCE = (
    "For the steward only: every figure here is computed from the private data, and choosing k or ε from "
    "them is itself a data-dependent choice that no guarantee of the method covers."
)


def _percent(value: float) -> str:
    return f"{100 * value:.2f}%"


def _spread(spread: Spread | None) -> str:
    return "" if spread is None else f"{100 * spread.mean:.2f}% ± {100 * spread.sd:.2f}"


def advice_rows(advice: Advice) -> list[dict[str, str]]:
    """One row of strings per cell, for the CLI's table and the markdown report (± is the sd over draws)."""
    rows = []
    for cell in advice.cells:
        row = {"k": str(cell.k), "ε": f"{cell.epsilon:g}"}
        if cell.refused is not None:
            row["anonymiser suppressed"] = "refused: " + cell.refused
            rows.append(row)
            continue
        row["anonymiser suppressed"] = _percent(cell.anonymiser_suppressed_fraction)
        row["classes"] = str(cell.classes)
        for column in advice.e_quasis:
            row[f"predicted error {column}"] = _percent(cell.predicted_error[column])
            row[f"Monte-Carlo error {column}"] = _spread(cell.measured_error[column])
        row["confidence suppression"] = _spread(cell.confidence_suppression)
        suppression = cell.confidence_suppression
        if suppression is not None and cell.anonymiser_suppressed_fraction + suppression.mean > advice.suppression_budget:
            # A release here would most likely fail its suppression-budget check after spending ε.
            row["confidence suppression"] += " over budget"
        row["linking risk"] = _spread(cell.linking_risk)
        rows.append(row)
    return rows


def answer_lines(advice: Advice, target_error: float | None, max_linking_risk: float | None) -> list[str]:
    """The answers to ``--target-error`` and ``--max-linking-risk``, as sentences."""
    lines = []
    if target_error is not None:
        for k, answer in smallest_epsilon_for_error(advice, target_error).items():
            grid = f"ε = {answer['grid']:g}" if answer["grid"] is not None else "no ε of the grid"
            exact = f" (exactly: ε ≥ {answer['exact']:.3g})" if answer["exact"] is not None else ""
            lines.append(f"predicted error ≤ {_percent(target_error)} at k = {k}: smallest {grid}{exact}")
    if max_linking_risk is not None:
        for epsilon, smallest in smallest_k_for_linking_risk(advice, max_linking_risk).items():
            found = f"k = {smallest}" if smallest is not None else "no k of the grid"
            lines.append(f"linking risk ≤ {_percent(max_linking_risk)} at ε = {epsilon:g}: smallest {found}")
    if target_error is not None or max_linking_risk is not None:
        best = recommendation(advice, target_error, max_linking_risk)
        lines.append(
            "no cell of the grid within the suppression budget meets every target"
            if best is None
            else f"least ε meeting every target within the suppression budget: k = {best.k}, ε = {best.epsilon:g}"
        )
    return lines


def monte_carlo_note(advice: Advice) -> str:
    """How the Monte-Carlo figures were obtained, said next to them."""
    return (
        f"Monte-Carlo columns: {advice.draws} noise draws per cell, never published or stored; "
        "shown as mean ± standard deviation over the draws. Linking risk is read conservatively "
        "(mean + 2 sd/√draws) when answering --max-linking-risk."
    )


def advice_markdown(advice: Advice, target_error: float | None = None, max_linking_risk: float | None = None) -> str:
    """The advice as a markdown page: the grid, the answers, how it was computed and what it is not."""
    rows = advice_rows(advice)
    widest: dict[str, str] = max(rows, key=len)  # a refused cell's row has fewer columns
    columns = list(widest)
    lines = [
        f"# Parameter advice for `{advice.population_id}`",
        "",
        f"{advice.rows} records, {advice.algorithm}, noise scale from {advice.scale_basis}; no ε spent.",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
    ]
    lines += ["| " + " | ".join(row.get(c, "") for c in columns) + " |" for row in rows]
    if advice.nodes:
        lines += ["", "OLA's node per k: " + "; ".join(f"k = {k}: {node}" for k, node in advice.nodes.items())]
    answers = answer_lines(advice, target_error, max_linking_risk)
    if answers:
        lines += ["", "## Answers", ""] + [f"- {line}" for line in answers]
    lines += ["", monte_carlo_note(advice), "", DATA_DEPENDENCE]
    return "\n".join(lines) + "\n"
