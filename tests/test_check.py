"""`kepsilon check` and the checks before ε the release shares with it (issues 22 and 24).

The check function is called as the flow calls it (no Prefect needed: it is the flow's body); the CLI, with its
own Prefect server, is the heavy variant at the end.
"""

import json
import os

import pytest
from cryptography.fernet import Fernet

from kepsilon.audit.ledger import remaining
from kepsilon.flows.check import check_release
from kepsilon.flows.spec import parse_spec
from kepsilon.tasks.errors import SpecError
from tests.conftest import capped_store


@pytest.fixture
def store(tmp_path, monkeypatch):
    return capped_store(tmp_path, monkeypatch, "test-population")


def verdict(result: dict, name: str) -> dict:
    return next(v for v in result["verdicts"] if v["name"] == name)


def reservations(store) -> int:
    return store.conn.execute("SELECT COUNT(*) FROM ledger WHERE kind = 'reserve'").fetchone()[0]


def test_a_release_that_would_publish_says_so_spends_nothing_and_is_recorded_as_a_read(store, synthetic_spec_dict):
    result = check_release(parse_spec(synthetic_spec_dict), via="cli")
    assert result["line"] == "would publish" and result["would_publish"]
    # The exact predicted error of the published (clamped) values: the demo's 13.48 % at k = 10, ε = 1.
    assert verdict(result, "relative error of HEIGHT")["figure"] == pytest.approx(0.1348, abs=5e-4)
    assert 0 < verdict(result, "linking risk")["figure"] < 0.1
    assert reservations(store) == 0 and remaining(store, "test-population") == pytest.approx(5.0)
    (event,) = list(store["advice_events"].rows)
    assert event["via"] == "cli" and json.loads(event["k_values"]) == [10] and event["id"] == result["event_id"]
    assert not os.listdir(synthetic_spec_dict["output_dir"])  # nothing written under the output folder


def test_a_release_over_its_suppression_budget_is_refused_with_the_figure_and_a_change_that_passes(store, synthetic_spec_dict):
    """ε = 4.9 with a budget of 1 %: confidence suppression removes about 3 % (measured after the noise, such a
    release failed with its ε spent); the check predicts it and finds a k or ε whose checks pass."""
    spec_dict = {**synthetic_spec_dict, "epsilon": 4.9, "suppression_budget": 0.01}
    result = check_release(parse_spec(spec_dict), via="cli")
    assert result["would_publish"] is False
    line = result["line"]
    assert line.startswith("would be refused: suppression ") and "(limit 1.00 %); try " in line
    name, value = line.split("; try ")[1].split()[:2]
    assert name in ("k", "epsilon")
    changed = {name: int(value) if name == "k" else float(value), "release_id": "again"}
    again = check_release(parse_spec({**spec_dict, **changed}), via="cli")
    assert again["line"] == "would publish"
    assert reservations(store) == 0


@pytest.mark.usefixtures("prefect_harness")
def test_a_limit_on_the_predicted_error_refuses_before_epsilon_and_suggests_a_larger_epsilon(store, synthetic_spec_dict):
    spec_dict = json.loads(json.dumps(synthetic_spec_dict))
    spec_dict["roles"]["e_quasi"][0]["max_relative_error"] = 0.10
    result = check_release(parse_spec(spec_dict), via="cli")
    assert result["line"].startswith("would be refused: relative error of HEIGHT 13.4")
    assert "(limit 10.00 %); try epsilon " in result["line"]
    suggested = float(result["line"].split("try epsilon ")[1].split()[0])
    predicted = float(result["line"].split("(predicted error ")[1].split()[0])
    assert 1 < suggested <= 3 and predicted <= 10.0
    # The release itself stops at the same verdict, before any reservation.
    from kepsilon.flows.release import governed_release

    with pytest.raises(SpecError, match="roles.e_quasi.HEIGHT.max_relative_error"):
        governed_release(parse_spec(spec_dict))
    assert reservations(store) == 0


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.parametrize("epsilon, problem", [(0.0005, "wider than the bounds"), (1e7, "float precision")])
def test_an_epsilon_the_noise_grid_cannot_carry_is_refused_before_the_reservation(store, synthetic_spec_dict, epsilon, problem):
    """Issue 24: these failed after the reservation, with ε recorded as spent."""
    store.conn.execute("SELECT 1")
    from kepsilon.audit.ledger import set_cap

    set_cap(store, "test-population", 2e7, by="test-officer", reason="room for an absurd ε")
    from kepsilon.flows.release import governed_release

    with pytest.raises(SpecError, match=problem):
        governed_release(parse_spec({**synthetic_spec_dict, "epsilon": epsilon}))
    assert reservations(store) == 0
    result = check_release(parse_spec({**synthetic_spec_dict, "epsilon": epsilon}), via="cli")
    assert result["line"].startswith("would be refused: noise grid: parameter 'epsilon'")
    assert "; try epsilon " in result["line"]


@pytest.mark.usefixtures("prefect_harness")
def test_a_corrupt_or_missing_seed_key_is_refused_before_the_reservation(store, synthetic_spec_dict, tmp_path, monkeypatch):
    from kepsilon.flows.release import governed_release

    key_file = tmp_path / "keys" / "seed.key"
    key_file.parent.mkdir(mode=0o700, exist_ok=True)
    key_file.write_bytes(b"not a key")
    with pytest.raises(SpecError, match="KEPSILON_SEED_KEY_FILE"):
        governed_release(parse_spec(synthetic_spec_dict))
    assert reservations(store) == 0


def test_a_deleted_seed_key_with_a_reservation_awaiting_its_seed_is_an_error_not_a_new_key(store, synthetic_spec_dict, tmp_path):
    """Issue 24: a deleted key file was silently recreated, and the rerun of an interrupted release could not
    unseal its seed (1 ε lost). Now the rerun is refused, naming the variable, and the file is not created."""
    from kepsilon.audit.ledger import reserve
    from kepsilon.audit.seeds import seal_seed
    from kepsilon.flows.manifest import idempotency_key
    from kepsilon.tasks.ingest import read_source
    from kepsilon.tasks.record import check_seed_key

    spec = parse_spec(synthetic_spec_dict)
    key = idempotency_key(spec, read_source(spec.source).sha256)
    reserve(store, population_id="test-population", epsilon=1.0, idempotency_key=key, release_id="test-release",
            operator="steward")
    seal_seed(store, idempotency_key=key, release_id="test-release", seed=os.urandom(32))
    key_file = tmp_path / "keys" / "seed.key"
    key_file.unlink()
    with pytest.raises(SpecError, match="KEPSILON_SEED_KEY_FILE.*missing.*reservation awaiting its seed"):
        check_seed_key(os.environ["KEPSILON_AUDIT_DB"], key)
    assert not key_file.exists()
    # Another key in its place is refused too: it did not seal this seed.
    key_file.write_bytes(Fernet.generate_key())
    with pytest.raises(SpecError, match="not the key this release's seed was sealed with"):
        check_seed_key(os.environ["KEPSILON_AUDIT_DB"], key)


def test_the_check_collects_every_verdict_where_the_release_stops_at_the_first(store, synthetic_spec_dict):
    spec_dict = {**synthetic_spec_dict, "epsilon": 4.9, "suppression_budget": 0.01, "approval_required": True}
    result = check_release(parse_spec(spec_dict), via="cli")
    refused = [v["name"] for v in result["verdicts"] if not v["success"]]
    assert "suppression" in refused and "approval" in refused
    assert verdict(result, "ε cap")["success"] is True  # 4.9 of the cap of 5


@pytest.mark.usefixtures("prefect_harness")
def test_a_scheduled_run_over_an_unchanged_source_publishes_nothing_and_spends_nothing(store, synthetic_spec_dict):
    """Issue 21: a nightly run over the same source drew fresh noise and spent ε again, letting records be
    averaged across nights. Now the second night says where the current release is; opting out re-releases."""
    from kepsilon.flows.release import governed_release

    first = governed_release(parse_spec({**synthetic_spec_dict, "release_id": "night-1"}))
    spent = remaining(store, "test-population")
    records = store.conn.execute("SELECT COUNT(*) FROM releases").fetchone()[0]
    second = governed_release(parse_spec({**synthetic_spec_dict, "release_id": "night-2"}))
    assert second["unchanged_source"] is True and second["release_id"] == "night-1"
    assert second["published_at"] == first["output_dir"]
    assert remaining(store, "test-population") == spent
    assert store.conn.execute("SELECT COUNT(*) FROM releases").fetchone()[0] == records
    assert not os.path.exists(os.path.join(synthetic_spec_dict["output_dir"], "night-2"))
    # A changed spec is a new release; so is an explicit opt-out.
    third = governed_release(parse_spec({**synthetic_spec_dict, "release_id": "night-3", "rerelease_unchanged": True}))
    assert "unchanged_source" not in third and os.path.isdir(third["output_dir"])
    assert "content_key" not in json.load(open(os.path.join(third["output_dir"], "manifest.json")))


def test_a_predicted_error_above_half_earns_a_warning_line_without_a_limit(store, synthetic_spec_dict):
    """Issue 22: income published at 282 % error passed every check with no word. Heights declared 0–1000 at
    ε = 0.05: the prediction is far above 50 %; no limit is set, so it warns and does not refuse."""
    spec_dict = json.loads(json.dumps({**synthetic_spec_dict, "epsilon": 0.05}))
    spec_dict["roles"]["e_quasi"][0].update(lower=0.0, upper=1000.0)
    result = check_release(parse_spec(spec_dict), via="cli")
    figure = verdict(result, "relative error of HEIGHT")["figure"]
    assert figure > 0.5 and verdict(result, "relative error of HEIGHT")["success"] is True
    (warning,) = result["predicted"]["warnings"]
    assert warning.startswith(f"warning: predicted relative error of HEIGHT is {100 * figure:.2f} %")


def test_the_check_shows_the_risk_models_of_the_anonymisers_groups_counted_independently(store, synthetic_spec_dict):
    """Issue 27.1: prosecutor, journalist and marketer risk in `kepsilon check`, before any noise. Recounted
    here from the anonymiser's own classes: records sharing their published labels form a group; the
    prosecutor risk of a record is 1/|group|, journalist = prosecutor when the sample is the population
    (no population declared), marketer = groups / records."""
    import numpy as np

    from kepsilon.engine.anonymise import k_anonymise
    from kepsilon.engine.partition import published_labels
    from kepsilon.tasks.certificate import risk_line
    from kepsilon.tasks.classify import classify
    from kepsilon.tasks.ingest import read_source

    spec = parse_spec(synthetic_spec_dict)
    result = check_release(spec, via="cli")
    table = classify(read_source(spec.source).frame, spec)
    partition = k_anonymise(table.frame, spec)
    kept = table.frame[partition.kept]
    labels = published_labels(kept[table.roles["k_quasi"]], partition.class_ids[partition.kept],
                              np.ones(len(kept), dtype=bool), partition.hierarchies, partition.levels)
    sizes = labels.groupby(list(labels.columns), dropna=False).size().to_numpy()
    figures = result["risk"]
    assert figures["prosecutor"]["highest"] == pytest.approx(1 / sizes.min())
    assert figures["prosecutor"]["average"] == pytest.approx(len(sizes) / sizes.sum())
    assert figures["journalist"]["highest"] == pytest.approx(figures["prosecutor"]["highest"])
    assert figures["marketer"] == pytest.approx(len(sizes) / sizes.sum())
    line = risk_line(figures)
    assert line.startswith("risk of the anonymiser's groups before the noise: prosecutor highest ")
    assert f"{1 / sizes.min():.3g}" in line and "marketer" in line
    assert reservations(store) == 0
