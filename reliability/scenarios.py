"""The reliability scenarios. Each adds its checks to a ``Results`` and returns nothing else.

Shared by ``make reliability`` (``reliability/run.py``, many repetitions) and the unit suite
(``tests/test_reliability.py``, one of each).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import secrets
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import numpy as np
import pandas as pd

from kepsilon.audit.headlog import head_log_path
from kepsilon.faults import FAULT_POINTS  # re-exported for run.py and the tests

from .harness import (
    BIN,
    POPULATION,
    ROOT,
    SYNTHETIC,
    Results,
    copy_head_log,
    finish,
    kepsilon,
    ledger_kinds,
    max_per_key,
    reader_view,
    rows,
    set_cap,
    spec_dict,
    store_env,
    verify,
    write_spec,
)

NOISE_DRAWN_FROM = FAULT_POINTS.index("after-noise")
BUDGET_MESSAGE = "exceeds the remaining budget"

# Fault, race and leak scenarios test what survives a kill, a race or a release, not the suppression
# budget. On a small sample, confidence suppression is random and can exceed 5 %, which would fail a
# release the scenario needs to succeed; so they allow any suppression and their outcome is fixed. For
# the same reason they lift the linking-risk gate (a 600-record sample links more than 10 %).
NO_BUDGET_FAILURES = {"suppression_budget": 1.0, "max_linking_risk": 1.0}


def sample_source(path: Path, n_rows: int) -> Path:
    """The first ``n_rows`` records of the bundled paper-synthetic table (header kept)."""
    lines = (SYNTHETIC / "people.csv").read_text(encoding="utf-8").splitlines(keepends=True)
    path.write_text("".join(lines[: n_rows + 1]), encoding="utf-8")
    return path


def _flat(text: str) -> str:
    return " ".join(text.split())


# --- 1. Faults -------------------------------------------------------------------------------


def fault_scenario(results: Results, env: dict, work: Path, source: Path, point: str, extra_reruns: int = 1) -> None:
    """SIGKILL a release at ``point``, inspect what survived, rerun it to completion, rerun it again."""
    cat = "faults"
    label = f"{point} [{work.name}]"
    work.mkdir(parents=True, exist_ok=True)
    env = {**store_env(env, work), "KEPSILON_DEFAULT_CAP": "10"}
    spec = spec_dict(work, "fault-release", source={"path": str(source), "delimiter": ";"}, **NO_BUDGET_FAILURES)
    spec_path = write_spec(work, spec)
    release_dir = work / "out" / "fault-release"
    db = work / "audit.db"
    noise_drawn = FAULT_POINTS.index(point) >= NOISE_DRAWN_FROM

    killed = kepsilon(["release", str(spec_path)], env, work, fault=point)
    results.add(cat, f"{label}: killed by SIGKILL", killed.returncode == -9, f"exit {killed.returncode}")

    ok, detail = reader_view(release_dir)
    results.add(cat, f"{label}: reader sees no half-written release", ok, detail)
    visible_tmp = [p.name for p in release_dir.glob("*.tmp") if not p.name.startswith(".")] if release_dir.exists() else []
    results.add(cat, f"{label}: leftover temp files are hidden", not visible_tmp, f"visible temp {visible_tmp}")
    manifest_after_kill = (release_dir / "manifest.json").exists()
    results.add(cat, f"{label}: nothing under the final name until the record is committed and renamed",
                not manifest_after_kill and not release_dir.exists(), f"manifest present: {manifest_after_kill}")
    staged = _staged_bytes(work / "out" / ".fault-release.staging", point)
    recorded = point == "after-audit-commit"

    sealed = [c for (c,) in rows(db, "SELECT commitment FROM sealed_seeds")]
    kinds = ledger_kinds(db)
    results.add(cat, f"{label}: one reservation", kinds.get("reserve", 0) == 1, f"ledger {kinds}")
    results.add(cat, f"{label}: seed sealed iff noise drawn", len(sealed) == (1 if noise_drawn else 0), f"sealed {len(sealed)}")
    results.add(cat, f"{label}: ε spent iff the kill came at/after after-noise",
                kinds.get("spend", 0) == (1 if noise_drawn else 0), f"spend entries {kinds.get('spend', 0)}")
    checked = verify(env, work)
    results.add(cat, f"{label}: audit verify passes after the kill", checked.returncode == 0, f"exit {checked.returncode}")

    rerun = kepsilon(["release", str(spec_path)], env, work)
    results.add(cat, f"{label}: rerun completes", rerun.returncode == 0, f"exit {rerun.returncode} {_flat(rerun.stderr)[-200:]}")
    if rerun.returncode != 0:
        return
    ok, detail = reader_view(release_dir)
    results.add(cat, f"{label}: rerun's release is complete and consistent", ok and (release_dir / "manifest.json").exists(), detail)
    if sealed:
        # The commitment is private: the audit record of the published release holds it.
        committed = rows(db, "SELECT seed_commitment FROM releases WHERE outcome = 'published'")
        results.add(cat, f"{label}: rerun uses the seed sealed before the kill",
                    bool(committed) and all(c == sealed[0] for (c,) in committed), "commitment compared")
    first = (release_dir / "data.csv").read_bytes()
    if staged is not None:
        results.add(cat, f"{label}: rerun's data.csv equals the bytes staged by the killed run", first == staged,
                    f"{len(first)} vs {len(staged)} bytes")
    if recorded:
        results.add(cat, f"{label}: the rerun only completes the recorded release (moves it into place)",
                    "already published" in _flat(rerun.stdout), _flat(rerun.stdout)[-160:])
    for again in range(extra_reruns):
        more = kepsilon(["release", str(spec_path)], env, work)
        same = more.returncode == 0 and (release_dir / "data.csv").read_bytes() == first
        results.add(cat, f"{label}: further rerun {again + 1} is a no-op saying where it was published",
                    same and "already published" in _flat(more.stdout), f"exit {more.returncode}")

    spends, seeds = max_per_key(db)
    kinds = ledger_kinds(db)
    results.add(cat, f"{label}: at most one noise draw and one sealed seed per release", spends <= 1 and seeds <= 1,
                f"max spends {spends}, max seeds {seeds}")
    spent = sum(n for (n,) in rows(db, "SELECT nano_epsilon FROM ledger WHERE kind = 'spend'"))
    results.add(cat, f"{label}: ledger spent = ε exactly once", spent == 10**9 and kinds.get("reserve") == 1,
                f"spent nano-ε {spent}, ledger {kinds}")
    outcomes = [o for (o,) in rows(db, "SELECT outcome FROM releases")]
    results.add(cat, f"{label}: one record, published", outcomes == ["published"], f"outcomes {outcomes}")
    unseals = rows(db, "SELECT COUNT(*) FROM unseal_events")[0][0]
    expected_unseals = 1 if noise_drawn and not recorded else 0
    results.add(cat, f"{label}: the seed unsealed only by the rerun that needed it", unseals == expected_unseals,
                f"unseals {unseals}, expected {expected_unseals}")
    leftover = sorted(p.name for p in (work / "out").iterdir() if p.name.startswith("."))
    leftover += sorted(p.name for p in release_dir.iterdir() if p.name.startswith("."))
    results.add(cat, f"{label}: no staging folder or hidden file left", not leftover, f"hidden left {len(leftover)}")
    checked = verify(env, work)
    results.add(cat, f"{label}: audit verify passes after the reruns", checked.returncode == 0, f"exit {checked.returncode}")


def _staged_bytes(staging: Path, point: str) -> bytes | None:
    """The data.csv bytes the killed run had fully written into its hidden staging folder, if any."""
    if point in ("after-staging", "before-manifest", "before-audit-commit", "after-audit-commit") and (staging / "data.csv").exists():
        return (staging / "data.csv").read_bytes()
    return None


# --- 2. Races --------------------------------------------------------------------------------


def race_scenario(results: Results, env: dict, work: Path, source: Path, processes: int, cap: str = "1.0", epsilon: str = "0.4") -> None:
    """``processes`` concurrent releases of one population, combined ε over the cap."""
    cat = "races"
    work.mkdir(parents=True, exist_ok=True)
    env = store_env(env, work)
    env.pop("KEPSILON_DEFAULT_CAP", None)
    set_cap(env, work, float(cap))
    admissible = min(processes, int(Fraction(cap) / Fraction(epsilon)))
    specs = []
    for i in range(processes):
        spec = spec_dict(
            work, f"race-{i}", epsilon=float(epsilon), source={"path": str(source), "delimiter": ";"}, **NO_BUDGET_FAILURES
        )
        specs.append((spec["release_id"], write_spec(work, spec)))
    running = [
        (release_id, subprocess.Popen([str(BIN / "kepsilon"), "release", str(path)], cwd=work, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        for release_id, path in specs
    ]
    outcomes = {release_id: (proc.wait(timeout=900), proc.communicate()[1]) for release_id, proc in running}
    winners = [r for r, (code, _) in outcomes.items() if code == 0]
    losers = [r for r, (code, _) in outcomes.items() if code != 0]
    label = f"{processes} processes, cap {cap}, ε {epsilon} each [{work.name}]"
    results.add(cat, f"{label}: exactly {admissible} succeed", len(winners) == admissible, f"succeeded {len(winners)}")
    refused_properly = all(outcomes[r][0] == 2 and BUDGET_MESSAGE in _flat(outcomes[r][1]) for r in losers)
    # What each loser said (its last line): a loser refused for another reason than the budget is told apart.
    said = "; ".join(f"{r}: {_flat(outcomes[r][1].strip().splitlines()[-1] if outcomes[r][1].strip() else '')[:160]}"
                     for r in losers if not (outcomes[r][0] == 2 and BUDGET_MESSAGE in _flat(outcomes[r][1])))
    results.add(cat, f"{label}: the others exit 2 with the budget message", refused_properly and len(losers) == processes - admissible,
                f"exit codes {sorted(outcomes[r][0] for r in losers)}" + (f"; not the budget message: {said}" if said else ""))
    db = work / "audit.db"
    for r in losers:
        kinds = ledger_kinds(db, r)
        seeds = rows(db, "SELECT COUNT(*) FROM sealed_seeds WHERE release_id = ?", (r,))[0][0]
        recorded = [o for (o,) in rows(db, "SELECT outcome FROM releases WHERE release_id = ?", (r,))]
        results.add(cat, f"{label}: {r} refused before noise (no seed, no ledger entry, recorded refused)",
                    not kinds and seeds == 0 and recorded == ["refused"], f"ledger {kinds}, seeds {seeds}, records {recorded}")
        results.add(cat, f"{label}: {r} published nothing", not (work / "out" / r).exists())
    spent = sum(n for (n,) in rows(db, "SELECT nano_epsilon FROM ledger WHERE kind IN ('reserve')"))
    cap_nano = int(Fraction(cap) * 10**9)
    results.add(cat, f"{label}: reserved ε within the cap", spent <= cap_nano, f"reserved nano-ε {spent} of {cap_nano}")
    checked = verify(env, work)
    results.add(cat, f"{label}: audit verify passes", checked.returncode == 0, f"exit {checked.returncode}")


# --- 3. Bad input ----------------------------------------------------------------------------


def _edit_row(lines: list[str], index: int, column: str, value: str) -> list[str]:
    header = lines[0].rstrip("\n").split(";")
    fields = lines[index].rstrip("\n").split(";")
    fields[header.index(column)] = value
    return lines[:index] + [";".join(fields) + "\n"] + lines[index + 1:]


def bad_input_cases(sample: Path) -> list[dict]:
    """The catalogue: name, how the source / spec is broken, and what the refusal must name.

    ``expect``: text the error message must contain (the column, parameter or problem), or None for a
    case the method may legitimately accept (then it must publish a consistent release).
    """
    lines = sample.read_text(encoding="utf-8").splitlines(keepends=True)
    header = lines[0]
    truncated = "".join(lines)
    cut = truncated.rstrip("\n")
    truncated_mid_height = cut[: cut.rfind(";") - 3]  # last record cut inside HEIGHT (WEIGHT lost)
    identical = header + lines[1] * 60
    dup_header = header.replace("ICD;", "HEIGHT;", 1)
    cases: list[dict[str, Any]] = [
        {"name": "NaN in an ε-quasi", "text": "".join(_edit_row(lines, 5, "HEIGHT", "NaN")), "expect": "HEIGHT"},
        {"name": "+inf in an ε-quasi", "text": "".join(_edit_row(lines, 5, "HEIGHT", "inf")), "expect": "HEIGHT"},
        {"name": "-inf in an ε-quasi", "text": "".join(_edit_row(lines, 5, "HEIGHT", "-inf")), "expect": "HEIGHT"},
        {"name": "text in an ε-quasi", "text": "".join(_edit_row(lines, 5, "HEIGHT", "tall")), "expect": "HEIGHT"},
        {"name": "empty value in an ε-quasi", "text": "".join(_edit_row(lines, 5, "HEIGHT", "")), "expect": "HEIGHT"},
        {"name": "empty value in a k-quasi", "text": "".join(_edit_row(lines, 5, "YOB", "")), "expect": "YOB"},
        {"name": "empty file", "text": "", "expect": "empty"},
        {"name": "header only", "text": header, "expect": "no records"},
        {"name": "one row (k=10)", "text": header + lines[1], "expect": None},
        {"name": "k > n (k=500)", "text": "".join(lines), "spec": {"k": 500}, "expect": None},
        # One class of zero diameter: no noise, every record links to itself (risk 100 %), so the
        # linking-risk gate refuses it, before ε is reserved (the risk is certain without noise).
        {"name": "all rows identical (60 rows)", "text": identical, "expect": "max_linking_risk"},
        {"name": "ε = 0", "spec": {"epsilon": 0}, "expect": "epsilon"},
        {"name": "ε < 0", "spec": {"epsilon": -1.0}, "expect": "epsilon"},
        {"name": "ε infinite", "spec": {"epsilon": float("inf")}, "expect": "epsilon"},
        {"name": "ε NaN", "spec": {"epsilon": float("nan")}, "expect": "epsilon"},
        {"name": "k = 0", "spec": {"k": 0}, "expect": "k"},
        {"name": "unknown column in the spec", "roles": ("e_quasi", "HEIGHT_CM"), "expect": "HEIGHT_CM"},
        {"name": "source column without a role", "drop_sensitive": "ICD", "expect": "ICD"},
        {"name": "duplicate column names", "text": dup_header + "".join(lines[1:]), "expect": "HEIGHT"},
        {"name": "value missing from a hierarchy", "text": "".join(_edit_row(lines, 5, "RACE", "Unlisted-Race")), "expect": "RACE"},
        {"name": "bounds lower ≥ upper", "bounds": (210, 130), "expect": "HEIGHT"},
        {"name": "bounds lower = upper", "bounds": (170, 170), "expect": "HEIGHT"},
        {"name": "non-UTF-8 bytes", "bytes": "".join(lines).encode("utf-8").replace(b"Sophia", b"Soph\xefa", 1), "expect": "UTF-8"},
        {"name": "truncated CSV (last record cut mid-field)", "text": truncated_mid_height, "expect": "fields"},
        {"name": "unknown field in the spec", "spec": {"k_anonymity": 5}, "expect": "k_anonymity"},
        {"name": "missing source file", "missing_source": True, "expect": "cannot read"},
    ]
    return cases


def _case_spec(work: Path, case: dict, sample: Path) -> dict:
    source = sample
    if "text" in case or "bytes" in case:
        source = work / "source.csv"
        if "bytes" in case:
            source.write_bytes(case["bytes"])
        else:
            source.write_text(case["text"], encoding="utf-8")
    if case.get("missing_source"):
        source = work / "absent.csv"
    spec = spec_dict(work, "bad-input", source={"path": str(source), "delimiter": ";"})
    spec.update(case.get("spec", {}))
    if "roles" in case:
        role, column = case["roles"]
        spec["roles"][role] = [{"column": column, "lower": 130, "upper": 210}]
    if "drop_sensitive" in case:
        spec["roles"]["sensitive"] = [c for c in spec["roles"]["sensitive"] if c != case["drop_sensitive"]]
    if "bounds" in case:
        lower, upper = case["bounds"]
        spec["roles"]["e_quasi"] = [{"column": "HEIGHT", "lower": lower, "upper": upper}]
        spec["scale_basis"] = "bounds"
    return spec


def bad_input_scenario(results: Results, env: dict, base: Path, sample: Path, run) -> list[dict]:
    """Every catalogue case through the CLI's ``release`` command; ``run(args, env, cwd) -> (code, output)``.

    Returns one row per case for the report: name, exit code, outcome and the message's first line.
    """
    cat = "bad input"
    table = []
    for number, case in enumerate(bad_input_cases(sample)):
        work = base / f"bad-{number:02d}"
        work.mkdir(parents=True, exist_ok=True)
        case_env = {**store_env(env, work), "KEPSILON_DEFAULT_CAP": "10"}
        spec_path = write_spec(work, _case_spec(work, case, sample), name="spec")
        code, output = run(["release", str(spec_path)], case_env, work)
        message = _refusal_line(output)
        db = work / "audit.db"
        kinds = ledger_kinds(db)
        seed_rows = rows(db, "SELECT COUNT(*) FROM sealed_seeds")
        seeds = seed_rows[0][0] if seed_rows else 0
        published = (work / "out" / "bad-input" / "manifest.json").exists()
        name = case["name"]
        if case["expect"] is None:
            outcome = "published" if code == 0 else "refused"
            if code == 0:
                ok, detail = reader_view(work / "out" / "bad-input")
                data = pd.read_csv(work / "out" / "bad-input" / "data.csv")
                k = json.loads((work / "out" / "bad-input" / "manifest.json").read_text())["method"]["k"]
                smallest = int(data.groupby(["YOB", "GENDER", "RACE", "MARITAL_STATUS"]).size().min()) if len(data) else 0
                results.add(cat, f"{name}: published release is consistent and k-anonymous", ok and (not len(data) or smallest >= k),
                            f"{len(data)} rows, smallest class {smallest}")
            else:
                results.add(cat, f"{name}: refused with exit 2, a message, nothing published",
                            code == 2 and bool(message) and not published, f"exit {code}")
                results.add(cat, f"{name}: no ε spent, no seed sealed", not kinds.get("spend") and seeds == 0,
                            f"ledger {kinds}, seeds {seeds}")
        else:
            outcome = "refused" if code == 2 else f"exit {code}"
            results.add(cat, f"{name}: exit code 2", code == 2, f"exit {code}")
            results.add(cat, f"{name}: message names {case['expect']!r}", case["expect"].lower() in message.lower(), message[:160])
            results.add(cat, f"{name}: nothing published", not published)
            results.add(cat, f"{name}: no ε reserved or spent, no seed sealed",
                        not kinds.get("reserve") and not kinds.get("spend") and seeds == 0, f"ledger {kinds}, seeds {seeds}")
        table.append({"case": name, "exit": code, "outcome": outcome, "message": message[:200]})
    results.counts["bad inputs tried"] = str(len(table))
    return table


def _refusal_line(output: str) -> str:
    """The CLI's refusal message (from 'release refused:' to the end, whitespace folded)."""
    flat = _flat(output)
    at = flat.find("release refused:")
    if at < 0:
        return ""
    message = flat[at + len("release refused:"):]
    # Stop at what follows the message: a repeat of it, a log line, a logging-handler traceback.
    end = re.search(r"release refused:|--- Logging error ---|\d\d:\d\d:\d\d\.\d+ \|", message)
    return (message[: end.start()] if end else message).strip()


def subprocess_cli(args: list[str], env: dict, cwd: Path) -> tuple[int, str]:
    """The real ``kepsilon`` command as a subprocess: (exit code, stderr + stdout)."""
    result = kepsilon(args, env, cwd)
    return result.returncode, result.stderr + result.stdout


def inprocess_cli(args: list[str], env: dict, cwd: Path) -> tuple[int, str]:
    """The same ``kepsilon`` Typer app invoked in this process (no import cost per case): (exit code, output).

    The audit store, seed key and default cap come from ``env`` for the call; Prefect talks to the
    server named by ``env['PREFECT_API_URL']`` (the CLI itself turns its run's heartbeats off,
    ``kepsilon.cli.release_client_settings``).
    """
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings
    from typer.testing import CliRunner

    from kepsilon.cli import app

    names = ("KEPSILON_AUDIT_DB", "KEPSILON_SEED_KEY_FILE", "KEPSILON_DEFAULT_CAP")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update({name: env[name] for name in names if name in env})
    # The server's login goes with its address: without it the CLI finds the configured server refusing the
    # run and starts a server of its own for every call (5-7 s each).
    server = {PREFECT_API_URL: env["PREFECT_API_URL"], PREFECT_API_AUTH_STRING: env.get("PREFECT_API_AUTH_STRING")}
    try:
        with temporary_settings(updates=server):
            result = CliRunner().invoke(app, args)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    stderr = getattr(result, "stderr", "") if result.stderr_bytes is not None else ""
    return result.exit_code, (stderr or "") + result.output


# --- 4. Leaks --------------------------------------------------------------------------------


EXPLICIT_TEXT_COLUMNS = ("ID", "NAME", "SURNAME", "EMAIL")


def plant_canaries(source: Path, target: Path, rows_with_canaries: int) -> list[str]:
    """Copy ``source`` to ``target`` with a unique canary string in every explicit text column of the
    first ``rows_with_canaries`` records; returns the canaries."""
    frame = pd.read_csv(source, sep=";", dtype=str, keep_default_na=False)
    canaries = []
    for row in range(rows_with_canaries):
        for column in EXPLICIT_TEXT_COLUMNS:
            canary = f"CANARY{column}{uuid.uuid4().hex}"
            if column == "EMAIL":
                canary = f"{canary.lower()}@canary.example"
            frame.loc[row, column] = canary
            canaries.append(canary)
    frame.to_csv(target, sep=";", index=False)
    return canaries


def _files_under(*roots: Path, exclude: tuple[Path, ...] = ()) -> list[Path]:
    found = []
    for root in roots:
        if root.is_file():
            found.append(root)
        elif root.exists():
            found.extend(p for p in root.rglob("*") if p.is_file() and not any(p.is_relative_to(e) for e in exclude))
    return found


def _hits(needles: dict[str, bytes], files: list[Path]) -> dict[str, int]:
    """For each needle, in how many of ``files`` its bytes occur."""
    counts = {name: 0 for name in needles}
    for path in files:
        content = path.read_bytes()
        for name, needle in needles.items():
            if needle in content:
                counts[name] += 1
    return counts


def _audit_dump(db: Path) -> bytes:
    """Every row of every table of the audit store, as text (the store's logical content)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return "\n".join(conn.iterdump()).encode("utf-8", errors="backslashreplace")
    finally:
        conn.close()


def _api_records(env: dict, flow_run_id: str) -> bytes:
    """The flow run's parameters, its task runs and its logs, read back through the Prefect API."""
    script = f"""
import asyncio, json
from uuid import UUID
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterFlowRunId
async def main():
    async with get_client() as client:
        run = await client.read_flow_run(UUID({flow_run_id!r}))
        tasks = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
        logs = await client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])))
        print(json.dumps({{"parameters": run.parameters, "tasks": [t.model_dump(mode="json") for t in tasks],
                           "logs": [l.message for l in logs], "n_logs": len(logs), "n_tasks": len(tasks)}}))
asyncio.run(main())
"""
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"reading the flow run back failed: {result.stderr[-500:]}")
    return result.stdout.encode("utf-8")


def leak_scenario(results: Results, env: dict, work: Path, sample: Path, rows_with_canaries: int = 5) -> dict:
    """Plant canaries and a canary seed, run a release against the real server, search every place."""
    cat = "leaks"
    work.mkdir(parents=True, exist_ok=True)
    source = work / "canary-source.csv"
    canaries = plant_canaries(sample, source, rows_with_canaries)
    seed = secrets.token_bytes(32)
    seed_file = work / "canary-seed.bin"
    seed_file.write_bytes(seed)
    run_env = {**store_env(env, work), "KEPSILON_DEFAULT_CAP": "10"}
    spec_path = write_spec(
        work, spec_dict(work, "leak-release", source={"path": str(source), "delimiter": ";"}, **NO_BUDGET_FAILURES)
    )
    logs = work / "logs"
    logs.mkdir()
    with open(logs / "stdout.txt", "w") as out, open(logs / "stderr.txt", "w") as err:
        run = subprocess.run([sys.executable, "-m", "reliability.leak_run", str(spec_path), str(seed_file)],
                             cwd=ROOT, env={**run_env, "PYTHONPATH": str(ROOT)}, stdout=out, stderr=err, timeout=600)
    results.add(cat, "canary release completes", run.returncode == 0, f"exit {run.returncode}")
    if run.returncode != 0:
        return {}
    reported = json.loads((logs / "stdout.txt").read_text().strip().splitlines()[-1])
    results.add(cat, "the canary seed was the one used (commitment = SHA-256 of the seed)",
                reported["seed_commitment"] == hashlib.sha256(seed).hexdigest())

    needles = {c: c.encode("utf-8") for c in canaries}
    needles["seed (hex)"] = seed.hex().encode()
    needles["seed (HEX)"] = seed.hex().upper().encode()
    needles["seed (raw bytes)"] = seed
    # Positive control: the search finds every canary where it was planted.
    planted = _hits({c: n for c, n in needles.items() if not c.startswith("seed")}, [source])
    results.add(cat, "positive control: every canary is found in the planted source", all(planted.values()),
                f"{sum(planted.values())} of {len(planted)}")
    results.add(cat, "positive control: the seed is found in its own file", seed in seed_file.read_bytes())

    home = Path(env["PREFECT_HOME"])
    prefect_dbs = sorted(home.glob("*.db*"))
    api_dump = work / "api-readback.json"
    api_dump.write_bytes(_api_records(env, reported["flow_run_id"]))
    audit_dump = work / "audit-dump.sql"
    audit_dump.write_bytes(_audit_dump(work / "audit.db"))
    places = {
        "published files": _files_under(work / "out"),
        "captured logs (run stdout/stderr)": _files_under(logs),
        "Prefect server log": _files_under(home / "server.log"),
        "audit store (raw file bytes, WAL included)": sorted(p for p in work.glob("audit.db*") if p.is_file()),
        "audit store (every table, dumped)": [audit_dump],
        "Prefect database (raw file bytes)": prefect_dbs,
        "PREFECT_HOME other files (storage, results)": _files_under(home, exclude=tuple(prefect_dbs) + (home / "server.log",)),
        "flow run parameters, task runs and logs via the API": [api_dump],
    }
    api = json.loads(api_dump.read_text())
    results.add(cat, "API read-back holds the flow run's logs and task runs", api["n_logs"] > 0 and api["n_tasks"] > 0,
                f"{api['n_logs']} logs, {api['n_tasks']} task runs")
    results.add(cat, "Prefect database file exists", bool(prefect_dbs), f"{[p.name for p in prefect_dbs]}")
    matrix = {}
    for place, files in places.items():
        hits = _hits(needles, files)
        leaked = sorted(name for name, n in hits.items() if n)
        matrix[place] = len(files)
        shown = ["seed" if n.startswith("seed") else "a canary" for n in leaked]
        results.add(cat, f"no canary or seed in {place} ({len(files)} files)", not leaked, f"found: {shown}")
    results.counts["canaries × places"] = f"{len(needles)} × {len(places)} ({len(canaries)} identifier canaries + the seed as hex, HEX and raw bytes)"
    return matrix


# --- 5. Tampering ----------------------------------------------------------------------------


def _copy_store(source: Path, target: Path) -> Path:
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    dst = sqlite3.connect(target)
    src.backup(dst)
    src.close()
    dst.close()
    copy_head_log(source, target)
    return target


def _without_triggers(db: Path, statements: Sequence[str], recreate: bool) -> None:
    """Run ``statements`` as an attacker with file access: drop the append-only triggers first,
    optionally put them back afterwards so the schema looks untouched."""
    conn = sqlite3.connect(db)
    triggers = conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'").fetchall()
    for name, _ in triggers:
        conn.execute(f"DROP TRIGGER [{name}]")
    for statement in statements:
        conn.execute(statement)
    if recreate:
        for _, sql in triggers:
            conn.execute(sql)
    conn.commit()
    conn.close()


def _truncate_tail(db: Path, entries: int) -> list[str]:
    conn = sqlite3.connect(db)
    tail = conn.execute("SELECT seq, table_name, row_id FROM chain ORDER BY seq DESC LIMIT ?", (entries,)).fetchall()
    conn.close()
    statements = []
    for seq, table, row_id in tail:
        statements.append(f"DELETE FROM [{table}] WHERE rowid = {int(row_id)}")
        statements.append(f"DELETE FROM chain WHERE seq = {int(seq)}")
    return statements


def tamper_scenario(results: Results, env: dict, work: Path, store: Path) -> int:
    """Edit, delete and truncate copies of a store built by real releases; ``kepsilon audit verify`` must notice."""
    cat = "tampering"
    work.mkdir(parents=True, exist_ok=True)
    pristine = _copy_store(store, work / "pristine.db")
    checkpoint = work / "checkpoint.json"
    made = kepsilon(["audit", "checkpoint", str(checkpoint)], {**env, "KEPSILON_AUDIT_DB": str(pristine)}, work)
    results.add(cat, "checkpoint exported from the real store", made.returncode == 0 and checkpoint.exists(), _flat(made.stderr)[-200:])
    published = rows(pristine, "SELECT MIN(id) FROM releases WHERE outcome = 'published'")[0][0]
    spend = rows(pristine, "SELECT MIN(id) FROM ledger WHERE kind = 'spend'")[0][0]
    n_entries = rows(pristine, "SELECT COUNT(*) FROM chain")[0][0]
    cases = [
        ("untampered copy (control)", [], True, False),
        ("edit: a published release's k changed", [f"UPDATE releases SET k = k + 1 WHERE id = {published}"], False, False),
        ("edit, triggers put back", [f"UPDATE releases SET rows_published = rows_published - 1 WHERE id = {published}"], True, False),
        ("edit: an ε spend entry lowered", [f"UPDATE ledger SET nano_epsilon = 1 WHERE id = {spend}"], True, False),
        ("delete: an ε spend entry", [f"DELETE FROM ledger WHERE id = {spend}"], True, False),
        ("delete: a row and its chain entry", [f"DELETE FROM ledger WHERE id = {spend}",
                                              f"DELETE FROM chain WHERE table_name = 'ledger' AND row_id = {spend}"], True, False),
        ("insert: a row outside the chain", ["INSERT INTO checks (release, name, success) "
                                            f"VALUES ({published}, 'forged', 1)"], True, False),
        ("truncate: last 3 entries removed (checkpoint given)", "truncate", True, True),
    ]
    tried = 0
    for number, (name, statements, recreate, with_checkpoint) in enumerate(cases):
        copy = _copy_store(pristine, work / f"case-{number}.db")
        if statements == "truncate":
            statements = _truncate_tail(copy, 3)
        _without_triggers(copy, statements, recreate)
        case_env = {**env, "KEPSILON_AUDIT_DB": str(copy)}
        plain = kepsilon(["audit", "verify"], case_env, work)
        with_cp = kepsilon(["audit", "verify", "--checkpoint", str(checkpoint)], case_env, work)
        if not statements:
            results.add(cat, f"{name}: verify passes, with and without the checkpoint",
                        plain.returncode == 0 and with_cp.returncode == 0, f"exit {plain.returncode}/{with_cp.returncode}")
            continue
        tried += 1
        results.add(cat, f"{name}: verify --checkpoint exits 2 and says BROKEN",
                    with_cp.returncode == 2 and "BROKEN" in with_cp.stdout, f"exit {with_cp.returncode}")
        if not with_checkpoint:
            results.add(cat, f"{name}: verify (no checkpoint) exits 2", plain.returncode == 2, f"exit {plain.returncode}")
        else:
            # A clean tail cut leaves a consistent chain: only the exported head reveals it.
            results.add(cat, f"{name}: detected only against the checkpoint (verify alone: exit {plain.returncode})",
                        "truncated" in _flat(with_cp.stdout), f"entries before {n_entries}")
    results.counts["tamper cases"] = f"{tried} tampered copies + 1 control, of a store with {n_entries} chain entries"
    return tried


# --- 6. Noise --------------------------------------------------------------------------------


NOISE_CASES: tuple[tuple[Literal["diameter", "bounds"], float, float], ...] = (
    # (scale basis, class diameter or bound width, ε) -> b = width / ε
    ("diameter", 1.0, 1.0),
    ("diameter", 10.0, 1.0),
    ("diameter", 80.0, 2.0),
    ("diameter", 0.3, 1.0),
    ("diameter", 1000.0, 1.0),
    ("bounds", 100.0, 50.0),
)


def _constructed_class(basis: str, width: float, n: int, epsilon: float) -> tuple[pd.DataFrame, SimpleNamespace]:
    """One equivalence class of ``n`` records whose values span exactly ``width`` (diameter mode), or
    sit mid-way between public bounds ``width`` apart (bounds mode). Published values are clamped to the
    bounds, so in diameter mode the bounds lie 6 b beyond the class: clamping touches a draw with
    probability e^−6 / 2 (a handful of 5,000), and the public grid stays near b/64 (wider bounds would
    make it coarse enough for the KS test to see the rounding)."""
    if basis == "diameter":
        values = np.where(np.arange(n) % 2 == 0, 0.0, width)
        margin = 6 * width / epsilon
        quasi = SimpleNamespace(column="v", lower=-margin, upper=width + margin)
    else:
        values = np.full(n, width / 2)
        quasi = SimpleNamespace(column="v", lower=0.0, upper=width)
    return pd.DataFrame({"v": values}), quasi


def noise_scenario(results: Results, samples: int, seed: int = 20240611) -> None:
    """KS fit of perturb's noise to Laplace(b), grid membership, and a wrong scale caught."""
    from scipy import stats

    from kepsilon.engine.perturb import perturb, public_grid

    cat = "noise"
    for case, (basis, width, epsilon) in enumerate(NOISE_CASES):
        rng = np.random.default_rng([seed, case])  # each case's draws its own, whatever the cases before it
        b = width / epsilon
        frame, quasi = _constructed_class(basis, width, samples, epsilon)
        result = perturb(frame, np.zeros(samples, dtype=int), [quasi], {"v": epsilon}, basis, rng)
        noise = result.frame["v"].to_numpy() - frame["v"].to_numpy()
        label = f"{basis} b={b:g} ({samples} samples)"
        results.add(cat, f"{label}: scale reported = width/ε", np.allclose(result.scales["v"], b), "")
        fit = stats.kstest(noise, "laplace", args=(0.0, b))
        results.add(cat, f"{label}: KS fit to Laplace(b)", fit.pvalue > 1e-3, f"D={fit.statistic:.4f}, p={fit.pvalue:.3g}")
        grid = public_grid(quasi.lower, quasi.upper, epsilon)
        on_grid = np.all(result.frame["v"].to_numpy() / grid == np.round(result.frame["v"].to_numpy() / grid))
        results.add(cat, f"{label}: every output on the public grid 2^(ceil(log2((upper-lower)/ε))-10)", bool(on_grid), f"grid {grid:g}")
        mean_abs = float(np.abs(noise).mean())
        results.add(cat, f"{label}: mean |noise| within 4 SE of b", abs(mean_abs - b) < 4 * b / math.sqrt(samples),
                    f"mean |noise| {mean_abs:.4g}")
        # A sampler with the wrong scale (ε taken as 0.8 ε: b 25% too large) must fail the same test.
        wrong = perturb(frame, np.zeros(samples, dtype=int), [quasi], {"v": epsilon * 0.8}, basis, rng)
        wrong_noise = wrong.frame["v"].to_numpy() - frame["v"].to_numpy()
        wrong_fit = stats.kstest(wrong_noise, "laplace", args=(0.0, b))
        results.add(cat, f"{label}: a 25% too large scale is rejected by the same test", wrong_fit.pvalue < 1e-6,
                    f"D={wrong_fit.statistic:.4f}, p={wrong_fit.pvalue:.3g}")
    results.counts["noise scales × samples"] = f"{len(NOISE_CASES)} × {samples} (plus {len(NOISE_CASES)} wrong-scale runs)"


# --- 7. An operator's bad day: tampered or broken stores, unusable folders, locks ------------------


BAD_DAY_CATEGORY = "bad day"


def _figures(db: Path, population: str = POPULATION) -> dict:
    """Releases published, ε spent (from spend entries), records by outcome, ledger entries."""
    spent = sum(n for (n,) in rows(db, "SELECT nano_epsilon FROM ledger WHERE kind = 'spend' AND population_id = ?",
                                   (population,))) / 10**9
    outcomes = [o for (o,) in rows(db, "SELECT outcome FROM releases ORDER BY id")]
    return {"published": outcomes.count("published"), "spent": spent, "records": outcomes,
            "reserves": ledger_kinds(db).get("reserve", 0), "seeds": rows(db, "SELECT COUNT(*) FROM sealed_seeds")[0][0]
            if db.exists() else 0}


def _one_line(stderr: str, prefix: str) -> str:
    """The CLI's one line starting with ``prefix`` (e.g. 'release refused:'), folded; '' if absent."""
    flat = _flat(stderr)
    at = flat.find(prefix)
    return flat[at:at + 1200] if at >= 0 else ""


class BadDay:
    """One bad-day scenario's work folder, store and spec, and its row in the report."""

    def __init__(self, results: Results, env: dict, base: Path, name: str, source: Path, cap: float = 10.0):
        self.results, self.name = results, name
        self.work = base / re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
        self.work.mkdir(parents=True, exist_ok=True)
        self.env = store_env(env, self.work)
        self.env.pop("KEPSILON_DEFAULT_CAP", None)
        self.db = self.work / "audit.db"
        self.source = source
        self.cap = cap

    def spec(self, release_id: str, **changes) -> Path:
        spec = spec_dict(self.work, release_id, source={"path": str(self.source), "delimiter": ";"}, **NO_BUDGET_FAILURES)
        spec.update(changes)
        return write_spec(self.work, spec)

    def release(self, release_id: str, fault: str | None = None, env: dict | None = None, **changes) -> subprocess.CompletedProcess:
        return kepsilon(["release", str(self.spec(release_id, **changes))], env or self.env, self.work, fault=fault)

    def check(self, what: str, ok: bool, detail: str = "") -> bool:
        return self.results.add(BAD_DAY_CATEGORY, f"{self.name}: {what}", ok, detail)

    def refused_cleanly(self, run, release_id: str, mentions: str, before: dict, figures_after: bool = True) -> None:
        """Exit 2, one line naming the problem, no traceback, no new ledger entry, nothing under the final name."""
        line = _one_line(run.stderr, "release refused:")
        self.check("exit 2 with one line naming the problem", run.returncode == 2 and mentions.lower() in line.lower(),
                   f"exit {run.returncode}: {line[:200] or _flat(run.stderr)[-200:]}")
        self.check("no traceback", "Traceback" not in run.stderr + run.stdout)
        after = _figures(self.db) if self.db.exists() and figures_after else before
        self.check("refused before any ε (no new reservation, spend or seed)",
                   (after["reserves"], after["spent"], after["seeds"]) == (before["reserves"], before["spent"], before["seeds"]),
                   f"before {before['reserves']}/{before['spent']}/{before['seeds']}, after {after['reserves']}/{after['spent']}/{after['seeds']}")
        final = Path(spec_dict(self.work, release_id)["output_dir"]) / release_id
        self.check("nothing under the final name", not final.exists())

    def row(self, outcome: str, refused_before_epsilon: bool | None, figures: dict | None = None) -> dict:
        """The report's row; ``figures`` for a store that can no longer be read (its state before the damage)."""
        figures = figures or _figures(self.db)
        records = ", ".join(f"{figures['records'].count(o)} {o}" for o in ("published", "failed", "refused") if figures["records"].count(o))
        return {"scenario": self.name, "outcome": outcome, "releases": figures["published"], "epsilon": figures["spent"],
                "records": records or "none", "refused_before_epsilon": refused_before_epsilon}


def _checkpointed_copy(source_dir: Path, target_dir: Path, keep_wal: bool) -> None:
    """Copy an audit store (with its WAL, head log and seed key) as it is on disk, WAL merged unless ``keep_wal``."""
    target_dir.mkdir(parents=True, exist_ok=True)
    for name in ("audit.db", "audit.db-wal", "seed.key"):
        if (source_dir / name).exists():
            shutil.copy2(source_dir / name, target_dir / name)
    copy_head_log(source_dir / "audit.db", target_dir / "audit.db")
    if not keep_wal:
        conn = sqlite3.connect(target_dir / "audit.db")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        (target_dir / "audit.db-wal").unlink(missing_ok=True)
        (target_dir / "audit.db-shm").unlink(missing_ok=True)


def tamper_over_cap(results: Results, env: dict, base: Path, source: Path) -> dict:
    """Cap 2: two releases of ε 1; the first one's ledger ε set to 0 behind the triggers; a third is refused."""
    day = BadDay(results, env, base, "tamper then release over the cap", source)
    set_cap(day.env, day.work, 2.0)
    for number in (1, 2):
        run = day.release(f"capped-{number}")
        day.check(f"release {number} of ε 1 published", run.returncode == 0, _flat(run.stderr)[-200:])
    honest = _figures(day.db)  # what was really spent, before the ledger is falsified
    _without_triggers(day.db, ["UPDATE ledger SET nano_epsilon = 0 WHERE kind IN ('reserve', 'spend') AND release_id = 'capped-1'"], True)
    before = _figures(day.db)
    third = day.release("capped-3")
    day.refused_cleanly(third, "capped-3", "kepsilon audit verify", before)
    return day.row("refused: store does not verify", True, figures=honest)


def broken_stores(results: Results, env: dict, base: Path, source: Path) -> list[dict]:
    """One real release killed after its record was committed (so its WAL holds it), then copies of that
    store with a flipped byte, cut in half, and with the -wal deleted: each refuses the rerun, and the
    officers' commands answer with one line instead of a traceback."""
    origin = BadDay(results, env, base, "broken store origin", source)
    set_cap(origin.env, origin.work, 10.0)
    killed = origin.release("broken", fault="after-audit-commit")
    origin.check("origin release killed after its record was committed", killed.returncode == -9, f"exit {killed.returncode}")
    origin.check("its WAL holds the commit", (origin.work / "audit.db-wal").exists())
    table = []
    for name, keep_wal, damage in (
        ("byte flip", False, _flip_a_byte),
        ("truncation", False, _cut_in_half),
        ("-wal deletion (rollback)", True, lambda work: (work / "audit.db-wal").unlink()),
    ):
        day = BadDay(results, env, base, name, source)
        _checkpointed_copy(origin.work, day.work, keep_wal)
        before = _figures(day.db)
        damage(day.work)
        damaged = _store_bytes(day.work)
        run = day.release("broken")
        day.refused_cleanly(run, "broken", "audit store", before, figures_after=False)
        day.check("the damaged store was not written to (file, WAL and head log unchanged)", _store_bytes(day.work) == damaged)
        for command in (["audit", "verify"], ["audit", "budget", POPULATION]):
            answer = kepsilon(command, day.env, day.work)
            day.check(f"`kepsilon {' '.join(command[:2])}` exits 2 with one line, no traceback",
                      answer.returncode == 2 and "Traceback" not in answer.stderr + answer.stdout,
                      f"exit {answer.returncode}: {_flat(answer.stderr + answer.stdout)[-160:]}")
        table.append(day.row("refused: store does not verify", True, figures=before))
    return table


def _store_bytes(work: Path) -> dict[str, bytes]:
    """The store's file, its head log and its WAL's content (an empty or absent WAL holds nothing)."""
    found = {name: (work / name).read_bytes() for name in ("audit.db", "audit.db-wal") if (work / name).exists()}
    log = head_log_path(work / "audit.db")
    if log.exists():
        found["head log"] = log.read_bytes()
    if not found.get("audit.db-wal"):
        found.pop("audit.db-wal", None)
    return found


def _flip_a_byte(work: Path) -> None:
    """Flip one bit of a stored text (the release id as stored in the ledger and release rows)."""
    data = bytearray((work / "audit.db").read_bytes())
    at = data.rfind(b"broken")
    data[at + 2] ^= 0x01
    (work / "audit.db").write_bytes(bytes(data))


def _cut_in_half(work: Path) -> None:
    path = work / "audit.db"
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size // 2)


def unusable_folders(results: Results, env: dict, base: Path, source: Path) -> list[dict]:
    """An unwritable output folder and a file where the folder should be: refused before any ε."""
    from .harness import make_unwritable

    table = []
    for name in ("unwritable output folder", "file as output folder"):
        day = BadDay(results, env, base, name, source)
        set_cap(day.env, day.work, 10.0)
        target = day.work / "out"
        undo = None
        if name.startswith("unwritable"):
            target.mkdir()
            undo = make_unwritable(target)
            if undo is None:
                day.check("skipped: neither mode 0555 nor chattr +i makes a folder unwritable here", True)
                continue
        else:
            target.write_text("a file, not a folder")
        before = _figures(day.db)
        try:
            run = day.release("unusable")
        finally:
            if undo is not None:
                undo()
        day.refused_cleanly(run, "unusable", "output_dir", before)
        table.append(day.row("refused: output_dir", True))
    return table


def file_size_limit(results: Results, env: dict, base: Path, source: Path) -> dict:
    """``ulimit -f`` below the expected output (EFBIG while publishing): refused before ε; without it, one spend."""
    import resource

    from kepsilon.tasks.preflight import expected_output_bytes

    day = BadDay(results, env, base, "EFBIG (file-size limit) during publish", source)
    set_cap(day.env, day.work, 10.0)
    # Half the expected data file, and above SQLite's 32 KiB shared-memory file, so the store still opens.
    limit = max(expected_output_bytes(source.stat().st_size)[0] // 2, 48 * 1024)

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    before = _figures(day.db)
    run = subprocess.run([str(BIN / "kepsilon"), "release", str(day.spec("limited"))], cwd=day.work, env=day.env,
                         capture_output=True, text=True, timeout=600, preexec_fn=limited)
    day.refused_cleanly(run, "limited", "ulimit -f", before)
    again = day.release("limited")
    figures = _figures(day.db)
    day.check("rerun without the limit publishes with one spend", again.returncode == 0 and figures["spent"] == 1.0
              and figures["reserves"] == 1, f"exit {again.returncode}, spent {figures['spent']}")
    return day.row("refused before ε; rerun published", True)


def _hold_lock(db: Path, seconds: float, start: threading.Event) -> _LockHolder:
    """Hold the store's write lock (BEGIN IMMEDIATE) for ``seconds`` in a thread, from when ``start`` is set."""
    taken = threading.Event()

    def hold():
        start.wait()
        conn = sqlite3.connect(db, timeout=120, check_same_thread=False)
        conn.execute("BEGIN IMMEDIATE")
        taken.set()
        time.sleep(seconds)
        conn.rollback()
        conn.close()

    thread = _LockHolder(hold, taken)
    thread.start()
    return thread


class _LockHolder(threading.Thread):
    """The thread that holds the store's write lock; ``taken`` is set once it holds it."""

    def __init__(self, hold: Callable[[], None], taken: threading.Event) -> None:
        super().__init__(target=hold, daemon=True)
        self.taken = taken


def _run_until(args: list[str], env: dict, cwd: Path, trigger, fired: threading.Event) -> tuple[int, str, str]:
    """Run the real ``kepsilon`` command; set ``fired`` as soon as ``trigger(stderr so far)`` is true."""
    process = subprocess.Popen([str(BIN / "kepsilon"), *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    err: list[str] = []
    out: list[str] = []
    readers = [threading.Thread(target=lambda s=stream, b=buf: b.extend(iter(s.readline, "")), daemon=True)
               for stream, buf in ((process.stderr, err), (process.stdout, out))]
    for reader in readers:
        reader.start()
    while process.poll() is None and not fired.is_set():
        if trigger("".join(err)):
            fired.set()
        time.sleep(0.002)
    fired.set()
    process.wait(timeout=900)
    for reader in readers:
        reader.join()
    return process.returncode, "".join(out), "".join(err)


def lock_held(results: Results, env: dict, base: Path, source: Path, seconds: float, busy_timeout: float) -> dict:
    """Another writer takes the store's lock as the release has read its input and holds it ``seconds``."""
    day = BadDay(results, env, base, f"lock held {seconds:g} s (busy timeout {busy_timeout:g} s)", source)
    set_cap(day.env, day.work, 10.0)
    run_env = {**day.env, "KEPSILON_AUDIT_BUSY_TIMEOUT": str(busy_timeout)}
    spec = day.spec("locked")
    fired = threading.Event()
    holder = _hold_lock(day.db, seconds, fired)
    before = _figures(day.db)
    code, out, err = _run_until(["release", str(spec)], run_env, day.work, lambda text: "records in" in text, fired)
    holder.join()
    run = subprocess.CompletedProcess([], code, out, err)
    day.check("says it is waiting for the lock, and for how long",
              "waiting for the audit store lock" in _flat(err) and "will wait up to" in _flat(err), _flat(err)[-200:])
    if seconds < busy_timeout:
        figures = _figures(day.db)
        day.check("published after the wait, one spend", code == 0 and figures["spent"] == 1.0 and figures["reserves"] == 1,
                  f"exit {code}, spent {figures['spent']}")
        return day.row("published after waiting", None)
    day.refused_cleanly(run, "locked", "locked by another process", before)
    return day.row("refused: store locked", True)


def late_lock(results: Results, env: dict, base: Path, source: Path, seconds: float, busy_timeout: float, rerun_cli=None) -> dict:
    """A lock taken when the release is completely staged (held there until the lock is taken) and held
    ``seconds``: the record cannot be written, nothing appears under the final name, and the rerun publishes with one spend.

    ``rerun_cli(args, env, cwd) -> (exit code, output)`` runs the rerun (default: ``subprocess_cli``).
    """
    day = BadDay(results, env, base, f"late lock, held {seconds:g} s (busy timeout {busy_timeout:g} s)", source)
    set_cap(day.env, day.work, 10.0)
    hold = day.work / "hold"  # the release waits, fully staged, until the lock is taken (kepsilon/faults.py)
    run_env = {**day.env, "KEPSILON_AUDIT_BUSY_TIMEOUT": str(busy_timeout),
               "KEPSILON_HOLD_AT": "before-audit-commit", "KEPSILON_HOLD_FILE": str(hold)}
    spec = day.spec("late")
    fired = threading.Event()
    holder = _hold_lock(day.db, seconds, fired)
    def stop_holding_once_the_lock_is_taken() -> None:
        if holder.taken.wait(900):
            hold.touch()

    releaser = threading.Thread(target=stop_holding_once_the_lock_is_taken, daemon=True)
    releaser.start()
    reached = hold.with_name("hold.reached")
    code, out, err = _run_until(["release", str(spec)], run_env, day.work, lambda _: reached.exists(), fired)
    holder.join()
    releaser.join()
    final = day.work / "out" / "late"
    line = _one_line(err, "release failed:")
    day.check("lock taken while the release was staging", holder.taken.is_set() and bool(line), _flat(err)[-200:])
    day.check("exit 2, one line: recorded as failed, or the reservation stands and a rerun resumes it",
              code == 2 and ("recorded as failed" in line or "the reservation stands" in line), line[-300:])
    day.check("no traceback", "Traceback" not in out + err)
    day.check("nothing under the final name", not final.exists())
    rerun_code, _ = (rerun_cli or subprocess_cli)(["release", str(spec)], day.env, day.work)
    figures = _figures(day.db)
    day.check("rerun publishes with the same reservation and seed (one spend, one draw)",
              rerun_code == 0 and figures["reserves"] == 1 and figures["spent"] == 1.0 and figures["seeds"] == 1,
              f"exit {rerun_code}, reserves {figures['reserves']}, spent {figures['spent']}, seeds {figures['seeds']}")
    return day.row("failed after ε, then resumed", False)


def moved_output(results: Results, env: dict, base: Path, source: Path) -> dict:
    """A release dies after its noise; the rerun names another output folder: same reservation and noise."""
    day = BadDay(results, env, base, "moved output folder", source)
    set_cap(day.env, day.work, 10.0)
    killed = day.release("moved", fault="before-audit-commit")
    staged = (day.work / "out" / ".moved.staging" / "data.csv")
    staged_bytes = staged.read_bytes() if staged.exists() else None
    elsewhere = day.work / "elsewhere"
    rerun = day.release("moved", output_dir=str(elsewhere))
    figures = _figures(day.db)
    day.check("killed after its noise", killed.returncode == -9, f"exit {killed.returncode}")
    day.check("rerun into the other folder publishes there", rerun.returncode == 0 and (elsewhere / "moved" / "manifest.json").exists(),
              _flat(rerun.stderr)[-200:])
    day.check("one reservation, one spend, one seed", (figures["reserves"], figures["spent"], figures["seeds"]) == (1, 1.0, 1),
              f"{figures['reserves']}/{figures['spent']}/{figures['seeds']}")
    day.check("same noise: the published data.csv is the bytes the killed run staged",
              staged_bytes is not None and (elsewhere / "moved" / "data.csv").read_bytes() == staged_bytes)
    return day.row("killed after noise, resumed elsewhere", False)


def bad_day_scenario(results: Results, env: dict, base: Path, source: Path, lock_seconds=(30, 90), busy_timeout: float = 60,
                     late_lock_seconds: float = 90, workers: int = 2) -> list[dict]:
    """Every bad-day scenario (issue 16); returns the report's rows. Independent folders, ``workers`` at a time."""
    from concurrent.futures import ThreadPoolExecutor

    base.mkdir(parents=True, exist_ok=True)
    jobs = [
        lambda: [tamper_over_cap(results, env, base, source)],
        lambda: broken_stores(results, env, base, source),
        lambda: unusable_folders(results, env, base, source),
        lambda: [file_size_limit(results, env, base, source)],
        *[(lambda s=s: [lock_held(results, env, base, source, s, busy_timeout)]) for s in lock_seconds],
        lambda: [late_lock(results, env, base, source, late_lock_seconds, busy_timeout)],
        lambda: [moved_output(results, env, base, source)],
    ]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        tables = list(pool.map(lambda job: job(), jobs))
    table = [row for rows_ in tables for row in rows_]
    results.counts["bad-day scenarios"] = f"{len(table)} (lock waits {', '.join(f'{s:g} s' for s in lock_seconds)}, busy timeout {busy_timeout:g} s)"
    return table


# --- 8. The orchestrator dies under a release (issue 24, item 2) ------------------------------------

ORCHESTRATOR_CATEGORY = "orchestrator lost"
# Where the Prefect server is killed: with ε reserved (no noise yet), with the noise drawn, and with the
# release completely staged but its record not yet committed.
ORCHESTRATOR_KILL_POINTS = ("after-reservation", "after-noise", "before-audit-commit")
STORE_SAYS = "the audit store says:"


def _store_state(db: Path, release_id: str) -> str:
    """What the store records for ``release_id``, read here independently of the CLI's own reading."""
    outcomes = [o for (o,) in rows(db, "SELECT outcome FROM releases WHERE release_id = ? ORDER BY id", (release_id,))]
    if "published" in outcomes:
        return "published"
    if "failed" in outcomes:
        return "failed"
    open_reservations = rows(db, "SELECT COUNT(*) FROM ledger r WHERE r.release_id = ? AND r.kind = 'reserve' AND NOT EXISTS "
                                 "(SELECT 1 FROM ledger v WHERE v.reservation_id = r.id AND v.kind = 'void')", (release_id,))
    return "reserved" if open_reservations and open_reservations[0][0] else "nothing"


def orchestrator_death(results: Results, base: Path, source: Path, point: str, max_seconds: float = 90,
                       migrated_database: Path | None = None) -> dict:
    """A release held at ``point`` while its Prefect server is SIGKILLed (with its process group), then let go.

    ``migrated_database``: a Prefect database already migrated, copied in as the server's own (the test suite's,
    which spares each fresh server Prefect's migrations); what the scenario checks does not depend on it.

    The release runs in the CLI's process and does not need the server: what the CLI tells the user must
    be what the audit store records — published (and where), failed (recorded) or still reserved — in one
    line, with the matching exit code, no traceback, and within ``max_seconds`` of the kill (Prefect's own
    retries used to take about four minutes and end in ``release failed: ConnectError``).
    """
    import signal

    from .harness import prefect_server

    name = f"server killed at {point}"
    work = base / re.sub(r"[^a-z0-9]+", "-", name)
    work.mkdir(parents=True, exist_ok=True)
    check = lambda what, ok, detail="": results.add(ORCHESTRATOR_CATEGORY, f"{name}: {what}", ok, detail)  # noqa: E731
    servers: list = []
    release_id = f"orchestrator-{point}"
    spec = write_spec(work, spec_dict(work, release_id, source={"path": str(source), "delimiter": ";"}, **NO_BUDGET_FAILURES))
    hold = work / "hold"
    with prefect_server(work / "prefect", started=servers, database=migrated_database) as server_env:
        env = {**store_env(server_env, work), "KEPSILON_HOLD_AT": point, "KEPSILON_HOLD_FILE": str(hold),
               "KEPSILON_REPORTS_DIR": str(work / "reports")}
        env.pop("KEPSILON_DEFAULT_CAP", None)
        set_cap(env, work, 10.0)
        process = subprocess.Popen([str(BIN / "kepsilon"), "release", str(spec)], cwd=work, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        reached = hold.with_name("hold.reached")
        deadline = time.monotonic() + 600
        while not reached.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        check("the release reached the point", reached.exists())
        os.killpg(servers[0].pid, signal.SIGKILL)
        servers[0].wait()
        killed = time.monotonic()
        hold.touch()
        out, err = finish(process, 600)
        seconds = time.monotonic() - killed
    lines = [line for line in (out + err).splitlines() if STORE_SAYS in line]
    said = lines[0].split(STORE_SAYS, 1)[1].strip() if len(lines) == 1 else ""
    state = _store_state(work / "audit.db", release_id)
    told = {"published": " published at ", "failed": " failed, recorded", "reserved": " stays reserved",
            "nothing": "nothing reserved"}[state]
    check("one line saying what the store records", len(lines) == 1 and told in said,
          f"store: {state}; CLI: {_flat(err)[-300:]}")
    if state == "published":
        folder = work / "out" / release_id
        check("the line names the published folder, which holds the manifest",
              str(folder) in said and (folder / "manifest.json").exists(), said[:200])
    check("exit code matches the store (0 published, 2 otherwise)",
          process.returncode == (0 if state == "published" else 2), f"exit {process.returncode}, store {state}")
    (work / "cli-output.txt").write_text(out + "\n--- stderr ---\n" + err, encoding="utf-8")
    check("no traceback, no 'release failed'", "Traceback" not in out + err and "release failed" not in err,
          _flat(err)[-200:])
    check(f"answered within {max_seconds:g} s of the kill", seconds < max_seconds, f"{seconds:.1f} s")
    figures = _figures(work / "audit.db")
    check("at most one reservation and one spend", figures["reserves"] <= 1 and figures["spent"] <= 1.0,
          f"reserves {figures['reserves']}, spent {figures['spent']}")
    return {"point": point, "store": state, "exit": process.returncode, "seconds": round(seconds, 1), "line": said}
# --- 9. Bad settings and same-id races (issue 24, items 4 and 5) ----------------------------------
#
# Kept apart from the blocks above: absurd values for every CLI option and environment variable and
# malformed Parquet sources, each through the real command; then three processes releasing the same
# id at once. The bar for bad input: one line naming the option, variable or column (never the value
# given), exit 2 — or success — never a traceback, nothing reserved or spent by a refusal.

SETTINGS_CATEGORY = "bad settings"
RACE_ID_CATEGORY = "same-id races"
ABSURD_VALUES = ("1e10", "1e308", "inf", "nan", "-1", "0", "abc")
IN_PROGRESS_MESSAGE = "is already being published by another run"


def _quotes(line: str, value: str) -> bool:
    """Whether the line repeats the value given (a one-digit number may occur in the rule itself, unquoted)."""
    if value.lstrip("-").isdigit() and len(value.lstrip("-")) == 1:
        return f"'{value}'" in line
    return value.lower() in line.lower().replace("kepsilon", "")


def _message_lines(output: str) -> list[str]:
    """The output's lines that are not Prefect's run log (timestamped) or its rich tables: what the CLI said."""
    said = []
    for line in output.splitlines():
        text = line.strip()
        if not text or re.match(r"\d\d:\d\d:\d\d\.\d+ \|", text) or text[0] in "┏┃┡│└━╭╰┗":
            continue
        if re.search(r"\d+/\d+ partitions", text):  # a stage's progress bar
            continue
        said.append(text)
    return said


def _settings_case(results: Results, name: str, args: list[str], env: dict, work: Path, names: tuple[str, ...],
                   value: str, before: dict, accepted: bool | None = None) -> dict:
    """Run one case; check: no traceback, exit 0 or 2, a refusal in one line naming one of ``names``, nothing spent."""
    run = kepsilon(args, env, work)
    output = run.stderr + run.stdout
    said = [line for line in _message_lines(run.stderr) if not line.startswith("note:")]
    if args[0] == "check" and not said and run.returncode == 2:
        # A check that ran prints its verdicts on stdout and ends with one "would be refused: …" line: that line.
        said = [line for line in _message_lines(run.stdout) if line.startswith("would be refused:")]
    results.add(SETTINGS_CATEGORY, f"{name}: no traceback", "Traceback" not in output, _flat(output)[-160:])
    results.add(SETTINGS_CATEGORY, f"{name}: exit 0 or 2", run.returncode in (0, 2), f"exit {run.returncode}")
    if accepted is not None:
        results.add(SETTINGS_CATEGORY, f"{name}: {'accepted' if accepted else 'refused'}",
                    (run.returncode == 0) == accepted, f"exit {run.returncode}: {_flat(output)[-160:]}")
    if run.returncode == 2:
        line = said[-1] if said else ""
        results.add(SETTINGS_CATEGORY, f"{name}: one line naming {names[0]}",
                    len(said) == 1 and any(n.lower() in line.lower().replace("-", "_") for n in names), line[:200])
        # The case's own folder is named after the case (and so holds the value): a store path under it is
        # the harness's choice, not the value repeated; anything else that quotes the value still fails.
        results.add(SETTINGS_CATEGORY, f"{name}: the value is not repeated",
                    not _quotes(line.replace(str(work), "<case folder>"), value), line[:200])
        after = _figures(work / "audit.db")
        results.add(SETTINGS_CATEGORY, f"{name}: nothing reserved or spent",
                    (after["reserves"], after["spent"], after["seeds"]) == (before["reserves"], before["spent"], before["seeds"]),
                    f"reserves {after['reserves']}, spent {after['spent']}, seeds {after['seeds']}")
    return {"case": name, "exit": run.returncode, "line": (said[-1] if said else "")[:160]}


def _settings_work(base: Path, name: str, env: dict, cap: float | None = 10.0) -> tuple[Path, dict]:
    work = base / re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    work.mkdir(parents=True, exist_ok=True)
    case_env = store_env(env, work)
    case_env.pop("KEPSILON_DEFAULT_CAP", None)
    if cap is not None:
        set_cap(case_env, work, cap)
    return work, case_env


def _bad_text_parquet(source: Path, target: Path, column: str) -> Path:
    """The CSV sample as Parquet (text columns as text), one value of ``column`` made invalid UTF-8."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    frame = pd.read_csv(source, sep=";", dtype=str, keep_default_na=False)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    values = [v.encode("utf-8") for v in frame[column]]
    values[len(values) // 2] = values[len(values) // 2][:1] + b"\xff" + values[len(values) // 2][1:]
    offsets = np.cumsum([0] + [len(v) for v in values]).astype(np.int32)
    broken = pa.StringArray.from_buffers(len(values), pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"".join(values)))
    table = table.set_column(table.column_names.index(column), column, broken)
    pq.write_table(table, target)
    return target


def _wrong_types_parquet(source: Path, target: Path) -> Path:
    """The sample as Parquet with HEIGHT (an ε-quasi) stored as text and YOB (a k-quasi) as booleans."""
    frame = pd.read_csv(source, sep=";", dtype=str, keep_default_na=False)
    frame["YOB"] = frame["YOB"].astype(int) % 2 == 0
    frame.to_parquet(target, index=False)
    return target


def malformed_parquet(results: Results, env: dict, base: Path, source: Path) -> list[dict]:
    """Invalid UTF-8 in a text column (memory and dask engines, and ``kepsilon init``), wrong column types, a
    truncated file: each refused in one line, exit 2, before any ε."""
    table = []
    cases: list[tuple[str, str, str | None, str, tuple[str, ...]]] = []
    for engine in ("memory", "dask"):
        for text_column in ("NAME", "RACE"):
            cases.append((f"Parquet, invalid UTF-8 in {text_column} ({engine})", "utf8", text_column, engine, (text_column,)))
    cases.append(("Parquet, wrong column types", "types", None, "memory", ("YOB", "HEIGHT")))
    cases.append(("Parquet, truncated file", "truncated", None, "memory", ("Parquet",)))
    for name, kind, column, engine, names in cases:
        work, case_env = _settings_work(base, name, env)
        target = work / "source.parquet"
        if kind == "utf8" and column is not None:  # every utf8 case names its column
            _bad_text_parquet(source, target, column)
        elif kind == "types":
            _wrong_types_parquet(source, target)
        else:
            _wrong_types_parquet(source, work / "whole.parquet")
            data = (work / "whole.parquet").read_bytes()
            target.write_bytes(data[: len(data) // 2])
        spec = spec_dict(work, "parquet-case", source={"path": str(target)}, **NO_BUDGET_FAILURES)
        if engine == "dask":
            spec["execution"] = {"engine": "dask", "partitions": 2, "workers": 1}
        path = write_spec(work, spec, name="spec")
        before = _figures(work / "audit.db")
        table.append(_settings_case(results, name, ["release", str(path)], case_env, work, names, "\xff", before, accepted=False))
        if kind == "utf8" and engine == "memory" and column == "NAME":
            table.append(_settings_case(results, f"{name}: kepsilon init", ["init", str(target), "-o", str(work / "init.yaml")],
                                        case_env, work, names, "\xff", before, accepted=False))
    return table


def option_matrix(results: Results, env: dict, base: Path, source: Path, values=ABSURD_VALUES) -> list[dict]:
    """Absurd numbers for every option of ``release``, ``advise``, ``init`` and ``audit`` (subprocess runs)."""
    table = []
    work, case_env = _settings_work(base, "options", env, cap=1000.0)  # room for every accepted release
    spec = write_spec(work, spec_dict(work, "options", source={"path": str(source), "delimiter": ";"}, **NO_BUDGET_FAILURES), name="spec")
    matrix: list[tuple[str, list[str], tuple[str, ...]]] = []
    for value in values:
        matrix += [
            (f"release --k {value}", ["release", str(spec), "--k", value], ("k",)),
            (f"release --epsilon {value}", ["release", str(spec), "--epsilon", value], ("epsilon",)),
            (f"release --algorithm {value}", ["release", str(spec), "--algorithm", value], ("algorithm",)),
            (f"check --k {value}", ["check", str(spec), "--k", value], ("k",)),
            (f"check --epsilon {value}", ["check", str(spec), "--epsilon", value], ("epsilon",)),
            (f"advise --k {value}", ["advise", str(spec), "--k", value, "--draws", "2"], ("k",)),
            (f"advise --epsilon {value}", ["advise", str(spec), "--epsilon", value, "--k", "2", "--draws", "2"], ("epsilon",)),
            (f"advise --draws {value}", ["advise", str(spec), "--k", "2", "--epsilon", "1", "--draws", value], ("draws",)),
            (f"advise --target-error {value}", ["advise", str(spec), "--k", "2", "--epsilon", "1", "--draws", "2",
                                                "--target-error", value], ("target_error",)),
            (f"advise --max-linking-risk {value}", ["advise", str(spec), "--k", "2", "--epsilon", "1", "--draws", "2",
                                                    "--max-linking-risk", value], ("max_linking_risk",)),
            (f"audit set-cap CAP {value}", ["audit", "set-cap", "--by", "r", "--reason", "r", "--", POPULATION, value], ("cap",)),
            (f"audit set-cap --delta {value}", ["audit", "set-cap", "--by", "r", "--reason", "r", "--delta", value, POPULATION, "10"],
             ("delta",)),
            (f"audit policy --min-k {value}", ["audit", "policy", "--min-k", value], ("min_k",)),
            (f"audit policy --max-epsilon {value}", ["audit", "policy", "--max-epsilon", value], ("max_epsilon",)),
        ]
    # Text-valued options: any text is a valid id or name, so these must succeed (or say why in one line).
    for value in ("1e10", "nan", "-1"):
        matrix += [(f"release --release-id {value}", ["release", str(spec), "--release-id", value], ("release_id",)),
                   (f"release --operator {value}", ["release", str(spec), "--operator", value, "--release-id", f"op-{value}"],
                    ("operator",))]
    for number, (name, args, names) in enumerate(matrix):
        if args[0] == "release" and "--release-id" not in args:
            args = [*args, "--release-id", f"case-{number}"]  # each its own release: none is "already published"
        table.append(_settings_case(results, name, args, case_env, work, names, name.split()[-1], _figures(work / "audit.db")))
    return table


NUMBER_VARIABLES = ("KEPSILON_DEFAULT_CAP", "KEPSILON_AUDIT_BUSY_TIMEOUT", "KEPSILON_SEED_KEY")
PATH_VARIABLES = ("KEPSILON_AUDIT_DB", "KEPSILON_SEED_KEY_FILE", "KEPSILON_AUDIT_HEAD_LOG", "KEPSILON_REPORTS_DIR")


def variable_matrix(results: Results, env: dict, base: Path, source: Path, values=ABSURD_VALUES) -> list[dict]:
    """Absurd values for every KEPSILON_ variable a user sets, through a release (numbers) or ``audit set-cap``
    and a release (paths, which any text names): refused in one line naming the variable, or used."""
    table = []
    for variable in NUMBER_VARIABLES + PATH_VARIABLES:
        for value in values if variable in NUMBER_VARIABLES else ("1e10", "nan"):
            name = f"{variable}={value}"
            work, case_env = _settings_work(base, name, env, cap=None if variable in ("KEPSILON_DEFAULT_CAP",) else 10.0)
            spec = write_spec(work, spec_dict(work, "variables", source={"path": str(source), "delimiter": ";"},
                                              **NO_BUDGET_FAILURES), name="spec")
            case_env = {**case_env, variable: value}
            if variable in ("KEPSILON_AUDIT_DB",):
                case_env["KEPSILON_DEFAULT_CAP"] = "10"  # a new store elsewhere: let it have a cap
            table.append(_settings_case(results, name, ["release", str(spec)], case_env, work, (variable,), value,
                                        _figures(work / "audit.db")))
    return table


def _told_published(out: str, err: str) -> bool:
    """Whether a run that exits 0 says it is not the publisher: it arrived after the release was published, or
    the busy Prefect server failed its client and the store it then read says the release is published."""
    said = _flat(out + err)
    return "already published" in said or ("the audit store says" in said and "published at" in said)


def same_id_race(results: Results, env: dict, base: Path, source: Path, processes: int = 3, trials: int = 5) -> list[dict]:
    """``processes`` runs of one release (same spec, same id) started together, ``trials`` times.

    Each trial: one publication, one reservation and one spend, no 'failed' or 'refused' record and no
    unseal added to the release; every other process says, in one line and exit 2, that the release is
    being published by another run — or, arriving after it finished, that it is already published (exit 0),
    or, when the busy Prefect server failed its client, what the audit store says: published (exit 0).
    """
    table = []
    for trial in range(trials):
        work, case_env = _settings_work(base, f"same-id-{trial}", env)
        spec = write_spec(work, spec_dict(work, "same-id", source={"path": str(source), "delimiter": ";"}, **NO_BUDGET_FAILURES),
                          name="spec")
        running = [subprocess.Popen([str(BIN / "kepsilon"), "release", str(spec)], cwd=work, env=case_env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(processes)]
        outcomes = [(proc.wait(timeout=900), *proc.communicate()) for proc in running]
        db = work / "audit.db"
        records = [o for (o,) in rows(db, "SELECT outcome FROM releases WHERE release_id = 'same-id' ORDER BY id")]
        kinds = ledger_kinds(db, "same-id")
        unseals = rows(db, "SELECT COUNT(*) FROM unseal_events")[0][0] if db.exists() else 0
        label = f"trial {trial + 1}: {processes} processes, one release id"
        published = [code for code, out, err in outcomes if code == 0 and not _told_published(out, err)]
        refused = [err for code, out, err in outcomes if code == 2]
        late = [out for code, out, err in outcomes if code == 0 and _told_published(out, err)]
        results.add(RACE_ID_CATEGORY, f"{label}: exactly one run publishes", len(published) == 1,
                    f"published {len(published)}, refused {len(refused)}, already published {len(late)}, "
                    f"exit codes {[c for c, _, _ in outcomes]}")
        results.add(RACE_ID_CATEGORY, f"{label}: one 'published' record and nothing else for the release",
                    records == ["published"], f"records {records}")
        results.add(RACE_ID_CATEGORY, f"{label}: one reservation, one spend", kinds == {"reserve": 1, "spend": 1}, f"ledger {kinds}")
        results.add(RACE_ID_CATEGORY, f"{label}: no unseal ('interrupted release') by another process", unseals == 0,
                    f"unseals {unseals}")
        said = [_message_lines(err) for err in refused]
        results.add(RACE_ID_CATEGORY, f"{label}: every refused run says so in one line, exit 2",
                    all(len(lines) == 1 and IN_PROGRESS_MESSAGE in lines[0] for lines in said),
                    "; ".join(lines[-1][:120] if lines else "(nothing)" for lines in said))
        results.add(RACE_ID_CATEGORY, f"{label}: no traceback", all("Traceback" not in out + err for _, out, err in outcomes))
        results.add(RACE_ID_CATEGORY, f"{label}: audit verify passes", verify(case_env, work).returncode == 0)
        table.append({"trial": trial + 1, "published": len(published), "refused": len(refused), "late": len(late),
                      "records": records, "ledger": kinds, "unseals": unseals})
    results.counts["same-id races"] = f"{trials} trials × {processes} processes started together"
    return table


def _fill(folder: Path) -> int:
    """Write zeros into ``folder`` until its file system is full; the bytes written."""
    written = 0
    chunk = b"\0" * (1 << 20)
    try:
        with open(folder / "filler", "wb") as handle:
            while True:
                handle.write(chunk)
                handle.flush()
                written += len(chunk)
    except OSError:
        pass
    return written


def full_disk_dask(results: Results, env: dict, base: Path, source: Path) -> dict | None:
    """The dask engine's disk (output and scratch on a 32 MiB tmpfs) filled right after the reservation:
    one ``release failed`` line naming the error, no task tracebacks, recorded; the rerun resumes it (one spend).

    Needs ``mount -t tmpfs`` (root in a container that allows it); skipped, and said so, where it fails.
    """
    name = "full disk during a dask release"
    work, case_env = _settings_work(base, name, env)
    disk = work / "small-disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m,mode=0700", "tmpfs", str(disk)], capture_output=True, text=True)
    if mounted.returncode != 0:
        results.add(SETTINGS_CATEGORY, f"{name}: skipped (no tmpfs mount here)", True, _flat(mounted.stderr)[:120])
        return None
    try:
        spec = spec_dict(work, "full-disk", source={"path": str(source), "delimiter": ";"}, output_dir=str(disk / "out"),
                         **NO_BUDGET_FAILURES)
        spec["execution"] = {"engine": "dask", "partitions": 2, "workers": 1, "scratch": str(disk / "scratch")}
        path = write_spec(work, spec, name="spec")
        hold = work / "hold"
        held_env = {**case_env, "KEPSILON_HOLD_AT": "after-reservation", "KEPSILON_HOLD_FILE": str(hold)}
        running = subprocess.Popen([str(BIN / "kepsilon"), "release", str(path)], cwd=work, env=held_env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 600
        while not hold.with_name("hold.reached").exists() and running.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        filled = _fill(disk)
        hold.touch()
        out, err = running.communicate(timeout=900)
        said = [line for line in _message_lines(err) if not line.startswith("note:")]
        db = work / "audit.db"
        records = [o for (o,) in rows(db, "SELECT outcome FROM releases WHERE release_id = 'full-disk' ORDER BY id")]
        results.add(SETTINGS_CATEGORY, f"{name}: exit 2, one line 'release failed:' naming the full disk",
                    running.returncode == 2 and len(said) == 1 and said[0].startswith("release failed:")
                    and ("No space left" in said[0] or "Errno 28" in said[0]),
                    f"exit {running.returncode}, filled {filled // 2**20} MiB: {' | '.join(said)[:240]}")
        results.add(SETTINGS_CATEGORY, f"{name}: no traceback (the workers' task tracebacks included)",
                    "Traceback" not in out + err, f"{(out + err).count('Traceback')} traceback(s)")
        results.add(SETTINGS_CATEGORY, f"{name}: recorded as failed", records == ["failed"], f"records {records}")
        (disk / "filler").unlink()
        again = kepsilon(["release", str(path)], case_env, work)
        records = [o for (o,) in rows(db, "SELECT outcome FROM releases WHERE release_id = 'full-disk' ORDER BY id")]
        kinds = ledger_kinds(db, "full-disk")
        results.add(SETTINGS_CATEGORY, f"{name}: with room again, the rerun publishes on the same reservation (one spend)",
                    again.returncode == 0 and records == ["failed", "published"] and kinds == {"reserve": 1, "spend": 1},
                    f"exit {again.returncode}, records {records}, ledger {kinds}")
        return {"case": name, "exit": running.returncode, "line": (said[-1] if said else "")[:160]}
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


def immutable_scratch(results: Results, env: dict, base: Path, source: Path) -> dict | None:
    """A Dask release whose ``execution.scratch`` folder is immutable (``chattr +i``: root ignores modes)."""
    from .harness import make_unwritable

    name = "immutable dask scratch folder"
    work, case_env = _settings_work(base, name, env)
    folder = work / "scratch"
    folder.mkdir()
    undo = make_unwritable(folder)
    if undo is None:
        results.add(SETTINGS_CATEGORY, f"{name}: skipped (neither mode 0555 nor chattr +i stops writes here)", True)
        return None
    try:
        spec = spec_dict(work, "scratch-case", source={"path": str(source), "delimiter": ";"}, **NO_BUDGET_FAILURES)
        spec["execution"] = {"engine": "dask", "partitions": 2, "workers": 1, "scratch": str(folder)}
        path = write_spec(work, spec, name="spec")
        return _settings_case(results, name, ["release", str(path)], case_env, work, ("execution.scratch",), "\xff",  # no value given: the path is named
                              _figures(work / "audit.db"), accepted=False)
    finally:
        undo()


def bad_settings_scenario(results: Results, env: dict, base: Path, source: Path, race_trials: int = 5) -> list[dict]:
    """Issue 24's items 4 and 5: malformed Parquet, every option and variable with absurd values, same-id races."""
    base.mkdir(parents=True, exist_ok=True)
    table = malformed_parquet(results, env, base, source)
    table += option_matrix(results, env, base, source)
    table += variable_matrix(results, env, base, source)
    for optional in (immutable_scratch, full_disk_dask):
        row = optional(results, env, base, source)
        table += [row] if row else []
    results.counts["bad settings tried"] = str(len(table))
    same_id_race(results, env, base, source, trials=race_trials)
    return table
