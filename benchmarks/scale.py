"""Whole releases through ``kepsilon release``, timed, with the peak memory of every process they start.

    python -m benchmarks.scale                     # release-1m (memory) and release-10m-dask
    python -m benchmarks.scale --series            # the dask engine at 1M, 5M and 10M rows, then release-1m
    python -m benchmarks.scale --fine              # fine-grained k-quasis at 1M, 10M, 30M rows (make bench-scale)
    python -m benchmarks.scale --fine --rows 1000000   # only the sizes given (and the fixed-cost case)

``--fine`` (issue 25): the fine-grained population (``population.py --fine``: 5-digit ZIP over 3,000 codes,
Zipf-like, year of birth, sex, race, marital status), released with a **configured** Prefect server and an
**existing** Dask scheduler, both started by this harness before the clock starts and kept across the
cases, as an operator runs them (``PREFECT_API_URL``; ``execution.scheduler: tls://127.0.0.1:…`` with the
client's TLS files in Dask's configuration, docs/dask.md): the release starts neither. The cluster: a
scheduler and ``--workers`` worker processes of one thread each, mutual TLS under a certificate made for
the session (files 0600 in a 0700 folder removed at the end), loopback only, no dashboard. Each case
records its wall time, the peak memory of every process (the flow's, the scheduler, each worker and
nanny, the Prefect server: the kernel's high-water mark, reset before each case), the distinct k-quasi
tuples and the classes (from the audit record), the Prefect task runs' durations per stage (the
partition work, in worker-seconds per record), and a small case (``FIXED_ROWS`` rows) whose wall time is
the fixed cost: what a release costs whatever its size. Results go under ``"fine"`` in
``scale-results.json`` with the machine and its load average.

Each case runs the real command on a synthetic population (``benchmarks/population.py``, generated once
into ``benchmarks/.populations/``, not timed, not shipped) with a throw-away audit store, seed key,
Prefect home and output folder, and the spec of ``releases/population-10m-dask.yaml`` pointed at it.
Wall time is the command's, from start to exit: the local Prefect server's start and stop, the Dask
cluster's (dask engine), every stage and the audit record. Memory: every process of the command's
tree is polled (``psutil``) and its peak resident set is read from the kernel's high-water mark
(``VmHWM`` in ``/proc/<pid>/status``), so a peak between two polls is not missed. Processes are
named by role: ``client`` (the ``kepsilon`` command, which runs the flow and the Dask scheduler),
``prefect-server``, ``dask-worker-N``, and ``other`` (helpers such as multiprocessing's resource
tracker).
"""

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
POPULATIONS = Path(__file__).resolve().parent / ".populations"
TEMPLATE = ROOT / "releases" / "population-10m-dask.yaml"
RESULTS = Path(__file__).resolve().parent / "scale-results.json"
MILLION = 1_000_000


def population(rows: int, fmt: str) -> Path:
    """The synthetic population of ``rows`` rows, generated once (``benchmarks/population.py``)."""
    POPULATIONS.mkdir(exist_ok=True)
    name = f"people-{rows}" + (".csv" if fmt == "csv" else "")
    path = POPULATIONS / name
    if not path.exists():
        subprocess.run(
            [sys.executable, "-m", "benchmarks.population", "--rows", str(rows), "--out", str(path), "--format", fmt],
            cwd=ROOT, check=True,
        )
    return path


def case_spec(folder: Path, source: Path, engine: str, fmt: str, partitions: int | None) -> Path:
    """The template spec, its source and output pointed at this case, on the given engine."""
    spec = yaml.safe_load(TEMPLATE.read_text(encoding="utf-8"))
    spec["release_id"] = f"bench-{engine}-{source.name}"
    spec["source"] = {"path": str(source)} | ({"delimiter": ";"} if fmt == "csv" else {})
    for quasi in spec["roles"]["k_quasi"]:
        quasi["hierarchy"] = str((TEMPLATE.parent / quasi["hierarchy"]).resolve())
    spec["output_dir"] = str(folder / "out")
    if engine == "memory":
        del spec["execution"]  # the default engine
    else:
        spec["execution"] = {**spec["execution"], "engine": engine} | ({"partitions": partitions} if partitions else {})
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


def _peak_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _role(process: psutil.Process, root_pid: int) -> str:
    if process.pid == root_pid:
        return "client"
    try:
        command = " ".join(process.cmdline())
    except psutil.Error:
        return "other"
    if "prefect" in command and "server" in command:
        return "prefect-server"
    if "spawn_main" in command or "distributed" in command:
        return "dask-worker"
    return "other"


class TreeWatcher:
    """Polls a process tree (or several: ``root`` may be a list) and keeps each process's role and peak RSS (MiB)."""

    def __init__(self, root: psutil.Process | list[psutil.Process], interval: float = 0.2):
        self.roots = root if isinstance(root, list) else [root]
        self.root, self.interval = self.roots[0], interval
        self.cpu_of: dict[int, psutil.Process] | None = None  # processes whose CPU time is sampled too
        self.cpu_samples: list[tuple[float, dict[int, float]]] = []
        self.peaks: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            processes = []
            for root in self.roots:
                try:
                    processes += [root, *root.children(recursive=True)]
                except psutil.Error:
                    pass
            for process in processes:
                peak = _peak_kib(process.pid)
                if peak is None:
                    continue
                role = self.peaks.get(process.pid, (None, 0))[0] or _role(process, self.root.pid)
                self.peaks[process.pid] = (role, max(peak / 1024, self.peaks.get(process.pid, (role, 0.0))[1]))
            if self.cpu_of is not None:
                self.cpu_samples.append((time.time(), {pid: _cpu_seconds(process) for pid, process in self.cpu_of.items()}))
            self._stop.wait(self.interval)

    def cpu_between(self, start: float, end: float) -> dict[int, float]:
        """CPU seconds each process of ``cpu_of`` used between two wall-clock times (nearest samples)."""
        inside = [sample for sample in self.cpu_samples if start <= sample[0] <= end]
        if len(inside) < 2:
            return {}
        first, last = inside[0][1], inside[-1][1]
        return {pid: round(last[pid] - first[pid], 2) for pid in first}

    def by_role(self) -> dict[str, float]:
        """Peak MiB per process, named by role (workers numbered in order of appearance)."""
        named, workers = {}, 0
        for pid, (role, peak) in sorted(self.peaks.items()):
            if role == "dask-worker":
                role = f"dask-worker-{workers}"
                workers += 1
            elif role in named:
                role = f"{role}-{pid}"
            named[role] = round(peak, 1)
        return named


def release_environment(folder: Path) -> dict[str, str]:
    """A benchmark release's own store, seed key, reports and Prefect home in ``folder`` (cap 10), and no
    configured Prefect server: the CLI starts its own, as on a machine without ``make serve``."""
    environment = {
        **os.environ,
        "PREFECT_HOME": str(folder / "prefect"),
        "KEPSILON_AUDIT_DB": str(folder / "audit.db"),
        # Its head log beside it, removed with the folder (by default it would outlive the store, in the account's state).
        "KEPSILON_AUDIT_HEAD_LOG": str(folder / "audit.heads"),
        "KEPSILON_SEED_KEY_FILE": str(folder / "seed.key"),
        "KEPSILON_REPORTS_DIR": str(folder / "reports"),
        "KEPSILON_DEFAULT_CAP": "10",
    }
    environment.pop("PREFECT_API_URL", None)
    return environment


def run_case(name: str, rows: int, engine: str, fmt: str = "parquet", partitions: int | None = None) -> dict:
    """One release through ``kepsilon release``: wall time, peak memory per process, published rows."""
    source = population(rows, fmt)
    folder = Path(tempfile.mkdtemp(prefix=f"kepsilon-{name}-"))
    try:
        spec = case_spec(folder, source, engine, fmt, partitions)
        environment = release_environment(folder)
        started = time.perf_counter()
        process = psutil.Popen(
            [str(Path(sys.executable).parent / "kepsilon"), "release", str(spec)],
            cwd=folder, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        with TreeWatcher(process) as watcher:
            output, _ = process.communicate()
        seconds = time.perf_counter() - started
        if process.returncode != 0:
            raise RuntimeError(f"{name}: kepsilon release exited with {process.returncode}:\n{output[-3000:]}")
        published = re.search(r"records published\s*│\s*(\d+)", output)
        peaks = watcher.by_role()
        return {
            "name": name,
            "rows": rows,
            "engine": engine,
            "source": "parquet dataset" if fmt == "parquet" else "csv",
            "seconds": round(seconds, 1),
            "peak_rss_mb": max(peaks.values()),
            "rows_published": int(published.group(1)) if published else None,
            "processes": peaks,
        }
    finally:
        shutil.rmtree(folder, ignore_errors=True)


TARGETS = {"release-10m-dask": (240.0, 3072.0)}


def verdict(result: dict) -> str:
    if result["name"] not in TARGETS:
        return ""
    seconds, megabytes = TARGETS[result["name"]]
    ok = result["seconds"] < seconds and result["peak_rss_mb"] < megabytes
    return ("ok " if ok else "MISSED ") + f"< {seconds:g} s, every process < {megabytes:g} MB"


def report(results: list[dict]) -> str:
    lines = [f"{'case':<22} {'rows':>11} {'seconds':>8} {'peak MB':>8}  processes (peak MB)"]
    for result in results:
        processes = ", ".join(f"{role} {mb:.0f}" for role, mb in result["processes"].items())
        lines.append(f"{result['name']:<22} {result['rows']:>11,} {result['seconds']:>8.1f} {result['peak_rss_mb']:>8.0f}  "
                     f"{processes}  {verdict(result)}")
    return "\n".join(lines)


def default_cases() -> list[tuple]:
    return [("release-1m", MILLION, "memory"), ("release-10m-dask", 10 * MILLION, "dask")]


def series_cases() -> list[tuple]:
    return [("release-1m-dask", MILLION, "dask"), ("release-5m-dask", 5 * MILLION, "dask"),
            ("release-10m-dask", 10 * MILLION, "dask"), ("release-1m", MILLION, "memory")]


# --------------------------------------------------------------------------- fine-grained k-quasis (issue 25)

FINE_SIZES = (MILLION, 10 * MILLION, 30 * MILLION)
FIXED_ROWS = 10_000  # the fixed-cost case: a release this small is almost all fixed cost
FINE_WORKERS = 2
PARTITION_STAGES = ("intake", "count-distinct", "distribute", "predict", "perturb-suppress", "publish-part", "write-csv")
FINE_K_QUASI = ("ZIP", "YOB", "GENDER", "RACE", "MARITAL_STATUS")


def partition_stages_cpu_us(stages: dict, rows: int) -> float:
    """The workers' CPU over the record partitions' own stages (``PARTITION_STAGES``: intake to publication,
    without the histogram's, Mondrian's and the certificate's shard steps), in µs per record: each stage's
    ``worker_cpu_seconds`` (the workers' CPU time over its span; the stages run one after the other)."""
    used = sum(entry.get("worker_cpu_seconds", 0.0) for stage, entry in stages.items() if stage in PARTITION_STAGES)
    return round(used / rows * 1e6, 2)


def fine_population(rows: int) -> Path:
    """The fine-grained population of ``rows`` rows (a Parquet dataset), generated once, not timed."""
    POPULATIONS.mkdir(exist_ok=True)
    path = POPULATIONS / f"fine-{rows}"
    if not path.exists():
        subprocess.run(
            [sys.executable, "-m", "benchmarks.population", "--fine", "--rows", str(rows), "--out", str(path),
             "--format", "parquet"],
            cwd=ROOT, check=True,
        )
    return path


def distinct_tuples(source: Path) -> int:
    """The population's distinct k-quasi tuples, counted here from the files (file by file, merged as it goes),
    so the figure does not depend on the release under test. Cached beside the population."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cache = source.with_name(f".{source.name}.distinct")
    if cache.exists():
        return int(cache.read_text())
    seen = None
    for file in sorted(source.glob("*.parquet")):
        chunk = pq.read_table(file, columns=list(FINE_K_QUASI)).group_by(list(FINE_K_QUASI)).aggregate([])
        seen = chunk if seen is None else pa.concat_tables([seen, chunk]).group_by(list(FINE_K_QUASI)).aggregate([])
    count = seen.num_rows if seen is not None else 0
    cache.write_text(str(count))
    return count


def fine_spec(folder: Path, source: Path, scheduler: str) -> Path:
    """The fine-grained release: the 5 k-quasis with builder hierarchies, on the existing scheduler."""
    spec = {
        "release_id": f"bench-fine-{source.name}",
        "population_id": "synthetic-fine",
        "source": {"path": str(source)},
        "roles": {
            "explicit": ["ID"],
            "k_quasi": [
                {"column": "ZIP", "hierarchy": {"kind": "masking", "length": 5}},
                {"column": "YOB", "hierarchy": {"kind": "intervals", "lower": 1930, "upper": 2010, "widths": [5, 10, 20, 40]}},
                {"column": "GENDER", "hierarchy": {"kind": "categories"}},
                {"column": "RACE", "hierarchy": {"kind": "categories"}},
                {"column": "MARITAL_STATUS", "hierarchy": {"kind": "categories"}},
            ],
            "e_quasi": [{"column": "HEIGHT", "lower": 130, "upper": 210}],
            "sensitive": ["RELIGION", "ICD"],
        },
        "k": 10, "epsilon": 1.0, "algorithm": "mondrian", "scale_basis": "diameter", "confidence": 0.99,
        "suppression_budget": 0.05,
        # A benchmark of speed and memory: the gate's linking-risk limit (10 % by default) is raised so that
        # every size is published (a 10,000-row sample of this population predicts about 11 %).
        "max_linking_risk": 0.5,
        "output_dir": str(folder / "out"),
        "execution": {"engine": "dask", "scheduler": scheduler},
    }
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


def _private_file(path: Path, content: str) -> str:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(content)
    return str(path)


class Services:
    """A Prefect server and a Dask cluster started before any case, as an operator keeps them running.

    The cluster: ``dask scheduler`` and ``dask worker --nworkers N --nthreads 1`` on 127.0.0.1, mutual TLS
    under a certificate made for this session (``Security.temporary()`` written out 0600 in a 0700 folder),
    encryption required, no dashboard, every HTTP route closed. ``client_env`` is what ``kepsilon release``
    needs to reach both (``PREFECT_API_URL``, Dask's TLS settings).
    """

    def __init__(self, folder: Path, workers: int, memory_limit: str):
        self.folder, self.workers, self.memory_limit = folder, workers, memory_limit
        self.processes: dict[str, psutil.Popen] = {}
        self.client_env: dict[str, str] = {}
        self.scheduler = ""
        self._server: contextlib.AbstractContextManager[dict] | None = None  # the Prefect server, once started

    def __enter__(self) -> "Services":
        from distributed import Security

        from kepsilon.local_server import free_port, prefect_server

        tls = self.folder / "tls"
        tls.mkdir(mode=0o700)
        credentials = Security.temporary()
        ca = _private_file(tls / "ca.pem", credentials.tls_ca_file)
        cert = _private_file(tls / "cert.pem", credentials.tls_client_cert)
        key = _private_file(tls / "key.pem", credentials.tls_client_key)
        started: list = []
        self._server = prefect_server(self.folder / "prefect", started)
        prefect_env = self._server.__enter__()
        self.processes["prefect-server"] = psutil.Process(started[0].pid)
        dask_env = {
            **os.environ,
            "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True",
            # Dask's developer logs keep 50 messages per comm, not 1,000 with each task's graph (docs/dask.md).
            "DASK_DISTRIBUTED__ADMIN__LOW_LEVEL_LOG_LENGTH": "50",
            # No statistical profiler, a tick a second, the process measured every 5 s (docs/dask.md).
            "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False",
            "DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL": "1s",
            "DASK_DISTRIBUTED__ADMIN__SYSTEM_MONITOR__INTERVAL": "5s",
            "DASK_DISTRIBUTED__SCHEDULER__HTTP__ROUTES": "[]",
            "DASK_DISTRIBUTED__WORKER__HTTP__ROUTES": "[]",
            "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": ca,
            "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": cert,
            "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY": key,
        }
        files = ["--tls-ca-file", ca, "--tls-cert", cert, "--tls-key", key]
        port = free_port()
        self.scheduler = f"tls://127.0.0.1:{port}"
        dask = str(Path(sys.executable).parent / "dask")
        quiet = {"stdout": subprocess.DEVNULL, "stderr": open(self.folder / "dask.log", "wb"), "cwd": ROOT, "env": dask_env}
        self.processes["dask-scheduler"] = psutil.Popen(
            [dask, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--protocol", "tls", "--no-dashboard", *files],
            **quiet,
        )
        self.processes["dask-workers"] = psutil.Popen(
            [dask, "worker", self.scheduler, "--host", "127.0.0.1", "--nworkers", str(self.workers), "--nthreads", "1",
             "--memory-limit", self.memory_limit, "--no-dashboard", "--local-directory", str(self.folder / "dask"), *files],
            **quiet,
        )
        self.client_env = {**{k: v for k, v in dask_env.items() if k.startswith("DASK_")},
                           "PREFECT_API_URL": prefect_env["PREFECT_API_URL"], "PREFECT_HOME": prefect_env["PREFECT_HOME"],
                           # The server asks a login: without it each release would find it refusing and start its own.
                           "PREFECT_API_AUTH_STRING": prefect_env["PREFECT_API_AUTH_STRING"]}
        self._wait_for_workers(credentials_files=(ca, cert, key))
        return self

    def _wait_for_workers(self, credentials_files: tuple[str, str, str]) -> None:
        from distributed import Client, Security

        ca, cert, key = credentials_files
        security = Security(tls_ca_file=ca, tls_client_cert=cert, tls_client_key=key, require_encryption=True)
        with Client(self.scheduler, security=security, timeout=120) as client:
            client.wait_for_workers(self.workers, timeout=180)

    def __exit__(self, *exc) -> None:
        for name in ("dask-workers", "dask-scheduler"):
            process = self.processes.get(name)
            if process is not None and process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
        if self._server is not None:
            self._server.__exit__(None, None, None)

    def long_lived(self) -> dict[str, psutil.Process]:
        """The services' processes and their children, by role, for the memory watch."""
        found: dict[str, psutil.Process] = {}
        for role, process in self.processes.items():
            found[role] = process
            workers = 0
            for child in process.children(recursive=True):
                if role == "dask-workers" and "spawn_main" in " ".join(child.cmdline()):
                    found[f"dask-worker-{workers}"] = child
                    workers += 1
                else:
                    found[f"{role}-child-{child.pid}"] = child
        return found


def reset_peaks(processes) -> None:
    """Reset each process's kernel high-water mark (``clear_refs`` 5), so a case's peak is its own."""
    for process in processes:
        try:
            Path(f"/proc/{process.pid}/clear_refs").write_text("5")
        except OSError:
            pass


def _cpu_seconds(process: psutil.Process) -> float:
    try:
        times = process.cpu_times()
        return times.user + times.system
    except psutil.Error:
        return 0.0


def _api(api_url: str, route: str, body: dict, auth_string: str | None) -> list:
    """POST ``body`` to the Prefect API's ``route`` with the server's login (every server kepsilon starts has one)."""
    import urllib.request

    from kepsilon.prefect_login import authorization_header

    request = urllib.request.Request(f"{api_url}/{route}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **authorization_header(auth_string)})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _seconds_since(stamp: str, origin: float) -> float:
    from datetime import datetime

    return round(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() - origin, 2)


def stage_times(api_url: str, started_wall: float, auth_string: str | None) -> dict:
    """The flow's stages from the Prefect API (asked with the server's login ``auth_string``): per task name, the
    task runs, their summed run time and their span (first start to last end, seconds from the command's start)."""
    from datetime import UTC, datetime

    after = datetime.fromtimestamp(started_wall - 1, UTC).isoformat()
    flows = _api(api_url, "flow_runs/filter", {"flow_runs": {"start_time": {"after_": after}}, "limit": 200}, auth_string)
    ids = [run["id"] for run in flows]
    runs, offset = [], 0
    while ids:
        page = _api(api_url, "task_runs/filter", {"flow_runs": {"id": {"any_": ids}}, "limit": 200, "offset": offset},
                    auth_string)
        runs += page
        offset += len(page)
        if len(page) < 200:
            break
    stages: dict[str, dict] = {}
    for run in runs:
        if not run.get("start_time") or not run.get("end_time"):
            continue
        name = run["name"].rsplit("-", 1)[0]
        entry = stages.setdefault(name, {"tasks": 0, "task_seconds": 0.0, "first_start_s": None, "last_end_s": None})
        entry["tasks"] += 1
        entry["task_seconds"] = round(entry["task_seconds"] + float(run.get("total_run_time") or 0.0), 2)
        start, end = _seconds_since(run["start_time"], started_wall), _seconds_since(run["end_time"], started_wall)
        entry["first_start_s"] = start if entry["first_start_s"] is None else min(entry["first_start_s"], start)
        entry["last_end_s"] = end if entry["last_end_s"] is None else max(entry["last_end_s"], end)
    flow_starts = [_seconds_since(run["start_time"], started_wall) for run in flows if run.get("start_time")]
    ordered = dict(sorted(stages.items(), key=lambda item: item[1]["first_start_s"]))
    return {"flow_run_start_s": min(flow_starts) if flow_starts else None, "stages": ordered}


def run_fine_case(name: str, rows: int, services: Services, source: Path) -> dict:
    """One fine-grained release on the running services: wall time, every process's peak and CPU time,
    the stages' task times, the distinct tuples and the classes."""
    folder = Path(tempfile.mkdtemp(prefix=f"kepsilon-{name}-"))
    try:
        spec = fine_spec(folder, source, services.scheduler)
        environment = {
            **os.environ, **services.client_env,
            "KEPSILON_AUDIT_DB": str(folder / "audit.db"),
            "KEPSILON_AUDIT_HEAD_LOG": str(folder / "audit.heads"),
            "KEPSILON_SEED_KEY_FILE": str(folder / "seed.key"),
            "KEPSILON_REPORTS_DIR": str(folder / "reports"),
            "KEPSILON_DEFAULT_CAP": "10",
        }
        long_lived = services.long_lived()
        reset_peaks(long_lived.values())
        cpu_before = {role: _cpu_seconds(process) for role, process in long_lived.items()}
        probe = speed_probe()
        load = os.getloadavg()
        started_wall, started = time.time(), time.perf_counter()
        process = psutil.Popen(
            [str(Path(sys.executable).parent / "kepsilon"), "release", str(spec)],
            cwd=folder, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        services_watcher = TreeWatcher(list(long_lived.values()))
        workers = {p.pid: p for role, p in long_lived.items() if role.startswith("dask-worker-")}
        services_watcher.cpu_of = workers
        with TreeWatcher(process) as watcher, services_watcher:
            cpu_client = 0.0
            while process.poll() is None:
                cpu_client = max(cpu_client, _cpu_seconds(process))
                try:
                    output, _ = process.communicate(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    continue
        seconds = time.perf_counter() - started
        load_after = os.getloadavg()
        if process.returncode != 0:
            raise RuntimeError(f"{name}: kepsilon release exited with {process.returncode}:\n{output[-3000:]}")
        peaks = {"flow (kepsilon release)": watcher.peaks.get(process.pid, ("client", 0.0))[1]}
        for pid, (_, peak) in watcher.peaks.items():
            if pid != process.pid:
                peaks[f"flow-child-{pid}"] = peak
        roles_by_pid = {process.pid: role for role, process in long_lived.items()}
        for pid, (_, peak) in services_watcher.peaks.items():
            peaks[roles_by_pid.get(pid, f"service-child-{pid}")] = peak
        cpu = {role: round(_cpu_seconds(p) - cpu_before[role], 1) for role, p in long_lived.items()}
        record = json.loads(_private_record(folder / "audit.db"))
        times = stage_times(services.client_env["PREFECT_API_URL"], started_wall,
                            services.client_env["PREFECT_API_AUTH_STRING"])
        # A stage is one Prefect task run in the flow's process (its partitions go to the workers as plain Dask
        # tasks), so its run time is the stage's span: the worker threads held it that long each.
        partition_stage_seconds = sum(entry["task_seconds"] for stage, entry in times["stages"].items()
                                      if stage in PARTITION_STAGES) * services.workers
        for stage, entry in times["stages"].items():
            # The stages run one after the other: the workers' CPU time over a stage's span is that stage's.
            used = services_watcher.cpu_between(started_wall + entry["first_start_s"], started_wall + entry["last_end_s"])
            if used and stage != "governed-release-dask":
                entry["worker_cpu_seconds"] = round(sum(used.values()), 2)
                entry["worker_cpu_us_per_record"] = round(sum(used.values()) / rows * 1e6, 2)
        worker_cpu = sum(value for role, value in cpu.items() if role.startswith("dask-worker-"))
        return {
            "name": name,
            "rows": rows,
            "distinct_tuples": distinct_tuples(source),
            "classes": record.get("anonymiser", {}).get("n_classes"),
            "partitions": record.get("execution", {}).get("partitions"),
            "rows_published": record.get("rows_published"),
            "seconds": round(seconds, 1),
            "speed_probe_cpu_s": probe,
            "load_average_before": [round(value, 2) for value in load],
            "load_average_after": [round(value, 2) for value in load_after],
            "peak_rss_mb": {role: round(mb, 1) for role, mb in peaks.items()},
            "cpu_seconds": {"flow (kepsilon release)": round(cpu_client, 1), **cpu},
            "partition_work": {
                "stage_thread_seconds": round(partition_stage_seconds, 1),
                "worker_cpu_seconds": round(worker_cpu, 1),
                "us_per_record_per_core_stage_time": round(partition_stage_seconds / rows * 1e6, 2),
                "us_per_record_per_core_cpu": round(worker_cpu / rows * 1e6, 2),
                "partition_stages_cpu_us_per_record": partition_stages_cpu_us(times["stages"], rows),
            },
            **times,
        }
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _private_record(store: Path) -> str:
    """The published release's private record (the audit store's ``manifest`` column)."""
    import sqlite3

    with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as connection:
        row = connection.execute("SELECT manifest FROM releases WHERE outcome = 'published' ORDER BY id DESC").fetchone()
    return row[0] if row else "{}"


def speed_probe(repeats: int = 3) -> float:
    """CPU seconds of one fixed, single-threaded piece of work like the stages' own — a sort of 2M integers, a
    hashed factorisation of 1M short texts, a pickle of a 200,000-row frame read back, AES-GCM over 16 MB — the
    best of ``repeats``, taken before each case: this machine's speed moved by a quarter within half an hour, so a
    case's figures are read beside how fast the machine was when it ran (a smaller probe: a faster machine)."""
    import pickle

    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    rng = np.random.default_rng(2026)
    integers = rng.integers(0, 2**40, size=2_000_000)
    texts = pd.array(np.char.zfill(rng.integers(0, 3_000, size=1_000_000).astype(str), 5).astype(object), dtype="string")
    frame = pd.DataFrame({"zip": texts[:200_000], "height": rng.normal(170, 10, size=200_000)})
    plain, sealer = bytes(16 << 20), AESGCM(bytes(32))  # a throughput probe over zeros: nothing secret is sealed
    best = float("inf")
    for _ in range(repeats):
        began = time.process_time()
        np.sort(integers)
        pd.factorize(texts)
        pickle.loads(pickle.dumps(frame, protocol=5))
        sealer.encrypt(bytes(12), plain, None)
        best = min(best, time.process_time() - began)
    return round(best, 3)


def machine() -> dict:
    """The machine the figures were taken on."""
    import platform

    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "note": "the load averages per case, before and after, say how busy the machine was",
    }


def fixed_and_per_record(cases: list[dict], fixed: dict) -> dict:
    """The fixed cost (the small case's wall time) and the per-record cost (the slope between the small case
    and each larger one), with a least-squares line over every case for comparison."""
    points = [(fixed["rows"], fixed["seconds"])] + [(case["rows"], case["seconds"]) for case in cases]
    rows, seconds = np.array([p[0] for p in points], dtype=float), np.array([p[1] for p in points])
    slope, intercept = (np.polyfit(rows, seconds, 1) if len(points) > 1 else (float("nan"), float("nan")))
    def cpu(case: dict) -> float:
        return sum(case["cpu_seconds"].values())

    return {
        # CPU time of every process (flow, scheduler, workers, Prefect server): what a loaded machine
        # does not inflate, unlike the wall time
        "fixed_cpu_seconds": round(cpu(fixed), 1),
        "per_record_cpu_us": {case["name"]: round((cpu(case) - cpu(fixed)) / (case["rows"] - fixed["rows"]) * 1e6, 2)
                              for case in cases},
        "fixed_seconds": fixed["seconds"],
        "per_record_us": {case["name"]: round((case["seconds"] - fixed["seconds"]) / (case["rows"] - fixed["rows"]) * 1e6, 2)
                          for case in cases},
        "least_squares": {"intercept_seconds": round(float(intercept), 1), "per_record_us": round(float(slope) * 1e6, 2)},
    }


def run_fine(sizes: list[int], workers: int, memory_limit: str) -> dict:
    """The fine-grained series on one configured Prefect server and one existing cluster; written to
    ``scale-results.json`` after every case, so a series cut short keeps what it measured."""
    sources = {rows: fine_population(rows) for rows in [FIXED_ROWS, *sizes]}
    folder = Path(tempfile.mkdtemp(prefix="kepsilon-bench-services-"))
    os.chmod(folder, 0o700)
    results: dict = {"machine": machine(), "workers": workers, "threads_per_worker": 1, "worker_memory_limit": memory_limit,
                     "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cases": []}
    completed = False
    try:
        with Services(folder, workers, memory_limit) as services:
            # A first small release warms the services (the server's database, the workers' imports), as
            # an operator's cluster is warm after its first release; it is recorded but not counted.
            results["warm_up"] = run_fine_case("fine-warm-up", FIXED_ROWS, services, sources[FIXED_ROWS])
            print(fine_report([results["warm_up"]]), flush=True)
            results["fixed_cost_case"] = run_fine_case("fine-fixed-cost", FIXED_ROWS, services, sources[FIXED_ROWS])
            print(fine_report([results["fixed_cost_case"]]), flush=True)
            _write_results("fine", results)
            for rows in sizes:
                name = f"fine-{rows // MILLION}m" if rows % MILLION == 0 else f"fine-{rows}"
                print(f"running {name} ({rows:,} rows, load average {os.getloadavg()[0]:.1f}) ...", flush=True)
                results["cases"].append(run_fine_case(name, rows, services, sources[rows]))
                print(fine_report(results["cases"][-1:]), flush=True)
                results["fixed_and_per_record"] = fixed_and_per_record(results["cases"], results["fixed_cost_case"])
                _write_results("fine", results)
        completed = True
    finally:
        kept = _keep_cluster_log(folder, results, completed)
        if kept is not None:
            print(f"a worker was replaced or the series stopped: the cluster's log is kept in {kept}", flush=True)
        shutil.rmtree(folder, ignore_errors=True)
    return results


def _replaced_workers(case: dict) -> bool:
    """Whether a worker was replaced during the case: a new process under the workers' nanny (``service-child-…``)."""
    return any(role.startswith("service-child-") for role in case.get("peak_rss_mb", {}))


def _keep_cluster_log(folder: Path, results: dict, completed: bool) -> Path | None:
    """The scheduler's and workers' log, copied out of the services' folder before it is removed, when a
    worker was replaced (the nanny says why: a memory limit, a crash) or the series did not finish.

    Kept under ``benchmarks/.logs/`` (ignored by git), 0600 in a 0700 folder: the log names the machine's
    processes and addresses, never a record's value, but it is the operator's, not the project's.
    """
    log = folder / "dask.log"
    cases = [results.get("warm_up", {}), results.get("fixed_cost_case", {}), *results["cases"]]
    if not log.exists() or (completed and not any(_replaced_workers(case) for case in cases)):
        return None
    logs = Path(__file__).resolve().parent / ".logs"
    logs.mkdir(mode=0o700, exist_ok=True)
    os.chmod(logs, 0o700)
    kept = logs / f"scale-{results['recorded_at'].replace(':', '')}-dask.log"
    descriptor = os.open(kept, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as copy:
        copy.write(log.read_bytes())
    return kept


def fine_report(cases: list[dict]) -> str:
    lines = []
    for case in cases:
        peaks = ", ".join(f"{role} {mb:.0f}" for role, mb in case["peak_rss_mb"].items() if mb >= 20)
        work = case["partition_work"]
        lines.append(
            f"{case['name']:<16} {case['rows']:>11,} rows {case['seconds']:>7.1f} s  tuples {case['distinct_tuples']:,} "
            f"classes {case['classes']}  load {case['load_average_before'][0]:.1f}->{case['load_average_after'][0]:.1f}  "
            f"speed probe {case.get('speed_probe_cpu_s', float('nan')):.3f} s  "
            f"partition work {work['us_per_record_per_core_cpu']} us/record CPU ({work['us_per_record_per_core_stage_time']} "
            f"stage time, {work.get('partition_stages_cpu_us_per_record')} CPU in the partitions' own stages)  peaks MB: {peaks}"
        )
    return "\n".join(lines)


def _write_results(key: str, value) -> None:
    """Write one part of scale-results.json, keeping the others (an older list is kept under ``series``)."""
    current = json.loads(RESULTS.read_text(encoding="utf-8")) if RESULTS.exists() else {}
    if isinstance(current, list):
        current = {"series": current}
    current[key] = value
    RESULTS.write_text(json.dumps(current, indent=2) + "\n", encoding="utf-8")
    from benchmarks.doc_tables import rewrite  # docs/performance.md's marked tables show what was just measured

    rewrite()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", action="store_true", help="the dask engine at 1M, 5M and 10M rows, then release-1m")
    parser.add_argument("--fine", action="store_true", help="fine-grained k-quasis on a configured server and cluster")
    parser.add_argument("--rows", type=int, action="append", help="--fine: a size to run (repeatable; default 1M, 10M, 30M)")
    parser.add_argument("--workers", type=int, default=FINE_WORKERS, help="--fine: worker processes (one thread each)")
    parser.add_argument("--memory-limit", default="1.5GB", help="--fine: each worker's Dask memory limit")
    parser.add_argument("--format", choices=("parquet", "csv"), default="parquet")
    arguments = parser.parse_args()
    if arguments.fine:
        results = run_fine(arguments.rows or list(FINE_SIZES), arguments.workers, arguments.memory_limit)
        _write_results("fine", results)
        print(fine_report([results["fixed_cost_case"], *results["cases"]]))
        print(json.dumps(results["fixed_and_per_record"]))
        print(f"written: {RESULTS} (fine)")
        return
    measured: list[dict] = []
    for name, rows, engine in series_cases() if arguments.series else default_cases():
        print(f"running {name} ({rows:,} rows, {engine} engine, load average {os.getloadavg()[0]:.1f}) ...", flush=True)
        measured.append(run_case(name, rows, engine, arguments.format))
        print(report(measured[-1:]), flush=True)
    _write_results("series" if arguments.series else "default", measured)
    print(report(measured))
    print(f"written: {RESULTS}")


if __name__ == "__main__":
    main()
