"""The DP search: its score (the expected quality a release at a node publishes), the score's stated
sensitivity checked on neighbouring tables, and the exhaustive search and the walk checked exactly
against e^ε on neighbouring tables, with controls that catch a wrong sensitivity."""

import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from scipy.stats import chisquare

from kepsilon.engine.dp import exponential_mechanism_probabilities
from kepsilon.engine.dp_quality import (
    QualityModel,
    domain_share_losses,
    expected_publication_sensitivity,
    expected_published,
    precision_losses,
    records_losses,
)
from kepsilon.engine.dp_search import (
    CodedTable,
    NodeScorer,
    all_nodes,
    dp_exhaustive_search,
    dp_search,
    sample_and_anonymise,
    specialisations,
    top_node,
    walk_budget,
)

# Two generalised columns (4 leaves in 3 levels, 3 leaves in 2 levels) and one fixed column.
FIRST_LEVELS = (np.arange(4), np.arange(4) // 2, np.zeros(4, dtype=np.int64))
SECOND_LEVELS = (np.arange(3), np.zeros(3, dtype=np.int64))


def tiny_table(rng, rows: int) -> CodedTable:
    first, second = rng.integers(0, 4, rows), rng.integers(0, 3, rows)
    return CodedTable(
        levels=(tuple(level[first] for level in FIRST_LEVELS), tuple(level[second] for level in SECOND_LEVELS)),
        fixed=(rng.integers(0, 2, rows),),
    )


def with_one_more_record(table: CodedTable, rng) -> CodedTable:
    extra = tiny_table(rng, 1)
    return CodedTable(
        levels=tuple(tuple(np.concatenate([a, b]) for a, b in zip(col, more)) for col, more in zip(table.levels, extra.levels)),
        fixed=tuple(np.concatenate([a, b]) for a, b in zip(table.fixed, extra.fixed)),
    )


def quality(name: str) -> QualityModel:
    if name == "granularity":
        return QualityModel(name, (domain_share_losses(FIRST_LEVELS), domain_share_losses(SECOND_LEVELS)))
    if name == "balanced":
        return QualityModel(name, (domain_share_losses(FIRST_LEVELS), domain_share_losses(SECOND_LEVELS)), 0.2)
    if name == "precision":
        return QualityModel(name, (precision_losses([4, 2, 1], 3), precision_losses([3, 1], 2)))
    return QualityModel(name, (records_losses([4, 2, 1]), records_losses([3, 1])))


def independent_score(table: CodedTable, node, model: QualityModel, k: int, beta: float) -> float:
    """u(D, g) by pandas groupby and exact binomial sums (no code shared with the engine's scorer)."""
    frame = pd.DataFrame({"a": table.levels[0][node[0]], "b": table.levels[1][node[1]], "s": table.fixed[0]})
    total = Fraction(0)
    for (a, b, _), size in frame.groupby(["a", "b", "s"]).size().items():
        p = Fraction(beta).limit_denominator(10**9)
        expected = sum(j * math.comb(size, j) * p**j * (1 - p) ** (size - j) for j in range(k, size + 1))
        loss = (model.losses[0][node[0]][a] + model.losses[1][node[1]][b]) / 2
        total += expected * Fraction(model.weight(loss))
    return float(total)


# --- the score ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("k, beta", [(1, 0.3), (3, 0.5), (10, 0.6), (73, 1 - math.exp(-0.9))])
def test_expected_published_is_the_mean_of_the_records_sampling_then_suppression_keeps(k, beta):
    for n in [0, 1, k - 1, k, k + 5, 3 * k, int(2 * k / beta)]:
        p = Fraction(beta)
        exact = sum(j * math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(k, n + 1))
        assert expected_published(np.array([n]), k, beta)[0] == pytest.approx(float(exact), rel=1e-9, abs=1e-12)


def test_expected_published_matches_simulated_sampling_and_suppression():
    rng = np.random.default_rng(7)
    k, beta, n = 10, 0.6, 18
    table = CodedTable(levels=((np.zeros(n, dtype=np.int64),),))
    published = [sample_and_anonymise(table, (0,), k, beta, rng)[1].sum() for _ in range(20_000)]
    expected = expected_published(np.array([n]), k, beta)[0]
    assert abs(np.mean(published) - expected) < 4 * np.std(published) / math.sqrt(20_000)


@pytest.mark.parametrize("k, beta", [(1, 0.3), (2, 0.5), (5, 0.5), (10, 0.6), (73, 1 - math.exp(-0.9)), (200, 0.1)])
def test_every_increment_of_the_expected_published_records_is_within_the_stated_sensitivity(k, beta):
    bound = expected_publication_sensitivity(k, beta)
    sizes = np.arange(0, int(20 * k / beta) + 50)
    increments = np.diff(expected_published(sizes, k, beta))
    assert increments.min() >= -1e-12  # monotone: adding a record never lowers it
    assert increments.max() <= bound + 1e-12
    assert increments.max() >= bound * (1 - 1e-9)  # and the bound is the maximum, not a loose guess


def test_on_adult_s_parameters_the_sensitivity_is_about_a_twentieth_of_k():
    k, beta = 73, 1 - math.exp(-0.9)
    assert 3.0 < expected_publication_sensitivity(k, beta) < 4.0


@pytest.mark.parametrize("model", ["granularity", "balanced", "precision", "records"])
def test_the_scorer_computes_the_expected_quality_published(model):
    rng = np.random.default_rng(12)
    table = tiny_table(rng, 40)
    scorer = NodeScorer(table, quality(model), 3, 0.5)
    for node in all_nodes(table.heights):
        assert scorer.score(node) == pytest.approx(independent_score(table, node, quality(model), 3, 0.5), rel=1e-9)


@pytest.mark.parametrize("model", ["granularity", "records"])
def test_scoring_the_whole_lattice_by_roll_up_equals_scoring_each_node_alone(model):
    rng = np.random.default_rng(13)
    table = tiny_table(rng, 300)
    for candidate in (table, table.compressed()):
        nodes, scores = NodeScorer(candidate, quality(model), 4, 0.5).score_lattice()
        alone = NodeScorer(table, quality(model), 4, 0.5)
        assert scores == pytest.approx([alone.score(node) for node in nodes], rel=1e-12)


@pytest.mark.parametrize("model", ["granularity", "balanced", "precision", "records"])
@pytest.mark.parametrize("k, beta", [(1, 0.4), (3, 0.5), (6, 0.7)])
def test_adding_one_record_moves_every_node_s_score_up_by_at_most_the_stated_sensitivity(model, k, beta):
    """Many neighbouring pairs D, D ∪ {x}: 0 ≤ u(D ∪ {x}, g) − u(D, g) ≤ Δ at every node g."""
    rng = np.random.default_rng(k)
    largest = 0.0
    for _ in range(300):
        table = tiny_table(rng, int(rng.integers(0, 40)) + 1)
        neighbour = with_one_more_record(table, rng)
        before = NodeScorer(table, quality(model), k, beta)
        after = NodeScorer(neighbour, quality(model), k, beta)
        assert after.sensitivity == before.sensitivity  # public: no function of the data
        changes = np.array([after.score(g) - before.score(g) for g in all_nodes(table.heights)])
        assert changes.min() >= -1e-9
        largest = max(largest, changes.max())
    assert largest <= before.sensitivity + 1e-9
    assert largest >= 0.5 * before.sensitivity  # the neighbours reach near the bound: the check has teeth


# --- the mechanism, exactly on neighbouring tables ----------------------------------------------------


def exhaustive_probabilities(table, model, k, beta, epsilon, sensitivity=None) -> np.ndarray:
    scorer = NodeScorer(table, model, k, beta)
    _, scores = scorer.score_lattice()
    return exponential_mechanism_probabilities(scores, epsilon, sensitivity or scorer.sensitivity, monotone=True)


def walk_probabilities(table, model, k, beta, epsilon, steps, sensitivity=None) -> dict:
    """Exact probability of every output of the walk: its pivots in order and the final draw among
    every node seen (everything the search's randomness decides), enumerated path by path."""
    scorer = NodeScorer(table, model, k, beta)
    sensitivity = sensitivity or scorer.sensitivity
    each, final = walk_budget(epsilon, steps)

    def probabilities(candidates, budget):
        scores = np.array([scorer.score(c) for c in candidates])
        return exponential_mechanism_probabilities(scores, budget, sensitivity, monotone=True)

    Pivots = tuple[tuple[int, ...], ...]  # the pivots drawn so far, in order
    paths: dict[Pivots, float] = {(top_node(table.heights),): 1.0}
    for _ in range(steps):
        longer: dict[Pivots, float] = {}
        for path, probability in paths.items():
            seen = {node for pivot in path for node in specialisations(pivot)} | {path[0]}
            candidates = sorted(seen - set(path))
            if not candidates:
                longer[path] = probability
                continue
            for candidate, p in zip(candidates, probabilities(candidates, each)):
                longer[path + (candidate,)] = probability * p
        paths = longer
    outputs = {}
    for path, probability in paths.items():
        # Seen: the top, the pivots, and the specialisations of every pivot but the last (whose own
        # would be added at a next step).
        seen_in_order = sorted(set(path) | {node for pivot in path[:-1] for node in specialisations(pivot)})
        for chosen, p in zip(seen_in_order, probabilities(seen_in_order, final)):
            outputs[path + (chosen,)] = probability * p
    return outputs


def worst_log_ratio(first, second) -> float:
    if isinstance(first, dict):
        return max(abs(math.log(first[path] / second[path])) for path in first)
    return float(np.max(np.abs(np.log(first / second))))


@pytest.mark.parametrize("model", ["balanced", "records"])
def test_the_exhaustive_search_is_epsilon_dp_on_neighbouring_tables_exactly(model):
    epsilon, k, beta = 2.0, 3, 0.5
    rng = np.random.default_rng(21)
    for _ in range(60):
        table = tiny_table(rng, int(rng.integers(3, 30)))
        neighbour = with_one_more_record(table, rng)
        ratio = worst_log_ratio(exhaustive_probabilities(table, quality(model), k, beta, epsilon),
                                exhaustive_probabilities(neighbour, quality(model), k, beta, epsilon))
        assert ratio <= epsilon + 1e-9


def test_the_exact_check_catches_an_exhaustive_search_run_with_half_the_sensitivity():
    epsilon, k, beta = 2.0, 3, 0.5
    rng = np.random.default_rng(21)
    ratios = []
    for _ in range(60):
        table = tiny_table(rng, int(rng.integers(3, 30)))
        neighbour = with_one_more_record(table, rng)
        half = expected_publication_sensitivity(k, beta) * quality("records").largest_weight / 2
        ratios.append(worst_log_ratio(exhaustive_probabilities(table, quality("records"), k, beta, epsilon, half),
                                      exhaustive_probabilities(neighbour, quality("records"), k, beta, epsilon, half)))
    assert max(ratios) > epsilon


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_the_walk_is_epsilon_dp_on_neighbouring_tables_exactly(steps):
    """Every output (pivots and final node) on D and on D plus one record, computed exactly, within e^ε."""
    epsilon, k, beta = 2.0, 3, 0.5
    rng = np.random.default_rng(5 + steps)
    for _ in range(25):
        table = tiny_table(rng, int(rng.integers(3, 30)))
        neighbour = with_one_more_record(table, rng)
        first = walk_probabilities(table, quality("balanced"), k, beta, epsilon, steps)
        assert sum(first.values()) == pytest.approx(1.0)
        ratio = worst_log_ratio(first, walk_probabilities(neighbour, quality("balanced"), k, beta, epsilon, steps))
        assert ratio <= epsilon + 1e-9


def test_the_exact_check_catches_a_walk_run_with_half_the_sensitivity():
    epsilon, k, beta = 2.0, 3, 0.5
    rng = np.random.default_rng(7)
    half = expected_publication_sensitivity(k, beta) * quality("records").largest_weight / 2
    ratios = []
    for _ in range(25):
        table = tiny_table(rng, int(rng.integers(3, 30)))
        neighbour = with_one_more_record(table, rng)
        ratios.append(worst_log_ratio(walk_probabilities(table, quality("records"), k, beta, epsilon, 2, half),
                                      walk_probabilities(neighbour, quality("records"), k, beta, epsilon, 2, half)))
    assert max(ratios) > epsilon


def test_the_walk_draws_with_the_mechanism_s_probabilities():
    rng = np.random.default_rng(9)
    table = tiny_table(rng, 60)
    outputs = walk_probabilities(table, quality("balanced"), 4, 0.5, 1.0, 2)
    final = {}
    for path, probability in outputs.items():
        final[path[-1]] = final.get(path[-1], 0.0) + probability
    scorer = NodeScorer(table, quality("balanced"), 4, 0.5)
    draws = [dp_search(scorer, 1.0, 2, rng).node for _ in range(4_000)]
    nodes = list(final)
    observed = [sum(d == node for d in draws) for node in nodes]
    assert chisquare(observed, [4_000 * final[node] for node in nodes]).pvalue > 1e-3


def test_the_exhaustive_search_draws_over_the_whole_lattice_with_the_mechanism_s_probabilities():
    rng = np.random.default_rng(10)
    table = tiny_table(rng, 60)
    nodes = all_nodes(table.heights)
    expected = exhaustive_probabilities(table, quality("balanced"), 4, 0.5, 1.0)
    scorer = NodeScorer(table, quality("balanced"), 4, 0.5)
    draws = [dp_exhaustive_search(scorer, 1.0, rng).node for _ in range(4_000)]
    observed = np.array([sum(d == node for d in draws) for node in nodes])
    kept = expected * 4_000 >= 5  # χ² needs expected counts of at least 5
    assert chisquare(np.append(observed[kept], observed[~kept].sum()),
                     np.append(4_000 * expected[kept], 4_000 * expected[~kept].sum())).pvalue > 1e-3


def test_a_walk_with_more_steps_than_nodes_stops_drawing_once_every_node_is_a_pivot():
    rng = np.random.default_rng(3)
    table = tiny_table(rng, 50)
    result = dp_search(NodeScorer(table, quality("records"), 3, 0.5), 1.0, 10, rng)
    assert sorted(result.path) == sorted(set(all_nodes(table.heights)) - {top_node(table.heights)})


def test_compressing_a_table_keeps_its_group_sizes():
    rng = np.random.default_rng(4)
    table = tiny_table(rng, 300)
    for node in [(0, 0), (1, 0), (2, 1), (0, 1)]:
        assert sorted(table.group_sizes(node)) == sorted(table.compressed().group_sizes(node))


def test_sampled_and_anonymised_records_form_no_group_below_k():
    rng = np.random.default_rng(6)
    table = tiny_table(rng, 2_000)
    sampled, published = sample_and_anonymise(table, (0, 0), 40, 0.5, rng)
    assert not (published & ~sampled).any() and 0 < published.sum() < sampled.sum()
    keys = pd.DataFrame({"a": table.levels[0][0], "b": table.levels[1][0], "s": table.fixed[0]})
    sizes = keys[published].groupby(["a", "b", "s"]).size()  # independent group count
    assert sizes.min() >= 40
    suppressed = keys[sampled & ~published].groupby(["a", "b", "s"]).size()
    assert (suppressed < 40).all()
    with pytest.raises(ValueError, match="outside"):
        sample_and_anonymise(table, (3, 0), 40, 0.5, rng)


def test_a_table_whose_keys_overflow_an_int64_is_scored_by_the_slower_grouping_alike():
    """Codes up to 2^21 in three columns: the mixed-radix key would leave int64, so nodes are grouped by
    ``combine_codes``; the score is still the expectation computed independently."""
    rng = np.random.default_rng(14)
    rows = 60
    wide = [rng.choice([0, 1, 2**21], rows) for _ in range(3)]
    table = CodedTable(levels=tuple((codes, np.zeros(rows, dtype=np.int64)) for codes in wide))
    model = QualityModel("records", tuple(records_losses([2**21 + 1, 1]) for _ in range(3)))
    scorer = NodeScorer(table, model, 3, 0.5)
    for node in all_nodes(table.heights):
        frame = pd.DataFrame({c: table.levels[c][level] for c, level in enumerate(node)})
        sizes = frame.groupby(list(frame.columns)).size().to_numpy()
        assert scorer.score(node) == pytest.approx(expected_published(sizes, 3, 0.5).sum(), rel=1e-12)


def test_the_walk_s_final_draw_chooses_among_every_node_seen_not_only_the_pivots():
    rng = np.random.default_rng(15)
    table = tiny_table(rng, 60)
    scorer = NodeScorer(table, quality("records"), 3, 0.5)
    results = [dp_search(scorer, 0.5, 1, rng) for _ in range(400)]
    top = top_node(table.heights)
    assert any(r.node not in {top, *r.path} for r in results)
    assert all(r.node in {top, *specialisations(top)} for r in results)
    longer = dp_search(scorer, 0.5, 3, rng)
    pivots = (top, *longer.path)
    assert set(longer.final_candidates) == set(pivots) | {n for pivot in pivots[:-1] for n in specialisations(pivot)}
    assert len(longer.final_candidates) == len(set(longer.final_candidates)) and longer.node in longer.final_candidates
