"""The figures of docs/performance.md, written from the files the benchmarks write, never by hand.

``make bench`` writes ``benchmarks/results.json`` and then calls :func:`rewrite`; ``make bench-scale`` writes
``benchmarks/scale-results.json``, after which ``python -m benchmarks.doc_tables`` does the same. :func:`rewrite`
replaces every table of docs/performance.md between a ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->`` marker with
the table rendered from those files. ``tests/test_docs.py`` checks that the page holds exactly what this module
renders from the committed result files, so a figure typed by hand there, or a stale one, fails the tests.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results.json"
SCALE_RESULTS = HERE / "scale-results.json"
PAGE = HERE.parent / "docs" / "performance.md"

# Targets of the project brief (seconds, peak MB), as `make bench` judges them; the OLA cases carry their own.
TARGETS: dict[str, tuple[float, float | None]] = {
    "mondrian-32k": (0.3, None), "engine-32k": (1.0, None), "engine-1m": (30.0, 4096.0),
    "audit-check-100k": (1.0, None), "engine-import": (1.0, None), "release-10m-dask": (240.0, 3072.0),
}


def _target(result: dict) -> str:
    seconds, megabytes = TARGETS.get(result["name"], (result.get("target_seconds"), None))
    if seconds is None:
        return "—"
    return f"< {seconds:g} s" + (f", < {megabytes / 1024:g} GB" if megabytes else "")


def stage_table(results: list[dict]) -> str:
    """Stage and engine cases: time and peak memory of each, with its target."""
    rows = ["| case | rows | seconds | peak RSS | target |", "|---|---:|---:|---:|---|"]
    for result in results:
        if result["name"].startswith(("ola-synthetic-", "release-")):
            continue
        rows.append(f"| `{result['name']}` | {result['rows']:,} | {result['seconds']:.3g} | "
                    f"{result['peak_rss_mb']:,.0f} MB | {_target(result)} |")
    return "\n".join(rows)


def ola_table(results: list[dict]) -> str:
    """OLA on paper-synthetic per k: the node's level of YOB, suppression, classes, nodes grouped, time."""
    rows = ["| k | node | suppressed | classes | nodes grouped / lattice | seconds |", "|---:|---|---:|---:|---:|---:|"]
    for result in results:
        if not result["name"].startswith("ola-synthetic-"):
            continue
        k = result["name"].removeprefix("ola-synthetic-k")
        rows.append(f"| {k} | `{result['node']}` | {result['suppressed_pct']:.2f} % | {result['n_classes']:,} | "
                    f"{result['nodes_evaluated']} / {result['nodes_in_lattice']} | {result['seconds']:.3f} |")
    return "\n".join(rows)


def release_table(results: list[dict]) -> str:
    """Whole releases through `kepsilon release`: wall time and each process's peak memory."""
    rows = ["| case | engine | rows | seconds | client (flow + scheduler) | Prefect server | each Dask worker |",
            "|---|---|---:|---:|---:|---:|---|"]
    for result in results:
        if not result["name"].startswith("release-"):
            continue
        processes = result["processes"]
        workers = [f"{mb:,.0f}" for name, mb in sorted(processes.items()) if name.startswith("dask-worker")]
        rows.append(f"| `{result['name']}` | {result['engine']} | {result['rows']:,} | {result['seconds']:.1f} | "
                    f"{processes['client']:,.0f} MB | {processes['prefect-server']:,.0f} MB | "
                    f"{' / '.join(workers) + ' MB' if workers else '—'} |")
    return "\n".join(rows)


def fine_table(fine: dict) -> str:
    """`make bench-scale`'s fine-grained series: the fixed-cost case, then each size, with every process's peak.

    A worker the nanny replaced during a case shows with its successor's peak ("then replaced by …"), and that
    case's partition work is not given: the replaced process's CPU counter restarted, so the figure measures nothing.
    """
    rows = ["| case | rows | distinct tuples | classes | partitions | wall | flow process | scheduler | each worker | "
            "Prefect server | partition work |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    for case in [fine["fixed_cost_case"], *fine["cases"]]:
        peaks = case["peak_rss_mb"]
        workers = " / ".join(f"{mb:,.0f}" for name, mb in sorted(peaks.items()) if name.startswith("dask-worker-"))
        successors = [mb for name, mb in peaks.items() if name.startswith("service-child-")]
        if successors:
            workers += " MB, then replaced by " + " / ".join(f"{mb:,.0f}" for mb in successors)
        work = case["partition_work"]["us_per_record_per_core_cpu"]
        rows.append(
            f"| `{case['name']}` | {case['rows']:,} | {case['distinct_tuples']:,} | {case['classes']:,} | "
            f"{case['partitions']} | {case['seconds']:.1f} s | {peaks['flow (kepsilon release)']:,.0f} MB | "
            f"{peaks['dask-scheduler']:,.0f} MB | {workers} MB | {peaks['prefect-server']:,.0f} MB | "
            f"{'not measured' if successors or work < 0 else f'{work:.1f} µs'} |")
    return "\n".join(rows)


def tables() -> dict[str, Callable[[], str]]:
    """Each marked table of the page and how to render it from the result files."""
    return {
        "bench-stages": lambda: stage_table(_load(RESULTS)),
        "bench-ola": lambda: ola_table(_load(RESULTS)),
        "bench-releases": lambda: release_table(_load(RESULTS)),
        "bench-scale": lambda: release_table(_scale_series()),
        "bench-scale-fine": lambda: fine_table(json.loads(SCALE_RESULTS.read_text(encoding="utf-8"))["fine"]),
    }


def _scale_series() -> list[dict]:
    """The resampled series of `make bench-scale`: the file's list, or its "series" entry where the file groups
    several series by name."""
    data = json.loads(SCALE_RESULTS.read_text(encoding="utf-8"))
    return data if isinstance(data, list) else data.get("series", [])


def _load(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))


def marked(text: str, name: str) -> str:
    """The text between NAME's markers (stripped); ``KeyError`` when the page has no such markers."""
    match = re.search(rf"<!-- {name}:begin -->\n(.*?)<!-- {name}:end -->", text, flags=re.DOTALL)
    if match is None:
        raise KeyError(name)
    return match.group(1).strip()


def rewrite(page: Path = PAGE) -> None:
    """Replace every marked table of ``page`` with its rendering; written to a temporary name, then renamed."""
    text = page.read_text(encoding="utf-8")
    for name, render in tables().items():
        old = f"<!-- {name}:begin -->\n{marked(text, name)}\n<!-- {name}:end -->"
        if old not in text:
            raise ValueError(f"{page}: the {name} table is not laid out as `make bench` writes it")
        text = text.replace(old, f"<!-- {name}:begin -->\n{render()}\n<!-- {name}:end -->", 1)
    temporary = page.with_name(f".{page.name}.writing")
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(page)


if __name__ == "__main__":
    rewrite()
    print(f"written: {PAGE}")
