"""The parameter advisor against the release's own figures, independent runs, and the audit store.

Every comparison is with something computed another way: a release's measured error, separate releases
drawn one at a time, the ledger and the published folder as they were before.
"""

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kepsilon.audit.fingerprint import file_fingerprint
from kepsilon.audit.integrity import check_store
from kepsilon.audit.ledger import set_cap
from kepsilon.audit.store import open_store
from kepsilon.cli import app
from kepsilon.engine.anonymise import k_anonymise
from kepsilon.engine.metrics import linking_risk, release_metrics
from kepsilon.engine.perturb import perturb
from kepsilon.engine.suppress import suppress_records
from kepsilon.flows.spec import load_spec, parse_spec
from kepsilon.tasks.advise import advise, smallest_epsilon_for_error
from kepsilon.tasks.classify import classify
from kepsilon.tasks.ingest import read_source

from .conftest import ROOT, release_spec_dict

SPEC_FILE = ROOT / "releases" / "paper-synthetic.yaml"


@pytest.fixture(scope="module")
def source():
    return read_source(load_spec(SPEC_FILE).source)


def test_predicted_error_for_k10_eps1_is_the_releases_own_and_within_2_percent_of_its_measured_error(source):
    spec = load_spec(SPEC_FILE)
    advice = advise(source.frame, spec, source.sha256, [10], [1.0], draws=2, seed=3)
    cell = advice.cell(10, 1.0)

    # A real release through the release's stage functions, with fresh noise.
    table = classify(source.frame, spec)
    partition = k_anonymise(table.frame, spec)
    kept, ids = table.frame[partition.kept], partition.class_ids[partition.kept]
    noisy = perturb(kept, ids, spec.roles.e_quasi, spec.epsilon_split(), spec.scale_basis, np.random.default_rng())
    suppression = suppress_records(kept, noisy.frame, ids, noisy.scales, spec)
    figures = release_metrics(kept, noisy.frame, ids, partition, suppression, spec, noisy.scales)

    assert cell.predicted_mean == pytest.approx(figures["information_loss"]["predicted"], rel=1e-12)
    measured = figures["information_loss"]["measured"]
    assert abs(cell.predicted_mean - measured) / measured < 0.02
    assert cell.classes == partition.report["n_classes"] and cell.anonymiser_suppressed == 0


def test_stacked_monte_carlo_equals_separate_releases_drawn_one_after_another(source):
    """Draw d of the vectorised Monte-Carlo is exactly the d-th of separate releases using the same stream."""
    spec = parse_spec(release_spec_dict("paper-synthetic", k=20, epsilon=4.0))
    draws, seed = 3, 11
    advice = advise(source.frame, spec, source.sha256, [20], [4.0], draws=draws, seed=seed)
    cell = advice.cell(20, 4.0)

    table = classify(source.frame, spec)
    partition = k_anonymise(table.frame, spec)
    kept, ids = table.frame.loc[partition.kept, ["HEIGHT"]], partition.class_ids[partition.kept]
    state = np.random.SeedSequence(seed).spawn(1)[0].generate_state(4, np.uint64)
    rng = np.random.Generator(np.random.PCG64(state))
    risks, removed = [], []
    for _ in range(draws):
        noisy = perturb(kept, ids, spec.roles.e_quasi, spec.epsilon_split(), spec.scale_basis, rng)
        suppression = suppress_records(kept, noisy.frame, ids, noisy.scales, spec)
        published = ~suppression.removed
        original, changed = kept["HEIGHT"].to_numpy(), noisy.frame["HEIGHT"].to_numpy()
        risks.append(linking_risk(original[published], changed[published], ids[published]))
        removed.append(int(suppression.removed.sum()) / len(source.frame))
    assert cell.linking_risk.mean == pytest.approx(np.mean(risks), abs=1e-12)
    assert cell.linking_risk.sd == pytest.approx(np.std(risks, ddof=1), abs=1e-12)
    assert cell.confidence_suppression.mean == pytest.approx(np.mean(removed), abs=1e-12)
    assert cell.linking_risk.draws == draws and cell.linking_risk.sd > 0


def test_smallest_epsilon_for_an_error_target_is_the_grid_answer(source):
    spec = load_spec(SPEC_FILE)
    grid = [0.5, 1.0, 2.0, 4.0, 8.0]
    advice = advise(source.frame, spec, source.sha256, [5], grid, draws=2, seed=1)
    answer = smallest_epsilon_for_error(advice, 0.05)[5]
    below = [e for e in grid if e < answer["grid"]]
    assert advice.cell(5, answer["grid"]).predicted_mean <= 0.05 < advice.cell(5, below[-1]).predicted_mean
    # The outputs are clamped to the bounds in both bases: the error is not ∝ 1/ε, no closed form is claimed.
    assert answer["exact"] is None
    errors = [advice.cell(5, e).predicted_mean for e in grid]
    assert errors == sorted(errors, reverse=True)


def test_ola_k_the_anonymiser_refuses_gets_refused_cells_not_a_crash(source):
    spec = parse_spec(release_spec_dict("paper-synthetic", algorithm="ola", ola_metric="dm_star", suppression_budget=0.0))
    advice = advise(source.frame, spec, source.sha256, [5, 40000], [1.0], draws=2, seed=1)
    assert advice.cell(40000, 1.0).refused and "k" in advice.cell(40000, 1.0).refused
    assert advice.cell(5, 1.0).refused is None and advice.nodes[5]


def test_cli_advise_prints_the_grid_spends_nothing_publishes_nothing_and_is_recorded(tmp_path, monkeypatch):
    store_path = tmp_path / "audit.db"
    monkeypatch.setenv("KEPSILON_AUDIT_DB", str(store_path))
    monkeypatch.setenv("KEPSILON_REPORTS_DIR", str(tmp_path / "reports"))
    db = open_store(store_path)
    set_cap(db, "paper-synthetic-people", 10.0, by="officer", reason="test")
    ledger_before = list(db["ledger"].rows)
    db.close()
    spec_file = tmp_path / "spec.yaml"
    spec = release_spec_dict("paper-synthetic", output_dir=str(tmp_path / "out"))
    spec_file.write_text(json.dumps(spec))  # JSON is YAML

    result = CliRunner().invoke(
        app,
        ["advise", str(spec_file), "--k", "10,50", "--epsilon", "1,8", "--draws", "3", "--target-error", "0.05",
         "--max-linking-risk", "0.1", "--operator", "steward-1"],
        env={"COLUMNS": "250"},
    )
    assert result.exit_code == 0, result.output
    # k = 10, ε = 1: the demo release's predicted error, of the values as published (clamped to 130–210;
    # 20.74 % before the clamp).
    assert "13.48%" in result.output
    assert "3 noise draws per cell" in result.output
    # ε = 1 misses the error target; at ε = 8 both k expect more confidence suppression than the 5 % budget.
    assert "over budget" in result.output
    assert "no cell of the grid within the suppression budget meets every target" in result.output

    db = open_store(store_path)
    assert list(db["ledger"].rows) == ledger_before
    (event,) = db["advice_events"].rows
    assert event["actor"] == "steward-1" and event["via"] == "cli" and event["draws"] == 3
    assert event["source_sha256"] == file_fingerprint(ROOT / "data/paper-synthetic/people.csv")  # keyed, not plain
    assert event["spec_hash"] == load_spec(spec_file, operator="steward-1").spec_hash()
    assert json.loads(event["k_values"]) == [10, 50] and json.loads(event["epsilon_values"]) == [1.0, 8.0]
    check_store(db)
    assert not (tmp_path / "out").exists()
    figures = Path(event["report_dir"])
    assert figures.parent == tmp_path / "reports"
    assert sorted(p.name for p in figures.iterdir()) == [
        "advice.md", "error_vs_epsilon.png", "linking_risk_vs_epsilon.png", "suppression_vs_epsilon.png"
    ]


def test_cli_advise_refuses_a_bad_grid_in_one_line_and_records_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("KEPSILON_AUDIT_DB", str(tmp_path / "audit.db"))
    result = CliRunner().invoke(app, ["advise", str(SPEC_FILE), "--k", "1,5"])
    assert result.exit_code == 2 and "advice refused" in result.output and "'k'" in result.output
    assert list(open_store(tmp_path / "audit.db")["advice_events"].rows) == []
