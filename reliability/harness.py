"""Shared machinery: a real local Prefect server, release specs in a scratch folder, CLI runs, audit reads.

Every scenario runs the real ``kepsilon`` command as a subprocess (or, for the leak test, the real
flow in a subprocess) against one local Prefect server, so a run costs its own work, not a server
start-up each time.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from kepsilon.flows.spec import load_spec
from kepsilon.local_server import prefect_server  # noqa: F401  (used by run.py and the tests through here)

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SYNTHETIC = ROOT / "data" / "paper-synthetic"
POPULATION = "reliability-people"


@dataclass
class Check:
    """One reliability assertion and its outcome; ``detail`` never holds a data value."""

    category: str
    name: str
    ok: bool
    detail: str = ""


@dataclass
class Results:
    """The checks of a run, and the counts the report quotes."""

    checks: list[Check] = field(default_factory=list)
    counts: dict[str, str] = field(default_factory=dict)

    def add(self, category: str, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append(Check(category, name, bool(ok), detail))
        return bool(ok)

    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]


def spec_dict(work: Path, release_id: str, **overrides) -> dict:
    """The shipped paper-synthetic release (absolute paths), publishing under ``work/out``."""
    spec = load_spec(ROOT / "releases" / "paper-synthetic.yaml").model_dump(mode="json")
    spec.update(release_id=release_id, population_id=POPULATION, output_dir=str(work / "out"), operator="reliability")
    # The scenarios release one source under several ids on purpose (races, caps): not "unchanged, skipped".
    spec.update(rerelease_unchanged=True)
    spec.update(overrides)
    return spec


def write_spec(work: Path, spec: dict, name: str | None = None) -> Path:
    path = work / f"{name or spec.get('release_id', 'spec')}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path


def store_env(env: dict, work: Path) -> dict:
    """``env`` with this scratch folder's audit store and seed key file."""
    return {**env, "KEPSILON_AUDIT_DB": str(work / "audit.db"), "KEPSILON_SEED_KEY_FILE": str(work / "seed.key")}


def kepsilon(args: list[str], env: dict, cwd: Path, fault: str | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the real ``kepsilon`` command; ``fault`` sets KEPSILON_FAULT_AT for this run only."""
    run_env = dict(env)
    run_env.pop("KEPSILON_FAULT_AT", None)
    if fault is not None:
        run_env["KEPSILON_FAULT_AT"] = fault
    return subprocess.run(
        [str(BIN / "kepsilon"), *args], cwd=cwd, env=run_env, capture_output=True, text=True, timeout=timeout
    )


def finish(process: subprocess.Popen, timeout: float = 600) -> tuple[str, str]:
    """Let a started ``kepsilon`` run end on its own within ``timeout`` seconds, else SIGKILL it; its
    (stdout, stderr) — stderr is empty when it was merged into stdout. A scenario that holds or kills
    something under a run always ends it this way, so a run that hangs fails its checks, not the suite."""
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
    return out or "", err or ""


def copy_head_log(source_store: Path, target_store: Path) -> None:
    """Put ``source_store``'s head log where ``target_store``'s belongs (a copy of a store goes with its log)."""
    import shutil

    from kepsilon.audit.headlog import head_log_path

    source, target = head_log_path(source_store), head_log_path(target_store)
    if source.exists():
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        shutil.copy2(source, target)


def set_cap(env: dict, work: Path, cap: float, population: str = POPULATION) -> None:
    result = kepsilon(["audit", "set-cap", population, str(cap), "--by", "reliability", "--reason", "test cap"], env, work)
    if result.returncode != 0:
        raise RuntimeError(f"set-cap failed: {result.stderr[-500:]}")


def rows(db_path: Path, sql: str, params: tuple = ()) -> list[tuple]:
    """Read-only query of an audit store (missing store: no rows)."""
    if not db_path.exists():
        return []
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        return conn.execute(sql, params).fetchall()
    except sqlite3.DatabaseError:  # missing table, or a store damaged on purpose
        return []
    finally:
        conn.close()


def ledger_kinds(db_path: Path, release_id: str | None = None) -> dict[str, int]:
    """Number of ledger entries of each kind (for one release id, or all)."""
    sql = "SELECT kind, COUNT(*) FROM ledger" + (" WHERE release_id = ?" if release_id else "") + " GROUP BY kind"
    return dict(rows(db_path, sql, (release_id,) if release_id else ()))


def max_per_key(db_path: Path) -> tuple[int, int]:
    """(most spend entries for one reservation, most sealed seeds for one idempotency key)."""
    spends = rows(db_path, "SELECT MAX(n) FROM (SELECT COUNT(*) n FROM ledger WHERE kind='spend' GROUP BY reservation_id)")
    seeds = rows(db_path, "SELECT MAX(n) FROM (SELECT COUNT(*) n FROM sealed_seeds GROUP BY idempotency_key)")
    return (spends[0][0] or 0) if spends else 0, (seeds[0][0] or 0) if seeds else 0


def verify(env: dict, work: Path, checkpoint: Path | None = None) -> subprocess.CompletedProcess:
    args = ["audit", "verify"] + (["--checkpoint", str(checkpoint)] if checkpoint else [])
    return kepsilon(args, env, work)


def reader_view(directory: Path) -> tuple[bool, str]:
    """What a reader of the release folder sees is consistent: no manifest, or a manifest whose every
    listed file is present with the listed SHA-256; every other file is hidden (dot-prefixed)."""
    if not directory.exists():
        return True, "no release folder"
    visible = sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))
    hidden = sorted(p.name for p in directory.iterdir() if p.name.startswith("."))
    manifest_path = directory / "manifest.json"
    if not manifest_path.exists():
        return True, f"no manifest; visible {visible}; hidden temp files {len(hidden)}"
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except ValueError:
        return False, "manifest.json is not valid JSON (half-written)"
    for name, digest in manifest.get("outputs", {}).items():
        path = directory / name
        if not path.exists() or hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            return False, f"manifest lists {name} but it is missing or its hash differs"
    extra = [n for n in visible if n != "manifest.json" and n not in manifest.get("outputs", {})]
    if extra:
        return False, f"visible files not in the manifest: {extra}"
    return True, f"manifest complete; hidden temp files {len(hidden)}"


def scratch(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"kepsilon-{prefix}-"))


def make_unwritable(folder: Path):
    """Make ``folder`` unwritable even for root (mode 0555, then ``chattr +i`` if that is not enough).

    Returns a function that undoes it, or None when neither works here (the caller then skips).
    """
    folder.chmod(0o555)

    def writable() -> bool:
        probe = folder / ".kepsilon-writable-probe"
        try:
            probe.write_text("x")
        except OSError:
            return False
        probe.unlink()
        return True

    if not writable():
        return lambda: folder.chmod(0o755)
    made = subprocess.run(["chattr", "+i", str(folder)], capture_output=True)
    if made.returncode == 0 and not writable():
        def undo() -> None:
            subprocess.run(["chattr", "-i", str(folder)], capture_output=True)
            folder.chmod(0o755)
        return undo
    subprocess.run(["chattr", "-i", str(folder)], capture_output=True)
    folder.chmod(0o755)
    return None
