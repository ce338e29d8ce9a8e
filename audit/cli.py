"""``kepsilon audit …``: the privacy officers' questions and the few attributed writes they need.

Read commands answer governance.md's questions 1–10 with ``--format table|csv|json``; write commands
(set-cap, approve, unseal, checkpoint, retire-head-log) each record who and why. A seed is never printed
unless asked for explicitly with ``--out -``.

Every command but ``verify`` and ``retire-head-log`` first runs the same store check as a release
(``integrity.check_store``): an answer from a tampered or rolled-back store would mislead, and a write would
build on it. A store that fails it, or that SQLite cannot read or write, is refused with one line on stderr
and exit code 2, never a traceback; ``verify`` lists every problem, then says so the same way.
``retire-head-log`` is the way out of one refusal only — a store removed on purpose, whose head log still
records its chain — and runs the store's own checks without the log (``integrity.inspect_chain``): it is
refused for a store with chain entries or one that fails them.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import sqlite3
import sys
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kepsilon.tasks.errors import KepsilonError

from . import queries
from .approvals import approval_fields
from .approvals import approve as record_approval
from .chain import chain_head, write_checkpoint
from .errors import sqlite_cause, unavailable
from .headlog import (
    ENV_HEAD_LOG,
    check_head_log_place,
    head_log_named,
    head_log_path,
    head_log_place,
    latest_head,
    retire_head_log,
)
from .integrity import RETIRE_HINT, check_store, inspect_chain, inspect_store
from .ledger import budget as budget_state
from .ledger import cap_fields
from .ledger import set_cap as record_cap
from .principals import FLOW_ACTOR, add_principal, init_admin, make_act, principal_rows, revoke_key
from .seeds import unseal_fields, unseal_seed
from .signing import SignedAct, generate_key, key_id, key_path, load_private_key, read_public_key
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
KeyOption = Annotated[
    Path | None,
    typer.Option("--key", help="your Ed25519 private key file (OpenSSH or PEM, mode 0600) to sign the act with; "
                 "default env KEPSILON_SIGNING_KEY. Required once the store has principals (docs/identity.md)"),
]


@audit_app.callback()
def _main(
    ctx: typer.Context,
    db: Annotated[
        Path | None, typer.Option("--db", help="audit store; default env KEPSILON_AUDIT_DB, else ./.kepsilon/audit.db")
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
        _fail(KepsilonError(_no_store(path)))
    return path


def _no_store(path: Path) -> str:
    """Why a read finds no store: none at that path, or one removed while its head log remains (then every
    release is refused as rolled back, and the line names the way out)."""
    missing = f"no audit store at {str(path)!r}"
    log = head_log_path(path)
    if not os.path.lexists(log):
        return f"{missing} (use --db or env KEPSILON_AUDIT_DB)"
    try:
        latest = latest_head(log)
    except OSError as error:
        recorded = f"it cannot be read: {type(error).__name__}"
    else:
        recorded = "no readable line" if latest is None else f"it recorded {latest.entries} chain entries, the last at {latest.at}"
    return (f"{missing}, but {head_log_named(log)} remains ({recorded}): a release there is refused. "
            f"Put the store back (or use --db or env KEPSILON_AUDIT_DB), or, {RETIRE_HINT}")


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
    _print_table(rows, title)


def _console() -> Console:
    """The terminal's own width on a terminal; 120 columns (or env COLUMNS) when the output is piped."""
    if sys.stdout.isatty():
        return Console()
    return Console(width=int(os.environ.get("COLUMNS", "0") or 0) or 120)


# The store's own "…Z" timestamps and the flow's ISO ones ("…+00:00"), both UTC.
_TIMESTAMP = re.compile(r"^(\d{4}-\d{2}-\d{2})T(\d{2}:\d{2})(:\d{2}(\.\d+)?)?(Z|\+00:00)$")


def _cell(value) -> str:
    """A value as a table shows it: timestamps to the minute, UTC (CSV and JSON keep them whole)."""
    if value is None:
        return ""
    text = str(value)
    match = _TIMESTAMP.match(text)
    return f"{match.group(1)} {match.group(2)}" if match else text


def _print_table(rows: list[dict], title: str) -> None:
    """One rich table when every cell fits on one line of the terminal; else each record as a two-column
    table (name, value), like ``psql``'s expanded display, after a one-line hint naming ``--format csv``.

    Headers wrap at word boundaries (underscores shown as spaces); cells never wrap in the wide layout,
    since a folded identifier or timestamp reads as noise.
    """
    console = _console()
    columns = list(rows[0]) if rows else ["(no rows)"]
    headers = [column.replace("_", " ") for column in columns]
    texts = [[_cell(value) for value in row.values()] for row in rows]
    widths = [max([max(len(word) for word in header.split())] + [len(values[i]) for values in texts])
              for i, header in enumerate(headers)]
    needed = sum(widths) + 3 * len(widths) + 1  # "│ " before each cell, " " after, and the closing border
    if not rows or needed <= console.width:
        table = Table(title=title)
        for header, width in zip(headers, widths):
            table.add_column(header, overflow="fold", width=width)  # headers wrap, cells stay whole
        for values in texts:
            table.add_row(*values)
        console.print(table)
        return
    console.print(f"[bold]{escape(title)}[/bold]: {len(rows)} record(s) of {len(columns)} columns, too wide for "
                  f"{console.width} columns: one record at a time (--format csv or json for a sheet)", highlight=False)
    for number, values in enumerate(texts, start=1):
        record = Table(show_header=False, title=f"{number} of {len(texts)}", title_justify="left")
        record.add_column("column", style="bold", no_wrap=True)
        record.add_column("value", overflow="fold")
        for header, value in zip(headers, values):
            record.add_row(header, value)
        console.print(record)


def _answer(ctx: typer.Context, name: str, fmt: Format, *, known: dict[str, str] | None = None, **params) -> None:
    """Run one question. ``known``: the ids it names, by kind ("population", "release"), each of which must be
    in the store — an unknown or empty one is refused (exit 2, one line), never answered with an empty table."""
    with _store(ctx) as db:
        for kind, identifier in (known or {}).items():
            _require_known(db, kind, identifier)
        answer = queries.run(db, name, **params)
    _emit(answer, fmt, queries.QUERIES[name].title)


def _require_known(db, kind: str, identifier: str) -> None:
    """Refuse an id the store has never seen: an empty table or zeros would read as "nothing happened"."""
    if not identifier.strip():
        raise KepsilonError(f"give a {kind} id (`kepsilon audit {kind}s` lists them)")
    if kind == "population":
        known = db.execute("SELECT 1 FROM populations WHERE population_id = ?", [identifier]).fetchone()
    else:
        known = db.execute(
            "SELECT 1 FROM releases WHERE release_id = :id UNION ALL SELECT 1 FROM ledger WHERE release_id = :id "
            "UNION ALL SELECT 1 FROM approvals WHERE release_id = :id LIMIT 1", {"id": identifier}
        ).fetchone()
    if not known:
        raise KepsilonError(f"{kind} {identifier!r} is not in the audit store (`kepsilon audit {kind}s` lists them)")


def _fail(error: Exception) -> None:
    typer.echo(f"error: {error}", err=True)
    raise typer.Exit(code=2)


@audit_app.command()
def budget(ctx: typer.Context, population: str, format: FormatOption = Format.table) -> None:
    """Q1: ε spent by POPULATION (lifetime, last 12 months), reserved, left under its cap; its DP total (ε, δ)."""
    _answer(ctx, "budget", format, known={"population": population}, population=population)


@audit_app.command()
def releases(
    ctx: typer.Context,
    population: Annotated[str, typer.Option(help="only this population")] = "",
    format: FormatOption = Format.table,
) -> None:
    """Every release, newest first: status, privacy model, k, ε, δ, records published (reservations not yet recorded too)."""
    _answer(ctx, "release_list", format, known={"population": population} if population else None, population=population)


@audit_app.command()
def populations(ctx: typer.Context, format: FormatOption = Format.table) -> None:
    """Every population, newest first: ε cap, spent and left, δ cap, releases and records published."""
    _answer(ctx, "population_list", format)


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
    _answer(ctx, "who", format, known={"release": release}, release=release)


@audit_app.command()
def provenance(ctx: typer.Context, release: str, format: FormatOption = Format.table) -> None:
    """Q4: source fingerprint (keyed) and code versions that produced RELEASE."""
    _answer(ctx, "provenance", format, known={"release": release}, release=release)


@audit_app.command()
def impact(
    ctx: typer.Context,
    source: Annotated[
        Path | None, typer.Option(help="a source file or Parquet folder: its fingerprint under this installation's key")
    ] = None,
    source_sha: Annotated[str, typer.Option(help="a source fingerprint as `provenance` shows it")] = "",
    version: Annotated[str, typer.Option(help="a version ('2.4.6') or package=version ('numpy=2.4.6')")] = "",
    format: FormatOption = Format.table,
) -> None:
    """Q4: releases that used a source (file or fingerprint) or a library/code version (impact analysis)."""
    if source is not None:
        from .fingerprint import file_fingerprint

        try:
            source_sha = file_fingerprint(source)
        except OSError as error:
            _fail(KepsilonError(f"option '--source': cannot read {str(source)!r} ({error.strerror})"))
        except KepsilonError as error:
            _fail(error)
    if not source_sha and not version:
        _fail(KepsilonError("give --source, --source-sha and/or --version"))
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
    """Q7: releases refused, failed, with a failed check (its figure and limit) or over their suppression budget, and
    the ε each one's reservation holds."""
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
    _answer(ctx, "unseals", format, known={"release": release} if release else None, release=release)


@audit_app.command()
def advice(
    ctx: typer.Context,
    population: Annotated[str, typer.Option(help="only this population")] = "",
    format: FormatOption = Format.table,
) -> None:
    """Q11: who ran the parameter advisor (a read of private data), when, on which source and spec."""
    _answer(ctx, "advice", format, known={"population": population} if population else None, population=population)


@audit_app.command()
def verify(
    ctx: typer.Context,
    checkpoint: Annotated[Path | None, typer.Option(help="checkpoint file exported earlier")] = None,
    published: Annotated[
        list[Path] | None,
        typer.Option(help="a folder of published releases (<folder>/<release>/manifest.json) whose chain heads "
                     "the store must hold; repeatable. Default: ./out (a spec's default output_dir) when present, "
                     "and the folders the store recorded"),
    ] = None,
    format: FormatOption = Format.table,
) -> None:
    """Q10: SQLite's integrity check, the hash chain, the checkpoints, the head log and the published
    manifests' chain heads (a store put back from a backup). Exit 2 if anything fails.

    Lists every problem (one row each), then one line on stderr; a file too damaged to list anything
    gets that line alone.
    """
    path = _path(ctx)
    folders = list(published) if published else [folder for folder in (Path("out"),) if folder.is_dir()]
    for folder in folders:
        if not folder.is_dir():
            _fail(KepsilonError(f"parameter 'published': {str(folder)!r} is not a folder"))
    try:
        inspection = inspect_store(path, checkpoint=checkpoint, manifests_in=folders)
    except KepsilonError as error:  # an unreadable --checkpoint file
        _fail(error)
    base = {"ok": inspection.ok, "entries": inspection.entries, "head_hash": inspection.head_hash,
            "head_log": inspection.head_log, "publications": inspection.publications,
            "signatures": inspection.signatures}
    rows = [{**base, "problem": problem} for problem in inspection.problems] or [{**base, "problem": ""}]
    _emit(rows, format, "Audit store: intact" if inspection.ok else "Audit store: BROKEN")
    if not inspection.ok:
        _fail(KepsilonError(inspection.summary(hint="the problems are listed above")))


@audit_app.command("retire-head-log")
def retire_head_log_command(
    ctx: typer.Context,
    by: Annotated[str | None, typer.Option(help="who retires the head log (recorded in it)")] = None,
    reason: Annotated[str | None, typer.Option(help="why: the store was removed on purpose (recorded in it)")] = None,
) -> None:
    """Start from nothing after removing the store on purpose: move its head log aside, recording who and why.

    Allowed only while the store is missing or has no chain entries (a store with entries is checked against
    its log, never released from it). The log is kept beside itself as <log>.retired-<UTC time>, 0600.
    """
    by, reason = " ".join((by or "").split()), (reason or "").strip()
    for option, value, what in (("--by", by, "who retires the head log (a name)"),
                                ("--reason", reason, "why the store was removed")):
        if not value:
            _fail(KepsilonError(f"option {option!r}: give {what}; retiring a head log is recorded"))
    if by == FLOW_ACTOR:
        _fail(KepsilonError(f"option '--by': {FLOW_ACTOR!r} is the release flow's own name, not a person's"))
    path = _path(ctx, create=True)
    try:
        log = head_log_path(path)
        check_head_log_place(log)
    except KepsilonError as error:
        _fail(error)
    if not os.path.lexists(log):
        _fail(KepsilonError(f"no head log to retire for audit store {str(path)!r}: {head_log_named(log)} does not exist"))
    inspection = inspect_chain(path)
    if inspection.entries > 0:
        _fail(KepsilonError(
            f"audit store {str(path)!r} has {inspection.entries} chain entries: its head log is retired only for a "
            "store removed or without a chain, never for one it witnesses; refused — run `kepsilon audit verify`"
        ))
    if not inspection.ok:
        _fail(KepsilonError(inspection.summary(
            hint="a head log is retired only for a store removed or without a chain; run `kepsilon audit verify`"
        )))
    try:
        retired = retire_head_log(log, by, reason, str(Path(os.path.abspath(path))))
    except OSError as error:
        _fail(KepsilonError(f"{head_log_named(log)} cannot be retired ({type(error).__name__}); it is still in place"))
    held = ("no readable head" if retired.latest is None
            else f"its most advanced head: {retired.latest.entries} chain entries at {retired.latest.at}")
    kept = (f"{retired.path.name!r} beside {ENV_HEAD_LOG}" if head_log_place(log) == ENV_HEAD_LOG
            else repr(str(retired.path)))
    typer.echo(f"head log of audit store {str(path)!r} retired by {by!r} ({held}); kept as {kept}; "
               "the store starts from nothing at its next write")


@audit_app.command()
def checkpoint(ctx: typer.Context, path: Path, key: KeyOption = None) -> None:
    """Export the verified chain head (entry count + hash) to PATH, outside the store, and record it; signed
    with --key (an officer's or admin's) in a store with principals, the file then carries the signature."""
    with _store(ctx) as db:
        count, head = chain_head(db)
        signed = _signed_act(db, key, "checkpoint", {"entry_count": count, "head_hash": head}, None)
        written = write_checkpoint(db, path, signed=signed)
    typer.echo(f"checkpoint: {written['entry_count']} entries, head {written['head_hash']} -> {path}")


@audit_app.command("set-cap")
def set_cap(
    ctx: typer.Context,
    population: str,
    cap: float,
    reason: Annotated[str, typer.Option(help="why")],
    by: Annotated[str | None, typer.Option(help="who sets the cap; with --key, the key's holder")] = None,
    delta: Annotated[
        float | None, typer.Option(help="lifetime δ cap over the DP mode's releases; default: keep the one in force")
    ] = None,
    key: KeyOption = None,
) -> None:
    """Set POPULATION's lifetime ε cap to CAP, and with --delta its δ cap (a new attributed ledger entry; never an edit).

    The ε cap counts every release; the δ cap the DP mode's releases, whose (ε, δ) compose by sums.
    """
    with _store(ctx, create=True) as db:
        signed = _signed_act(db, key, "set-cap", cap_fields(population, cap, reason, delta), by)
        _require_by(by, signed)
        entry = record_cap(db, population, cap, by, reason, delta=delta, signed=signed)
        kept = budget_state(db, population)["delta_cap"]
    shown = "no δ cap" if kept is None else f"δ={kept / 10**18:g}"
    typer.echo(f"cap of {population!r} set to ε={cap:g}, {shown} (ledger entry {entry})")


@audit_app.command()
def approve(
    ctx: typer.Context,
    release: str,
    spec_hash: Annotated[str, typer.Option(help="SHA-256 of the spec being approved")],
    reason: Annotated[str, typer.Option(help="why")],
    by: Annotated[str | None, typer.Option(help="the approver (must differ from the operator); with --key, the key's holder")] = None,
    key: KeyOption = None,
) -> None:
    """Approve RELEASE as specified by --spec-hash (two-person rule); signed with --key in a store with principals."""
    with _store(ctx, create=True) as db:
        signed = _signed_act(db, key, "approve", approval_fields(release, spec_hash, reason), by)
        _require_by(by, signed)
        entry = record_approval(db, release_id=release, spec_hash=spec_hash, approver=by, reason=reason, signed=signed)
    typer.echo(f"approval {entry} recorded for {release!r}" + (f", signed by {signed.payload['by']}" if signed else ""))


@audit_app.command()
def unseal(
    ctx: typer.Context,
    release: str,
    reason: Annotated[str, typer.Option(help="why")],
    out: Annotated[str, typer.Option(help="file for the seed as hex (created 0600); '-' prints it")],
    by: Annotated[str | None, typer.Option(help="who unseals; with --key, the key's holder")] = None,
    idempotency_key: Annotated[str | None, typer.Option(help="choose among several seeds of RELEASE")] = None,
    key: KeyOption = None,
) -> None:
    """Decrypt RELEASE's seed (recorded: who, why, when) and write it as hex to --out."""
    with _store(ctx) as db:
        signed = _signed_act(db, key, "unseal", unseal_fields(release, idempotency_key, reason), by)
        _require_by(by, signed)
        seed = unseal_seed(
            db,
            idempotency_key=idempotency_key,
            release_id=release,
            by=by,
            reason=reason,
            signed=signed,
        )
    if out == "-":
        typer.echo(seed.hex())
        return
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(seed.hex() + "\n")
    typer.echo(f"seed of {release!r} written to {out} (unseal recorded)")


@audit_app.command()
def certificate(
    ctx: typer.Context,
    release: str,
    verify: Annotated[Path | None, typer.Option("--verify", help="check this certificate file against the store")] = None,
    pdf: Annotated[bool, typer.Option("--pdf", help="also print it to certificate.pdf beside it (headless Chromium)")] = False,
) -> None:
    """The officer's certificate of RELEASE: write it (private report folder), or --verify FILE against the store."""
    from .certificate import print_pdf, verify_certificate, write_certificate

    path = _path(ctx)
    with _store(ctx):  # refuses a store whose chain does not verify
        pass
    try:
        if verify is None:
            written = write_certificate(path, release)
            typer.echo(f"certificate of {release}: {written}")
            if pdf:
                typer.echo(f"printed to PDF (for filing; the HTML is what --verify checks): {print_pdf(written)}")
            return
        outcome = verify_certificate(path, release, verify)
    except KepsilonError as error:
        _fail(error)
    if not outcome.ok:
        _fail(KepsilonError(f"certificate does not verify: {outcome.message}"))
    typer.echo(outcome.message)


def _private_key(key: Path | None):
    """The signer's private key (``--key``, else env KEPSILON_SIGNING_KEY), or None when neither names one."""
    path, setting = key_path(key)
    return None if path is None else load_private_key(path, setting)


def _signed_act(db, key: Path | None, act: str, fields: dict, by: str | None) -> SignedAct | None:
    """``act`` over ``fields`` signed with the caller's key, or None without a key (the store then decides:
    a store with principals refuses an unsigned act, one without records the name given)."""
    private = _private_key(key)
    return None if private is None else make_act(db.conn, private, act, fields, by)


def _require_by(by: str | None, signed: SignedAct | None) -> None:
    """An unsigned act needs a name; the flow's own name is not one a person may take."""
    if signed is None and not (by and by.strip()):
        raise KepsilonError("give --by NAME (or, in a store with principals, --key FILE)")
    if by is not None and " ".join(by.split()) == FLOW_ACTOR:
        raise KepsilonError(f"option '--by': {FLOW_ACTOR!r} is the release flow's own name, not a person's")


@audit_app.command()
def keygen(path: Annotated[Path, typer.Argument(metavar="FILE", help="where the private key goes (0600; FILE.pub beside it)")]) -> None:
    """Make an Ed25519 key pair for signing (like `ssh-keygen -t ed25519 -N ''`); give FILE.pub to your admin."""
    try:
        public = generate_key(path)
    except KepsilonError as error:
        _fail(error)
    typer.echo(f"private key {path} (keep it; never share it), public key {path}.pub: {key_id(public)}")


@audit_app.command()
def init(
    ctx: typer.Context,
    admin: Annotated[str, typer.Option(help="the first admin's name")],
    key: KeyOption = None,
    reason: Annotated[str, typer.Option(help="why")] = "first admin of this store",
) -> None:
    """Register the store's first admin (self-signed with --key): from now on every act must be signed."""
    with _store(ctx, create=True) as db:
        private = _private_key(key)
        if private is None:
            raise KepsilonError("give --key FILE (the admin's private key; `kepsilon audit keygen FILE` makes one)")
        store = init_admin(db, private, admin, reason)
        kid = key_id(_public_text(private))
    typer.echo(f"{admin!r} is the admin of this audit store (key {kid}, store id {store}); "
               "from now on every approval, cap, unseal, checkpoint, principal change and release must be signed")


def _public_text(private) -> str:
    from .signing import public_key_text

    return public_key_text(private.public_key())


principal_app = typer.Typer(help="Add or revoke principals (signed by an admin's key).", no_args_is_help=True)
audit_app.add_typer(principal_app, name="principal")


@principal_app.command("add")
def principal_add(
    ctx: typer.Context,
    name: str,
    role: Annotated[str, typer.Option(help="steward, approver, officer or admin")],
    public_key: Annotated[Path, typer.Option(help="the new principal's public key file (FILE.pub, OpenSSH or PEM)")],
    reason: Annotated[str, typer.Option(help="why")],
    key: KeyOption = None,
) -> None:
    """Register NAME's public key with ROLE (run again with another --role for a second role)."""
    with _store(ctx) as db:
        public = read_public_key(public_key, "--public-key")
        fields = {"change": "add", "name": " ".join(name.split()), "role": role, "key_id": key_id(public), "reason": reason}
        signed = _signed_act(db, key, "principal", fields, None)
        if signed is None:
            raise KepsilonError("give --key FILE: an admin's private key signs principal changes")
        add_principal(db, signed, name=name, role=role, public_key=public, reason=reason)
    typer.echo(f"{name!r} added as {role} with key {key_id(public)}")


@principal_app.command("revoke")
def principal_revoke(
    ctx: typer.Context,
    name: str,
    public_key: Annotated[Path, typer.Option(help="the public key file to revoke (FILE.pub)")],
    reason: Annotated[str, typer.Option(help="why")],
    key: KeyOption = None,
) -> None:
    """Revoke one of NAME's keys (every role it held); a revoked key is never valid again."""
    with _store(ctx) as db:
        public = read_public_key(public_key, "--public-key")
        fields = {"change": "revoke", "name": " ".join(name.split()), "role": None, "key_id": key_id(public), "reason": reason}
        signed = _signed_act(db, key, "principal", fields, None)
        if signed is None:
            raise KepsilonError("give --key FILE: an admin's private key signs principal changes")
        revoke_key(db, signed, name=name, public_key=public, reason=reason)
    typer.echo(f"key {key_id(public)} of {name!r} revoked")


@audit_app.command()
def principals(ctx: typer.Context, format: FormatOption = Format.table) -> None:
    """Registered principals: name, key id, roles, active or revoked (empty: acts are not authenticated)."""
    with _store(ctx) as db:
        rows = principal_rows(db.conn)
    _emit(rows, format, "Principals")
