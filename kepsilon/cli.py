"""The ``kepsilon`` command: run a release from a spec file, and query the audit store.

    kepsilon release releases/paper-synthetic.yaml --k 5 --epsilon 0.5
    kepsilon check releases/paper-synthetic.yaml --epsilon 16
    kepsilon advise releases/paper-synthetic.yaml --target-error 0.05 --max-linking-risk 0.1
    kepsilon audit budget paper-synthetic

What ``kepsilon release`` prints: Prefect's run log (with a progress bar per stage and partition on the
dask engine), then the release summary; for a release already
published, one line saying where (exit code 0, nothing done); one line ``release refused: <reason>``
(exit code 2) when the release stops on a KepsilonError before any ε is reserved — bad spec or input, ε
over the cap, an id already published, a check before ε with its predicted figure and limit; one line ``release failed: <reason>`` (exit code 2) when it stopped
after its ε was reserved — a failed check of the gate included (recorded, or the line says the
reservation stands and a rerun resumes it).
Tracebacks are kept off the console (``--debug`` shows them). Any other exception is a crash: its
traceback is printed and the command ends with ``release failed: <error>`` (exit code 1).
"""

import contextlib
import logging
import os
import sys
import time
import traceback
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Optional, cast

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kepsilon.tasks.errors import KepsilonError
from kepsilon.usage_errors import OneLineUsageErrors

app = typer.Typer(
    cls=OneLineUsageErrors,  # a bad option value: one line naming the option, exit code 2
    help="Governed, auditable (k,ε)-anonymised releases.",
    no_args_is_help=True,
    add_completion=False,
    # A crash's local variables may hold records of the data being released: never print them.
    pretty_exceptions_show_locals=False,
)
console = Console()

if TYPE_CHECKING:
    from prefect.logging.handlers import PrefectConsoleHandler
    from rich.progress import Progress

    from kepsilon.local_server import LocalServer
errors = Console(stderr=True)


def _mount_audit_commands() -> None:
    from kepsilon.audit.cli import audit_app

    app.add_typer(audit_app, name="audit", help="Audit store, ε ledger and privacy officers' questions.")
    from kepsilon.audit.officers_cli import officers_app

    app.add_typer(officers_app, name="officers", help="Officers' logins of the audit UI (make audit-ui).")


class RefusalTracebacks(logging.Filter):
    """Console filter: drops Prefect's records of a flow or task run that stopped on an exception.

    Prefect logs every exception that ends a task or flow run at ERROR with its full traceback, twice for
    an exception raised in a task (once for the task, once for the flow). When the record is made, it is
    not yet known whether the flow turns the exception into a recorded failure (an OSError while
    staging becomes ``ReleaseFailed``) or it is a crash; so the console gets none of them, and the CLI
    prints the one line, plus the traceback itself for a crash. The records still reach every other
    handler (the run's logs on a Prefect server).
    """

    def __init__(self) -> None:
        super().__init__()
        self.tracebacks_shown: list[BaseException] = []

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.exc_info or record.exc_info[1] is None


def _console_handlers() -> list[logging.Handler]:
    """The handlers that write Prefect's log to the terminal: the root's console handler, and the stream
    handler of ``prefect._internal`` (which does not propagate; it reports the client's service errors)."""
    from prefect.logging.handlers import PrefectConsoleHandler

    root: list[logging.Handler] = [h for h in logging.getLogger().handlers if isinstance(h, PrefectConsoleHandler)]
    internal = [handler for handler in logging.getLogger("prefect._internal").handlers
                if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)]
    return root + internal


@contextlib.contextmanager
def _console_filter(quiet: logging.Filter) -> Iterator[None]:
    handlers = _console_handlers()
    for handler in handlers:
        handler.addFilter(quiet)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(quiet)


def _flush_prefect_client() -> None:
    """Send the run's queued logs and events now, while the server that receives them is still up.

    Left to interpreter exit (Prefect's default), the flush races the server's own shutdown.
    """
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=10)
    EventsWorker.drain_all(timeout=10)


# Where ``make serve`` (deployments/serve.sh) puts its server: 127.0.0.1, port PREFECT_PORT or 4200.
SERVE_PORT_ENV = "PREFECT_PORT"
SERVE_DEFAULT_PORT = 4200
# The CLI's bound on Prefect's client retries: Prefect's default (5, doubling waits from 2 s) kept a run
# whose server had died retrying for about four minutes before saying anything. One retry (2 s) rides
# out a blip; a call that still fails does not decide what the user is told (the audit store does).
CLIENT_MAX_RETRIES = 1

# The flow run the CLI starts in its own process sends no heartbeats unless the environment asks for them
# (PREFECT_FLOWS_HEARTBEAT_FREQUENCY, or its legacy name PREFECT_RUNNER_HEARTBEAT_FREQUENCY). A heartbeat only
# serves a server automation that marks silent runs as crashed, which kepsilon does not set up, and the first
# heartbeat and the thread's join at exit cost 1.5-2.5 s of every release (docs/cli-and-server.md); what the
# user is told of a run whose process died comes from the audit store anyway.
HEARTBEAT_VARIABLES = ("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", "PREFECT_RUNNER_HEARTBEAT_FREQUENCY")


def _serve_api_url() -> str:
    return f"http://127.0.0.1:{os.environ.get(SERVE_PORT_ENV) or SERVE_DEFAULT_PORT}/api"


def _serve_login(settings) -> str | None:
    """The login for ``make serve``'s server: PREFECT_API_AUTH_STRING if set, else the secret make serve keeps."""
    from kepsilon.prefect_login import read_auth_string
    from kepsilon.tasks.errors import SpecError

    if settings.api.auth_string is not None:
        return settings.api.auth_string.get_secret_value()
    try:
        return read_auth_string()
    except (OSError, SpecError):
        return None


def _note(text: str) -> None:
    errors.print(f"[dim]{escape(text)}[/]", soft_wrap=True)


def release_client_settings(environ: Mapping[str, str]) -> dict:
    """The Prefect client settings of the CLI's own flow run, where ``environ`` leaves them to kepsilon:
    bounded retries (``CLIENT_MAX_RETRIES``) and no heartbeats (``HEARTBEAT_VARIABLES``)."""
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, PREFECT_FLOWS_HEARTBEAT_FREQUENCY

    settings: dict = {}
    if "PREFECT_CLIENT_MAX_RETRIES" not in environ:
        settings[PREFECT_CLIENT_MAX_RETRIES] = CLIENT_MAX_RETRIES
    if not any(name in environ for name in HEARTBEAT_VARIABLES):
        settings[PREFECT_FLOWS_HEARTBEAT_FREQUENCY] = None
    return settings


@contextlib.contextmanager
def _prefect_api() -> Iterator[Optional["LocalServer"]]:
    """The Prefect API the release reports to, so that its run is listed where the user looks for runs.

    In order: the API configured by PREFECT_API_URL (the environment or the active Prefect profile); else
    the server ``make serve`` runs (127.0.0.1, port PREFECT_PORT or 4200), when it answers. Only when
    neither answers, a ``prefect server start`` in the same PREFECT_HOME serves this run alone (instead of
    Prefect's temporary server, which prints to this terminal and is stopped at exit), and one line says
    so; its log is a file in PREFECT_HOME, kept only when it holds an error, and pointed at when the
    error came during the run. Client retries are bounded (``CLIENT_MAX_RETRIES``) unless
    PREFECT_CLIENT_MAX_RETRIES is set: a server that dies mid-run is reported within seconds, and what
    happened to the release is then read from the audit store. The run sends no heartbeats unless the
    environment asks for them (``HEARTBEAT_VARIABLES``).
    """
    from prefect.settings import (
        PREFECT_API_AUTH_STRING,
        PREFECT_API_URL,
        get_current_settings,
        temporary_settings,
    )

    from kepsilon.local_server import LocalServer
    from kepsilon.orchestrator import accepts_login
    from kepsilon.orchestrator import api_answers as _answers
    from kepsilon.prefect_login import ENV_AUTH_FILE

    settings = get_current_settings()
    client_settings = release_client_settings(os.environ)
    configured = settings.api.url
    configured_login = settings.api.auth_string.get_secret_value() if settings.api.auth_string else None
    if configured and _answers(configured) and (settings.api.key or accepts_login(configured, configured_login)):
        with temporary_settings(updates=client_settings):
            yield None
        return
    serve_login = _serve_login(settings)
    if configured:
        _note(f"the Prefect server at {configured} (PREFECT_API_URL) does not answer or refuses the login "
              "(PREFECT_API_AUTH_STRING); this run uses a local Prefect server of its own, stopped when the run ends")
    elif not _answers(_serve_api_url()):
        _note(f"no Prefect server configured (PREFECT_API_URL) or answering at {_serve_api_url()} (make serve); "
              "this run uses a local Prefect server of its own, stopped when the run ends")
    elif accepts_login(_serve_api_url(), serve_login):
        _note(f"Prefect server: {_serve_api_url().removesuffix('/api')} (make serve); the run is listed in its UI")
        with temporary_settings(updates={PREFECT_API_URL: _serve_api_url(), PREFECT_API_AUTH_STRING: serve_login,
                                         **client_settings}):
            yield None
        return
    else:
        _note(f"the Prefect server at {_serve_api_url()} (make serve) refuses this run's login ({ENV_AUTH_FILE} or "
              "PREFECT_API_AUTH_STRING); this run uses a local Prefect server of its own, stopped when the run ends")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    log_path = Path(settings.home).expanduser() / f"kepsilon-release-server-{stamp}-{os.getpid()}.log"
    server = LocalServer(log_path, startup_timeout=max(60, settings.server.ephemeral.startup_timeout_seconds))
    try:
        server.start()
    except RuntimeError as failure:
        raise RuntimeError(f"{failure}; its log: {log_path}") from None
    try:
        with temporary_settings(updates={PREFECT_API_URL: server.api_url, PREFECT_API_AUTH_STRING: server.auth_string,
                                         **client_settings}):
            yield server
    finally:
        server.stop()
        problems = server.errors_while_running()
        if problems:
            errors.print(
                f"note: the local Prefect server logged {len(problems)} problem line(s) during the run; "
                f"see {escape(str(log_path))}",
                soft_wrap=True,
            )
        elif not server.has_errors():
            log_path.unlink(missing_ok=True)


class _PrintedAbove:
    """Stands in for a Prefect console handler's console: renders a log line with it (level colours, links),
    then prints the result through ``target``, the console whose live display draws the bars."""

    def __init__(self, renderer: Console, target: Console):
        self.renderer = renderer
        self.target = target

    def print(self, message, soft_wrap: bool = True) -> None:
        from rich.text import Text

        with self.renderer.capture() as captured:
            self.renderer.print(message, soft_wrap=soft_wrap)
        self.target.print(Text.from_ansi(captured.get().rstrip("\n")), soft_wrap=soft_wrap)


class StageBars:
    """Progress bars at the terminal, one per stage of a release with partitions (``tasks/progress.py``).

    Drawn only once a stage starts, so a release that reports no stage prints exactly what it printed
    before. While the bars are live, Prefect's log lines are printed above them by the same rich console
    (:meth:`_route_logs_above_bars`): written straight to the terminal, as Prefect's handlers do, they
    land inside the bar block, which rich then redraws below them, once per line.
    """

    def __init__(self, console: Console):
        self.console = console
        self.progress: Progress | None = None
        self.bars: dict[str, Any] = {}  # rich's TaskID per stage
        # What _route_logs_above_bars replaced, to put back: each console handler's console, each stream
        # handler's stream.
        self._consoles: list[tuple[PrefectConsoleHandler, Console]] = []
        self._streams: list[tuple[logging.StreamHandler, IO[str]]] = []

    def _route_logs_above_bars(self) -> None:
        """Have Prefect's terminal handlers print through the console that draws the bars.

        On a terminal, rich's live display prints what goes through its own console above the bars (and
        replaces ``sys.stderr`` with a proxy that does the same). Prefect's console handler has a rich
        console of its own, which writes straight to the terminal, so it is given one that renders the
        line as before (its colours) and prints it through ours; its stream handler for Prefect's internal
        errors gets the proxy. Undone by ``_restore_log_streams`` when the bars close.
        """
        from prefect.logging.handlers import PrefectConsoleHandler
        from rich.file_proxy import FileProxy

        proxy = sys.stderr
        if not isinstance(proxy, FileProxy):  # not a terminal: nothing is redrawn, nothing to route
            return
        for handler in _console_handlers():
            if isinstance(handler, PrefectConsoleHandler):
                self._consoles.append((handler, handler.console))
                # The handler only calls its console's print, which _PrintedAbove provides.
                handler.console = cast(Console, _PrintedAbove(handler.console, self.console))
            elif isinstance(handler, logging.StreamHandler):
                previous = handler.setStream(proxy)
                if previous is not None:
                    self._streams.append((handler, previous))

    def _restore_log_streams(self) -> None:
        for handler, console in reversed(self._consoles):
            handler.console = console
        for stream_handler, stream in reversed(self._streams):
            stream_handler.setStream(stream)
        self._consoles.clear()
        self._streams.clear()

    def stage_started(self, name: str, total: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        if self.progress is None:
            self.progress = Progress(
                TextColumn("{task.description:<18}"), BarColumn(), MofNCompleteColumn(), TextColumn("partitions"),
                TimeElapsedColumn(), console=self.console,
            )
            self.progress.start()
            self._route_logs_above_bars()
        self.bars[name] = self.progress.add_task(name, total=total)

    def _started(self) -> "Progress":
        """The bars, which a stage's first report (``stage_started``) draws."""
        if self.progress is None:
            raise RuntimeError("a stage reported progress before it started")
        return self.progress

    def stage_advanced(self, name: str, done: int, total: int) -> None:
        self._started().update(self.bars[name], completed=done)

    def stage_finished(self, name: str, done: int, total: int, seconds: float) -> None:
        self._started().update(self.bars[name], completed=done)
        self._started().stop_task(self.bars[name])

    def close(self) -> None:
        if self.progress is not None:
            self._restore_log_streams()
            self.progress.stop()


@contextlib.contextmanager
def _stage_bars() -> Iterator[None]:
    from kepsilon.tasks.progress import add_listener, remove_listener

    bars = StageBars(errors)
    add_listener(bars)
    try:
        yield
    finally:
        remove_listener(bars)
        bars.close()


def _refused(failure: KepsilonError, debug: bool) -> None:
    from kepsilon.tasks.errors import ReleaseFailed, ValidationFailed

    if debug:
        traceback.print_exception(failure, file=sys.stderr)
    message = str(failure)
    if isinstance(failure, ValidationFailed):
        # The gate runs on the noisy release: its ε is spent, which "refused" would deny.
        message += "; nothing published, recorded as failed (`kepsilon audit failures`), its ε is spent"
    verdict = "release failed:" if isinstance(failure, (ReleaseFailed, ValidationFailed)) else "release refused:"
    errors.print(f"[bold red]{verdict}[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code=2)


def _crashed(failure: Exception, quiet: RefusalTracebacks, debug: bool, verdict: str = "release failed:") -> None:
    """A crash (not a refusal): its traceback, then one line ``<verdict> <error>``, exit 1.

    ``verdict`` names the command that crashed: ``kepsilon check`` says "check failed:", since it
    publishes and spends nothing and "release failed" would suggest a release was attempted.
    """
    if debug or not any(failure is shown for shown in quiet.tracebacks_shown):
        traceback.print_exception(failure, file=sys.stderr)
    errors.print(
        f"[bold red]{escape(verdict)}[/] {escape(type(failure).__name__)}: {escape(str(failure))}", soft_wrap=True
    )
    raise typer.Exit(code=1)


def _workers_log_to_the_run_only() -> None:
    """Keep the processes this run starts (a Dask LocalCluster's workers) from printing INFO lines here.

    They inherit this terminal and print with consoles of their own, which no live display can route:
    their per-task lines landed inside the bar block. Their log still reaches the flow run on the server,
    and the bars show their progress; warnings and errors still print. Set after this process configured
    its own logging (importing the flow did), so that only processes started from now on read it; an
    operator's own PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL wins.
    """
    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")


def _orchestrator_lost(watch) -> bool:
    """Whether the Prefect server of this run stopped answering (``watch``: the run's ``ConnectionNoise``).

    Asked once, as the flow ends, while a server of the CLI's own is still up; the answer is kept in
    ``watch.lost`` for the lines printed after that server is stopped.
    """
    from kepsilon.orchestrator import api_answers

    if watch is not None and not watch.lost and not api_answers(watch.api_url):
        watch.lost = True
    return watch is not None and watch.lost


def _talking_to_prefect_failed(failure: BaseException | None) -> bool:
    """Whether ``failure`` (or what caused it) is the Prefect client failing to reach or hear its server.

    A server error answer counts too: Prefect's SQLite database answers 503 while it is busy and its client
    gives up after PREFECT_CLIENT_MAX_RETRIES tries; the release itself may have run (or not yet begun), so
    the store, not the status code, says what happened.
    """
    import httpx

    seen = set()
    while failure is not None and id(failure) not in seen:
        seen.add(id(failure))
        if isinstance(failure, httpx.TransportError):
            return True
        if isinstance(failure, httpx.HTTPStatusError) and failure.response.status_code >= 500:
            return True
        failure = failure.__cause__ or failure.__context__
    return False


def _prefect_failure(failure: BaseException) -> str:
    """A few words on how the Prefect client failed: the server's status code when it answered one."""
    import httpx

    cause: BaseException | None = failure
    seen = set()
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, httpx.HTTPStatusError):
            return f"the Prefect server answered {cause.response.status_code} after the client's retries"
        cause = cause.__cause__ or cause.__context__
    return f"the Prefect client failed ({type(failure).__name__})"


# A release the Prefect server was too busy to start (its SQLite database answers 503 while other runs
# write; the client gives up after CLIENT_MAX_RETRIES) is started again, up to BUSY_SERVER_STARTS starts in
# all, the waits doubling from BUSY_SERVER_WAIT seconds, and not once BUSY_SERVER_PATIENCE seconds have passed
# since the first start: a server stuck for longer (each call waiting out its 60 s busy timeout) is reported
# from the store at once, as before.
BUSY_SERVER_STARTS = 4
BUSY_SERVER_WAIT = 2.0
BUSY_SERVER_PATIENCE = 45.0


def _before_the_release_began(failure: Exception, watch, release_id: str, started: str) -> bool:
    """Whether ``failure`` is the Prefect server failing a run that had not begun: worth starting again.

    All three must hold: the failure is the Prefect client's (a transport error or a 5xx answer); the
    server answers now (busy, not dead: a dead one is reported from the store at once); and the audit
    store holds nothing of the release from this run (no open reservation, no failure, not published),
    so starting it again is exactly the rerun the store's line would ask the user for.
    """
    from kepsilon.audit.store import store_path
    from kepsilon.orchestrator import api_answers, store_outcome

    if isinstance(failure, KepsilonError) or watch is None or not _talking_to_prefect_failed(failure):
        return False
    if not api_answers(watch.api_url, seconds=10):
        return False
    return store_outcome(store_path(), release_id, started).state == "nothing"


def _release_despite_a_busy_server(run, spec, watch, started: str) -> dict:
    """``run(spec)``, started again when the Prefect server failed it before the release began.

    Several releases at once keep a Prefect server's SQLite database busy; when its 503 outlasts the
    client's bounded retries while the flow run is being created, the release never began. Telling the
    user "nothing reserved, recorded or published" was true, but a loser of a budget race then never
    learned that it was over the budget (and left no refusal record), and a release that fitted was
    simply not run. A note says each new start; any other failure is raised as before.
    """
    attempt, first_start = 1, time.monotonic()
    while True:
        try:
            return run(spec)
        except Exception as failure:
            if (attempt == BUSY_SERVER_STARTS or time.monotonic() - first_start > BUSY_SERVER_PATIENCE
                    or not _before_the_release_began(failure, watch, spec.release_id, started)):
                raise
            wait = BUSY_SERVER_WAIT * 2 ** (attempt - 1)
            watch.lost = False  # its health check may have timed out under the same load; it answers now
            _note(f"note: {_prefect_failure(failure)} before release {spec.release_id!r} began (nothing of it in the "
                  f"audit store); starting it again in {wait:g} s ({attempt + 1} of {BUSY_SERVER_STARTS})")
        time.sleep(wait)
        attempt += 1


def _drop_undeliverable() -> None:
    from kepsilon.orchestrator import discard_undeliverable

    discard_undeliverable()


def _told_by_the_store(release_id: str, started: str, store: Path, why: str = "the Prefect server stopped answering") -> None:
    """The run's Prefect server is gone: one line with the release's outcome as the audit store records it.

    Prefect's answer (a ConnectError, a flow run left Running) says nothing about the release, which
    runs in this process and does not need the server; the store says whether it was published.
    """
    from kepsilon.orchestrator import store_outcome

    outcome = store_outcome(store, release_id, started)
    style = "bold green" if outcome.state == "published" else "bold red"
    errors.print(
        f"[{style}]{escape(why)}; the audit store says:[/] {escape(outcome.line)}",
        soft_wrap=True,
    )
    raise typer.Exit(code=outcome.exit_code)


@app.command()
def release(
    spec_path: Path = typer.Argument(..., metavar="SPEC.yaml", help="release spec (YAML)"),
    k: int | None = typer.Option(None, "--k", help="override the spec's k"),
    epsilon: float | None = typer.Option(None, "--epsilon", help="override the spec's ε"),
    release_id: str | None = typer.Option(None, "--release-id", help="override the spec's release id"),
    algorithm: str | None = typer.Option(None, "--algorithm", help="mondrian or ola"),
    operator: str | None = typer.Option(None, "--operator", help="who runs the release (default: OS user); "
                                        "with principals, the signer (docs/identity.md)"),
    db: Path | None = typer.Option(None, "--db", envvar="KEPSILON_AUDIT_DB", help="audit store (default ./.kepsilon/audit.db)"),
    debug: bool = typer.Option(False, "--debug", help="also print the traceback of a refusal"),
    key: Path | None = typer.Option(None, "--key", help="the steward's private key that signs the release "
                                    "(default env KEPSILON_SIGNING_KEY); required once the store has principals"),
) -> None:
    """Run the governed-release flow on SPEC.yaml and print the release summary.

    The flow reports to the Prefect API configured by PREFECT_API_URL, else to the server of `make serve`
    (127.0.0.1, port PREFECT_PORT or 4200); when neither answers, to a local Prefect server started for this
    run in PREFECT_HOME (no UI, no scheduler), stopped when the run is over. If the server stops answering
    during the run, the outcome printed is the audit store's (docs/cli-and-server.md).
    """
    from kepsilon.audit.store import now, store_path
    from kepsilon.flows.spec import load_spec

    if db is not None:
        os.environ["KEPSILON_AUDIT_DB"] = str(db)
    if key is not None:  # the flow runs here and reads the key file itself: a path, never a flow parameter
        os.environ["KEPSILON_SIGNING_KEY"] = str(key)
    # The dask engine's local workers keep failed tasks' tracebacks off this terminal too (kepsilon/worker_console.py).
    os.environ["KEPSILON_WORKER_TRACEBACKS"] = "shown" if debug else "hidden"
    if not debug:
        # Prefect's log shipper writes "--- Error logging to API ---" to stderr itself when its server is
        # gone, unless logging's own error reporting is off; the outcome line says what matters.
        logging.raiseExceptions = False
    quiet = RefusalTracebacks()
    lost = None
    started = now()
    try:
        spec = load_spec(
            spec_path, k=k, epsilon=epsilon, release_id=release_id, algorithm=algorithm, operator=operator
        )
        with _prefect_api() as local_server:
            from prefect.settings import get_current_settings

            from kepsilon.flows.release import governed_release
            from kepsilon.orchestrator import ConnectionNoise

            _workers_log_to_the_run_only()

            lost = ConnectionNoise(get_current_settings().api.url)
            with contextlib.nullcontext() if debug else _console_filter(quiet), _console_filter(lost), _stage_bars():
                try:
                    manifest = _release_despite_a_busy_server(governed_release, spec, lost, started)
                finally:
                    if _orchestrator_lost(lost):
                        _drop_undeliverable()
                    else:
                        _flush_prefect_client()
                        if local_server is not None:
                            local_server.wait_until_recorded()
                            local_server.run_ended()
    except KepsilonError as failure:
        if lost is not None and lost.lost:
            _told_by_the_store(spec.release_id, started, store_path())
        _refused(failure, debug)
    except Exception as failure:
        if lost is not None and (lost.lost or _talking_to_prefect_failed(failure)):
            if debug:
                traceback.print_exception(failure, file=sys.stderr)
            why = "the Prefect server stopped answering" if lost.lost else _prefect_failure(failure)
            _told_by_the_store(spec.release_id, started, store_path(), why)
        _crashed(failure, quiet, debug)
    if lost is not None and lost.lost:
        _told_by_the_store(spec.release_id, started, store_path())
    if manifest.get("unchanged_source"):
        console.print(
            f"release {escape(manifest['requested_release_id'])}: source and spec unchanged since release "
            f"{escape(str(manifest['release_id']))}, published at {escape(str(manifest['published_at']))}; nothing "
            "published, no ε spent (`rerelease_unchanged: true` in the spec publishes a new release anyway)",
            soft_wrap=True,
        )
        return
    if manifest.get("already_published"):
        where = manifest["published_at"] if manifest.get("folder_present") else f"{manifest['published_at']} (folder no longer there)"
        console.print(
            f"release {escape(manifest['release_id'])} was already published at {escape(where)}; "
            "nothing done (no new record, no ε, no noise)",
            soft_wrap=True,
        )
        return
    console.print(summary_table(manifest))
    for warning in (manifest.get("pre_epsilon") or {}).get("warnings", []):
        console.print(escape(warning), soft_wrap=True, highlight=False)


@app.command()
def check(
    spec_path: Path = typer.Argument(..., metavar="SPEC.yaml", help="release spec (YAML)"),
    k: int | None = typer.Option(None, "--k", help="override the spec's k"),
    epsilon: float | None = typer.Option(None, "--epsilon", help="override the spec's ε"),
    release_id: str | None = typer.Option(None, "--release-id", help="override the spec's release id"),
    algorithm: str | None = typer.Option(None, "--algorithm", help="mondrian or ola"),
    operator: str | None = typer.Option(None, "--operator", help="who would run the release (default: OS user)"),
    db: Path | None = typer.Option(None, "--db", envvar="KEPSILON_AUDIT_DB", help="audit store (default ./.kepsilon/audit.db)"),
    debug: bool = typer.Option(False, "--debug", help="also print the traceback of a refusal"),
    key: Path | None = typer.Option(None, "--key", help="the steward's private key the release would be signed with "
                                    "(default env KEPSILON_SIGNING_KEY)"),
) -> None:
    """Everything `kepsilon release SPEC.yaml` would decide without noise, then one line: "would publish" or
    "would be refused: <check> <figure> (limit <limit>); try <change>". Spends no ε, publishes nothing;
    recorded in the audit store as an advice event (it reads the private data). Exit 0 only when the
    release would publish, else 2."""
    from kepsilon.flows.spec import load_spec

    if db is not None:
        os.environ["KEPSILON_AUDIT_DB"] = str(db)
    if key is not None:
        os.environ["KEPSILON_SIGNING_KEY"] = str(key)
    # The dask engine's local workers keep failed tasks' tracebacks off this terminal too (kepsilon/worker_console.py).
    os.environ["KEPSILON_WORKER_TRACEBACKS"] = "shown" if debug else "hidden"
    quiet = RefusalTracebacks()
    try:
        spec = load_spec(
            spec_path, k=k, epsilon=epsilon, release_id=release_id, algorithm=algorithm, operator=operator
        )
        with _prefect_api() as local_server:
            from kepsilon.flows.check import release_check

            with contextlib.nullcontext() if debug else _console_filter(quiet):
                try:
                    result = release_check(spec, via="cli")
                finally:
                    _flush_prefect_client()
                    if local_server is not None:
                        local_server.wait_until_recorded()
                        local_server.run_ended()
    except KepsilonError as failure:
        if debug:
            traceback.print_exception(failure, file=sys.stderr)
        errors.print(f"[bold red]check refused:[/] {escape(str(failure))}", soft_wrap=True)
        raise typer.Exit(code=2) from None
    except Exception as failure:
        _crashed(failure, quiet, debug, verdict="check failed:")
    from kepsilon.flows.check import verdict_lines

    console.print(f"check of release {escape(result['release_id'])} (nothing reserved, drawn or published):", soft_wrap=True)
    for line in verdict_lines(result):
        console.print("  " + escape(line), soft_wrap=True, highlight=False)
    for warning in (result.get("predicted") or {}).get("warnings", []):
        console.print(escape(warning), soft_wrap=True, highlight=False)
    if result.get("risk"):
        from kepsilon.tasks.certificate import risk_line

        console.print("  " + escape(risk_line(result["risk"])), soft_wrap=True, highlight=False)
    if result.get("event_id") is not None:
        console.print(f"recorded as advice event {result['event_id']} in the audit store; no ε spent", soft_wrap=True)
    style = "bold green" if result["would_publish"] else "bold red"
    console.print(f"[{style}]{escape(result['line'])}[/]", soft_wrap=True, highlight=False)
    if not result["would_publish"]:
        raise typer.Exit(code=2)


def _numbers(option: str, text: str | None, kind):
    """A comma-separated grid option (``--k 2,5,10``) as numbers; None when not given."""
    if text is None:
        return None
    try:
        return [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise KepsilonError(f"parameter '{option}': give comma-separated numbers, e.g. {option} 2,5,10") from None


@app.command()
def advise(
    spec_path: Path = typer.Argument(..., metavar="SPEC.yaml", help="release spec (YAML)"),
    k: str | None = typer.Option(None, "--k", help="k values, comma-separated (default 2,5,10,20,50,100)"),
    epsilon: str | None = typer.Option(
        None, "--epsilon", help="ε values, comma-separated (default 0.05,0.5,1,2,4,8,16)"
    ),
    draws: int = typer.Option(10, "--draws", help="Monte-Carlo noise draws per cell"),
    target_error: float | None = typer.Option(None, "--target-error", help="smallest ε with predicted error ≤ this"),
    max_linking_risk: float | None = typer.Option(
        None, "--max-linking-risk", help="smallest k with linking risk ≤ this"
    ),
    operator: str | None = typer.Option(None, "--operator", help="who asks (default: OS user)"),
    db: Path | None = typer.Option(None, "--db", envvar="KEPSILON_AUDIT_DB", help="audit store (default ./.kepsilon/audit.db)"),
) -> None:
    """Print what each k and ε of a grid would do to SPEC.yaml's data, before any ε is spent.

    Per cell: the anonymiser's suppression and classes and the predicted error (exact), and the expected
    confidence suppression, error and linking risk (Monte-Carlo over noise that is thrown away). Spends no
    ε and publishes nothing; recorded in the audit store as an advice event. For the steward only.
    """
    import getpass
    import time

    from kepsilon.flows.spec import load_spec, require_kepsilon_mode
    from kepsilon.tasks.advise import (
        DATA_DEPENDENCE,
        DEFAULT_EPSILON,
        DEFAULT_K,
        advice_rows,
        advise_and_record,
        answer_lines,
        monte_carlo_note,
    )

    started = time.monotonic()
    try:
        spec = load_spec(spec_path, operator=operator)
        require_kepsilon_mode(spec, "the advisor")
        run = advise_and_record(
            spec,
            operator=spec.operator or getpass.getuser(),
            via="cli",
            k_values=_numbers("--k", k, int) or DEFAULT_K,
            epsilon_values=_numbers("--epsilon", epsilon, float) or DEFAULT_EPSILON,
            draws=draws,
            target_error=target_error,
            max_linking_risk=max_linking_risk,
            store=db,
        )
    except KepsilonError as failure:
        errors.print(f"[bold red]advice refused:[/] {escape(str(failure))}", soft_wrap=True)
        raise typer.Exit(code=2) from None
    rows = advice_rows(run.advice)
    table = Table(title=f"advice for {run.advice.population_id} ({run.advice.rows} records, {run.advice.algorithm})")
    for column in max(rows, key=len):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*[row.get(str(c.header), "") for c in table.columns])
    console.print(table)
    console.print(monte_carlo_note(run.advice), soft_wrap=True)
    for line in answer_lines(run.advice, target_error, max_linking_risk):
        console.print(line, soft_wrap=True)
    console.print(
        f"recorded as advice event {run.event_id} in the audit store; no ε spent; private figures in "
        f"{escape(str(run.report_dir))} ({time.monotonic() - started:.1f} s)",
        soft_wrap=True,
    )
    console.print(DATA_DEPENDENCE, soft_wrap=True)


@app.command()
def init(
    data_path: Path = typer.Argument(..., metavar="DATA.csv", help="your table: a CSV with a header, or Parquet"),
    output: Path | None = typer.Option(
        None, "-o", "--output", metavar="SPEC.yaml", help="spec to write (default: DATA's name .yaml, here)"
    ),
) -> None:
    """Write a starter release spec for DATA.csv: a suggested role and hierarchy for every column.

    Edit it (the bounds read from the data are private: replace them with public ones), set the
    population's ε cap, then check and release it. Reads the file only: nothing recorded, no ε spent.
    Never overwrites a file.
    """
    os.environ.setdefault("DO_NOT_TRACK", "1")  # init reads a file; Prefect's telemetry banner has no place here
    from kepsilon.init_spec import summary_lines, write_starter_spec

    try:
        starter = write_starter_spec(data_path, output)
    except KepsilonError as failure:
        errors.print(f"[bold red]init refused:[/] {escape(str(failure))}", soft_wrap=True)
        raise typer.Exit(code=2) from None
    for line in summary_lines(starter):
        console.print(escape(line), soft_wrap=True)


def summary_table(manifest: dict) -> Table:
    from kepsilon.flows.report import summary_rows

    table = Table(title=f"release {manifest['release_id']}", show_header=True, header_style="bold")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for row in summary_rows(manifest):
        table.add_row(row["measure"], row["value"])
    return table


_mount_audit_commands()
