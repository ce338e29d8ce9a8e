"""``kepsilon audit …``: the privacy officers' questions and the few attributed writes they need.

Read commands answer governance.md's questions 1–10 with ``--format table|csv|json``; write commands
(set-cap, approve, unseal, checkpoint) each record who and why. A seed is never printed unless asked
for explicitly with ``--out -``.
"""

from __future__ import annotations

import csv
import io
import json
import os
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from kepsilon.tasks.errors import KepsilonError

from . import queries
from .approvals import approve as record_approval
from .chain import verify_chain, write_checkpoint
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
        Optional[Path], typer.Option("--db", help="audit store; default env KEPSILON_AUDIT_DB, else ./audit.db")
    ] = None,
) -> None:
    ctx.obj = {"db": db}


def _store(ctx: typer.Context, *, create: bool = False):
    """Open the store; read-only questions refuse a missing file rather than create an empty store."""
    path = store_path(ctx.obj.get("db") if ctx.obj else None)
    if not create and not path.exists():
        _fail(KepsilonError(f"no audit store at {str(path)!r} (use --db or env KEPSILON_AUDIT_DB)"))
    return open_store(path)


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
    db = _store(ctx)
    try:
        _emit(queries.run(db, name, **params), fmt, queries.QUERIES[name].title)
    finally:
        db.close()


def _fail(error: Exception) -> None:
    typer.echo(f"error: {error}", err=True)
    raise typer.Exit(code=2)


@audit_app.command()
def budget(ctx: typer.Context, population: str, format: FormatOption = Format.table) -> None:
    """Q1: ε spent by POPULATION (lifetime, last 12 months), reserved, and left under its cap."""
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
def verify(
    ctx: typer.Context,
    checkpoint: Annotated[Optional[Path], typer.Option(help="checkpoint file exported earlier")] = None,
    format: FormatOption = Format.table,
) -> None:
    """Q10: recompute the hash chain; compare its head with the last checkpoint. Exit 1 if broken."""
    db = _store(ctx)
    try:
        ok, problems = verify_chain(db, checkpoint)
        head = queries.run(db, "chain_head")[0]
    except KepsilonError as error:
        _fail(error)
    finally:
        db.close()
    rows = [{"ok": ok, "entries": head["entries"], "head_hash": head["head_hash"], "problem": p} for p in problems]
    if ok:
        rows = [{"ok": ok, "entries": head["entries"], "head_hash": head["head_hash"], "problem": ""}]
    _emit(rows, format, "Audit chain: intact" if ok else "Audit chain: BROKEN")
    if not ok:
        raise typer.Exit(code=1)


@audit_app.command()
def checkpoint(ctx: typer.Context, path: Path) -> None:
    """Export the verified chain head (entry count + hash) to PATH, outside the store, and record it."""
    db = _store(ctx)
    try:
        written = write_checkpoint(db, path)
    except KepsilonError as error:
        _fail(error)
    finally:
        db.close()
    typer.echo(f"checkpoint: {written['entry_count']} entries, head {written['head_hash']} -> {path}")


@audit_app.command("set-cap")
def set_cap(
    ctx: typer.Context,
    population: str,
    cap: float,
    by: Annotated[str, typer.Option(help="who sets the cap")],
    reason: Annotated[str, typer.Option(help="why")],
) -> None:
    """Set POPULATION's lifetime ε cap to CAP (a new attributed ledger entry; never an edit)."""
    db = _store(ctx, create=True)
    try:
        entry = record_cap(db, population, cap, by, reason)
    except KepsilonError as error:
        _fail(error)
    finally:
        db.close()
    typer.echo(f"cap of {population!r} set to ε={cap:g} (ledger entry {entry})")


@audit_app.command()
def approve(
    ctx: typer.Context,
    release: str,
    spec_hash: Annotated[str, typer.Option(help="SHA-256 of the spec being approved")],
    by: Annotated[str, typer.Option(help="the approver (must differ from the operator)")],
    reason: Annotated[str, typer.Option(help="why")],
) -> None:
    """Approve RELEASE as specified by --spec-hash (two-person rule)."""
    db = _store(ctx, create=True)
    try:
        entry = record_approval(db, release_id=release, spec_hash=spec_hash, approver=by, reason=reason)
    except KepsilonError as error:
        _fail(error)
    finally:
        db.close()
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
    db = _store(ctx)
    try:
        seed = unseal_seed(
            db,
            idempotency_key=idempotency_key,
            release_id=release,
            by=by,
            reason=reason,
        )
    except KepsilonError as error:
        _fail(error)
    finally:
        db.close()
    if out == "-":
        typer.echo(seed.hex())
        return
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(seed.hex() + "\n")
    typer.echo(f"seed of {release!r} written to {out} (unseal recorded)")
