"""The officer's certificate: one private, self-contained HTML document per release, checkable against the store.

Everything in it comes from the audit store (governance: what we tell the officer comes from the store,
not from the orchestrator): the release's record (its private manifest, with the risk and utility
figures computed at release time), its chain entry, its approvals and the ε ledger. The document is a
deterministic rendering of those *facts*: the same store renders the same bytes, figures included
(PNG written without a timestamp). So ``--verify`` re-renders the certificate from the store and compares
bytes: one changed byte of the file, or one changed fact in the store, and it does not verify. The
facts' SHA-256 (canonical JSON) is printed in the document beside the release's chain entry, and the
facts themselves are embedded as JSON, so the officer can see *what* differs.

The rendering depends on this module and matplotlib's version: a certificate written by another
version may not re-render byte for byte. Its embedded facts still compare (the verify message says
which of the two failed). See docs/certificate.md.
"""

from __future__ import annotations

import base64
import hashlib
import html
import io
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlite_utils

from kepsilon.tasks.errors import KepsilonError

from .store import canonical_json, open_store

FORMAT = "kepsilon-certificate/1"
FILE_NAME = "certificate.html"
_DIGEST = re.compile(r'<meta name="kepsilon-certificate-digest" content="([0-9a-f]{64})">')
_FACTS = re.compile(r'<script type="application/json" id="kepsilon-certificate-facts">(.*?)</script>', re.S)


class CertificateError(KepsilonError):
    """No certificate can be made or checked for this release (one line, names the release)."""


# --- facts from the store ---------------------------------------------------------------------------


def certificate_facts(db: sqlite_utils.Database, release_id: str) -> dict:
    """What the certificate states, read from the store only: record, chain entry, approvals, budget."""
    conn = db.conn
    row = conn.execute(
        "SELECT id, outcome, manifest, recorded_at, reservation_id FROM releases WHERE release_id = ? "
        "ORDER BY (outcome = 'published') DESC, id DESC LIMIT 1",
        (release_id,),
    ).fetchone()
    if row is None:
        raise CertificateError(f"no release {release_id!r} in the audit store")
    record_id, outcome, manifest_text, recorded_at, reservation_id = row
    entry = conn.execute("SELECT seq, entry_hash FROM chain WHERE table_name = 'releases' AND row_id = ?", (record_id,)).fetchone()
    if entry is None:
        raise CertificateError(f"release {release_id!r}: its record has no chain entry (the store does not verify)")
    record = json.loads(manifest_text)
    approvals = [
        {"approver": a, "reason": r, "approved_at": t}
        for a, r, t in conn.execute(
            "SELECT approver, reason, created_at FROM approvals WHERE release_id = ? AND spec_hash = ? ORDER BY id",
            (release_id, record.get("spec_hash")),
        )
    ]
    outputs = [{"path": p, "sha256": h} for p, h in conn.execute("SELECT path, sha256 FROM outputs WHERE release = ? ORDER BY id", (record_id,))]
    return {
        "format": FORMAT,
        "release_id": release_id,
        "record_id": record_id,
        "outcome": outcome,
        "recorded_at": recorded_at,
        "chain": {"entry": entry[0], "entry_hash": entry[1]},
        "manifest_sha256": hashlib.sha256(manifest_text.encode("utf-8")).hexdigest(),
        "record": record,
        "approvals": approvals,
        "outputs": outputs,
        "budget": _budget_at(conn, record.get("population_id"), reservation_id),
    }


def _budget_at(conn, population_id: str | None, reservation_id: int | None) -> dict | None:
    """ε (and δ) in use by the population just before this release's reservation and with it, and the cap then.

    Counted from ledger rows older than the reservation only, so later entries do not change it (and
    do not unsettle a certificate already written): reservations not voided by then, plus re-draws.
    """
    if population_id is None or reservation_id is None:
        return None
    before = conn.execute(
        """SELECT COALESCE(SUM(r.nano_epsilon), 0), COALESCE(SUM(r.atto_delta), 0) FROM ledger r
           WHERE r.population_id = ? AND r.kind = 'reserve' AND r.id < ?
             AND NOT EXISTS (SELECT 1 FROM ledger v WHERE v.reservation_id = r.id AND v.kind = 'void' AND v.id < ?)""",
        (population_id, reservation_id, reservation_id),
    ).fetchone()
    own = conn.execute("SELECT nano_epsilon, atto_delta FROM ledger WHERE id = ?", (reservation_id,)).fetchone()
    cap = conn.execute(
        "SELECT nano_epsilon, atto_delta FROM ledger WHERE population_id = ? AND kind = 'cap' AND id < ? ORDER BY id DESC LIMIT 1",
        (population_id, reservation_id),
    ).fetchone()
    nano, atto = 1e-9, 1e-18
    return {
        "population_id": population_id,
        "reservation_id": reservation_id,
        "epsilon_before": before[0] * nano,
        "epsilon_after": (before[0] + (own[0] if own else 0)) * nano,
        "delta_before": before[1] * atto if before[1] else None,
        "delta_after": ((before[1] or 0) + own[1]) * atto if own and own[1] else None,
        "epsilon_cap": cap[0] * nano if cap else None,
        "delta_cap": cap[1] * atto if cap and cap[1] else None,
    }


def facts_digest(facts: dict) -> str:
    """SHA-256 of the facts' canonical JSON: what the certificate states, chain position included."""
    return hashlib.sha256(canonical_json(facts).encode("utf-8")).hexdigest()


# --- writing and verifying -----------------------------------------------------------------------------


def render_for(store: str | Path, release_id: str) -> tuple[str, dict]:
    db = open_store(store)
    try:
        facts = certificate_facts(db, release_id)
    finally:
        db.close()
    return render_certificate(facts), facts


def write_certificate(store: str | Path, release_id: str, folder: Path | None = None) -> Path:
    """Write ``certificate.html`` into the private ``folder`` (0700), as a 0600 file, atomically.

    Default folder: the release's private report folder (``KEPSILON_REPORTS_DIR``/release id), refused
    when it would lie inside the folder the release was published to.
    """
    document, facts = render_for(store, release_id)
    if folder is None:
        from kepsilon.tasks.figures import private_report_dir

        published = facts["record"].get("output_dir")
        folder = private_report_dir(release_id, Path(published).parent if published else None)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)
    path = folder / FILE_NAME
    temporary = folder / f".{FILE_NAME}.{os.getpid()}.tmp"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(document.encode("utf-8"))
        os.replace(temporary, path)
    finally:
        if temporary.exists():
            temporary.unlink()
    return path


PDF_NAME = "certificate.pdf"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
# Headless, offline, nothing kept: the document is self-contained (figures as data URIs), so the browser
# needs no network at all, and a fresh profile in a private temporary folder is removed afterwards.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--no-pdf-header-footer", "--disable-extensions")


def print_pdf(html_path: Path, timeout: float = 180.0) -> Path:
    """Print the certificate ``html_path`` to ``certificate.pdf`` beside it with headless Chromium.

    The PDF is a print of the HTML, for filing: it is not checked by ``--verify`` (Chromium stamps it
    with the time of printing, so its bytes differ from one print to the next); the HTML is the
    document that verifies. Written 0600 under a temporary name in the same private folder, then
    renamed. Raises ``CertificateError`` (one line) when no Chromium is installed or it fails.
    """
    import shutil
    import subprocess
    import tempfile

    browser = next((found for name in CHROMIUM_NAMES if (found := shutil.which(name))), None)
    if browser is None:
        raise CertificateError("a PDF needs Chromium (chromium on the PATH); the HTML certificate is written and "
                               "prints to PDF from any browser")
    html_path = Path(html_path).resolve()
    folder = html_path.parent
    path = folder / PDF_NAME
    with tempfile.TemporaryDirectory(prefix=".kepsilon-pdf-", dir=folder) as scratch:  # 0700, inside the private folder
        temporary = Path(scratch) / PDF_NAME
        command = [browser, *CHROMIUM_FLAGS, f"--user-data-dir={Path(scratch) / 'profile'}",
                   f"--print-to-pdf={temporary}", html_path.as_uri()]
        try:
            subprocess.run(command, capture_output=True, timeout=timeout, check=False, env={**os.environ, "HOME": scratch})
        except subprocess.TimeoutExpired:
            raise CertificateError(f"Chromium did not print the certificate within {timeout:.0f} s") from None
        if not temporary.exists() or not temporary.read_bytes().startswith(b"%PDF-"):
            raise CertificateError("Chromium did not print the certificate to PDF (run it by hand to see why)")
        os.chmod(temporary, 0o600)
        os.replace(temporary, path)
    return path


@dataclass(frozen=True)
class Verification:
    ok: bool
    message: str


def verify_certificate(store: str | Path, release_id: str, file: Path) -> Verification:
    """Whether ``file`` is exactly the certificate the store renders for ``release_id`` now."""
    try:
        content = Path(file).read_bytes()
    except OSError as error:
        raise CertificateError(f"cannot read the certificate {str(file)!r} ({error.strerror})") from None
    expected, facts = render_for(store, release_id)
    if content == expected.encode("utf-8"):
        return Verification(True, f"certificate matches the store: release {release_id!r}, chain entry "
                                  f"{facts['chain']['entry']}, entry hash {facts['chain']['entry_hash']}, "
                                  f"facts digest {facts_digest(facts)}")
    text = content.decode("utf-8", errors="replace")
    digest = _DIGEST.search(text)
    embedded = _FACTS.search(text)
    if digest is None or embedded is None:
        return Verification(False, "not a kepsilon certificate, or its digest or facts were removed")
    try:
        stated = json.loads(html.unescape(embedded.group(1)))
    except json.JSONDecodeError:
        return Verification(False, "the certificate's embedded facts were altered (not valid JSON)")
    if facts_digest(stated) != facts_digest(facts):
        differ = sorted(k for k in set(stated) | set(facts) if stated.get(k) != facts.get(k))
        return Verification(False, f"the certificate does not match the store: its facts differ in {', '.join(differ)}")
    if digest.group(1) != facts_digest(facts):
        return Verification(False, "the certificate's digest was altered")
    return Verification(False, "the certificate's facts match the store, but the document was altered (or rendered "
                               "by another kepsilon/matplotlib version): its bytes differ from the store's rendering")


# --- rendering -------------------------------------------------------------------------------------------


def _e(value) -> str:
    return html.escape("—" if value is None else str(value))


def _num(value, digits: int = 4) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    try:
        return f"{float(value):.{digits}g}"
    except (TypeError, ValueError):
        return _e(value)


def _pct(value) -> str:
    return "—" if value is None else f"{100 * float(value):.3g} %"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _figure(draw, caption: str) -> str:
    """A figure drawn by ``draw(ax)``, embedded as a PNG data URI (no timestamp: the bytes are reproducible)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"svg.hashsalt": "kepsilon", "font.size": 9}):
        figure, ax = plt.subplots(figsize=(6.4, 2.6))
        draw(ax)
        figure.tight_layout()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=90, metadata={"Software": None})
        plt.close(figure)
    encoded = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f'<figure><img alt="{_e(caption)}" src="data:image/png;base64,{encoded}"><figcaption>{_e(caption)}</figcaption></figure>'


def _bars(ax, heights: dict[int, float], color: str, width: float) -> None:
    """A bar of ``width`` from 0 to ``y`` at each ``x`` of ``heights``, drawn as one collection of rectangles:
    ``ax.bar`` makes an artist per bar, and a release's certificate spent 0.6 s drawing 316 group sizes (a 1M-row
    release), growing with them, in the flow's process after the release was already in place."""
    from matplotlib.collections import PolyCollection

    half = width / 2
    rectangles = [[(x - half, 0), (x - half, y), (x + half, y), (x + half, 0)] for x, y in heights.items()]
    # Outlined in their colour: a bar narrower than a pixel (hundreds of sizes side by side) may cover no pixel's
    # centre and vanish, as the smallest groups' bars did, the tallest among them.
    ax.add_collection(PolyCollection(rectangles, facecolors=color, edgecolors=color, linewidths=0.5))
    ax.autoscale_view()
    ax.set_ylim(bottom=0)


def render_certificate(facts: dict) -> str:
    """The certificate as one HTML document (figures inside, printable), a function of ``facts`` only."""
    record = facts["record"]
    sections = [
        _summary(facts, record),
        _parameters(record),
        _people(facts, record),
        _budget(facts.get("budget"), record),
        _gates(record),
        _risk(record),
        _utility(record),
        _chain(facts),
    ]
    facts_json = html.escape(canonical_json(facts), quote=False)
    digest = facts_digest(facts)
    title = f"Officer's certificate — release {facts['release_id']}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="kepsilon-certificate-format" content="{FORMAT}">
<meta name="kepsilon-certificate-digest" content="{digest}">
<title>{_e(title)}</title>
<style>
body {{ font-family: "DejaVu Sans", Helvetica, Arial, sans-serif; max-width: 52em; margin: 2em auto; color: #111; line-height: 1.4; }}
h1 {{ font-size: 1.5em; border-bottom: 2px solid #333; }} h2 {{ font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #bbb; }}
table {{ border-collapse: collapse; margin: .5em 0; font-size: .9em; }} td, th {{ border: 1px solid #ccc; padding: .2em .5em; text-align: left; vertical-align: top; }}
th {{ background: #f0f0f0; }} .pass {{ color: #0a6b0a; font-weight: bold; }} .fail {{ color: #a00; font-weight: bold; }}
.private {{ background: #fff4d6; border: 1px solid #e0b84c; padding: .5em .8em; }} code {{ font-size: .85em; word-break: break-all; }}
figure {{ margin: .6em 0; }} figure img {{ max-width: 100%; }} figcaption {{ font-size: .85em; color: #444; }}
@media print {{ body {{ margin: 0; max-width: none; }} h2 {{ page-break-after: avoid; }} figure, table {{ page-break-inside: avoid; }} }}
</style></head><body>
<h1>{_e(title)}</h1>
<p class="private"><b>Private.</b> For the privacy officer only: this document holds figures computed from the
private data (risks, distances, accuracies). It is never published with the release.</p>
{"".join(sections)}
<script type="application/json" id="kepsilon-certificate-facts">{facts_json}</script>
</body></html>
"""


def _summary(facts: dict, record: dict) -> str:
    guarantee = (record.get("public_manifest") or {}).get("guarantee")
    outcome = facts["outcome"]
    published = record.get("rows_published")
    rows_in = record.get("rows_in")
    return f"""<h2>What was released</h2>
<p>Release <b>{_e(facts['release_id'])}</b> of population <b>{_e(record.get('population_id'))}</b>:
outcome <b>{_e(outcome)}</b>, recorded {_e(facts['recorded_at'])}. {_num(published)} of {_num(rows_in)} records were
published, under the privacy model <b>{_e(record.get('privacy_model') or 'kepsilon')}</b>.</p>
<p><b>Guarantee, as published with the release:</b> {_e(guarantee)}</p>
<p>Columns by role (explicit identifiers are removed, never released): {"; ".join(f"{_e(role)}: {_e(', '.join(cols) or '—')}" for role, cols in (record.get('roles') or {}).items())}.</p>"""


def _parameters(record: dict) -> str:
    names = ["k", "epsilon", "epsilon_split", "algorithm", "scale_basis", "confidence", "suppression_budget",
             "max_linking_risk", "max_prosecutor_risk", "sensitive_criteria", "dp"]
    rows = [[_e(name), f"<code>{_e(canonical_json(record.get(name)) if isinstance(record.get(name), (dict, list)) else record.get(name))}</code>"]
            for name in names if record.get(name) is not None]
    return "<h2>Parameters</h2>" + _table(["parameter", "value"], rows)


def _people(facts: dict, record: dict) -> str:
    execution = record.get("execution") or {}
    approval = record.get("approval")
    rows = [["operator (ran the release)", _e(execution.get("operator"))],
            ["flow run", f"<code>{_e(execution.get('flow_run_id'))}</code>"],
            ["started / finished", f"{_e(execution.get('started_at'))} / {_e(execution.get('finished_at'))}"]]
    if approval:
        rows.append(["approved by (two-person rule)", f"{_e(approval.get('approver'))} at {_e(approval.get('approved_at'))}"])
    else:
        rows.append(["approval", "not required by the spec"])
    for item in facts.get("approvals") or []:
        rows.append(["approval on record", f"{_e(item['approver'])} at {_e(item['approved_at'])}: {_e(item['reason'])}"])
    return "<h2>Who acted</h2>" + _table(["role", "who and when"], rows)


def _budget(budget: dict | None, record: dict) -> str:
    if not budget:
        return "<h2>Privacy budget</h2><p>No reservation is recorded for this release (it was refused before any ε).</p>"
    rows = [["ε in use by the population", _num(budget["epsilon_before"]), _num(budget["epsilon_after"]), _num(budget["epsilon_cap"])]]
    if budget.get("delta_after") is not None:
        rows.append(["δ in use (DP mode)", _num(budget["delta_before"]), _num(budget["delta_after"]), _num(budget["delta_cap"])])

    def draw(ax):
        ax.barh(["before", "after"], [budget["epsilon_before"], budget["epsilon_after"]], color=["#999", "#3465a4"])
        if budget.get("epsilon_cap") is not None:
            ax.axvline(budget["epsilon_cap"], color="#a00", linestyle="--", label="cap")
            ax.legend(loc="lower right")
        ax.set_xlabel("ε in use by the population")

    return ("<h2>Privacy budget (ε, δ) before and after</h2><p>From the ledger rows older than this release's reservation "
            f"(#{_e(budget['reservation_id'])}), so later entries do not change it. In the method's own mode ε is "
            "bookkeeping per record, not a differential-privacy guarantee (docs/method.md).</p>"
            + _table(["", "before this release", "with it", "cap then"], rows)
            + _figure(draw, "ε in use by the population before and with this release"))


_NO_FIGURES = "the record holds no certificate figures: it was recorded before kepsilon computed them"

_GATE_FIGURES = {
    "k_anonymous_groups": (("groups", "smallest"), ("k",)),
    "linking_risk_within_limit": (("linking_risk",), ("max_linking_risk",)),
    "prosecutor_risk_within_limit": (("disclosure", "prosecutor_risk"), ("max_prosecutor_risk",)),
    "l_diversity": (("disclosure", "l_diversity_min"), None),
    "t_closeness": (("disclosure", "t_closeness_max"), None),
    "suppression_within_budget": (None, ("suppression_budget",)),
}


def _get(record: dict, path):
    value: Any = record
    for part in path or ():
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _gates(record: dict) -> str:
    rows = []
    removed = sum((record.get("rows_removed") or {}).values()) if isinstance(record.get("rows_removed"), dict) else None
    for check in record.get("checks") or []:
        name = str(check.get("name"))
        figure_path, limit_path = _GATE_FIGURES.get(name, (None, None))
        figure = _get(record, figure_path) if figure_path else None
        if name == "suppression_within_budget" and removed is not None and record.get("rows_in"):
            figure = removed / record["rows_in"]
        limit = _get(record, limit_path) if limit_path else None
        verdict = '<span class="pass">passed</span>' if check.get("success") else '<span class="fail">failed</span>'
        rows.append([_e(name), verdict, _num(figure), _num(limit)])
    certificate = record.get("certificate") or {}
    predicted = ((certificate.get("risk") or {}).get("predicted") or {})
    for name, key in (("max_journalist_risk", "journalist"), ("max_marketer_risk", "marketer")):
        if record.get(name) is not None or (predicted.get(key) is not None and name in record):
            value = predicted.get(key)
            value = value.get("highest") if isinstance(value, dict) else value
            rows.append([_e(name) + " (before ε)", '<span class="pass">passed</span>', _num(value), _num(record.get(name))])
    return ("<h2>Gates</h2><p>Every check the release passed before it was published, with the figure it "
            "checked where there is one. A release that fails a gate is not published.</p>"
            + _table(["gate", "result", "figure", "limit"], rows))


def _risk(record: dict) -> str:
    certificate = record.get("certificate")
    if not certificate or not certificate.get("computed"):
        reason = (_NO_FIGURES if certificate is None else certificate.get("reason"))
        return f"<h2>Re-identification risk</h2><p>Not computed: {_e(reason)}.</p>"
    risk = certificate["risk"]
    parts = ["<h2>Re-identification risk</h2>",
             "<p>Three attackers (El Emam and Dankar 2008). The <b>prosecutor</b> knows their target is in the "
             "release; the <b>journalist</b> does not, and matches against the population; the <b>marketer</b> "
             "tries to re-identify everyone and succeeds, on average, for the share shown. "
             "<i>Predicted</i>: the anonymiser's groups before the noise (what the gates checked before ε); "
             "<i>published</i>: the groups as released, after every suppression.</p>"]
    rows = []
    for label, block in (("predicted (before ε)", risk.get("predicted")), ("published", risk.get("published"))):
        if not isinstance(block, dict) or block.get("computed") is False:
            rows.append([_e(label)] + [_e("not computed: " + str((block or {}).get("reason")))] + [""] * 5)
            continue
        rows.append([_e(label), _num(block["groups"]), _pct(block["prosecutor"]["highest"]), _pct(block["prosecutor"]["average"]),
                     _pct(block["journalist"]["highest"]), _pct(block["marketer"]), _pct(block["prosecutor"]["records_at_risk"])])
    parts.append(_table(["groups", "count", "prosecutor highest", "prosecutor average", "journalist highest", "marketer",
                         "records at risk (prosecutor)"], rows))
    published = risk.get("published") if isinstance(risk.get("published"), dict) else {}
    if published.get("population_basis"):
        parts.append(f"<p>Population: {_e(published['population_basis'])} ({_num(int(round(published['population_size'])) if published.get('population_size') is not None else None)} people). "
                     f"A record counts as at risk above {_pct(published['prosecutor']['threshold'])}. Journalist risk per "
                     "record is 1/F with F the group's population size, or — from a sampling fraction or weights — "
                     "the Benedetti–Franconi individual risk E[1/F | f] (sdcMicro's).</p>")
    source = risk.get("source")
    if isinstance(source, dict) and source.get("population_uniqueness"):
        unique = source["population_uniqueness"]
        estimates = unique.get("estimates") or {}
        parts.append("<h3>Population uniqueness of the source</h3><p>How many people the source's own values (the "
                     "k-quasis as read, before anonymisation) single out in the population, by three models and Dankar "
                     "et al.'s (2012) rule for choosing among them.</p>")
        parts.append(_table(["sampling fraction", "sample uniques", "Pitman", "Zayatz", "SNB", "Dankar's choice", "population uniqueness"],
                            [[_num(unique["sampling_fraction"]), _num(unique["sample_uniques"]), _num(estimates.get("pitman")),
                              _num(estimates.get("zayatz")), _num(estimates.get("snb")), _e(unique["model"]),
                              _pct(unique["population_uniqueness"])]]))
    suda = risk.get("special_uniques")
    if isinstance(suda, dict) and "combinations" in suda:
        parts.append(f"<h3>Special uniques in the source (SUDA)</h3><p>{_num(suda['records_with_msu'])} of "
                     f"{_num(suda['records'])} source records are singled out by some combination of at most "
                     f"{_e(suda['max_size'])} k-quasi values (a minimal sample unique). The combinations that do it "
                     "most often — a warning of what the anonymiser had to hide:</p>")
        parts.append(_table(["columns", "records singled out"], [[_e(" + ".join(c["columns"])), _num(c["records"])] for c in suda["combinations"]]))
    if published.get("group_sizes"):
        sizes = {int(k): v for k, v in published["group_sizes"].items()}
        k = record.get("k")

        def draw(ax):
            _bars(ax, sizes, color="#3465a4", width=0.8)
            if k:
                ax.axvline(k - 0.5, color="#a00", linestyle="--", label=f"k = {k}")
                ax.legend()
            ax.set_xlabel("published group size (records)")
            ax.set_ylabel("groups")

        parts.append(_figure(draw, "How many published groups have each size: a record's prosecutor risk is 1/size"))
    return "".join(parts)


def _utility(record: dict) -> str:
    certificate = record.get("certificate") or {}
    report = certificate.get("utility")
    if not isinstance(report, dict) or report.get("computed") is False or "columns" not in report:
        reason = (report or {}).get("reason") if isinstance(report, dict) else _NO_FIGURES
        return f"<h2>Utility</h2><p>Not computed: {_e(reason)}.</p>"
    rows = []
    for column, measures in report["columns"].items():
        if measures["kind"] == "generalised":
            detail = (f"granularity {_num(measures['granularity'], 3)}; non-uniform entropy {_num(measures['non_uniform_entropy_bits'], 3)} bits; "
                      f"released as read for {_pct(measures['released_as_read'])} of records")
        elif measures["kind"] == "noised":
            detail = (f"Wasserstein {_num(measures['wasserstein'], 3)} ({_pct(measures['wasserstein_of_range'])} of the public range); "
                      f"Kolmogorov–Smirnov {_num(measures['ks'], 3)}")
        else:
            detail = f"total variation {_num(measures['total_variation'], 3)}"
        rows.append([_e(column), _e(measures["kind"]), detail])
    parts = ["<h2>Utility</h2><p>Is the release still fit for its purpose? Per released column, how far its "
             "distribution moved from the source's (0 = unchanged): total variation for columns released as read "
             "(they change only by the records removed), Wasserstein and Kolmogorov–Smirnov distances for noised "
             "numbers (source values snapped to the published grid first), and ARX's generalisation measures for "
             "generalised columns (granularity 1 = as read, 0 = fully generalised).</p>",
             _table(["column", "treatment", "measures"], rows),
             f"<p>Discernibility (Σ group size², suppressed records counted n each): {_num(report.get('discernibility'))}.</p>"]
    correlations = report.get("correlations")
    if correlations:
        parts.append(_table(["ε-quasis", "correlation before", "after"],
                            [[_e(" × ".join(p["columns"])), _num(p["before"], 3), _num(p["after"], 3)] for p in correlations["pairs"]]))
    distances = {c: m.get("total_variation", m.get("ks")) for c, m in report["columns"].items() if m["kind"] != "generalised"}
    granular = {c: m["granularity"] for c, m in report["columns"].items() if m["kind"] == "generalised"}
    if distances or granular:

        def draw(ax):
            names = list(granular) + list(distances)
            values = list(granular.values()) + list(distances.values())
            colours = ["#73a15a"] * len(granular) + ["#c4773b"] * len(distances)
            ax.barh(names, [v or 0 for v in values], color=colours)
            ax.set_xlim(0, 1)
            ax.set_xlabel("green: granularity (1 = as read)   orange: distance to the source (0 = same)")
            ax.invert_yaxis()

        parts.append(_figure(draw, "Per released column: how much was kept (granularity) or moved (distance)"))
    classifier = report.get("classifier") or {}
    if classifier.get("computed"):
        models = classifier["models"]
        parts.append(f"<h3>Classifier utility (as ARX reports it)</h3><p>Predicting <b>{_e(classifier['target'])}</b> for "
                     f"{_num(classifier['test_records'])} held-out source records, from a model trained on "
                     f"{_num(classifier['training_records'])} records as released, and from one trained on the same records "
                     f"as in the source. Majority-class baseline: {_pct(classifier['baseline'])}.</p>")
        parts.append(_table(["model", "trained on the source", "trained on the release", "relative utility"],
                            [[_e(name.replace("_", " ")), _pct(m["source"]), _pct(m["released"]), _pct(m["relative"])] for name, m in models.items()]))

        def draw_models(ax):
            import numpy as np

            names = list(models)
            x = np.arange(len(names))
            ax.bar(x - 0.2, [models[n]["source"] for n in names], 0.4, label="trained on the source", color="#999")
            ax.bar(x + 0.2, [models[n]["released"] for n in names], 0.4, label="trained on the release", color="#3465a4")
            ax.axhline(classifier["baseline"], color="#a00", linestyle="--", label="majority baseline")
            ax.set_xticks(x, [n.replace("_", " ") for n in names])
            ax.set_ylim(0, 1)
            ax.set_ylabel("accuracy")
            ax.legend(loc="lower right", fontsize=7)

        parts.append(_figure(draw_models, f"Accuracy predicting {classifier['target']} on held-out source records"))
    else:
        parts.append(f"<p>Classifier utility: not computed ({_e(classifier.get('reason'))}).</p>")
    seconds = certificate.get("seconds")
    if seconds is not None:
        parts.append(f"<p>These figures took {_num(seconds, 3)} s to compute at release time.</p>")
    return "".join(parts)


def _chain(facts: dict) -> str:
    rows = [["record id in the store", _num(facts["record_id"])],
            ["chain entry (position)", _num(facts["chain"]["entry"])],
            ["chain entry hash (the head once this record was committed)", f"<code>{_e(facts['chain']['entry_hash'])}</code>"],
            ["SHA-256 of the record (private manifest, as stored)", f"<code>{_e(facts['manifest_sha256'])}</code>"],
            ["SHA-256 of this certificate's facts", f"<code>{facts_digest(facts)}</code>"]]
    for output in facts.get("outputs") or []:
        rows.append([f"published file {_e(output['path'])}", f"<code>{_e(output['sha256'])}</code>"])
    return ("<h2>Place in the audit chain</h2><p>This certificate is a rendering of the store. To check it: "
            f"<code>kepsilon audit certificate {_e(facts['release_id'])} --verify FILE</code> re-renders it from the "
            "store (after verifying the store's hash chain) and compares bytes.</p>" + _table(["", ""], rows))
