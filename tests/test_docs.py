"""The README and docs/ cannot drift from the code: size, links, the commands they show.

The README is a guide that fits (≤ 20 KB); everything else lives in docs/ pages. These tests read the files as
a reader's browser would follow them (relative links and GitHub's heading anchors) and run ``kepsilon --help``
as the reader would, to check that every command and option the README shows exists.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
README_LIMIT_BYTES = 20_000
KEPSILON = Path(sys.executable).with_name("kepsilon")

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def _prose(text: str) -> str:
    """The text outside fenced code blocks (a link inside a code block is not followed by a browser)."""
    kept, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            kept.append(line)
    return "\n".join(kept)


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (word characters, spaces, hyphens
    kept, Unicode letters included), spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    headings = [line.lstrip("#").strip() for line in _prose(page.read_text(encoding="utf-8")).splitlines()
                if re.match(r"^#{1,6} ", line)]
    return {_anchor(heading) for heading in headings}


def test_anchor_rule_matches_githubs_on_known_headings():
    """The slug rule the link check relies on, on headings whose GitHub anchors were linked before."""
    assert _anchor("The DP mode: (ε,δ)-differential privacy") == "the-dp-mode-εδ-differential-privacy"
    assert _anchor("A store put back from a backup (rollback)") == "a-store-put-back-from-a-backup-rollback"
    assert _anchor("What `make demo` prints") == "what-make-demo-prints"


def test_readme_fits():
    size = README.stat().st_size
    assert size <= README_LIMIT_BYTES, f"README.md is {size} bytes; move detail into a docs/ page"


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path):
    """Every relative link (and image) names a file of the repository, and its #anchor a heading there."""
    broken = []
    for match in LINK.finditer(_prose(page.read_text(encoding="utf-8"))):
        target = match.group(1) or match.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, broken


def test_every_page_is_linked_from_the_readme():
    """A page nobody can reach from the README is a page nobody reads."""
    linked = {
        (README.parent / (m.group(1) or "").partition("#")[0]).resolve()
        for m in LINK.finditer(_prose(README.read_text(encoding="utf-8")))
        if m.group(1)
    }
    unlinked = [page.name for page in PAGES if page.resolve() not in linked]
    assert not unlinked, unlinked


def _help(*command: str) -> str:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
    done = subprocess.run([str(KEPSILON), *command, "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _readme_commands() -> list[list[str]]:
    """Every `kepsilon …` invocation the README shows: console lines and inline code spans."""
    text = README.read_text(encoding="utf-8")
    lines = [line[2:] for line in text.splitlines() if line.startswith("$ kepsilon ")]
    spans = [span for span in re.findall(r"`(kepsilon [^`]+)`", text)]
    return [line.split("#", 1)[0].split() for line in lines + spans]


def _subcommand(words: list[str]) -> list[str]:
    """``kepsilon audit set-cap x 5 --by …`` → ``[audit, set-cap]``: the command words before arguments."""
    command = words[1:2]
    if command == ["audit"] and len(words) > 2 and not words[2].startswith("-"):
        command.append(words[2])
    return command


def test_readme_commands_and_options_exist():
    """Each command the README shows is listed by `kepsilon --help` (or `kepsilon audit --help`), and each
    option it passes is listed by that command's own --help."""
    invocations = _readme_commands()
    assert len(invocations) >= 5, invocations  # the quick start alone shows init, set-cap, check, release
    top, audit = _help(), _help("audit")
    missing = []
    for words in invocations:
        command = _subcommand(words)
        listing = top if len(command) == 1 else audit
        if not re.search(rf"\b{re.escape(command[-1])}\b", listing):
            missing.append(" ".join(command))
            continue
        options = [word.split("=")[0] for word in words if word.startswith("--")]
        if options:
            own = _help(*command)
            missing += [f"{' '.join(command)} {option}" for option in options if option not in own]
    assert not missing, missing


def test_readme_make_targets_exist():
    """Every `make X` the README names is a target of the Makefile."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):", makefile, flags=re.MULTILINE))
    named = set(re.findall(r"\bmake ([a-z][a-z0-9-]*)", README.read_text(encoding="utf-8")))
    assert named, "the README names no make target"
    assert named <= targets, sorted(named - targets)


def test_performance_tables_are_what_the_benchmarks_measured():
    """docs/performance.md's marked tables are rendered from the committed result files, as `make bench` and
    `make bench-scale` write them (benchmarks/doc_tables.py): no figure there is typed by hand."""
    from benchmarks import doc_tables

    text = doc_tables.PAGE.read_text(encoding="utf-8")
    for name, render in doc_tables.tables().items():
        assert doc_tables.marked(text, name) == render(), name


def test_rewriting_the_performance_page_changes_only_its_tables(tmp_path: Path):
    """A fresh measurement replaces the figures between the markers and nothing else of the page."""
    from benchmarks import doc_tables

    page = tmp_path / "performance.md"
    original = doc_tables.PAGE.read_text(encoding="utf-8")
    stale = original.replace("| `engine-1m` | 1,000,000 |", "| `engine-1m` | 7 |")
    assert stale != original
    page.write_text(stale, encoding="utf-8")
    doc_tables.rewrite(page)
    assert page.read_text(encoding="utf-8") == doc_tables.PAGE.read_text(encoding="utf-8")


def test_reliability_counts_are_the_reports():
    """docs/reliability.md's check counts and total are those of reliability/report.md, which `make reliability`
    writes: a new run that changes them makes this fail until the page says what the report says."""
    report = (ROOT / "reliability" / "report.md").read_text(encoding="utf-8")
    section = report.split("## Checks per category", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| ([^|]+?) \| (\d+) \| (\d+) \| (\d+) \|$", section, flags=re.MULTILINE)
    measured = {name.strip(): int(passed) for name, passed, _failed, _seconds in rows}
    assert len(measured) >= 7, measured
    page = (ROOT / "docs" / "reliability.md").read_text(encoding="utf-8")
    stated = {name: int(checks) for name, checks in re.findall(r"^\| ([^|]+?) \| .* \| (\d+) \|$", page, flags=re.MULTILINE)}
    assert stated == measured
    total = re.search(r"\*\*(\d+) passed, (\d+) failed\*\*", page)
    assert total is not None
    failed = sum(int(f) for _n, _p, f, _s in rows)
    assert (int(total.group(1)), int(total.group(2))) == (sum(measured.values()), failed)


def test_readme_figures_are_the_shipped_specs():
    """The figures the README states about `make demo` are those of the spec and the data it releases. (The
    quick start's k = 20 and ε = 1 for a noised column are checked on `kepsilon init`'s output by
    tests/test_init_spec.py.)"""
    from kepsilon.flows.spec import load_spec

    text = README.read_text(encoding="utf-8")
    assert "releases `releases/paper-synthetic.yaml` (32,440 synthetic people, k = 10, ε = 1)" in text
    spec = load_spec(ROOT / "releases" / "paper-synthetic.yaml")
    assert (spec.k, spec.epsilon) == (10, 1.0)
    with open(spec.source.path, encoding="utf-8") as source:
        assert sum(1 for _ in source) - 1 == 32_440  # the header, then one line per person
    assert "The smallest group is at least 10." in text
