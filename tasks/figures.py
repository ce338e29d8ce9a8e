"""Private figures for the steward: the advisor's trade-off curves and each release's group and error plots.

PNG bytes from matplotlib's Agg backend (no display needed). Every figure is computed from private values,
so it goes to the private report folder (:func:`private_report_dir`, never the published folder) and to
the flow run's page in the Prefect UI, never into a release or its public manifest.

Each figure can be drawn twice (:class:`Figure`): at page size, for the report folder and the artifact's own page,
and at the width of an artifact card, for the run's Artifacts tab, where the Prefect UI shows a card per
artifact with its description rendered as markdown. Redrawn rather than shrunk, so that its labels stay legible.
No Prefect import here: the flows attach what these functions draw.
"""

import base64
import io
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from kepsilon import settings

from .errors import SpecError
from .figure_inputs import GRIDSIZE, SCATTER_LIMIT, FigureInputs, SizeCounts  # noqa: F401 (SCATTER_LIMIT: named here too)

REPORTS_ENV = "KEPSILON_REPORTS_DIR"
DEFAULT_REPORTS_DIR = "reports/private"


def private_report_dir(name: str, output_dir: str | Path | None = None) -> Path:
    """The private folder for one release's or one advice's figures: ``$KEPSILON_REPORTS_DIR/<name>``.

    Default root ``reports/private`` (git-ignored), made absolute so a worker writes where the operator
    looks. Refused (``SpecError``) when it would lie inside ``output_dir``, where releases are published:
    a private figure there would be published with the next release. The root is created 0700 here,
    before any work, and refused when group or others can write to it (``audit.private``); each report's
    folder is 0700 and its files 0600 (``write_figures``).
    """
    from kepsilon.audit.private import private_folder

    root = (settings.current().reports_dir or Path(DEFAULT_REPORTS_DIR)).resolve()
    folder = root / name
    if output_dir is not None:
        published = Path(output_dir).resolve()
        if folder == published or published in folder.parents:
            raise SpecError(REPORTS_ENV, "the private report folder must not lie inside the published output folder")
    private_folder(root, REPORTS_ENV)
    return folder


class Figure:
    """One figure as two PNGs: ``png`` at page size, ``card`` at the width of an artifact card in the Prefect UI.

    Each is drawn when first asked for (``draw(size) -> PNG bytes``), then kept: ``kepsilon advise``, which
    runs no flow and attaches nothing to a run, never pays for the cards; a release's flow run (from the CLI
    or a deployment) draws both sizes of each of its two figures.
    """

    def __init__(self, draw):
        self._draw = draw

    @cached_property
    def png(self) -> bytes:
        return self._draw(PAGE)

    @cached_property
    def card(self) -> bytes:
        return self._draw(CARD)


@dataclass(frozen=True)
class _Size:
    """How large to draw: a factor on the page's figure size (inches) and the resolution."""

    scale: float
    dpi: int

    def figsize(self, width: float, height: float) -> tuple[float, float]:
        return width * self.scale, height * self.scale


PAGE = _Size(scale=1.0, dpi=90)  # 7 in → 630 px: the report folder and an artifact's page
CARD = _Size(scale=0.62, dpi=80)  # 7 in → 347 px: about a card's width on the run's Artifacts tab


def write_figures(figures: dict[str, Figure], folder: Path) -> list[Path]:
    """Write each figure's page-size PNG to ``folder`` (created private, mode 0700), each file 0600; returns the paths."""
    from kepsilon.audit.private import FILE_MODE, private_folder

    private_folder(folder, REPORTS_ENV)
    paths = []
    for name, figure in figures.items():
        path = folder / f"{name}.png"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, FILE_MODE)
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), FILE_MODE)
            handle.write(figure.png)
        paths.append(path)
    return paths


def markdown_image(alt: str, png: bytes) -> str:
    """Markdown showing a PNG embedded as a ``data:`` URI, so the image travels inside the artifact itself
    (a link to a file would need the UI's browser to reach the worker's disk). Brackets in ``alt`` become
    parentheses, which cannot end the alt text early."""
    encoded = base64.b64encode(png).decode("ascii")
    return f"![{alt.replace('[', '(').replace(']', ')')}](data:image/png;base64,{encoded})"


def pyplot():
    """matplotlib's pyplot on the headless Agg backend (workers and CI have no display), imported by the first
    figure drawn rather than with this module: a release refused before ε never draws one, and pyplot costs
    about 0.25 s of every `kepsilon release`'s start."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(figure, size: _Size) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=size.dpi, bbox_inches="tight")
    pyplot().close(figure)
    return buffer.getvalue()


def _by_k(advice):
    """Per k with figures: its cells in increasing ε."""
    for k in advice.k_values:
        cells = sorted((c for c in advice.cells if c.k == k and c.refused is None), key=lambda c: c.epsilon)
        if cells:
            yield k, cells


# --- The advisor's curves ----------------------------------------------------------------------------


ADVICE_CAPTIONS = {
    "error_vs_epsilon": "Relative error against ε per k (lines: predicted, exact; points: Monte-Carlo mean ± sd)",
    "linking_risk_vs_epsilon": "Linking risk against ε per k (Monte-Carlo mean ± sd)",
    "suppression_vs_epsilon": "Records suppressed against ε per k (anonymiser + confidence suppression, Monte-Carlo mean ± sd)",
}


def advice_figures(advice, max_linking_risk: float | None = None, target_error: float | None = None) -> dict[str, Figure]:
    """The three trade-off plots of an :class:`kepsilon.tasks.advise.Advice`, by name."""
    return {
        "error_vs_epsilon": Figure(lambda size: _error_vs_epsilon(advice, target_error, size)),
        "linking_risk_vs_epsilon": Figure(lambda size: _linking_risk_vs_epsilon(advice, max_linking_risk, size)),
        "suppression_vs_epsilon": Figure(lambda size: _suppression_vs_epsilon(advice, size)),
    }


def _draws(advice) -> str:
    return f"{advice.draws} draws per cell"


def _error_vs_epsilon(advice, target_error: float | None, size: _Size) -> bytes:
    """Log–log: predicted error as lines, Monte-Carlo mean ± sd as points, per k."""
    figure, axes = pyplot().subplots(figsize=size.figsize(7, 4.5))
    for k, cells in _by_k(advice):
        epsilons = [c.epsilon for c in cells]
        (line,) = axes.plot(epsilons, [c.predicted_mean for c in cells], label=f"k = {k}")
        measured = [np.mean([s.mean for s in c.measured_error.values()]) for c in cells]
        spread = [np.mean([s.sd for s in c.measured_error.values()]) for c in cells]
        axes.errorbar(epsilons, measured, yerr=spread, fmt="o", color=line.get_color(), markersize=4)
    if target_error is not None:
        axes.axhline(target_error, color="grey", linestyle="--", linewidth=1, label="target error")
    axes.set(xscale="log", yscale="log", xlabel="ε", ylabel="mean relative error", title=f"Error vs ε ({_draws(advice)})")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    return _png(figure, size)


def _linking_risk_vs_epsilon(advice, max_linking_risk: float | None, size: _Size) -> bytes:
    """Linking risk (Monte-Carlo mean ± sd) against ε, per k."""
    figure, axes = pyplot().subplots(figsize=size.figsize(7, 4.5))
    for k, cells in _by_k(advice):
        axes.errorbar(
            [c.epsilon for c in cells],
            [100 * c.linking_risk.mean for c in cells],
            yerr=[100 * c.linking_risk.sd for c in cells],
            marker="o",
            markersize=4,
            label=f"k = {k}",
        )
    if max_linking_risk is not None:
        axes.axhline(100 * max_linking_risk, color="grey", linestyle="--", linewidth=1, label="risk limit")
    axes.set(xscale="log", xlabel="ε", ylabel="linking risk (%)", title=f"Linking risk vs ε ({_draws(advice)})")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    return _png(figure, size)


def _suppression_vs_epsilon(advice, size: _Size) -> bytes:
    """Records suppressed (anonymiser + confidence suppression, Monte-Carlo mean ± sd) against ε, per k."""
    figure, axes = pyplot().subplots(figsize=size.figsize(7, 4.5))
    for k, cells in _by_k(advice):
        axes.errorbar(
            [c.epsilon for c in cells],
            [100 * (c.anonymiser_suppressed_fraction + c.confidence_suppression.mean) for c in cells],
            yerr=[100 * c.confidence_suppression.sd for c in cells],
            marker="o",
            markersize=4,
            label=f"k = {k}",
        )
    axes.set(xscale="log", xlabel="ε", ylabel="records suppressed (%)", title=f"Suppression vs ε ({_draws(advice)})")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    return _png(figure, size)


# --- A release's figures -----------------------------------------------------------------------------


RELEASE_CAPTIONS = {
    "group_sizes": "Sizes of the published groups",
    "error_by_group": "Per group: predicted against measured relative error",
}


def release_figures(inputs: FigureInputs, k: int) -> dict[str, Figure]:
    """A release's group-size histogram and its per-group predicted-vs-measured error figure, by name.

    ``inputs``: the published groups' sizes as a frequency of frequencies and the classes' errors (per
    anonymiser class, the mean expected and measured relative error of its records,
    :func:`kepsilon.engine.metrics.errors_by_class`), reduced so that their size does not grow with the
    groups (``tasks/figure_inputs.py``): the Dask engine adds them up over partitions.
    """
    return {
        "group_sizes": Figure(lambda size: _group_sizes(inputs.group_sizes, k, size)),
        "error_by_group": Figure(lambda size: _png(_error_figure(inputs, size), size)),
    }


def _group_sizes(sizes: SizeCounts, k: int, size: _Size) -> bytes:
    """Histogram of the published groups' sizes (log bins), with k marked: each distinct size weighted by
    its number of groups, which is the histogram of every group's size."""
    figure, axes = pyplot().subplots(figsize=size.figsize(7, 4.5))
    bins: list[int] | int = (
        np.unique(np.geomspace(max(1, sizes.smallest), sizes.largest + 1, 30).astype(int)).tolist() if sizes.groups else 10
    )
    axes.hist(sizes.values, bins=bins, weights=sizes.counts, color="tab:blue", edgecolor="white")
    axes.axvline(k, color="tab:red", linestyle="--", linewidth=1, label=f"k = {k}")
    axes.set(xscale="log", xlabel="records in the group", ylabel="groups", title=f"{sizes.groups} published groups")
    axes.legend(fontsize=8, loc="upper right")  # a fixed place: "best" searches every bar, slow over many groups
    return _png(figure, size)


def _percent_log_axis(axis, low: float, high: float) -> None:
    """Label a log axis spanning ``low``–``high`` as percentages ("2 %", "10 %"), the minor ticks unlabelled:
    at 1, 2 and 5 per decade over up to two decades, at the powers of ten over more.

    Matplotlib's default labels minor ticks of a log axis spanning less than a decade with ``3×10⁻²``-style
    text, which overlaps; a few short labels per decade never do at the figure's width.
    """
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    decades = np.log10(high / low) if low > 0 and high > low else 1.0
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if decades <= 2 else (1.0,)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{100 * value:.3g} %"))
    axis.set_minor_formatter(NullFormatter())


def error_by_group_figure(predicted: np.ndarray, measured: np.ndarray, size: _Size):
    """Per class with noise: measured against predicted relative error (log–log), with the diagonal, from every
    class's errors (:func:`_error_figure` on their reduction)."""
    return _error_figure(FigureInputs.of_arrays(np.zeros(0, dtype=np.int64), predicted, measured), size)


def _error_figure(inputs: FigureInputs, size: _Size):
    """Per class with noise (both errors positive): measured against predicted relative error (log–log).

    Up to ``SCATTER_LIMIT`` classes one point each; above it a log-scaled count of classes per hexagonal cell,
    so that thousands of classes read as a distribution rather than overprinted points. The cells' counts come
    with ``inputs`` (``ErrorCells``, added up over partitions); ``hexbin`` draws each non-empty cell from its
    centre weighted by its count, on the grid (the extent) the counts were made on.
    """
    figure, axes = pyplot().subplots(figsize=size.figsize(5.5, 5))
    errors = inputs.errors
    if inputs.points is None:
        assert inputs.cells is not None and inputs.extent is not None, "FigureInputs holds cells when not points"
        x, y = inputs.cells.centres(inputs.extent)
        cells = axes.hexbin(x, y, C=inputs.cells.counts, reduce_C_function=np.sum, xscale="log", yscale="log",
                            gridsize=GRIDSIZE, extent=inputs.extent, bins="log", mincnt=1, cmap="Blues", linewidths=0.2)
        from matplotlib.ticker import FuncFormatter

        figure.colorbar(cells, ax=axes, label="groups in the cell", format=FuncFormatter(lambda value, _: f"{value:g}"))
    else:
        axes.scatter(*inputs.points, s=8, alpha=0.5)
    low, high = 0.01, 1.0
    if errors.shown:
        low = min(errors.predicted[0], errors.measured[0])
        high = max(errors.predicted[1], errors.measured[1])
        axes.plot([low, high], [low, high], color="grey", linestyle="--", linewidth=1, label="measured = predicted")
        axes.legend(fontsize=8, loc="upper left")  # a fixed place: "best" tests every point, slow over many groups
    axes.set(xscale="log", yscale="log", xlabel="predicted relative error", ylabel="measured relative error",
             title=f"Per group ({errors.shown} groups with noise)")
    _percent_log_axis(axes.xaxis, low, high)
    _percent_log_axis(axes.yaxis, low, high)
    axes.grid(True, which="both", alpha=0.3)
    return figure
