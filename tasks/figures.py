"""Private figures for the steward: the advisor's trade-off curves and each release's group and error plots.

PNG bytes from matplotlib's Agg backend (no display needed). Every figure is computed from private values,
so it goes to the private report folder (:func:`private_report_dir`, never the published folder) and to
the flow run's page in the Prefect UI, never into a release or its public manifest.
No Prefect import here: the flows attach what these functions draw.
"""

import base64
import io
import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: workers and CI have no display

import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import numpy as np  # noqa: E402

from .errors import SpecError  # noqa: E402

REPORTS_ENV = "KEPSILON_REPORTS_DIR"
DEFAULT_REPORTS_DIR = "reports/private"


def private_report_dir(name: str, output_dir: str | Path | None = None) -> Path:
    """The private folder for one release's or one advice's figures: ``$KEPSILON_REPORTS_DIR/<name>``.

    Default root ``reports/private`` (git-ignored), made absolute so a worker writes where the operator
    looks. Refused (``SpecError``) when it would lie inside ``output_dir``, where releases are published:
    a private figure there would be published with the next release.
    """
    root = Path(os.environ.get(REPORTS_ENV) or DEFAULT_REPORTS_DIR).resolve()
    folder = root / name
    if output_dir is not None:
        published = Path(output_dir).resolve()
        if folder == published or published in folder.parents:
            raise SpecError(REPORTS_ENV, "the private report folder must not lie inside the published output folder")
    return folder


def write_figures(figures: dict[str, bytes], folder: Path) -> list[Path]:
    """Write each PNG to ``folder`` (created private, mode 0700); returns the paths."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    paths = []
    for name, png in figures.items():
        path = folder / f"{name}.png"
        path.write_bytes(png)
        paths.append(path)
    return paths


def markdown_images(figures: dict[str, bytes], captions: dict[str, str]) -> str:
    """Markdown embedding each PNG as a ``data:`` URI, so the image travels inside the artifact itself
    (a link to a file would need the UI's browser to reach the worker's disk)."""
    parts = []
    for name, png in figures.items():
        encoded = base64.b64encode(png).decode("ascii")
        parts.append(f"### {captions.get(name, name)}\n\n![{name}](data:image/png;base64,{encoded})\n")
    return "\n".join(parts)


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(figure)
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


def advice_figures(advice, max_linking_risk: float | None = None, target_error: float | None = None) -> dict[str, bytes]:
    """The three trade-off plots of an :class:`kepsilon.tasks.advise.Advice`, as PNG bytes by name."""
    draws = f"{advice.draws} draws per cell"
    figures = {}

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for k, cells in _by_k(advice):
        epsilons = [c.epsilon for c in cells]
        (line,) = axes.plot(epsilons, [c.predicted_mean for c in cells], label=f"k = {k}")
        measured = [np.mean([s.mean for s in c.measured_error.values()]) for c in cells]
        spread = [np.mean([s.sd for s in c.measured_error.values()]) for c in cells]
        axes.errorbar(epsilons, measured, yerr=spread, fmt="o", color=line.get_color(), markersize=4)
    if target_error is not None:
        axes.axhline(target_error, color="grey", linestyle="--", linewidth=1, label="target error")
    axes.set(xscale="log", yscale="log", xlabel="ε", ylabel="mean relative error", title=f"Error vs ε ({draws})")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    figures["error_vs_epsilon"] = _png(figure)

    figure, axes = plt.subplots(figsize=(7, 4.5))
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
    axes.set(xscale="log", xlabel="ε", ylabel="linking risk (%)", title=f"Linking risk vs ε ({draws})")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    figures["linking_risk_vs_epsilon"] = _png(figure)

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for k, cells in _by_k(advice):
        axes.errorbar(
            [c.epsilon for c in cells],
            [100 * (c.anonymiser_suppressed_fraction + c.confidence_suppression.mean) for c in cells],
            yerr=[100 * c.confidence_suppression.sd for c in cells],
            marker="o",
            markersize=4,
            label=f"k = {k}",
        )
    axes.set(xscale="log", xlabel="ε", ylabel="records suppressed (%)", title=f"Suppression vs ε ({draws})")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    figures["suppression_vs_epsilon"] = _png(figure)
    return figures


# --- A release's figures -----------------------------------------------------------------------------


RELEASE_CAPTIONS = {
    "group_sizes": "Sizes of the published groups",
    "error_by_group": "Per group: predicted against measured relative error",
}


def release_figures(group_sizes: np.ndarray, predicted: np.ndarray, measured: np.ndarray, k: int) -> dict[str, bytes]:
    """A release's group-size histogram and its per-group predicted-vs-measured error scatter (PNG bytes).

    ``group_sizes``: records per published group; ``predicted``, ``measured``: per anonymiser class, the
    mean expected and measured relative error of its records (:func:`kepsilon.engine.metrics.errors_by_class`).
    """
    figures = {}
    figure, axes = plt.subplots(figsize=(7, 4.5))
    sizes = np.asarray(group_sizes)
    bins = np.unique(np.geomspace(max(1, sizes.min()), sizes.max() + 1, 30).astype(int)) if len(sizes) else 10
    axes.hist(sizes, bins=bins, color="tab:blue", edgecolor="white")
    axes.axvline(k, color="tab:red", linestyle="--", linewidth=1, label=f"k = {k}")
    axes.set(xscale="log", xlabel="records in the group", ylabel="groups", title=f"{len(sizes)} published groups")
    axes.legend(fontsize=8)
    figures["group_sizes"] = _png(figure)

    figure, axes = plt.subplots(figsize=(5.5, 5))
    shown = (np.asarray(predicted) > 0) & (np.asarray(measured) > 0)
    axes.scatter(np.asarray(predicted)[shown], np.asarray(measured)[shown], s=8, alpha=0.5)
    if shown.any():
        low = min(np.min(predicted[shown]), np.min(measured[shown]))
        high = max(np.max(predicted[shown]), np.max(measured[shown]))
        axes.plot([low, high], [low, high], color="grey", linestyle="--", linewidth=1, label="measured = predicted")
        axes.legend(fontsize=8)
    axes.set(xscale="log", yscale="log", xlabel="predicted relative error", ylabel="measured relative error",
             title=f"Per group ({int(shown.sum())} groups with noise)")
    axes.grid(True, which="both", alpha=0.3)
    figures["error_by_group"] = _png(figure)
    return figures
