"""The DP mode on UCI Adult at ε = 1, δ ≤ 1e-6: the DP search against the best fixed node.

``make dp-adult`` (or ``python -m benchmarks.dp_adult``) runs the stages a ``privacy_model: dp`` release
runs (classify, plan, then sample, search and safe-k-anonymise: ``kepsilon.tasks.dp_release``, the
functions its Prefect tasks call) on ``releases/adult-dp.yaml``: eight generalised columns (a lattice of
6,480 nodes) and salary-class as read, over ``RUNS`` fixed benchmark seeds (never do that for a release).
It prints one markdown table, each figure the mean over the seeds (the spread in brackets):

- **DP search, exhaustive** (the spec as shipped): ε_search = 0.1 on one draw over the whole lattice,
  ε_anon = 0.9, β = 1 − e^(−0.9), k = 73 (the smallest k with δ ≤ 1e-6 there);
- **DP search, walk** (SafePub's walk, default steps) at the same parameters;
- **best fixed node**: all of ε = 1 for the anonymisation (β = 1 − e^(−1), k = 74, the smallest k with
  δ ≤ 1e-6 there) at the node with the best granularity on that seed's sample, found by trying all
  6,480 nodes. Choosing the node by looking at the data is *not* differentially private: this is the
  utility a fixed node could reach at best, for comparison only.

Utility: records published (of 30,162), records suppressed as a share of the sample (groups of fewer than
k sampled records), the node's precision loss (mean over columns of level/(height − 1); 0 = as read,
1 = all ``*``) and granularity = (1 − loss) × published / records in (the search's score, normalised).
Time: the DP stage (search, sampling, safe k-anonymisation, labels), seconds, on this machine.
"""

import statistics
import time
from pathlib import Path

import pandas as pd

from kepsilon.engine.dp import smallest_k
from kepsilon.engine.dp_search import all_nodes, precision_loss
from kepsilon.flows.spec import load_spec, parse_spec
from kepsilon.tasks.classify import classify
from kepsilon.engine.dp_release import dp_generators, mechanism, plan
from kepsilon.tasks.ingest import read_source

SPEC = Path(__file__).resolve().parent.parent / "releases" / "adult-dp.yaml"
RUNS = 5
MAX_DELTA = 1e-6


def seed(run: int) -> bytes:
    return bytes([run + 1]) * 32


def variant(base: dict, **dp) -> object:
    """The shipped spec with its DP parameters replaced (k: the smallest for δ ≤ 1e-6 at its ε_anon)."""
    probe = parse_spec({**base, "dp": {"max_delta": 0.999, **dp}})  # β and ε_anon only, before k is known
    search, anonymisation = probe.dp_epsilons()
    k = smallest_k(MAX_DELTA, probe.dp_beta(), anonymisation)
    return parse_spec({**base, "k": k, "dp": {"max_delta": MAX_DELTA, **dp}})


def figures(table: pd.DataFrame, node: dict, report: dict, heights, seconds: float) -> dict:
    loss = precision_loss(list(node.values()), heights)
    return {
        "published": report["rows_published"],
        "suppressed_share": report["rows_suppressed"] / report["rows_sampled"],
        "precision_loss": loss,
        "granularity": (1 - loss) * report["rows_published"] / report["rows_in"],
        "groups": int(table.groupby(list(table.columns), dropna=False).ngroups),
        "seconds": seconds,
        "node": node,
    }


def run_release(frame: pd.DataFrame, spec, run: int) -> dict:
    """One DP stage as the release runs it, timed."""
    dp_plan = plan(frame, spec)
    started = time.perf_counter()
    table, node, report = mechanism(frame, dp_plan, spec, dp_generators(seed(run)))
    return figures(table, node, report, dp_plan.heights, time.perf_counter() - started)


def best_fixed_node(frame: pd.DataFrame, base: dict, run: int) -> dict:
    """Non-private: the node with the best granularity on this seed's sample, then released at it."""
    probe = variant(base, node={column: 0 for column in load_spec(SPEC).generalised_columns()})
    dp_plan = plan(frame, probe)
    sampling = dp_generators(seed(run))[1]
    sampled = dp_plan.table.take(sampling.random(dp_plan.table.rows) < probe.dp_beta()).compressed()
    best, best_granularity = None, -1.0
    for node in all_nodes(dp_plan.heights):
        sizes = sampled.group_sizes(node)
        granularity = (1 - precision_loss(node, dp_plan.heights)) * sizes[sizes >= probe.k].sum()
        if granularity > best_granularity:
            best, best_granularity = node, granularity
    fixed = variant(base, node=dict(zip(dp_plan.columns, best)))
    return run_release(frame, fixed, run)


def mean_and_spread(values: list[float]) -> str:
    return f"{statistics.mean(values):.3f} ({min(values):.3f}–{max(values):.3f})"


def row(name: str, spec, runs: list[dict]) -> str:
    search, anonymisation = spec.dp_epsilons()
    published = [r["published"] for r in runs]
    return (
        f"| {name} | {search:g} + {anonymisation:g} | {spec.dp_beta():.3f} | {spec.k} | {spec.dp_delta():.2e} "
        f"| {statistics.mean(published):,.0f} ({min(published):,}–{max(published):,}) "
        f"| {mean_and_spread([100 * r['suppressed_share'] for r in runs])} % "
        f"| {mean_and_spread([r['precision_loss'] for r in runs])} | {mean_and_spread([r['granularity'] for r in runs])} "
        f"| {statistics.mean(r['groups'] for r in runs):.0f} | {statistics.mean(r['seconds'] for r in runs):.2f} |"
    )


def main() -> None:
    shipped = load_spec(SPEC)
    base = shipped.model_dump(mode="json")
    source = read_source(shipped.source)
    frame = classify(source.frame, shipped).frame
    walk = variant(base, search={"epsilon": 0.1, "strategy": "walk"})
    cases = [
        ("DP search, exhaustive (releases/adult-dp.yaml)", shipped, [run_release(frame, shipped, r) for r in range(RUNS)]),
        ("DP search, SafePub's walk", walk, [run_release(frame, walk, r) for r in range(RUNS)]),
    ]
    best_runs = [best_fixed_node(frame, base, r) for r in range(RUNS)]
    best_spec = variant(base, node=best_runs[0]["node"])
    cases.append(("best fixed node (non-private choice)", best_spec, best_runs))

    print(f"UCI Adult, {len(frame):,} records, ε = 1, δ ≤ 1e-6; mean over {RUNS} seeds (range)\n")
    print("| node chosen by | ε search + anon | β | k | δ | records published | suppressed (share of sample) "
          "| precision loss | granularity | groups | DP stage (s) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, spec, runs in cases:
        print(row(name, spec, runs))
    print("\nNodes chosen (levels in the order of the spec's columns):")
    for name, _, runs in cases:
        counts = pd.Series([tuple(r["node"].values()) for r in runs]).value_counts()
        print(f"- {name}: " + "; ".join(f"{node} ×{n}" for node, n in counts.items()))


if __name__ == "__main__":
    main()
