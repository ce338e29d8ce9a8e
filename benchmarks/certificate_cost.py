"""`make certificate-cost`: what the officer's certificate costs a release (docs/certificate.md).

    python -m benchmarks.certificate_cost              # adult (memory) and population-10m (dask)
    python -m benchmarks.certificate_cost --cases adult

Each case runs a whole release through ``kepsilon release`` (as ``benchmarks/scale.py`` does: throw-away
store, seed key, Prefect home, reports and output folders; wall time and every process's peak memory)
with the certificate's figures asked for in full — a classifier target and a declared population —
then reads from the release's record in the store what the figures took:

* ``certificate.seconds`` and ``seconds_by_part``: computed in the flow's process (memory engine), or by
  the reduction task on the cluster (Dask engine);
* ``certificate.seconds_in_partitions`` (Dask engine): the partitions' sketches, summed over partitions
  (they run in parallel on the workers, inside the intake and publish stages);
* the rendering of the HTML document from the store (``kepsilon.audit.certificate.render_for``, timed
  here in this process), which the release does after its record is committed.

Cases: ``adult`` (UCI Adult, 30,162 records, memory engine, target salary-class, sampling fraction 1 %);
``population-10m`` (10,000,000 synthetic people, Dask engine, 2 local workers, 20 partitions, target
GENDER, sampling fraction 1 %; generated once into benchmarks/.populations/ by benchmarks/population.py,
not timed). The machine and its load are written beside the figures: on a shared machine they are
slower than on an idle one.
"""

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import yaml

from benchmarks.scale import ROOT, TreeWatcher, case_spec, population, release_environment

RESULTS = Path(__file__).resolve().parent / "certificate-cost.json"
ADULT = ROOT / "releases" / "adult.yaml"


def adult_spec(folder: Path) -> Path:
    spec = yaml.safe_load(ADULT.read_text(encoding="utf-8"))
    spec["release_id"] = "bench-certificate-adult"
    spec["source"]["path"] = str((ADULT.parent / spec["source"]["path"]).resolve())
    for quasi in spec["roles"]["k_quasi"]:
        quasi["hierarchy"] = str((ADULT.parent / quasi["hierarchy"]).resolve())
    spec["output_dir"] = str(folder / "out")
    spec["certificate"] = {"utility_target": "salary-class"}
    spec["population"] = {"sampling_fraction": 0.01}
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


def population_spec(folder: Path, rows: int, partitions: int) -> Path:
    path = case_spec(folder, population(rows, "parquet"), "dask", "parquet", partitions)
    spec = yaml.safe_load(path.read_text(encoding="utf-8"))
    spec["certificate"] = {"utility_target": "GENDER"}
    spec["population"] = {"sampling_fraction": 0.01}
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


def run(name: str, make_spec) -> dict:
    """One release, then its certificate's figures' costs from the store."""
    from kepsilon.audit.certificate import render_for
    from kepsilon.audit.store import open_store

    folder = Path(tempfile.mkdtemp(prefix=f"kepsilon-certificate-{name}-"))
    try:
        spec = make_spec(folder)
        release_id = yaml.safe_load(spec.read_text(encoding="utf-8"))["release_id"]
        environment = release_environment(folder)
        load_before = os.getloadavg()[0]
        started = time.perf_counter()
        process = psutil.Popen([str(Path(sys.executable).parent / "kepsilon"), "release", str(spec)], cwd=folder,
                               env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        with TreeWatcher(process) as watcher:
            output, _ = process.communicate()
        seconds = time.perf_counter() - started
        if process.returncode != 0:
            raise RuntimeError(f"{name}: kepsilon release exited with {process.returncode}:\n{output[-3000:]}")
        db = open_store(folder / "audit.db")
        try:
            record = json.loads(db.conn.execute(
                "SELECT manifest FROM releases WHERE release_id = ? AND outcome = 'published'", (release_id,)).fetchone()[0])
        finally:
            db.close()
        begun = time.perf_counter()
        document, _ = render_for(folder / "audit.db", release_id)
        render_seconds = time.perf_counter() - begun
        certificate = record["certificate"]
        execution = record["execution"]
        from datetime import datetime

        flow_seconds = (datetime.fromisoformat(execution["finished_at"]) - datetime.fromisoformat(execution["started_at"])).total_seconds()
        written = (folder / "reports" / release_id / "certificate.html").exists()
        return {
            "name": name,
            "rows_in": record["rows_in"],
            "rows_published": record["rows_published"],
            "engine": execution.get("engine", "memory"),
            "command_seconds": round(seconds, 1),
            "flow_started_to_finished_seconds": round(flow_seconds, 1),
            "certificate_seconds": certificate["seconds"],
            "certificate_seconds_by_part": certificate["seconds_by_part"],
            "certificate_seconds_in_partitions": certificate.get("seconds_in_partitions"),
            "classifier_seconds": (certificate["utility"].get("classifier") or {}).get("seconds"),
            "render_seconds": round(render_seconds, 2),
            "document_bytes": len(document.encode("utf-8")),
            "certificate_written_at_release": written,
            "peak_rss_mb": max(watcher.by_role().values()),
            "processes_peak_mb": watcher.by_role(),
            "load_average_before": round(load_before, 1),
            "load_average_after": round(os.getloadavg()[0], 1),
        }
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def fine_population_spec(folder: Path, rows: int, partitions: int) -> Path:
    """The fine-grained population (``benchmarks/population.py --fine``), where the risk models' tables grow with
    the distinct tuples: the release of ``make bench-scale`` on a local cluster, its certificate asked for in full."""
    from benchmarks.scale import fine_population, fine_spec

    path = fine_spec(folder, fine_population(rows), scheduler="")
    spec = yaml.safe_load(path.read_text(encoding="utf-8"))
    spec["release_id"] = f"bench-certificate-fine-{rows}"
    spec["execution"] = {"engine": "dask", "workers": 2, "partitions": partitions}
    spec["certificate"] = {"utility_target": "GENDER"}
    spec["population"] = {"sampling_fraction": 0.01}
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


CASES = {
    "adult": adult_spec,
    "population-10m": lambda folder: population_spec(folder, 10_000_000, 20),
    "fine-10m": lambda folder: fine_population_spec(folder, 10_000_000, 20),
}


def machine() -> dict:
    return {"cpus": os.cpu_count(), "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
            "platform": platform.platform(), "python": platform.python_version()}


def table(results: list[dict]) -> str:
    lines = ["| case | engine | records | whole command | flow (started → finished) | certificate figures (of which classifier) "
             "| sketches in partitions (sum) | rendering | share of the flow |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        spent = r["certificate_seconds"] + (r["certificate_seconds_in_partitions"] or 0)
        lines.append(
            f"| {r['name']} | {r['engine']} | {r['rows_in']:,} | {r['command_seconds']:.1f} s | {r['flow_started_to_finished_seconds']:.1f} s "
            f"| {r['certificate_seconds']:.2f} s ({r['classifier_seconds'] or 0:.2f} s) "
            f"| {'—' if r['certificate_seconds_in_partitions'] is None else format(r['certificate_seconds_in_partitions'], '.2f') + ' s'} "
            f"| {r['render_seconds']:.2f} s | {100 * spent / r['flow_started_to_finished_seconds']:.0f} % |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    arguments = parser.parse_args()
    results = []
    for name in arguments.cases:
        print(f"running {name} (load average {os.getloadavg()[0]:.1f}) ...", flush=True)
        results.append(run(name, CASES[name]))
        print(json.dumps(results[-1], indent=2), flush=True)
    RESULTS.write_text(json.dumps({"machine": machine(), "results": results}, indent=2) + "\n", encoding="utf-8")
    print(table(results))
    print(f"machine: {machine()}")
    print(f"written: {RESULTS}")


if __name__ == "__main__":
    main()
