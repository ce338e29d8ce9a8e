"""Per-class Laplace perturbation: error formula, noise distribution, grid, bounds, seeds, bad input."""

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from kepsilon.engine.metrics import expected_relative_errors, measured_relative_error, predicted_relative_error
from kepsilon.engine.perturb import grid_exponents, new_seed, perturb, public_grid
from kepsilon.engine.randomness import SEED_BYTES, RecordStreams
from kepsilon.tasks.errors import InputError, SpecError

PEOPLE = Path(__file__).resolve().parents[1] / "data" / "paper-synthetic" / "people.csv"


def quasi(column, lower=None, upper=None):
    return SimpleNamespace(column=column, lower=lower, upper=upper)


HEIGHT = quasi("HEIGHT", 130.0, 210.0)


def noise_rng(byte: int = 7) -> RecordStreams:
    return RecordStreams(bytes([byte]) * SEED_BYTES)


@pytest.fixture(scope="module")
def people():
    frame = pd.read_csv(PEOPLE, sep=";", usecols=["YOB", "GENDER", "RACE", "MARITAL_STATUS", "HEIGHT"])
    class_ids = frame.groupby(["YOB", "GENDER", "RACE", "MARITAL_STATUS"]).ngroup().to_numpy()
    return frame, class_ids


def one_class(n: int, low: float, diameter: float) -> pd.DataFrame:
    """n values spread over [low, low+diameter], both ends present, so diam = diameter exactly."""
    values = low + np.linspace(0.0, 1.0, n) * diameter
    values[-1] = low + diameter
    return pd.DataFrame({"X": values, "label": np.arange(n)})


@pytest.mark.parametrize("epsilon", [1.0, 4.0])
def test_measured_error_converges_to_predicted_over_30_seeds(people, epsilon):
    """The published values are clamped to the bounds: the measured error converges to the clamped
    Laplace's expectation, and lies below the paper's unclamped formula (which it equals without a clamp)."""
    frame, class_ids = people
    paper = predicted_relative_error(frame["HEIGHT"], class_ids, epsilon)
    scales = perturb(frame, class_ids, [HEIGHT], {"HEIGHT": epsilon}, "diameter", noise_rng(0)).scales["HEIGHT"]
    predicted = float(np.mean(expected_relative_errors(
        frame["HEIGHT"].to_numpy(), scales, lower=130.0, upper=210.0, epsilon=epsilon, scale_basis="diameter")))
    measured = []
    for seed in range(30):
        rng = noise_rng(seed)
        noisy = perturb(frame, class_ids, [HEIGHT], {"HEIGHT": epsilon}, "diameter", rng).frame
        measured.append(measured_relative_error(frame["HEIGHT"], noisy["HEIGHT"]))
    # Grid rounding moves each value by < b/512, far below this tolerance.
    assert np.mean(measured) == pytest.approx(predicted, rel=0.02)
    assert 0 < predicted < paper


def test_diameter_mode_publishes_inside_the_bounds_and_predicts_the_clamped_error():
    """Issue 22: demo heights were published at −8 … 388 for bounds 130–210. Classes of diameter 80 at
    ε = 0.1 (b = 800): every published value now lies in the bounds, and the measured error over 200
    seeds matches the clamped Laplace's exact expectation (the unclamped one, b/|v|, is ~10× larger)."""
    values = np.tile([130.0, 150.0, 170.0, 190.0, 210.0], 40)
    frame = pd.DataFrame({"X": values})
    ids = np.repeat(np.arange(40), 5)
    x = quasi("X", 130.0, 210.0)
    measured, published = [], []
    for seed in range(200):
        result = perturb(frame, ids, [x], {"X": 0.1}, "diameter", noise_rng(seed % 256))
        noisy = result.frame["X"].to_numpy()
        published.append(noisy)
        measured.append(measured_relative_error(values, noisy))
    published = np.concatenate(published)
    assert published.min() >= 130.0 and published.max() <= 210.0
    assert (published == 130.0).mean() > 0.3 and (published == 210.0).mean() > 0.3  # most draws clamp
    predicted = float(np.mean(expected_relative_errors(
        values, result.scales["X"], lower=130.0, upper=210.0, epsilon=0.1, scale_basis="diameter")))
    unclamped = float(np.mean(800.0 / values))
    assert np.mean(measured) == pytest.approx(predicted, rel=0.02)
    assert unclamped > 9 * predicted


def test_measured_error_converges_to_predicted_on_mondrian_classes(people):
    """The paper's set-up: Mondrian classes (k = 10) on the sample, ε = 1, 30 seeds."""
    from kepsilon.engine import mondrian as k_anonymise
    from kepsilon.engine.hierarchy import load_hierarchy

    frame, _ = people
    columns = ["YOB", "GENDER", "RACE", "MARITAL_STATUS"]
    hierarchies = {c: load_hierarchy(PEOPLE.parent / "hierarchies" / f"{c}.csv", c) for c in columns}
    partition = k_anonymise.mondrian(frame, columns, 10, hierarchies)
    kept = frame[partition.kept]
    class_ids = partition.class_ids[partition.kept]
    paper = predicted_relative_error(kept["HEIGHT"], class_ids, 1.0)
    scales = perturb(kept, class_ids, [HEIGHT], {"HEIGHT": 1.0}, "diameter", noise_rng(0)).scales["HEIGHT"]
    predicted = float(np.mean(expected_relative_errors(
        kept["HEIGHT"].to_numpy(), scales, lower=130.0, upper=210.0, epsilon=1.0, scale_basis="diameter")))
    assert predicted <= paper
    measured = [
        measured_relative_error(
            kept["HEIGHT"],
            perturb(kept, class_ids, [HEIGHT], {"HEIGHT": 1.0}, "diameter", noise_rng(seed)).frame["HEIGHT"],
        )
        for seed in range(30)
    ]
    assert np.mean(measured) == pytest.approx(predicted, rel=0.02)


@pytest.mark.parametrize("diameter", [0.05, 3.0, 250.0])
def test_noise_is_laplace_with_scale_diameter_over_epsilon(diameter):
    frame = one_class(6000, 100.0, diameter)
    epsilon = 0.5
    b = diameter / epsilon
    # Bounds 8 scales beyond the values: the output clamp touches about one record in 3,000.
    bounds = quasi("X", 100.0 - 8 * b, 100.0 + diameter + 8 * b)
    result = perturb(frame, np.zeros(len(frame), dtype=np.int64), [bounds], {"X": epsilon}, "diameter", noise_rng(1))
    assert np.allclose(result.scales["X"], b)
    noise = result.frame["X"].to_numpy() - frame["X"].to_numpy()
    assert stats.kstest(noise, stats.laplace(scale=b).cdf).pvalue > 0.01


def test_ks_rejects_a_wrong_scale():
    frame = one_class(20000, 10.0, 2.0)
    # Bounds 8 scales beyond the values, so the output clamp touches almost no record.
    result = perturb(frame, np.zeros(len(frame), dtype=np.int64), [quasi("X", -6.0, 28.0)], {"X": 1.0}, "diameter", noise_rng(2))
    noise = result.frame["X"].to_numpy() - frame["X"].to_numpy()
    assert stats.kstest(noise, stats.laplace(scale=2.0).cdf).pvalue > 0.01
    assert stats.kstest(noise, stats.laplace(scale=2.5).cdf).pvalue < 1e-6


def test_every_noisy_value_lies_on_the_public_grid(people):
    frame, class_ids = people
    result = perturb(frame, class_ids, [HEIGHT], {"HEIGHT": 2.0}, "diameter", noise_rng(3))
    grid = public_grid(130.0, 210.0, 2.0)
    assert grid == 2.0 ** (math.ceil(math.log2(80.0 / 2.0)) - 10) == 2.0**-4
    assert result.report["columns"]["HEIGHT"]["grid"] == grid
    b = result.scales["HEIGHT"]
    assert (b <= 80.0 / 2.0).all() and (b > 0).any()
    noisy = result.frame["HEIGHT"].to_numpy()[b > 0]
    steps = noisy / grid
    assert np.array_equal(steps, np.round(steps))


def test_grid_exponent_is_exact_at_powers_of_two():
    scales = np.array([1.0, np.nextafter(1.0, 2.0), 0.75, 0.5, 3.0, 1024.0])
    assert grid_exponents(scales).tolist() == [-10, -9, -10, -11, -8, 0]


def test_bounds_mode_clamps_inputs_and_outputs_and_uses_public_scale():
    values = np.array([120.0, 150.0, 180.0, 250.0, 90.0] * 400)
    frame = pd.DataFrame({"X": values})
    class_ids = np.repeat(np.arange(400), 5)
    result = perturb(frame, class_ids, [quasi("X", 100.0, 200.0)], {"X": 0.5}, "bounds", noise_rng(4))
    noisy = result.frame["X"].to_numpy()
    assert np.all(result.scales["X"] == 200.0)
    assert noisy.min() >= 100.0 and noisy.max() <= 200.0
    # With b = 200 over a width of 100 most draws land outside and are clamped to the bounds.
    assert (noisy == 100.0).sum() > 400 and (noisy == 200.0).sum() > 400
    assert result.report["columns"]["X"]["clamped_inputs"] == 800
    grid = 2.0 ** (math.ceil(math.log2(200.0)) - 10)
    assert np.array_equal(noisy / grid, np.round(noisy / grid))


def test_both_modes_refuse_missing_or_inverted_bounds():
    frame = pd.DataFrame({"X": [1.0, 2.0, 3.0]})
    ids = np.zeros(3, dtype=np.int64)
    for basis in ("bounds", "diameter"):
        for bad in (quasi("X"), quasi("X", 5.0, 1.0), quasi("X", 0.0, math.inf)):
            with pytest.raises(SpecError, match="'X'") as caught:
                perturb(frame, ids, [bad], {"X": 1.0}, basis, noise_rng())
            assert "X" in caught.value.parameter


def test_zero_diameter_classes_are_released_unchanged():
    values = np.array([170.25, 170.25, 170.25, 160.0, 180.0, 181.0, 155.5, 155.5])
    frame = pd.DataFrame({"X": values})
    class_ids = np.array([3, 3, 3, 8, 8, 8, 11, 11])
    result = perturb(frame, class_ids, [quasi("X", 150.0, 200.0)], {"X": 1.0}, "diameter", noise_rng(5))
    noisy = result.frame["X"].to_numpy()
    assert np.array_equal(noisy[[0, 1, 2, 6, 7]], values[[0, 1, 2, 6, 7]])
    assert np.all(result.scales["X"][[0, 1, 2, 6, 7]] == 0)
    assert np.all(result.scales["X"][3:6] == 21.0)
    assert not np.array_equal(noisy[3:6], values[3:6])
    assert result.report["columns"]["X"]["zero_diameter_classes"] == 2
    assert result.report["columns"]["X"]["noised_records"] == 3


def test_same_seed_same_release_different_seed_different(people):
    frame, class_ids = people
    seed = new_seed()

    def release(seed_bytes):
        return perturb(frame, class_ids, [HEIGHT], {"HEIGHT": 1.0}, "diameter", RecordStreams(seed_bytes)).frame

    first, again = release(seed), release(seed)
    assert first["HEIGHT"].to_numpy().tobytes() == again["HEIGHT"].to_numpy().tobytes()
    other = release(new_seed())
    assert not np.array_equal(first["HEIGHT"].to_numpy(), other["HEIGHT"].to_numpy())


def test_record_streams_are_deterministic_keyed_by_column_and_withhold_the_seed():
    seed = new_seed()
    assert len(seed) == SEED_BYTES and seed != new_seed()
    positions = np.arange(50)
    first, again = RecordStreams(seed), RecordStreams(seed)
    assert np.array_equal(first.laplace("HEIGHT", positions), again.laplace("HEIGHT", positions))
    assert np.array_equal(first.order(positions), again.order(positions))
    assert not np.array_equal(first.laplace("HEIGHT", positions), first.laplace("WEIGHT", positions))
    assert not np.array_equal(first.laplace("HEIGHT", positions), RecordStreams(new_seed()).laplace("HEIGHT", positions))
    assert seed.hex() not in repr(first) and str(int.from_bytes(seed, "big")) not in repr(first)
    for bad in (b"short", seed + b"x", "a" * SEED_BYTES):
        with pytest.raises(SpecError) as caught:
            RecordStreams(bad)
        assert caught.value.parameter == "seed"


def test_epsilon_is_split_across_the_record_quasis():
    frame = pd.DataFrame({"H": [150.0, 190.0, 170.0, 160.0], "W": [50.0, 90.0, 70.0, 60.0], "other": list("abcd")})
    class_ids = np.array([1, 1, 2, 2])
    split = {"H": 0.25, "W": 0.75}
    result = perturb(frame, class_ids, [quasi("H", 100.0, 200.0), quasi("W", 0.0, 100.0)], split, "diameter", noise_rng(6))
    assert result.scales["H"].tolist() == [160.0, 160.0, 40.0, 40.0]
    assert result.scales["W"].tolist() == pytest.approx([40 / 0.75, 40 / 0.75, 10 / 0.75, 10 / 0.75])
    assert result.report["epsilon_split"] == split
    assert result.report["epsilon_total"] == 1.0
    assert result.frame["other"].tolist() == list("abcd")
    assert list(result.frame.index) == list(frame.index)
    # The input is not modified in place.
    assert frame["H"].tolist() == [150.0, 190.0, 170.0, 160.0]


def test_report_is_json_and_repr_holds_no_data():
    import json

    frame = pd.DataFrame({"X": [171.123456, 199.654321]})
    result = perturb(frame, np.array([0, 0]), [quasi("X", 100.0, 250.0)], {"X": 1.0}, "diameter", noise_rng())
    text = json.dumps(result.report) + repr(result)
    assert "171.12" not in text and "199.65" not in text


@pytest.mark.parametrize(
    "bad_value, dtype",
    [(np.nan, float), (np.inf, float), (-np.inf, float), ("tall-171.5", object)],
)
def test_bad_values_in_an_epsilon_quasi_name_the_column_not_the_value(bad_value, dtype):
    frame = pd.DataFrame({"HEIGHT": pd.Series([171.5, 180.25, bad_value], dtype=dtype)})
    with pytest.raises(InputError) as caught:
        perturb(frame, np.array([0, 0, 0]), [HEIGHT], {"HEIGHT": 1.0}, "diameter", noise_rng())
    assert caught.value.column == "HEIGHT"
    assert "171.5" not in str(caught.value) and "180.25" not in str(caught.value)


def test_missing_epsilon_quasi_column_is_named():
    frame = pd.DataFrame({"HEIGHT": [1.0, 2.0]})
    with pytest.raises(InputError, match="'WEIGHT'") as caught:
        perturb(frame, np.array([0, 0]), [quasi("WEIGHT", 0.0, 300.0)], {"WEIGHT": 1.0}, "diameter", noise_rng())
    assert caught.value.column == "WEIGHT"


@pytest.mark.parametrize("epsilon", [0.0, -1.0, math.inf, math.nan, "1"])
def test_bad_epsilon_is_refused(epsilon):
    frame = pd.DataFrame({"HEIGHT": [1.0, 2.0]})
    with pytest.raises(SpecError, match="'HEIGHT'") as caught:
        perturb(frame, np.array([0, 0]), [HEIGHT], {"HEIGHT": epsilon}, "diameter", noise_rng())
    assert caught.value.parameter == "epsilon"


def test_bad_scale_basis_and_class_ids_are_refused():
    frame = pd.DataFrame({"X": [1.0, 2.0]})
    with pytest.raises(SpecError) as caught:
        perturb(frame, np.array([0, 0]), [quasi("X", 0.0, 10.0)], {"X": 1.0}, "public", noise_rng())
    assert caught.value.parameter == "scale_basis"
    for ids in (np.array([0, -1]), np.array([0]), np.array([0.0, 1.0])):
        with pytest.raises(SpecError) as caught:
            perturb(frame, ids, [quasi("X", 0.0, 10.0)], {"X": 1.0}, "diameter", noise_rng())
        assert caught.value.parameter == "class_ids"


def test_noise_finer_than_float_precision_is_refused():
    # Values near 1e12 have a float spacing of 2^-13; bounds 2 wide at ε = 1 give a grid of 2^-9.
    frame = pd.DataFrame({"X": [1e12, 1e12 + 0.001]})
    with pytest.raises(SpecError, match="'X'") as caught:
        perturb(frame, np.array([0, 0]), [quasi("X", 1e12 - 1, 1e12 + 1)], {"X": 1.0}, "diameter", noise_rng())
    assert caught.value.parameter == "epsilon"


# --- The public grid (issue 9, item 4) ------------------------------------------------------------


def two_adic_valuation_of_gcd(values: np.ndarray) -> int:
    """log2 of the greatest power of two dividing every value (values are dyadic rationals)."""
    exponents = []
    for value in values:
        mantissa, exponent = math.frexp(float(value))
        integer = int(mantissa * 2**53)  # exact: a double's mantissa has 53 bits
        trailing = (integer & -integer).bit_length() - 1
        exponents.append(exponent - 53 + trailing)
    return min(exponents)


def test_public_grid_is_exact_and_refuses_bad_input():
    assert public_grid(130.0, 210.0, 1.0) == 2.0**-3  # 80 → ceil(log2) = 7
    assert public_grid(0.0, 1024.0, 1.0) == 1.0  # a power of two is not rounded up
    assert public_grid(0.0, np.nextafter(1024.0, 2048.0), 1.0) == 2.0
    assert public_grid(130.0, 210.0, 16.0) == 2.0**-7
    for args, parameter in (((1.0, 1.0, 1.0), "bounds"), ((0.0, math.inf, 1.0), "bounds"), ((0.0, 1.0, 0.0), "epsilon")):
        with pytest.raises(SpecError) as caught:
            public_grid(*args)
        assert caught.value.parameter == parameter


@pytest.mark.parametrize("epsilon", [1e7, 1e200, 1e308, np.finfo(float).max])
def test_an_epsilon_near_the_float_maximum_is_refused_as_too_fine_not_an_overflow(epsilon):
    """``kepsilon check --epsilon 1e308`` ended in OverflowError (exit 1, a traceback): the grid was subnormal,
    and the bounds divided by it overflowed before the precision check could refuse."""
    from kepsilon.engine.perturb import check_noise_grid

    quasi = SimpleNamespace(column="HEIGHT", lower=130.0, upper=210.0)
    with pytest.raises(SpecError, match="finer than the values' float precision") as caught:
        check_noise_grid([quasi], {"HEIGHT": epsilon})
    assert caught.value.parameter == "epsilon"


@pytest.mark.parametrize("basis", ["diameter", "bounds"])
def test_tables_of_very_different_diameters_share_the_public_grid(basis):
    grid = public_grid(130.0, 210.0, 1.0)
    narrow = pd.DataFrame({"HEIGHT": 170.0 + np.linspace(0.0, 1.0, 300)})  # diameter 1
    wide = pd.DataFrame({"HEIGHT": 140.0 + np.linspace(0.0, 60.0, 300)})  # diameter 60
    ids = np.zeros(300, dtype=np.int64)
    valuations = []
    for table in (narrow, wide):
        result = perturb(table, ids, [HEIGHT], {"HEIGHT": 1.0}, basis, noise_rng(9))
        published = result.frame["HEIGHT"].to_numpy()
        assert result.report["columns"]["HEIGHT"]["grid"] == grid
        assert np.array_equal(published / grid, np.round(published / grid))
        valuations.append(two_adic_valuation_of_gcd(published))
    # The grid read off the published values is the public one whatever the diameter: before, it was
    # 2^-10 for the class of diameter 1 and 2^-4 for the class of diameter 60.
    assert valuations == [-3, -3]


def test_report_keeps_private_figures_but_no_grid_exponents():
    frame = pd.DataFrame({"X": [120.0, 150.0, 150.0, 150.0, 90.0, 250.0]})
    ids = np.array([0, 0, 1, 1, 2, 2])
    result = perturb(frame, ids, [quasi("X", 100.0, 200.0)], {"X": 1.0}, "diameter", noise_rng(8))
    column = result.report["columns"]["X"]
    assert not any("exponent" in name for name in column)
    assert column["grid"] == public_grid(100.0, 200.0, 1.0)
    assert column["zero_diameter_classes"] == 1 and column["clamped_inputs"] == 2
    assert "mean_scale" in column


def test_diameter_mode_clamps_inputs_before_the_diameter():
    # 90 and 250 are clamped to 100 and 200 first: the class diameter is 100, not 160.
    frame = pd.DataFrame({"X": [90.0, 250.0, 150.0, 150.0]})
    result = perturb(frame, np.array([0, 0, 1, 1]), [quasi("X", 100.0, 200.0)], {"X": 2.0}, "diameter", noise_rng(10))
    assert result.scales["X"].tolist() == [50.0, 50.0, 0.0, 0.0]
    assert result.frame["X"].tolist()[2:] == [150.0, 150.0]  # zero diameter: published exactly


def test_noise_and_order_do_not_depend_on_how_the_table_is_split(people):
    """Keyed per record: perturbing two partitions separately gives every record the noise it gets whole."""
    frame, class_ids = people
    streams = noise_rng(11)
    whole = perturb(frame, class_ids, [HEIGHT], {"HEIGHT": 1.0}, "diameter", streams)
    scales = whole.scales["HEIGHT"]
    for cut in (1, len(frame) // 3, len(frame) - 1):
        parts = [frame.iloc[:cut], frame.iloc[cut:]]
        noise = np.concatenate([streams.laplace("HEIGHT", part.index.to_numpy()) for part in parts])
        assert np.array_equal(noise, streams.laplace("HEIGHT", frame.index.to_numpy()))
    raw = frame["HEIGHT"].to_numpy() + streams.laplace("HEIGHT", frame.index.to_numpy()) * scales
    noised = scales > 0
    grid = whole.report["columns"]["HEIGHT"]["grid"]
    snapped = np.clip(np.round(raw[noised] / grid) * grid, 130.0, 210.0)  # the bounds lie on the grid
    assert np.array_equal(whole.frame["HEIGHT"].to_numpy()[noised], snapped)
    # The published order of any subset is the whole order restricted to it.
    positions = frame.index.to_numpy()
    whole_order = positions[streams.order(positions)]
    subset = positions[::3]
    assert np.array_equal(subset[streams.order(subset)], whole_order[np.isin(whole_order, subset)])


def test_keyed_noise_is_standard_laplace_and_the_order_is_uniform():
    streams = noise_rng(12)
    draws = streams.laplace("X", np.arange(200_000))
    assert stats.kstest(draws, stats.laplace().cdf).pvalue > 0.01
    # Each of 5 records lands in each of 5 places equally often over many seeds' orders.
    places = np.zeros((5, 5))
    for byte in range(200):
        order = RecordStreams(bytes([byte, 1]) + bytes(30)).order(np.arange(5))
        places[order, np.arange(5)] += 1
    assert stats.chisquare(places.ravel()).pvalue > 0.001


def test_positions_must_be_the_source_positions():
    frame = pd.DataFrame({"HEIGHT": [150.0, 160.0]}, index=[3, 3])
    with pytest.raises(SpecError) as caught:
        perturb(frame, np.array([0, 0]), [HEIGHT], {"HEIGHT": 1.0}, "diameter", noise_rng())
    assert caught.value.parameter == "frame"
