"""Whole releases through ``kepsilon release``, timed, with the peak memory of every process they start.

    python -m benchmarks.scale                     # release-1m (memory) and release-10m-dask
    python -m benchmarks.scale --series            # the dask engine at 1M, 5M and 10M rows, then release-1m

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
    """Polls a process tree and keeps each process's role and peak RSS (MiB)."""

    def __init__(self, root: psutil.Process, interval: float = 0.2):
        self.root, self.interval = root, interval
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
            try:
                processes = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                processes = []
            for process in processes:
                peak = _peak_kib(process.pid)
                if peak is None:
                    continue
                role = self.peaks.get(process.pid, (None, 0))[0] or _role(process, self.root.pid)
                self.peaks[process.pid] = (role, max(peak / 1024, self.peaks.get(process.pid, (role, 0.0))[1]))
            self._stop.wait(self.interval)

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


def run_case(name: str, rows: int, engine: str, fmt: str = "parquet", partitions: int | None = None) -> dict:
    """One release through ``kepsilon release``: wall time, peak memory per process, published rows."""
    source = population(rows, fmt)
    folder = Path(tempfile.mkdtemp(prefix=f"kepsilon-{name}-"))
    try:
        spec = case_spec(folder, source, engine, fmt, partitions)
        environment = {
            **os.environ,
            "PREFECT_HOME": str(folder / "prefect"),
            "KEPSILON_AUDIT_DB": str(folder / "audit.db"),
            "KEPSILON_SEED_KEY_FILE": str(folder / "seed.key"),
            "KEPSILON_REPORTS_DIR": str(folder / "reports"),
            "KEPSILON_DEFAULT_CAP": "10",
        }
        environment.pop("PREFECT_API_URL", None)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", action="store_true", help="the dask engine at 1M, 5M and 10M rows, then release-1m")
    parser.add_argument("--format", choices=("parquet", "csv"), default="parquet")
    arguments = parser.parse_args()
    results = []
    for name, rows, engine in series_cases() if arguments.series else default_cases():
        print(f"running {name} ({rows:,} rows, {engine} engine, load average {os.getloadavg()[0]:.1f}) ...", flush=True)
        results.append(run_case(name, rows, engine, arguments.format))
        print(report(results[-1:]), flush=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(report(results))
    print(f"written: {RESULTS}")


if __name__ == "__main__":
    main()
