"""`make bench`: run every benchmark case in its own process, write benchmarks/results.json, print a table.

Cases: ``mondrian-32k`` (benchmarks/bench_mondrian.py), ``engine-32k`` and ``engine-1m``
(benchmarks/bench_engine.py), ``audit-check-100k`` (bench_audit.py), ``engine-import`` (bench_import.py), and whatever ``benchmarks.bench_ola.run_all()`` returns (a list of
result dicts with extra fields) when that module exists; then two whole releases through
``kepsilon release`` (``benchmarks/scale.py``): ``release-1m`` on the memory engine and
``release-10m-dask`` on the dask engine (local cluster of 2 workers), with the peak memory of every
process (``KEPSILON_BENCH_RELEASES=0`` leaves them out). A case module that is not there yet is
reported as skipped; an error inside an existing module is not hidden.
"""

import importlib
import json
import os
from pathlib import Path

from benchmarks.harness import measure

RESULTS = Path(__file__).resolve().parent / "results.json"
# (name, module, function) of the single-result cases.
CASES = [
    ("mondrian-32k", "benchmarks.bench_mondrian", "mondrian_32k"),
    ("engine-32k", "benchmarks.bench_engine", "engine_32k"),
    ("engine-1m", "benchmarks.bench_engine", "engine_1m"),
    ("audit-check-100k", "benchmarks.bench_audit", "audit_check_100k"),
    ("engine-import", "benchmarks.bench_import", "engine_import"),
]
# Targets from the project brief: seconds, peak RSS in MB.
TARGETS = {
    "engine-32k": (1.0, None), "engine-1m": (30.0, 4096.0), "engine-import": (1.0, None),
    "release-10m-dask": (240.0, 3072.0),  # the peak of every process of the release below 3 GB
}
MAIN_FIELDS = ("name", "rows", "seconds", "peak_rss_mb")


def _optional_module(name: str):
    """The module, or None if that module itself does not exist (yet)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            return None
        raise


def run_cases() -> tuple[list[dict], list[str]]:
    """Measure every available case; return the results and the names of skipped modules."""
    results, skipped = [], []
    for name, module_name, function in CASES:
        module = _optional_module(module_name)
        if module is None:
            skipped.append(module_name)
            continue
        results.append(measure(name, getattr(module, function)))
    ola = _optional_module("benchmarks.bench_ola")
    if ola is None:
        skipped.append("benchmarks.bench_ola")
    else:
        results.extend(ola.run_all())
    if os.environ.get("KEPSILON_BENCH_RELEASES", "1") != "0":
        from benchmarks.scale import default_cases, run_case

        for name, rows, engine in default_cases():
            print(f"running {name} through kepsilon release ({rows:,} rows, {engine} engine) ...", flush=True)
            results.append(run_case(name, rows, engine))
    return results, skipped


def _verdict(result: dict) -> str:
    if result["name"] not in TARGETS:
        return ""
    max_seconds, max_rss = TARGETS[result["name"]]
    ok = result["seconds"] < max_seconds and (max_rss is None or result["peak_rss_mb"] < max_rss)
    target = f"< {max_seconds:g} s" + (f", < {max_rss:g} MB" if max_rss else "")
    if "processes" in result:
        target += " (every process)"
    return ("ok " if ok else "MISSED ") + target


def _shown(value) -> str:
    if isinstance(value, dict):  # peak MB per process of a whole release
        return "{" + ", ".join(f"{name} {mb:.0f}" for name, mb in value.items()) + "}"
    return str(value)


def format_table(results: list[dict]) -> str:
    """A plain-text table: the four main fields, the target verdict, then any extra fields."""
    lines = [f"{'case':<28} {'rows':>10} {'seconds':>9} {'peak MB':>9}  target / extra"]
    for result in results:
        extras = ", ".join(
            f"{key}={_shown(value)}" for key, value in result.items() if key not in MAIN_FIELDS
        )
        note = "; ".join(part for part in (_verdict(result), extras) if part)
        lines.append(
            f"{result['name']:<28} {result['rows']:>10,} {result['seconds']:>9.3f} {result['peak_rss_mb']:>9.1f}  {note}"
        )
    return "\n".join(lines)


def main() -> None:
    results, skipped = run_cases()
    RESULTS.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(format_table(results))
    for module_name in skipped:
        print(f"skipped: {module_name} not found")
    print(f"written: {RESULTS}")
    from benchmarks.doc_tables import PAGE, rewrite  # docs/performance.md's tables show this run's figures

    rewrite()
    print(f"written: {PAGE}")


if __name__ == "__main__":
    main()
