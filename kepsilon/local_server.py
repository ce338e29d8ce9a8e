"""A throw-away local Prefect server for scripted checks (the deployment check, the reliability suite).

The server gets its own PREFECT_HOME, a free port, and the project's privacy-safe settings; the
context manager yields the environment a client or worker needs to talk to it, and stops the server
with SIGINT (what Prefect's processes answer to) when the block ends.
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_healthy(api_url: str, seconds: float = 120) -> None:
    """Block until the server answers its health check, or raise after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{api_url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
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


@contextlib.contextmanager
def prefect_server(home: Path) -> Iterator[dict]:
    """A real local Prefect server with its own PREFECT_HOME; yields the env a client needs."""
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_RESULTS_PERSIST_BY_DEFAULT": "false",
        "DO_NOT_TRACK": "1",
    }
    env.pop("KEPSILON_FAULT_AT", None)
    with open(home / "server.log", "wb") as log:
        server = subprocess.Popen(
            [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            cwd=home, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            wait_healthy(env["PREFECT_API_URL"])
            yield env
        finally:
            stop(server)
