"""``kepsilon officers``: the accounts that log in to the officers' audit UI (``make audit-ui``).

Kept apart from the audit store's commands: an account opens the read-only Datasette, it signs nothing and
spends nothing. Bad input is one line naming the parameter, exit 2; a password is never echoed, printed or
taken as an argument (it would be in the shell's history and in ``ps``).
"""

import sys

import typer

from .officers import AccountError, accounts_file, load_accounts, remove, set_password

officers_app = typer.Typer(help="Officers' accounts of the audit UI (make audit-ui): add, remove, list.",
                           no_args_is_help=True)


def _fail(message: str) -> None:
    typer.echo(f"refused: {message}", err=True)
    raise typer.Exit(2)


@officers_app.command("add")
def add(
    name: str = typer.Argument(..., help="The officer's login name."),
    password_stdin: bool = typer.Option(False, "--password-stdin", help="Read the password from one line of stdin."),
) -> None:
    """Add an officer, or set a new password for one (asked twice, hidden; or one line of stdin)."""
    if password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = typer.prompt("Password", hide_input=True, confirmation_prompt=True)
    try:
        new = set_password(name, password)
    except AccountError as error:
        _fail(str(error))
    typer.echo(f"officer {name!r} {'added' if new else 'given a new password'} in {accounts_file()} (owner-only)")


@officers_app.command("remove")
def remove_officer(name: str = typer.Argument(..., help="The officer's login name.")) -> None:
    """Remove an officer: a running audit UI refuses their next request."""
    try:
        remove(name)
    except AccountError as error:
        _fail(str(error))
    typer.echo(f"officer {name!r} removed from {accounts_file()}")


@officers_app.command("list")
def list_officers() -> None:
    """The officers' names (never their hashes)."""
    for name in sorted(load_accounts()):
        typer.echo(name)


@officers_app.command("check")
def check_some() -> None:
    """Exit 2 with one line when there is no account (make audit-ui runs this before serving)."""
    try:
        names = load_accounts()
    except (OSError, ValueError) as error:
        _fail(f"{accounts_file()} cannot be read ({error.__class__.__name__})")
    if not names:
        _fail(f"no officer account in {accounts_file()}: add one with `kepsilon officers add NAME`")
    typer.echo(f"audit UI logins: {len(names)} officer account(s) in {accounts_file()}")
