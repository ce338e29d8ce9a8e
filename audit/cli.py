"""``kepsilon audit …``: the privacy officers' questions and the few attributed writes they need.

Read commands answer governance.md's questions 1–10 with ``--format table|csv|json``; write commands
(set-cap, approve, unseal, checkpoint) each record who and why. A seed is never printed unless asked
for explicitly with ``--out -``.

Every command but ``verify`` first runs the same store check as a release (``integrity.check_store``):
an answer from a tampered or rolled-back store would mislead, and a write would build on it. A store
that fails it, or that SQLite cannot read or write, is refused with one line on stderr and exit code 2,
never a traceback; ``verify`` lists every problem, then says so the same way.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import sqlite3
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from kepsilon.tasks.errors import KepsilonError

from . import queries
from .approvals import approve as record_approval
from .chain import write_checkpoint
from .errors import sqlite_cause, unavailable
from .integrity import check_store, inspect_store
from .ledger import budget as budget_state
from .ledger import set_cap as record_cap
from .seeds import unseal_seed
from .store import open_store, store_path

audit_app = typer.Typer(help="Query and maintain the audit store (ε ledger, releases, seeds, approvals).", no_args_is_help=True)


class Format(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"


class Only(str, Enum):
    all = "all"
    shared = "shared"
    unpublished = "unpublished"
    voided = "voided"


class Basis(str, Enum):
    any = "any"
    diameter = "diameter"
    bounds = "bounds"


FormatOption = Annotated[Format, typer.Option("--format", "-f", help="table (rich), csv or json")]


@audit_app.callback()
def _main(
    ctx: typer.Context,
    db: Annotated[
        Optional[Path], typer.Option("--db", help="audit store; default env KEPSILON_AUDIT_DB, else ./.kepsilon/audit.db")
    ] = None,
) -> None:
    ctx.obj = {"db": db}


def _path(ctx: typer.Context, *, create: bool = False) -> Path:
    """The store's path; read-only questions refuse a missing file rather than create an empty store."""
    try:
        path = store_path(ctx.obj.get("db") if ctx.obj else None)
    except KepsilonError as error:
        _fail(error)
    if not create and not path.exists():
        _fail(KepsilonError(f"no audit store at {str(path)!r} (use --db or env KEPSILON_AUDIT_DB)"))
    return path


@contextlib.contextmanager
def _store(ctx: typer.Context, *, create: bool = False) -> Iterator:
    """The checked, open store for one command, closed afterwards.

    Refuses (one line, exit 2) a store that fails ``check_store``, and turns any refusal or store
    error met while the command runs into the same one line.
    """
    path = _path(ctx, create=create)
    try:
        check_store(path)
        db = open_store(path)
    except KepsilonError as error:
        _fail(error)
    try:
        yield db
    except KepsilonError as error:
        _fail(error)
    except sqlite3.Error as error:
        if sqlite_cause(error) is None:
            raise
        _fail(unavailable(str(path), error, "read"))
    finally:
        db.close()


def _emit(rows: list[dict], fmt: Format, title: str) -> None:
    """Print rows in the chosen format; an empty answer is an empty table/CSV header/JSON list."""
    if fmt is Format.json:
        typer.echo(json.dumps(rows, indent=2, ensure_ascii=False))
        return
    if fmt is Format.csv:
        buffer = io.StringIO()
        if rows:
            writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
        typer.echo(buffer.getvalue(), nl=False)
        return
    table = Table(title=title)
    for column in rows[0] if rows else ["(no rows)"]:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*("" if value is None else str(value) for value in row.values()))
    Console(width=max(120, int(os.environ.get("COLUMNS", "0") or 0))).print(table)


def _answer(ctx: typer.Context, name: str, fmt: Format, **params) -> None:
    with _store(ctx) as db:
        answer = queries.run(db, name, **params)
    _emit(answer, fmt, queries.QUERIES[name].title)


def _fail(error: Exception) -> None:
    typer.echo(f"error: {error}", err=True)
    raise typer.Exit(code=2)


@audit_app.command()
def budget(ctx: typer.Context, population: str, format: FormatOption = Format.table) -> None:
    """Q1: ε spent by POPULATION (lifetime, last 12 months), reserved, left under its cap; its DP total (ε, δ)."""
    _answer(ctx, "budget", format, population=population)


@audit_app.command()
def policy(
    ctx: typer.Context,
    min_k: Annotated[int, typer.Option(help="smallest k allowed by policy")] = 5,
    max_epsilon: Annotated[float, typer.Option(help="largest ε allowed by policy")] = 1.0,
    format: FormatOption = Format.table,
) -> None:
    """Q2: releases with k below --min-k or ε above --max-epsilon."""
    _answer(ctx, "policy", format, min_k=min_k, max_epsilon=max_epsilon)


@audit_app.command()
def who(ctx: typer.Context, release: str, format: FormatOption = Format.table) -> None:
    """Q3: who ran RELEASE, who approved it, and whether they were the same person."""
    _answer(ctx, "who", format, release=release)


@audit_app.command()
def provenance(ctx: typer.Context, release: str, format: FormatOption = Format.table) -> None:
    """Q4: source file hash and code versions that produced RELEASE."""
    _answer(ctx, "provenance", format, release=release)


@audit_app.command()
def impact(
    ctx: typer.Context,
    source_sha: Annotated[str, typer.Option(help="SHA-256 of a source file")] = "",
    version: Annotated[str, typer.Option(help="a version ('2.4.6') or package=version ('numpy=2.4.6')")] = "",
    format: FormatOption = Format.table,
) -> None:
    """Q4: releases that used a source hash or a library/code version (impact analysis)."""
    if not source_sha and not version:
        _fail(KepsilonError("give --source-sha and/or --version"))
    _answer(ctx, "impact", format, source_sha=source_sha, version=version)


@audit_app.command()
def reruns(
    ctx: typer.Context,
    only: Annotated[Only, typer.Option(help="all, shared (keys with >1 run), unpublished, voided")] = Only.all,
    format: FormatOption = Format.table,
) -> None:
    """Q5: reservations per idempotency key, their runs and outcomes, voids and why."""
    _answer(ctx, "reruns", format, only=only.value)


@audit_app.command("noise-draws")
def noise_draws(ctx: typer.Context, format: FormatOption = Format.table) -> None:
    """Q6: logical releases (idempotency keys) whose noise was drawn more than once."""
    _answer(ctx, "noise_draws", format)


@audit_app.command()
def failures(ctx: typer.Context, format: FormatOption = Format.table) -> None:
    """Q7: releases refused (e.g. over budget), failed, with a failed check, or over their suppression budget."""
    _answer(ctx, "failures", format)


@audit_app.command()
def diversity(ctx: typer.Context, format: FormatOption = Format.table) -> None:
    """Releases with homogeneous groups or failed ℓ-diversity/t-closeness checks, with achieved ℓ, t and risks."""
    _answer(ctx, "diversity", format)


@audit_app.command("scale-basis")
def scale_basis(
    ctx: typer.Context,
    basis: Annotated[Basis, typer.Option(help="any, diameter (data-derived) or bounds")] = Basis.any,
    format: FormatOption = Format.table,
) -> None:
    """Q8: which releases used data-derived noise scales (class diameter) rather than public bounds."""
    _answer(ctx, "scale_basis", format, basis="" if basis is Basis.any else basis.value)


@audit_app.command()
def unseals(
    ctx: typer.Context,
    release: Annotated[str, typer.Option(help="only this release")] = "",
    format: FormatOption = Format.table,
) -> None:
    """Q9: who unsealed a seed, when, why, and whether it matched its commitment."""
    _answer(ctx, "unseals", format, release=release)


@audit_app.command()
def advice(
    ctx: typer.Context,
    population: Annotated[str, typer.Option(help="only this population")] = "",
    format: FormatOption = Format.table,
) -> None:
    """Q11: who ran the parameter advisor (a read of private data), when, on which source and spec."""
    _answer(ctx, "advice", format, population=population)


@audit_app.command()
def verify(
    ctx: typer.Context,
    checkpoint: Annotated[Optional[Path], typer.Option(help="checkpoint file exported earlier")] = None,
    format: FormatOption = Format.table,
) -> None:
    """Q10: SQLite's integrity check, the hash chain, the checkpoints and the head log. Exit 2 if anything fails.

    Lists every problem (one row each), then one line on stderr; a file too damaged to list anything
    gets that line alone.
    """
    path = _path(ctx)
    try:
        inspection = inspect_store(path, checkpoint=checkpoint)
    except KepsilonError as error:  # an unreadable --checkpoint file
        _fail(error)
    base = {"ok": inspection.ok, "entries": inspection.entries, "head_hash": inspection.head_hash,
            "head_log": inspection.head_log}
    rows = [{**base, "problem": problem} for problem in inspection.problems] or [{**base, "problem": ""}]
    _emit(rows, format, "Audit store: intact" if inspection.ok else "Audit store: BROKEN")
    if not inspection.ok:
        _fail(KepsilonError(inspection.summary(hint="the problems are listed above")))


@audit_app.command()
def checkpoint(ctx: typer.Context, path: Path) -> None:
    """Export the verified chain head (entry count + hash) to PATH, outside the store, and record it."""
    with _store(ctx) as db:
        written = write_checkpoint(db, path)
    typer.echo(f"checkpoint: {written['entry_count']} entries, head {written['head_hash']} -> {path}")


@audit_app.command("set-cap")
def set_cap(
    ctx: typer.Context,
    population: str,
    cap: float,
    by: Annotated[str, typer.Option(help="who sets the cap")],
    reason: Annotated[str, typer.Option(help="why")],
    delta: Annotated[
        Optional[float], typer.Option(help="lifetime δ cap over the DP mode's releases; default: keep the one in force")
    ] = None,
) -> None:
    """Set POPULATION's lifetime ε cap to CAP, and with --delta its δ cap (a new attributed ledger entry; never an edit).

    The ε cap counts every release; the δ cap the DP mode's releases, whose (ε, δ) compose by sums.
    """
    with _store(ctx, create=True) as db:
        entry = record_cap(db, population, cap, by, reason, delta=delta)
        kept = budget_state(db, population)["delta_cap"]
    shown = "no δ cap" if kept is None else f"δ={kept / 10**18:g}"
    typer.echo(f"cap of {population!r} set to ε={cap:g}, {shown} (ledger entry {entry})")


@audit_app.command()
def approve(
    ctx: typer.Context,
    release: str,
    spec_hash: Annotated[str, typer.Option(help="SHA-256 of the spec being approved")],
    by: Annotated[str, typer.Option(help="the approver (must differ from the operator)")],
    reason: Annotated[str, typer.Option(help="why")],
) -> None:
    """Approve RELEASE as specified by --spec-hash (two-person rule)."""
    with _store(ctx, create=True) as db:
        entry = record_approval(db, release_id=release, spec_hash=spec_hash, approver=by, reason=reason)
    typer.echo(f"approval {entry} recorded for {release!r}")


@audit_app.command()
def unseal(
    ctx: typer.Context,
    release: str,
    by: Annotated[str, typer.Option(help="who unseals")],
    reason: Annotated[str, typer.Option(help="why")],
    out: Annotated[str, typer.Option(help="file for the seed as hex (created 0600); '-' prints it")],
    idempotency_key: Annotated[Optional[str], typer.Option(help="choose among several seeds of RELEASE")] = None,
) -> None:
    """Decrypt RELEASE's seed (recorded: who, why, when) and write it as hex to --out."""
    with _store(ctx) as db:
        seed = unseal_seed(
            db,
            idempotency_key=idempotency_key,
            release_id=release,
            by=by,
            reason=reason,
        )
    if out == "-":
        typer.echo(seed.hex())
        return
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(seed.hex() + "\n")
    typer.echo(f"seed of {release!r} written to {out} (unseal recorded)")
