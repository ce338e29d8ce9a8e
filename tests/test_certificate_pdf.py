"""``kepsilon audit certificate RELEASE --pdf`` run as a user runs it: a private PDF printed by headless
Chromium, or one line when there is no Chromium (no Prefect needed: the release is recorded directly)."""

import os
import stat
import subprocess
from pathlib import Path

import pytest

from .conftest import ROOT, capped_store

KEPSILON = str(ROOT / ".venv" / "bin" / "kepsilon") if (ROOT / ".venv" / "bin" / "kepsilon").exists() else "kepsilon"


@pytest.fixture
def store(tmp_path, monkeypatch):
    return capped_store(tmp_path, monkeypatch, "test-population")


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([KEPSILON, "audit", "certificate", *args], capture_output=True, text=True, env=os.environ.copy(), timeout=300)



def _minimal_release(store) -> None:
    from kepsilon.audit.records import record_release

    record_release(store, {"release_id": "small-release", "population_id": "test-population", "rows_in": 10,
                           "rows_published": 10, "checks": [{"name": "k_anonymous_groups", "success": True}]},
                   outcome="published", reservation_id=None)


def test_a_pdf_without_chromium_is_refused_in_one_line_and_the_html_is_still_written(store, tmp_path):
    _minimal_release(store)
    environment = {**os.environ, "PATH": str(Path(KEPSILON).parent) if os.path.isabs(KEPSILON) else "/nonexistent"}
    result = subprocess.run([KEPSILON, "audit", "certificate", "small-release", "--pdf"], capture_output=True, text=True,
                            env=environment, timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["error: a PDF needs Chromium (chromium on the PATH); the HTML certificate "
                                                  "is written and prints to PDF from any browser"]
    folder = tmp_path / "reports" / "small-release"
    assert sorted(p.name for p in folder.iterdir()) == ["certificate.html"]


@pytest.mark.heavy  # headless Chromium
def test_the_certificate_prints_to_a_private_pdf_with_chromium(store, tmp_path):
    _minimal_release(store)
    result = _cli("small-release", "--pdf")
    assert result.returncode == 0, result.stderr
    folder = tmp_path / "reports" / "small-release"
    assert sorted(p.name for p in folder.iterdir()) == ["certificate.html", "certificate.pdf"]  # no profile left behind
    pdf = folder / "certificate.pdf"
    assert pdf.read_bytes().startswith(b"%PDF-") and pdf.stat().st_size > 5_000
    assert stat.S_IMODE(pdf.stat().st_mode) == 0o600
    assert "printed to PDF" in result.stdout
