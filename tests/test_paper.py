"""The campaign of method.md §8 in small (benchmarks/paper.py): its shape checks on real runs, that they can fail,
the exhaustive survey that checks OLA's node, and the finding at k = 100 (DM*'s node, not the search)."""

import copy
import math

import pytest

from benchmarks.paper import (
    OTHER_SETUPS,
    campaign_source,
    exactness_check,
    other_setups,
    paper_spec,
    report_markdown,
    run_campaign,
    shape_checks,
    survey_lattice,
)


@pytest.fixture(scope="module")
def people():
    frame, _ = campaign_source(paper_spec())
    return frame


def test_a_small_campaign_shows_the_expected_shapes_and_writes_its_report(people):
    advice = run_campaign(k_values=[5, 20], epsilon_values=[0.05, 1.0, 8.0], draws=4)
    survey = survey_lattice(people, paper_spec(), [5, 20])
    checks = shape_checks(advice, survey)
    assert len(checks) == 7
    assert all(ok for _, ok, _ in checks), [c for c in checks if not c[1]]
    assert exactness_check(advice, survey)[1]
    assert set(advice.nodes) == {5, 20}
    assert all(c.anonymiser_suppressed_fraction <= paper_spec().suppression_budget for c in advice.cells)
    report = report_markdown(advice, checks, 1.0, "test", survey, people)
    assert report.count("| yes |") >= 7 and "![error_vs_epsilon](error_vs_epsilon.png)" in report
    assert "**Exactness:** OLA/DM*'s node is the optimum of an exhaustive search" in report
    assert "Why the error" not in report  # it rises from k = 5 to 20: nothing to explain


def test_the_exhaustive_survey_finds_olas_node_and_its_predicted_error_at_every_k(people):
    """The survey groups all 360 nodes with no pruning; OLA's pruned search must land on its DM* optimum."""
    survey = survey_lattice(people, paper_spec(), [2, 100])
    assert len(survey.nodes) == 5 * 6 * 2 * 2 * 3 and survey.max_suppressed == math.floor(0.05 * len(people))
    advice = run_campaign(k_values=[2, 100], epsilon_values=[1.0], draws=2)
    for k in (2, 100):
        choice = survey.dm_star_choice(k)
        assert choice.levels == tuple(advice.nodes[k][c] for c in survey.columns)
        assert choice.error[k] == pytest.approx(advice.cell(k, 1.0).predicted_mean, rel=1e-12)
        assert all(choice.dm_star <= n.dm_star for n in survey.qualifying(k))
    name, ok, detail = exactness_check(advice, survey)
    assert ok and "ZIP 5" in detail  # at k = 100, ZIP 4 and ZIP 5 group alike: every ZIP starts with 3


def test_at_k_100_dm_star_keeps_gender_raw_and_its_error_falls_though_every_fixed_node_rises(people):
    """The finding the report explains, on real runs: the fall is DM*'s node choice, not noise or the search."""
    advice = run_campaign(k_values=[50, 100], epsilon_values=[0.5, 1.0], draws=2)
    survey = survey_lattice(people, paper_spec(), [50, 100])
    checks = dict((name, ok) for name, ok, _ in shape_checks(advice, survey))
    assert not checks["error rises with k for the node OLA/DM* chooses (predicted, at every ε)"]
    assert checks["the least predicted error any node within the budget reaches rises with k"]
    assert checks["the predicted error of a fixed node never falls as k rises (every node, within the budget)"]
    assert advice.nodes[50]["GENDER"] == 1 and advice.nodes[100]["GENDER"] == 0
    for level in (0, 1):  # with GENDER held at either level, DM*'s node's error rises from 50 to 100
        held = [survey.dm_star_choice(k, where=lambda n, level=level: n.levels[2] == level) for k in (50, 100)]
        assert held[0].error[50] <= held[1].error[100]
    report = report_markdown(advice, shape_checks(advice, survey), 1.0, "test", survey, people)
    assert "## Why the error of DM*'s node falls from k = 50 to k = 100" in report
    assert "keeps GENDER less general than at k = 50" in report and "HEIGHT by GENDER" in report


def test_without_zip_dm_stars_error_rises_from_50_to_100_and_with_zip_it_falls(people):
    results = other_setups(people, [50, 100])
    with_zip, without_zip, classical = (results[label] for label in OTHER_SETUPS)
    assert with_zip[100][1] < with_zip[50][1]
    assert without_zip[50][1] <= without_zip[100][1] and "ZIP" not in without_zip[50][0]
    assert classical[50][0] != with_zip[50][0]  # the classical DM charges suppression differently


def test_the_shape_checks_fail_when_the_shapes_are_broken(people):
    advice = run_campaign(k_values=[5, 20], epsilon_values=[0.05, 1.0, 8.0], draws=2, rows=8000)
    survey = survey_lattice(people.sample(n=8000, random_state=1), paper_spec(), [5, 20])
    broken = copy.deepcopy(advice)
    for cell in broken.cells:
        cell.measured_error["HEIGHT"].mean = 0.1  # error flat in ε
        cell.linking_risk.mean = 0.5 * cell.k / 20 * (1 / cell.epsilon)  # risk up with k, down with ε
        cell.confidence_suppression.mean = 0.05
        cell.predicted_error["HEIGHT"] /= cell.k  # falls with k
    broken_survey = copy.deepcopy(survey)
    for node in broken_survey.nodes:
        node.error[20] = node.error[5] / 2  # every node's error falls from k = 5 to 20
    assert [ok for _, ok, _ in shape_checks(broken, broken_survey)] == [False] * 7


def test_exactness_fails_when_olas_node_is_not_the_optimum(people):
    advice = run_campaign(k_values=[20], epsilon_values=[1.0], draws=2)
    survey = survey_lattice(people, paper_spec(), [20])
    assert exactness_check(advice, survey)[1]
    wrong = copy.deepcopy(advice)
    wrong.nodes[20] = {**wrong.nodes[20], "YOB": (wrong.nodes[20]["YOB"] + 1) % 5}
    assert not exactness_check(wrong, survey)[1]
