"""The prediction before ε on large tables (``kepsilon.engine.predict``): draws of a sample of whole classes.

Above 1M kept records each of the two throw-away draws perturbs a random sample of the classes, so a prediction
stacks about ``STACKED_ROWS`` records whatever the table's size (issue 25: at 10M records the draws of every class
cost 1.6–2.2 µs of worker CPU a record). These tests hold the sample to whole classes, its figures to the full draws',
and the partitioned path to the table's design.
"""

import numpy as np
import pandas as pd
import pytest

from kepsilon.engine.errors import SpecError
from kepsilon.engine.predict import STACKED_ROWS, Prediction, _stacked_rows, design_for, predict
from kepsilon.spec import ReleaseSpec
from tests.conftest import release_spec_dict


@pytest.fixture(scope="module")
def spec() -> ReleaseSpec:
    data = release_spec_dict("paper-synthetic", release_id="design", population_id="design",
                             source={"path": "unused.csv"}, output_dir="/nonexistent/out")
    return ReleaseSpec.model_validate(data)


def classes_of_heights(records: int, spec: ReleaseSpec, seed: int = 1) -> tuple[pd.DataFrame, np.ndarray]:
    """``records`` heights in hundredths, in classes of 10 to 29 records spread over the column's bounds."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(10, 30, records // 10)
    class_ids = np.repeat(np.arange(len(sizes)), sizes)[:records]
    lower, upper = spec.roles.e_quasi[0].bounds()
    centres = rng.uniform(lower + 10, upper - 10, len(sizes))
    heights = np.round(np.clip(centres[class_ids] + rng.normal(0, 4, len(class_ids)), lower, upper), 2)
    return pd.DataFrame({"HEIGHT": heights}), class_ids


@pytest.mark.parametrize("records, draws, share", [
    (1_000, 10, 1.0),
    (200_000, 10, 1.0),
    (500_000, 4, 1.0),
    (1_000_000, 2, 1.0),
    (4_000_000, 2, 0.25),
    (1_000_000_000, 2, 0.001),
])
def test_the_draws_stack_at_most_the_rows_a_prediction_may_hold(records, draws, share):
    design = design_for(records)
    assert (design.draws, design.share) == (draws, pytest.approx(share))
    assert design.draws * design.share * records <= STACKED_ROWS


def test_each_draw_takes_whole_classes_numbered_densely():
    rng = np.random.default_rng(3)
    dense = np.repeat(np.arange(5_000), rng.integers(1, 8, 5_000))
    rows, ids, draw_of_row = _stacked_rows(dense, 5_000, 2, 0.3, np.random.default_rng(7))
    assert np.array_equal(np.unique(ids), np.arange(len(np.unique(ids))))  # dense, as the engine's steps expect
    sizes = np.bincount(dense)
    for draw in range(2):
        mine = draw_of_row == draw
        chosen = np.unique(dense[rows[mine]])
        assert mine.sum() == sizes[chosen].sum()  # every record of a chosen class, none of the others
        assert 0.25 < len(chosen) / 5_000 < 0.35
        # one stacked class per chosen class, holding exactly that class's records
        assert len(np.unique(ids[mine])) == len(chosen)
        assert all(len(np.unique(dense[rows[mine][ids[mine] == i]])) == 1 for i in np.unique(ids[mine])[:50])
    first, second = (set(np.unique(dense[rows[draw_of_row == d]])) for d in range(2))
    assert first != second  # each draw samples its own classes


def test_every_class_drawn_takes_each_record_once_per_draw():
    dense = np.array([0, 0, 1, 2, 2, 2])
    rows, ids, draw_of_row = _stacked_rows(dense, 3, 2, 1.0, np.random.default_rng(0))
    assert rows.tolist() == [0, 1, 2, 3, 4, 5] * 2
    assert ids.tolist() == [0, 0, 1, 2, 2, 2, 3, 3, 4, 5, 5, 5]
    assert draw_of_row.tolist() == [0] * 6 + [1] * 6


def test_a_sample_of_classes_predicts_what_the_draws_of_every_class_predict(spec):
    frame, class_ids = classes_of_heights(200_000, spec)
    full = [predict(frame, class_ids, spec, 2, np.random.default_rng(seed)) for seed in range(4)]
    sampled = [predict(frame, class_ids, spec, 2, np.random.default_rng(seed), share=0.25) for seed in range(4)]
    assert all(p.share == 0.25 for p in sampled)
    assert all(0.2 * 2 * len(frame) < p.drawn.sum() < 0.3 * 2 * len(frame) for p in sampled)
    full_risk = np.mean([p.linking_risk() for p in full])
    assert 0.02 < full_risk < 0.5  # a figure worth predicting
    assert np.mean([p.linking_risk() for p in sampled]) == pytest.approx(full_risk, abs=0.003)
    full_published = np.mean([p.published_records() for p in full])
    assert len(frame) * 0.9 < full_published < len(frame)
    assert np.mean([p.published_records() for p in sampled]) == pytest.approx(full_published, rel=0.002)
    # The predicted errors need no noise: every record, whatever the share.
    assert sampled[0].relative_errors() == full[0].relative_errors()


def test_partitions_sampled_at_the_tables_share_add_up_to_the_tables_prediction(spec):
    frame, class_ids = classes_of_heights(100_000, spec, seed=5)
    half = class_ids < class_ids.max() // 2  # two class partitions: whole classes each
    parts = [predict(frame[mask], class_ids[mask], spec, 2, np.random.default_rng(seed), share=0.5)
             for seed, mask in enumerate([half, ~half])]
    added = Prediction(draws=2, share=0.5, published=np.zeros(2))
    for part in parts:
        added = added.add(part)
    assert added.records == len(frame)
    assert added.drawn.tolist() == (parts[0].drawn + parts[1].drawn).tolist()
    whole = predict(frame, class_ids, spec, 2, np.random.default_rng(9))
    assert added.published_records() == pytest.approx(whole.published_records(), rel=0.005)
    assert added.linking_risk() == pytest.approx(whole.linking_risk(), abs=0.01)
    with pytest.raises(ValueError, match="shares of classes"):
        added.add(Prediction(draws=2, share=1.0, published=np.zeros(2)))


@pytest.mark.parametrize("draws, share, parameter", [(0, 1.0, "draws"), (2, 0.0, "share"), (2, 1.5, "share"),
                                                     (2, True, "share"), (2.0, 1.0, "draws")])
def test_a_design_out_of_range_is_refused_by_name(spec, draws, share, parameter):
    frame, class_ids = classes_of_heights(100, spec)
    with pytest.raises(SpecError) as refused:
        predict(frame, class_ids, spec, draws, np.random.default_rng(0), share=share)
    assert refused.value.parameter == parameter
