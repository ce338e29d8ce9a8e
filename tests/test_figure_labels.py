"""The release figure "error by group" stays readable: no two tick labels of an axis overlap, at page and card
size, for errors spanning less than a decade up to several decades, and many groups are drawn as a distribution."""

import numpy as np
import pytest

from kepsilon.tasks.figures import CARD, PAGE, SCATTER_LIMIT, error_by_group_figure


def _errors(groups: int, low: float, high: float) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    predicted = rng.uniform(low, high, groups)
    return predicted, predicted * rng.lognormal(0.0, 0.3, groups)


def _overlapping_labels(figure, axis) -> list[tuple[str, str]]:
    """Pairs of neighbouring, visible tick labels of ``axis`` whose drawn boxes intersect."""
    renderer = figure.canvas.get_renderer()
    figure.canvas.draw()
    labels = [t for t in axis.get_ticklabels(which="both") if t.get_visible() and t.get_text()]
    boxes = sorted(((t.get_window_extent(renderer), t.get_text()) for t in labels), key=lambda b: (b[0].x0, b[0].y0))
    return [(a[1], b[1]) for a, b in zip(boxes, boxes[1:]) if a[0].overlaps(b[0])]


@pytest.mark.parametrize("size", [PAGE, CARD], ids=["page", "card"])
@pytest.mark.parametrize("groups,low,high", [(40, 0.11, 0.19), (620, 0.05, 0.4), (5000, 0.001, 2.0)])
def test_no_two_tick_labels_of_the_error_figure_overlap(size, groups, low, high):
    import matplotlib.pyplot as plt

    figure = error_by_group_figure(*_errors(groups, low, high), size)
    try:
        axes = figure.axes[0]
        for axis in (axes.xaxis, axes.yaxis):
            shown = [t.get_text() for t in axis.get_ticklabels(which="both") if t.get_visible() and t.get_text()]
            assert len(shown) >= 2, shown  # labelled at all: an axis without numbers is not readable either
            assert _overlapping_labels(figure, axis) == []
        assert all(label.endswith("%") for label in shown)
    finally:
        plt.close(figure)


def test_many_groups_are_drawn_as_counts_per_cell_not_one_point_each():
    import matplotlib.pyplot as plt
    from matplotlib.collections import PathCollection, PolyCollection

    few = error_by_group_figure(*_errors(SCATTER_LIMIT, 0.05, 0.4), PAGE)
    many = error_by_group_figure(*_errors(SCATTER_LIMIT + 1, 0.05, 0.4), PAGE)
    try:
        assert [len(c.get_offsets()) for c in few.axes[0].collections if isinstance(c, PathCollection)] == [SCATTER_LIMIT]
        cells = [c for c in many.axes[0].collections if isinstance(c, PolyCollection)]
        assert len(cells) == 1 and cells[0].get_array().sum() == SCATTER_LIMIT + 1  # every group counted once
        assert len(many.axes) == 2  # the colour bar saying how many groups a cell holds
    finally:
        plt.close(few)
        plt.close(many)
