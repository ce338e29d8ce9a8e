"""Local Prefect servers started by kepsilon itself, with their output in a log file rather than a terminal.

Two uses:

- ``prefect_server(home)``: a throw-away server with its own PREFECT_HOME for scripted checks (the
  deployment check, the reliability suite); yields the environment a client or worker needs.
- ``LocalServer``: the server ``kepsilon release`` runs its flow against when no Prefect API is
  configured, in place of Prefect's temporary (ephemeral) server. That one shares the CLI's stdout and
  stderr and is stopped at interpreter exit, racing Prefect's own exit-time flush of logs and events;
  what it printed while shutting down (an ERROR and a traceback, in 2 of 6 runs) read as a failed
  release. This one writes to a log file and is stopped by the CLI after the client has flushed.

Both are stopped with SIGINT (what Prefect's processes answer to), then SIGKILL if they hang. Both require a
login (Prefect's ``auth_string``, a fresh secret per server, see ``kepsilon.prefect_login``): only the
clients given it can create runs, read artifacts or subscribe to events, even from the same machine.
"""

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from kepsilon.prefect_login import CLIENT_SETTING, SERVER_SETTING, authorization_header, new_auth_string

BIN = Path(sys.executable).parent
_PR_SET_PDEATHSIG = 1


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_healthy(api_url: str, seconds: float = 120, process: subprocess.Popen | None = None) -> None:
    """Block until the server answers its health check, or raise after ``seconds`` (or once ``process`` exits)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"Prefect server at {api_url} exited with code {process.returncode} while starting")
        try:
            with urllib.request.urlopen(f"{api_url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.25)
    raise RuntimeError(f"Prefect server at {api_url} did not become healthy in {seconds:.0f} s")


def stop(process: subprocess.Popen | None, seconds: float = 30) -> None:
    """Stop a Prefect server or worker: SIGINT (a worker ignores SIGTERM), then SIGKILL if it hangs."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _parent_death_signal():
    """A pre-exec hook that has the child SIGINTed when its parent dies, or None off Linux.

    prctl is looked up here, in the parent: the hook runs between fork and exec, where loading a library
    could deadlock on a lock another thread held at fork time.
    """
    if sys.platform != "linux":
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(_PR_SET_PDEATHSIG, int(signal.SIGINT))


class LocalServer:
    """``prefect server start`` on a free port of 127.0.0.1, for the flow runs of one process.

    The server uses the caller's PREFECT_HOME (its database, like Prefect's temporary server), no UI, and
    no scheduler or late-run services: it lives for one release, so it must not schedule anything. All its
    output goes to ``log_path``; ``errors_while_running()`` tells the CLI whether it logged an error before
    the run ended (a real problem worth pointing at) as opposed to while it was being stopped.
    """

    def __init__(self, log_path: Path, *, startup_timeout: float = 120):
        self.log_path = log_path
        self.startup_timeout = startup_timeout
        self.port = free_port()
        self.api_url = f"http://127.0.0.1:{self.port}/api"
        # This run's login: the server requires it, the CLI's flow run sends it (never written to disk).
        self.auth_string = new_auth_string()
        self.process: subprocess.Popen | None = None
        self._run_ended_at: int | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PREFECT_API_URL": self.api_url, SERVER_SETTING: self.auth_string}
        env.pop(CLIENT_SETTING, None)
        command = [
            str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(self.port),
            "--no-ui", "--no-scheduler", "--no-late-runs",
        ]
        with open(self.log_path, "wb") as log:
            # Its own session: a Ctrl-C meant for the CLI must not kill the server under a flow run that is
            # still reporting its state; the CLI stops it once the run is over.
            self.process = subprocess.Popen(
                command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=_parent_death_signal(),  # a killed CLI leaves no server behind
            )
        try:
            wait_healthy(self.api_url, self.startup_timeout, self.process)
        except BaseException:
            self.stop()
            raise

    def run_ended(self) -> None:
        """Mark the end of the run in the log: what the server logs after this is its shutdown."""
        self._run_ended_at = self.log_path.stat().st_size if self.log_path.exists() else 0

    def errors_while_running(self) -> list[str]:
        """Lines of the log, up to the end of the run, that report an error or start a traceback."""
        if not self.log_path.exists():
            return []
        text = self.log_path.read_bytes()
        if self._run_ended_at is not None:
            text = text[: self._run_ended_at]
        lines = text.decode("utf-8", errors="replace").splitlines()
        return [line for line in lines if "| ERROR" in line or line.startswith("Traceback") or "CRITICAL" in line]

    def has_errors(self) -> bool:
        """Whether the whole log, shutdown included, holds an error or a traceback."""
        if not self.log_path.exists():
            return False
        text = self.log_path.read_text(encoding="utf-8", errors="replace")
        return "ERROR" in text or "Traceback" in text or "CRITICAL" in text

    def wait_until_recorded(self, seconds: float = 15) -> None:
        """Wait until the server has recorded every task run's final state, then return.

        The client's flush only hands events to the server; the server records them asynchronously, and
        stopping it mid-write makes it log a cancelled flush with a traceback. Done when no task run is
        in an unfinished state and the number of task runs is stable across two polls.
        """
        unfinished = {"task_runs": {"state": {"type": {"any_": ["SCHEDULED", "PENDING", "RUNNING", "PAUSED", "CANCELLING"]}}}}
        deadline = time.monotonic() + seconds
        last_total = None
        while time.monotonic() < deadline:
            try:
                total = self._count({})
                open_runs = self._count(unfinished)
            except OSError:
                return  # the server is not answering: nothing more to wait for
            if open_runs == 0 and total == last_total:
                return
            last_total = total
            time.sleep(0.3)

    def _count(self, body: dict) -> int:
        request = urllib.request.Request(
            f"{self.api_url}/task_runs/count", data=json.dumps(body).encode(), method="POST",
            headers={"Content-Type": "application/json", **authorization_header(self.auth_string)},
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(json.loads(response.read()))

    def stop(self) -> None:
        stop(self.process, seconds=15)

    def __enter__(self) -> "LocalServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def seeded_prefect_home(home: Path, database: Path) -> Path:
    """``home`` (created) holding a copy of ``database``, a Prefect database Prefect has already migrated, as its
    ``prefect.db``: a server started there skips Prefect's migrations (about 4.5 s of CPU on an empty home).
    The test suite's servers use it; a user's first server migrates its own. Returns ``home``."""
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(database, home / "prefect.db")
    return home


@contextlib.contextmanager
def prefect_server(home: Path, started: list | None = None, database: Path | None = None) -> Iterator[dict]:
    """A real local Prefect server with its own PREFECT_HOME; yields the env a client needs.

    The server requires a login, a fresh secret: the env yielded carries it for clients
    (PREFECT_API_AUTH_STRING); the server's own setting stays out of it.

    ``started``, if given, receives the server's ``Popen`` (its own process group): a reliability
    scenario kills it under a running release. ``database``, if given, is copied in first
    (:func:`seeded_prefect_home`).
    """
    if database is not None:
        seeded_prefect_home(home, database)
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_RESULTS_PERSIST_BY_DEFAULT": "false",
        "DO_NOT_TRACK": "1",
        CLIENT_SETTING: new_auth_string(),
    }
    env.pop("KEPSILON_FAULT_AT", None)
    env.pop(SERVER_SETTING, None)
    server_env = {**env, SERVER_SETTING: env[CLIENT_SETTING]}
    with open(home / "server.log", "wb") as log:
        server = subprocess.Popen(
            [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            cwd=home, env=server_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        if started is not None:
            started.append(server)
        try:
            wait_healthy(env["PREFECT_API_URL"], process=server)
            yield env
        finally:
            stop(server)
