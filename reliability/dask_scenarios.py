"""The Dask engine under attack and under kills (issue 21, items 1 and 2; issue 24, item 5).

Kept apart from ``scenarios.py``: every scenario here runs the real ``kepsilon release`` on the Dask
engine (a LocalCluster the CLI starts) with its temporary folder (``TMPDIR``) inside the scenario's
folder, so the default scratch it uses and sweeps is its own.

- ``dask_kill_scenario``: canaries planted in the source (an exact height, a name); the release SIGKILLed
  at one point of the Dask path; then the output folder and the scratch are searched for the canaries
  (nothing readable anywhere, no scratch under the output folder, every leftover piece sealed); then a
  release of another id on the memory engine removes the leftovers and says so.
- ``cluster_intruder_scenario``: a release held in the middle of ``distribute``; meanwhile another
  client tries every port the release's processes listen on — without credentials, with credentials of
  its own, as plain HTTP — and gets nothing; every port is on 127.0.0.1.
- ``worker_kill_scenario``: a worker SIGKILLed inside ``distribute`` or ``publish-part`` (once): the
  release still publishes, complete, with one spend.
"""

from __future__ import annotations

import os
import struct
import subprocess
import time
import uuid
from pathlib import Path

import pandas as pd

from kepsilon.faults import DASK_FAULT_POINTS
from kepsilon.tasks.scratch import MAGIC, MARKER, ROOT_PREFIX

from .harness import BIN, Results, finish, kepsilon, ledger_kinds, spec_dict, store_env, write_spec

# The flow-process kill points a Dask release passes, in order (the shared ones included).
DASK_KILL_POINTS = ("dask-intake", "after-reservation", "dask-distribute", "dask-perturb-suppress", "after-noise",
                    "dask-publish-part", "before-audit-commit")
assert set(DASK_FAULT_POINTS) <= set(DASK_KILL_POINTS)
CANARY_HEIGHT = 171.2345678
NO_BUDGET_FAILURES = {"suppression_budget": 1.0, "max_linking_risk": 1.0}
SWEEP_LINE = "scratch folder(s) left by interrupted Dask runs"


def plant_dask_canaries(source: Path, target: Path, rows: int = 5) -> dict[str, bytes]:
    """Copy ``source`` with an exact canary height and a canary name in its first ``rows`` records;
    returns the byte patterns that would give them away (text, and the height as a float64)."""
    frame = pd.read_csv(source, sep=";", dtype=str, keep_default_na=False)
    name = f"CANARYNAME{uuid.uuid4().hex[:12]}"
    frame.loc[: rows - 1, "HEIGHT"] = repr(CANARY_HEIGHT)
    frame.loc[: rows - 1, "NAME"] = name
    frame.to_csv(target, sep=";", index=False)
    return {
        "height as text": repr(CANARY_HEIGHT).encode(),
        "height as float64": struct.pack("<d", CANARY_HEIGHT),
        "height as big-endian float64": struct.pack(">d", CANARY_HEIGHT),
        "name": name.encode(),
    }


def _environment(env: dict, work: Path) -> dict:
    tmp = work / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    return {**store_env(env, work), "KEPSILON_DEFAULT_CAP": "10", "TMPDIR": str(tmp),
            "KEPSILON_REPORTS_DIR": str(work / "reports")}


def _dask_spec(work: Path, release_id: str, source: Path, **execution) -> Path:
    spec = spec_dict(work, release_id, source={"path": str(source), "delimiter": ";"}, **NO_BUDGET_FAILURES,
                     execution={"engine": "dask", "workers": 1, "partitions": 2, "csv": True, **execution})
    return write_spec(work, spec)


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


def _found(needles: dict[str, bytes], files: list[Path]) -> list[str]:
    found: set[str] = set()
    for path in files:
        content = path.read_bytes()
        found.update(name for name, needle in needles.items() if needle in content)
    return sorted(found)


def dask_kill_scenario(results: Results, env: dict, work: Path, sample: Path, point: str) -> None:
    """SIGKILL a Dask release at ``point``; search what it left; a later release of another id sweeps it."""
    cat = "dask scratch"
    label = f"{point} [{work.name}]"
    work.mkdir(parents=True, exist_ok=True)
    run_env = _environment(env, work)
    source = work / "canary-source.csv"
    needles = plant_dask_canaries(sample, source)
    results.add(cat, f"{label}: positive control: every canary is in the planted source",
                _found({k: v for k, v in needles.items() if "float64" not in k}, [source]) == ["height as text", "name"])
    killed = kepsilon(["release", str(_dask_spec(work, "killed-release", source))], run_env, work, fault=point)
    results.add(cat, f"{label}: killed by SIGKILL", killed.returncode == -9, f"exit {killed.returncode}")

    out = work / "out"
    account = work / "tmp" / f"{ROOT_PREFIX}{os.getuid()}"
    runs = [p for p in account.iterdir() if (p / MARKER).exists()] if account.exists() else []
    leftovers = [p for run in runs for p in _files(run) if p.name != MARKER]
    results.add(cat, f"{label}: no scratch under the output folder", not list(out.rglob("*.scratch")) and not any(
        (p / MARKER).exists() for p in out.rglob("*")), "searched for scratch folders and markers")
    results.add(cat, f"{label}: no canary readable under the output folder", not _found(needles, _files(out)),
                f"{len(_files(out))} files searched")
    results.add(cat, f"{label}: the killed run left its scratch folder (to be swept)", len(runs) == 1, f"{len(runs)} run folder(s)")
    results.add(cat, f"{label}: no canary readable in the scratch", not _found(needles, leftovers),
                f"{len(leftovers)} pieces searched")
    unsealed = [p.name for p in leftovers if not p.read_bytes().startswith(MAGIC)]
    results.add(cat, f"{label}: every leftover piece is sealed", not unsealed, f"unsealed: {len(unsealed)}")
    private = all(oct(p.stat().st_mode & 0o777) == ("0o700" if p.is_dir() else "0o600")
                  for run in runs for p in [run, *run.rglob("*")])
    results.add(cat, f"{label}: scratch folders 0700, files 0600", private)

    later = work / "later.yaml"
    spec = spec_dict(work, "later-release", source={"path": str(sample), "delimiter": ";"}, **NO_BUDGET_FAILURES)
    later.write_text(__import__("yaml").safe_dump(spec, sort_keys=False), encoding="utf-8")
    swept = kepsilon(["release", str(later)], run_env, work)
    said = [line for line in (swept.stdout + swept.stderr).splitlines() if SWEEP_LINE in line]
    results.add(cat, f"{label}: a later release of another id completes", swept.returncode == 0, f"exit {swept.returncode}")
    results.add(cat, f"{label}: it says in one line that it removed the leftovers",
                len(said) == 1 and (not runs or str(runs[0]) in said[0]), f"{len(said)} line(s)")
    remaining = [p for p in account.iterdir() if (p / MARKER).exists()] if account.exists() else []
    results.add(cat, f"{label}: no scratch left after it", not remaining, f"{len(remaining)} run folder(s)")


def _tree_ports(pid: int) -> list[tuple[str, int]]:
    import psutil

    found = []
    for process in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
        try:
            connections = process.net_connections(kind="inet")
        except psutil.Error:
            continue
        found += [(c.laddr.ip, c.laddr.port) for c in connections if c.status == psutil.CONN_LISTEN]
    return found


INTRUDER = """
import os, socket, ssl, sys, urllib.error, urllib.request
from distributed import Client, Security
port, attempts = int(sys.argv[1]), sys.argv[2:]


def attempt(how):
    if how == "http":
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/info/main/workers.html", timeout=5)
            return "GOT a page"
        except urllib.error.HTTPError as answer:
            return "GOT a page" if answer.code != 404 else "refused: 404"
        except Exception as error:
            return f"refused: {type(error).__name__}"
    if how == "tls-no-certificate":
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        try:  # a TLS alert (certificate required) is a refusal; silence means the session was open
            with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, context.wrap_socket(raw) as tls:
                tls.sendall(bytes(8))
                tls.recv(1)
            return "GOT a TLS session"
        except ssl.SSLError as error:
            return f"refused: {error.reason}"
        except OSError as error:
            return "GOT a TLS session" if isinstance(error, TimeoutError) else f"refused: {type(error).__name__}"
    options = {"security": Security.temporary()} if how == "tls-own-credentials" else {}
    scheme = "tls" if how == "tls-own-credentials" else "tcp"
    try:
        with Client(f"{scheme}://127.0.0.1:{port}", timeout=5, **options) as intruder:
            return f"GOT a task run in process {intruder.submit(os.getpid).result(timeout=5)}"
    except Exception as error:
        return f"refused: {type(error).__name__}"


for how in attempts:
    print(how, attempt(how), flush=True)
"""


def _is_http(port: int) -> bool:
    """Whether a port answers HTTP (a status line, whatever the status)."""
    import http.client
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5)
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError):
        return False  # a Dask comm answers with its own handshake, or hangs up
    return True


def _intrusions(port: int) -> dict[str, bool]:
    """What another process gets from a port: True where it got something (a page, a session, a task run).

    The attempts run in a process of their own, as another account's would, with a hard time limit (an
    attempt that hangs got nothing)."""
    import sys

    attempts = ["http"] if _is_http(port) else ["tls-no-certificate", "tls-own-credentials", "tcp-no-credentials"]
    try:
        answer = subprocess.run([sys.executable, "-c", INTRUDER, str(port), *attempts], capture_output=True, text=True,
                                timeout=120).stdout
    except subprocess.TimeoutExpired as hung:
        partial = hung.stdout or ""
        answer = partial.decode() if isinstance(partial, bytes) else partial
    lines = dict(line.split(" ", 1) for line in answer.splitlines() if " " in line)
    return {how: lines.get(how, "").startswith("GOT") for how in attempts}


def cluster_intruder_scenario(results: Results, env: dict, work: Path, sample: Path) -> None:
    """Hold a Dask release mid-``distribute``; try its every listening port as another client would."""
    cat = "dask cluster"
    work.mkdir(parents=True, exist_ok=True)
    hold = work / "hold"
    run_env = {**_environment(env, work), "KEPSILON_HOLD_AT": "dask-distribute", "KEPSILON_HOLD_FILE": str(hold),
               "KEPSILON_HOLD_SECONDS": "1200"}
    spec = _dask_spec(work, "held-release", sample, workers=2)
    process = subprocess.Popen([str(BIN / "kepsilon"), "release", str(spec)], cwd=work, env=run_env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 600
        while not hold.with_name(hold.name + ".reached").exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        results.add(cat, "the release reached distribute and holds there", hold.with_name(hold.name + ".reached").exists())
        ports = _tree_ports(process.pid)
        results.add(cat, "its processes listen (scheduler, workers, HTTP)", len(ports) >= 3, f"{len(ports)} ports")
        results.add(cat, "every listening port is on 127.0.0.1", all(ip == "127.0.0.1" for ip, _ in ports),
                    f"{sorted({ip for ip, _ in ports})}")
        gains = {f"{what} on port {port}": ok for _, port in ports for what, ok in _intrusions(port).items()}
        results.add(cat, "another client gets nothing from any port (no task run, no page)", not any(gains.values()),
                    f"{sum(gains.values())} of {len(gains)} attempts got something: {[k for k, v in gains.items() if v]}")
        still = process.poll() is None and set(_tree_ports(process.pid)) == set(ports)
        results.add(cat, "the release was still held, the same ports open, after every attempt", still)
    finally:
        hold.touch()
        output, _ = finish(process, 600)
    results.add(cat, "the held release then publishes", process.returncode == 0, f"exit {process.returncode}")
    results.add(cat, "no 'dashboard is available' line", "dashboard is available" not in output)


def _complete(folder: Path) -> tuple[bool, str]:
    """A Dask release's folder as its manifest lists it: every output present with its SHA-256, every part
    listed, no other file (``reader_view`` of the memory layout, with the dataset's folder of parts)."""
    import hashlib
    import json

    manifest = folder / "manifest.json"
    if not manifest.exists():
        return False, "no manifest"
    outputs = json.loads(manifest.read_text(encoding="utf-8")).get("outputs", {})
    wrong = [name for name, digest in outputs.items()
             if not (folder / name).is_file() or hashlib.sha256((folder / name).read_bytes()).hexdigest() != digest]
    present = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()} - {"manifest.json"}
    extra = sorted(present - set(outputs))
    return not wrong and not extra, f"{len(outputs)} outputs; wrong or missing {wrong}; unlisted {extra}"


def worker_kill_scenario(results: Results, env: dict, work: Path, sample: Path, point: str) -> None:
    """SIGKILL a Dask worker inside a partition task (once): the partition is re-run, the release publishes."""
    cat = "dask worker kill"
    work.mkdir(parents=True, exist_ok=True)
    once = work / "killed-once"
    run_env = {**_environment(env, work), "KEPSILON_FAULT_ONCE": str(once)}
    spec = _dask_spec(work, "worker-kill", sample, workers=2, partitions=3)
    run = kepsilon(["release", str(spec)], run_env, work, fault=point)
    results.add(cat, f"{point}: a worker was killed inside the task", once.exists())
    results.add(cat, f"{point}: the release still publishes", run.returncode == 0,
                f"exit {run.returncode} {' '.join(run.stderr.split())[-200:]}")
    ok, detail = _complete(work / "out" / "worker-kill")
    results.add(cat, f"{point}: the published folder is complete and consistent", ok, detail)
    kinds = ledger_kinds(work / "audit.db")
    results.add(cat, f"{point}: one reservation, one spend", (kinds.get("reserve"), kinds.get("spend")) == (1, 1), f"{kinds}")
