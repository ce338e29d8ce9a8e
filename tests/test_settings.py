"""One settings object for every ``KEPSILON_*`` variable, and one table of them in docs/settings.md.

The table cannot drift: it must be what ``kepsilon.settings.markdown_table()`` prints, every ``KEPSILON_*`` name
the package's code mentions must be a field, and every name the tools (tests, benchmarks, deployments) mention
must be in the tools table. The rule "empty is unset" is checked on every field, and on the audit store's path
through the CLI, where an empty ``KEPSILON_AUDIT_DB`` once meant the project folder in one module and
``audit.db`` in another.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from kepsilon import settings
from kepsilon.audit.store import DEFAULT_PATH, store_path
from kepsilon.tasks.record import store_location

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "settings.md"
NAME = re.compile(r"KEPSILON_[A-Z0-9_]*[A-Z0-9]")
PACKAGE = ("kepsilon", "flows", "tasks", "audit")
TOOLS = ("tests", "benchmarks", "reliability", "scripts", "deployments", ".ci", "Makefile")


def _names_in(*places: str) -> set[str]:
    found: set[str] = set()
    for place in places:
        root = ROOT / place
        files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
        for path in files:
            try:
                found |= set(NAME.findall(path.read_text(encoding="utf-8")))
            except UnicodeDecodeError:
                continue
    return found


def _table(text: str, begin: str, end: str) -> str:
    return text.split(begin, 1)[1].split(end, 1)[0].strip()


def _tools_table() -> set[str]:
    tools = DOC.read_text(encoding="utf-8").split("## Variables read by the tools", 1)[1]
    return set(re.findall(r"^\| `(KEPSILON_[A-Z0-9_]+)` \|", tools, flags=re.MULTILINE))


def test_doc_table_is_what_the_object_prints():
    text = DOC.read_text(encoding="utf-8")
    assert _table(text, "<!-- settings-table:begin -->", "<!-- settings-table:end -->") == settings.markdown_table()


def test_every_variable_the_package_names_is_a_setting_and_back():
    declared = {env for _name, env, _default, _doc in settings.FIELDS}
    named = _names_in(*PACKAGE)
    assert named == declared, {"named, not a setting": named - declared, "a setting nothing names": declared - named}


def test_every_variable_the_tools_name_is_documented():
    declared = {env for _name, env, _default, _doc in settings.FIELDS}
    tools = _names_in(*TOOLS) - declared
    assert tools == _tools_table(), {"undocumented": tools - _tools_table(), "stale": _tools_table() - tools}


def test_every_variable_the_docs_name_exists():
    """A variable named in the README or a docs page is one the code reads."""
    known = {env for _name, env, _default, _doc in settings.FIELDS} | _tools_table()
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    named = set().union(*(NAME.findall(page.read_text(encoding="utf-8")) for page in docs))
    assert named <= known, sorted(named - known)


def test_every_field_has_a_doc_and_a_default():
    for name, env, default, doc in settings.FIELDS:
        assert env == "KEPSILON_" + name.upper(), name
        assert doc.strip() and default.strip(), name


@pytest.mark.parametrize("field", [f.name for f in fields(settings.Settings)])
def test_empty_is_unset_and_values_are_read_at_use(field: str, monkeypatch: pytest.MonkeyPatch):
    env = "KEPSILON_" + field.upper()
    monkeypatch.setenv(env, "")
    assert getattr(settings.current(), field) is None
    monkeypatch.setenv(env, "/some/where")  # set after import: read lazily, so seen now
    value = getattr(settings.current(), field)
    assert str(value) == "/some/where"
    monkeypatch.delenv(env)
    assert getattr(settings.current(), field) is None


def test_empty_audit_db_is_the_default_store_in_every_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KEPSILON_AUDIT_DB", "")
    assert store_path() == Path(DEFAULT_PATH)
    assert store_location() == str((tmp_path / DEFAULT_PATH).resolve())


def test_empty_audit_db_at_the_cli_names_the_default_store(tmp_path: Path):
    """`KEPSILON_AUDIT_DB= kepsilon audit budget p` in an empty folder: the default store, not the folder."""
    env = {**os.environ, "KEPSILON_AUDIT_DB": "", "COLUMNS": "200", "NO_COLOR": "1"}
    kepsilon = Path(sys.executable).with_name("kepsilon")
    done = subprocess.run([str(kepsilon), "audit", "budget", "p"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    assert f"no audit store at '{DEFAULT_PATH}'" in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
