"""The campaign of method.md §8 in small (benchmarks/paper.py): its shape checks on real runs, and that they can fail."""

import copy

from benchmarks.paper import paper_spec, report_markdown, run_campaign, shape_checks


def test_a_small_campaign_shows_the_expected_shapes_and_writes_its_report():
    advice = run_campaign(k_values=[5, 20], epsilon_values=[0.05, 1.0, 8.0], draws=4)
    checks = shape_checks(advice)
    assert len(checks) == 5
    assert all(ok for _, ok, _ in checks), [c for c in checks if not c[1]]
    assert set(advice.nodes) == {5, 20}
    assert all(c.anonymiser_suppressed_fraction <= paper_spec().suppression_budget for c in advice.cells)
    report = report_markdown(advice, checks, 1.0, "test")
    assert report.count("| yes |") == 5 and "![error_vs_epsilon](error_vs_epsilon.png)" in report


def test_the_shape_checks_fail_when_the_shapes_are_broken():
    advice = run_campaign(k_values=[5, 20], epsilon_values=[0.05, 1.0, 8.0], draws=2, rows=8000)
    broken = copy.deepcopy(advice)
    for cell in broken.cells:
        cell.measured_error["HEIGHT"].mean = 0.1  # error flat in ε
        cell.linking_risk.mean = 0.5 * cell.k / 20 * (1 / cell.epsilon)  # risk up with k, down with ε
        cell.confidence_suppression.mean = 0.05
        cell.predicted_error["HEIGHT"] /= cell.k  # falls with k
    assert [ok for _, ok, _ in shape_checks(broken)] == [False] * 5
