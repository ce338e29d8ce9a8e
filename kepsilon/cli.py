"""The ``kepsilon`` command: run a release from a spec file, and query the audit store.

    kepsilon release releases/paper-synthetic.yaml --k 5 --epsilon 0.5
    kepsilon audit budget paper-synthetic
"""

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from kepsilon.tasks.errors import KepsilonError

app = typer.Typer(help="Governed, auditable (k,ε)-anonymised releases.", no_args_is_help=True, add_completion=False)
console = Console()
errors = Console(stderr=True)


def _mount_audit_commands() -> None:
    from kepsilon.audit.cli import audit_app

    app.add_typer(audit_app, name="audit", help="Audit store, ε ledger and privacy officers' questions.")


@app.command()
def release(
    spec_path: Path = typer.Argument(..., metavar="SPEC.yaml", help="release spec (YAML)"),
    k: Optional[int] = typer.Option(None, "--k", help="override the spec's k"),
    epsilon: Optional[float] = typer.Option(None, "--epsilon", help="override the spec's ε"),
    release_id: Optional[str] = typer.Option(None, "--release-id", help="override the spec's release id"),
    algorithm: Optional[str] = typer.Option(None, "--algorithm", help="mondrian or ola"),
    operator: Optional[str] = typer.Option(None, "--operator", help="who runs the release (default: OS user)"),
    db: Optional[Path] = typer.Option(None, "--db", envvar="KEPSILON_AUDIT_DB", help="audit store (default ./audit.db)"),
) -> None:
    """Run the governed-release flow on SPEC.yaml and print the release summary."""
    import os

    from kepsilon.flows.spec import load_spec

    if db is not None:
        os.environ["KEPSILON_AUDIT_DB"] = str(db)
    try:
        spec = load_spec(
            spec_path, k=k, epsilon=epsilon, release_id=release_id, algorithm=algorithm, operator=operator
        )
        from kepsilon.flows.release import governed_release

        manifest = governed_release(spec)
    except KepsilonError as failure:
        errors.print(f"[bold red]release refused:[/] {failure}")
        raise typer.Exit(code=2)
    console.print(summary_table(manifest))


def summary_table(manifest: dict) -> Table:
    from kepsilon.flows.report import summary_rows

    table = Table(title=f"release {manifest['release_id']}", show_header=True, header_style="bold")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for row in summary_rows(manifest):
        table.add_row(row["measure"], row["value"])
    return table


_mount_audit_commands()
