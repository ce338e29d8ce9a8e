"""The officer's certificate end to end: figures at release time, the pre-ε risk gates, the private
HTML document, and ``kepsilon audit certificate --verify`` run as a user runs it."""

import json
import os
import stat
import subprocess

import pandas as pd
import pytest

from kepsilon.audit.certificate import certificate_facts, render_certificate
from kepsilon.audit.ledger import remaining
from kepsilon.engine import risk
from kepsilon.flows.release import governed_release
from kepsilon.flows.spec import parse_spec
from kepsilon.tasks.errors import SpecError

from .conftest import ROOT, capped_store

pytestmark = [pytest.mark.flow, pytest.mark.usefixtures("prefect_harness")]

KEPSILON = str(ROOT / ".venv" / "bin" / "kepsilon") if (ROOT / ".venv" / "bin" / "kepsilon").exists() else "kepsilon"
K_QUASIS = ["YOB", "GENDER", "RACE", "MARITAL_STATUS"]


@pytest.fixture
def store(tmp_path, monkeypatch):
    return capped_store(tmp_path, monkeypatch, "test-population")


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([KEPSILON, "audit", "certificate", *args], capture_output=True, text=True, env=os.environ.copy(), timeout=300)


def test_release_writes_a_private_certificate_that_verifies_and_fails_after_one_changed_byte(store, synthetic_spec_dict, tmp_path):
    # Confidence 0.9 so that suppression removes records (at 0.99 clamped values leave none here): the released-as-read column then moves (checked below).
    spec = {**synthetic_spec_dict, "certificate": {"utility_target": "GENDER"}, "population": {"sampling_fraction": 0.1},
            "confidence": 0.9}
    record = governed_release(parse_spec(spec))
    data = pd.read_csv(tmp_path / "out" / "test-release" / "data.csv")
    groups = data.groupby(K_QUASIS).size().to_numpy()

    figures = record["certificate"]
    assert figures["computed"]
    published = figures["risk"]["published"]
    # Independent counts on the published file.
    assert published["prosecutor"]["highest"] == pytest.approx(1 / groups.min())
    assert published["prosecutor"]["average"] == pytest.approx(len(groups) / len(data))
    # π = 10 %: each record stands for 10 people; journalist risk is E[1/F | f] per group, below 1/f.
    expected = risk.individual_risk(groups, groups * 10.0)
    assert published["journalist"]["highest"] == pytest.approx(expected.max())
    assert published["marketer"] == pytest.approx((groups * expected).sum() / len(data))
    assert published["journalist"]["highest"] < published["prosecutor"]["highest"]
    assert figures["risk"]["special_uniques"]["columns"] == K_QUASIS
    assert figures["utility"]["classifier"]["computed"] and figures["utility"]["classifier"]["target"] == "GENDER"
    # A column released as read moves only by the records removed: independent total variation.
    source = pd.read_csv(ROOT / "data" / "paper-synthetic" / "people.csv", sep=";", dtype=str)
    p, q = (frame["RELIGION"].value_counts(normalize=True, dropna=False) for frame in (source, data))  # missing counts too
    independent = 0.5 * (p.reindex(p.index.union(q.index), fill_value=0) - q.reindex(p.index.union(q.index), fill_value=0)).abs().sum()
    assert figures["utility"]["columns"]["RELIGION"]["total_variation"] == pytest.approx(independent)
    assert independent > 0
    # Nothing of it is published.
    public = (tmp_path / "out" / "test-release" / "manifest.json").read_text()
    assert "certificate" not in json.loads(public) and "journalist" not in public

    path = tmp_path / "reports" / "test-release" / "certificate.html"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    text = path.read_text(encoding="utf-8")
    assert "Re-identification risk" in text and "data:image/png;base64," in text and "Classifier utility" in text
    entry = store.execute("SELECT seq, entry_hash FROM chain WHERE table_name = 'releases'").fetchone()
    assert entry[1] in text

    verified = _cli("test-release", "--verify", str(path))
    assert verified.returncode == 0, verified.stderr
    assert f"chain entry {entry[0]}" in verified.stdout

    content = bytearray(path.read_bytes())
    position = content.index(b"records were")
    content[position] = ord("R")
    tampered = tmp_path / "tampered.html"
    tampered.write_bytes(bytes(content))
    refused = _cli("test-release", "--verify", str(tampered))
    assert refused.returncode == 2
    assert refused.stderr.strip().startswith("error: certificate does not verify") and len(refused.stderr.strip().splitlines()) == 1
    assert "Traceback" not in refused.stderr

    # Written again by the CLI: the same bytes (the rendering is deterministic).
    rewritten = _cli("test-release")
    assert rewritten.returncode == 0, rewritten.stderr
    assert path.read_bytes() == text.encode("utf-8")


def test_a_marketer_risk_gate_over_its_limit_refuses_before_any_reservation(store, synthetic_spec_dict):
    with pytest.raises(SpecError, match="max_marketer_risk"):
        governed_release(parse_spec({**synthetic_spec_dict, "max_marketer_risk": 0.001}))
    assert remaining(store, "test-population") == pytest.approx(5.0)
    assert store.execute("SELECT COUNT(*) FROM ledger WHERE kind = 'reserve'").fetchone()[0] == 0


def test_a_journalist_gate_the_groups_meet_lets_the_release_through(store, synthetic_spec_dict):
    record = governed_release(parse_spec({**synthetic_spec_dict, "max_journalist_risk": 0.1}))  # k = 10
    assert record["certificate"]["risk"]["predicted"]["journalist"]["highest"] <= 0.1


def test_a_record_without_figures_says_not_computed(store, tmp_path):
    """A record without certificate figures (one recorded before they existed): the document says so instead of failing."""
    from kepsilon.audit.records import record_release

    record_release(store, {"release_id": "dask-release", "population_id": "test-population", "rows_in": 10,
                           "rows_published": 10, "checks": [{"name": "k_anonymous_groups", "success": True}]},
                   outcome="published", reservation_id=None)
    document = render_certificate(certificate_facts(store, "dask-release"))
    assert "Re-identification risk</h2><p>Not computed: the record holds no certificate figures: it was recorded before" in document
    assert "Utility</h2><p>Not computed" in document


def test_risk_models_with_a_population_table(tmp_path):
    from kepsilon.engine.hierarchy import load_hierarchy
    from kepsilon.flows.spec import Population
    from kepsilon.tasks.certificate import risk_models

    path = tmp_path / "h.csv"
    path.write_text("a;AB;*\nb;AB;*\nc;C;*\n")
    hierarchy = load_hierarchy(path, "x")
    labels = pd.DataFrame({"x": ["AB"] * 4 + ["c"] * 2})
    population = pd.DataFrame({"x": ["a", "b", "c"], "count": ["30", "10", "4"]})

    class Spec:
        certificate = None

    Spec.population = Population(table=str(tmp_path / "population.csv"))
    figures = risk_models(labels, Spec, {"x": hierarchy}, population_table=population)
    assert figures["journalist"]["highest"] == pytest.approx(1 / 4)
    assert figures["marketer"] == pytest.approx((4 / 40 + 2 / 4) / 6)
    assert figures["population_size"] == 44




def test_the_group_size_figure_is_one_artist_and_shows_bars_narrower_than_a_pixel():
    """The published group sizes are drawn as one collection, whatever their number (one artist per size took
    0.6 s for 316 sizes of a 1M-row release, growing with them), and a bar narrower than a pixel still shows:
    with sizes up to 460 on the axis, the bars of sizes 10 to 21 (the tallest, the riskiest groups) vanished."""
    import base64
    import io
    import re

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    from kepsilon.audit.certificate import _bars, _risk

    sizes = {10: 2413, 11: 2226, 12: 1784, 13: 1582, 14: 1369, 15: 1183, 16: 953, 17: 909, 18: 792, 19: 735,
             20: 641, 21: 582, 460: 1}  # a 1M-row fine release's smallest sizes and its largest
    figure, ax = plt.subplots()
    _bars(ax, {size: float(count) for size, count in sizes.items()}, color="#3465a4", width=0.8)
    assert len(ax.collections) == 1 and not ax.patches
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] >= 2413 and ax.get_xlim()[0] <= 9.6 and ax.get_xlim()[1] >= 460.4
    plt.close(figure)

    published = {"groups": 13, "prosecutor": {"highest": 0.1, "average": 0.05, "records_at_risk": 0.0},
                 "journalist": {"highest": 0.1}, "marketer": 0.01,
                 "group_sizes": {str(size): count for size, count in sizes.items()}}
    section = _risk({"k": 10, "certificate": {"computed": True, "risk": {"published": published}}})
    png = base64.b64decode(re.findall(r'src="data:image/png;base64,([^"]+)"', section)[-1])
    image = Image.open(io.BytesIO(png)).convert("RGB")
    bar_rows = [y for y in range(image.height) for x in range(image.width)
                if (lambda red, green, blue: blue > red + 60 and blue > 120)(*image.getpixel((x, y)))]
    assert bar_rows and min(bar_rows) < image.height / 4  # the tallest bar reaches the top of the axes
