"""The DP mode on UCI Adult at ε = 1, δ ≤ 1e-6: the DP search's strategies and quality models.

``make dp-adult`` (or ``python -m benchmarks.dp_adult``) runs the stages a ``privacy_model: dp`` release
runs (classify, plan, then search, sample and safe-k-anonymise: ``kepsilon.engine.dp_release``, the
functions its Prefect tasks call) on ``releases/adult-dp.yaml``: eight generalised columns (a lattice of
6,480 nodes) and salary-class as read, ε_search = 0.04, ε_anon = 0.96, β = 1 − e^(−0.96), k = 73 (the
smallest k with δ ≤ 1e-6 there), over ``RUNS`` fixed benchmark seeds (never do that for a release).

Per strategy (the shipped walk; the exhaustive search with each quality model; the walk at SafePub's 111
steps; the walk and the exhaustive search at SafePub's ε_search = 0.1, where k stays 73 and δ = 7.1e-7) it
prints, each figure the mean over the seeds (the range in brackets): records published (of 30,162),
suppressed share of the sample, ARX Granularity (below), kepsilon's own granularity ((1 − the node's
precision loss) × published / records in), the DP stage's seconds (wall clock, and CPU seconds of this
process in brackets: on a loaded machine the wall clock mostly measures the wait) and the nodes scored.

**ARX Granularity** is computed from the published table alone, as ARX's ``getGranularity()`` defines it:
per generalised column, the mean over *all* input records of the label's domain share (leaves under
the label / leaves of the hierarchy; a record not published counts 1), m = 1/leaves; then
1 − (mean over columns of the shares − mean of m) / (1 − mean of m): 1 = as read, 0 = nothing.

Then **robustness to the walk's budget**: for steps from 1 to the lattice's size − 1, the expected
records published and expected ARX Granularity of the walk, each node's expectation computed exactly
(the score with the ``records`` and ``granularity`` models is that expectation) and averaged over
``SWEEP_DRAWS`` walks per step count, each walk's final draw averaged exactly over the nodes it saw,
against the exhaustive search's, computed exactly (the lowest column: the walk, of the ``SWEEP_DRAWS``, whose
final draw expects the fewest records).

The table goes to ``benchmarks/dp-adult.json`` (written under a temporary name, then renamed).
"""

import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import pandas as pd

from kepsilon.engine.dp import exponential_mechanism_probabilities
from kepsilon.engine.dp_release import dp_generators, mechanism, plan, quality_model
from kepsilon.engine.dp_search import NodeScorer, dp_search, lattice_size, precision_loss, walk_budget
from kepsilon.flows.spec import ReleaseSpec, load_spec, parse_spec
from kepsilon.tasks.classify import classify
from kepsilon.tasks.ingest import read_source

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "releases" / "adult-dp.yaml"
JSON_OUT = Path(__file__).resolve().parent / "dp-adult.json"
RUNS = 5
SWEEP_DRAWS = 40
SAFEPUB = {  # measured with ARX 3.9.2 on the same data and parameters (issue 28), five runs each
    "ARX SafePub, Loss model (111 steps)": {"mean_published": 14134, "arx_granularity": 0.2951},
    "ARX SafePub, Precision model (111 steps)": {"mean_published": 15018, "arx_granularity": 0.2603},
}


def seed(run: int) -> bytes:
    return bytes([run + 1]) * 32


def variant(base: dict, **search) -> ReleaseSpec:
    """The shipped spec with its search replaced (k stays; δ follows ε_anon and stays within max_delta)."""
    return parse_spec({**base, "dp": {**base["dp"], "search": {**base["dp"]["search"], **search}}})


def arx_granularity(table: pd.DataFrame, dp_plan, node: dict, records_in: int) -> float:
    """ARX's Granularity of a published table (module docstring), from its labels and the hierarchies."""
    shares, floors = [], []
    for column, level in node.items():
        hierarchy = dp_plan.hierarchies[column]
        leaves = len(hierarchy.leaves)
        share_of = pd.Series(hierarchy.labels[level]).value_counts() / leaves
        published = table[column].map(share_of).to_numpy(dtype=float)
        assert not np.isnan(published).any(), f"{column}: a published label is not in its hierarchy"
        shares.append((published.sum() + (records_in - len(table))) / records_in)
        floors.append(1 / leaves)
    return 1 - (np.mean(shares) - np.mean(floors)) / (1 - np.mean(floors))


def run_release(frame: pd.DataFrame, spec, run: int) -> dict:
    """One DP stage as the release runs it, timed (wall clock, and this process's CPU time, which a
    loaded machine inflates less), and its measures."""
    dp_plan = plan(frame, spec)
    started, cpu = time.perf_counter(), time.process_time()
    table, node, report = mechanism(frame, dp_plan, spec, dp_generators(seed(run)))
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu
    loss = precision_loss(list(node.values()), dp_plan.heights)
    return {
        "published": report["rows_published"],
        "suppressed_share": report["rows_suppressed"] / report["rows_sampled"],
        "arx_granularity": arx_granularity(table, dp_plan, node, len(frame)),
        "granularity": (1 - loss) * report["rows_published"] / report["rows_in"],
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "nodes_scored": report.get("search", {}).get("nodes_scored"),
        "node": tuple(node.values()),
    }


def summary(runs: list[dict]) -> dict:
    published = [r["published"] for r in runs]
    return {
        "mean_published": statistics.mean(published),
        "min_published": min(published),
        "max_published": max(published),
        "mean_suppressed_share": statistics.mean(r["suppressed_share"] for r in runs),
        "mean_arx_granularity": statistics.mean(r["arx_granularity"] for r in runs),
        "min_arx_granularity": min(r["arx_granularity"] for r in runs),
        "mean_granularity": statistics.mean(r["granularity"] for r in runs),
        "seconds": statistics.mean(r["seconds"] for r in runs),
        "cpu_seconds": statistics.mean(r["cpu_seconds"] for r in runs),
        "nodes_scored": statistics.mean(r["nodes_scored"] for r in runs),
        "published": [r["published"] for r in runs],
        "nodes": [list(r["node"]) for r in runs],
    }


def expectations(frame: pd.DataFrame, spec) -> tuple[dict, np.ndarray, np.ndarray]:
    """Per node, the exact expected records published and expected ARX Granularity of a release there."""
    dp_plan = plan(frame, spec)
    table = dp_plan.table.compressed()
    by_model = {}
    for name in ("records", "granularity"):
        model = quality_model(variant(spec.model_dump(mode="json"), quality=name), dp_plan.columns, dp_plan.hierarchies)
        by_model[name] = NodeScorer(table, model, spec.k, spec.dp_beta()).score_lattice()
    nodes, published = by_model["records"]
    floor = np.mean([1 / len(dp_plan.hierarchies[c].leaves) for c in dp_plan.columns])
    granularity = by_model["granularity"][1] / (len(frame) * (1 - floor))
    return {node: i for i, node in enumerate(nodes)}, published, granularity


def budget_sweep(frame: pd.DataFrame, spec) -> dict:
    """Expected records and ARX Granularity of the walk for steps 1 … lattice size − 1, and of the
    exhaustive search, at the shipped quality model."""
    index, published, granularity = expectations(frame, spec)
    dp_plan = plan(frame, spec)
    if dp_plan.quality is None:
        raise ValueError("the budget sweep needs a spec whose node is chosen by the DP search")
    scorer = NodeScorer(dp_plan.table.compressed(), dp_plan.quality, spec.k, spec.dp_beta())
    nodes, scores = scorer.score_lattice()  # cached: the sweep's walks only draw
    epsilon_search = spec.dp_epsilons()[0]
    probabilities = exponential_mechanism_probabilities(scores, epsilon_search, scorer.sensitivity, monotone=True)
    exhaustive = {"expected_published": float(probabilities @ published),
                  "expected_arx_granularity": float(probabilities @ granularity)}
    size = lattice_size(dp_plan.heights)
    _, final_epsilon = walk_budget(epsilon_search, 1)
    rng = np.random.default_rng(2026)
    walk = []
    for steps in sorted({*(2**i for i in range(13) if 2**i < size), 17, 111, 136, size - 1}):
        # Each draw's walk, then the exact expectation of its final draw given the nodes it saw (the
        # final draw's own randomness averaged out exactly: far less noise than drawing it).
        given_path = []
        for _ in range(SWEEP_DRAWS):
            seen = [index[node] for node in dp_search(scorer, epsilon_search, steps, rng).final_candidates]
            final = exponential_mechanism_probabilities(scores[seen], final_epsilon, scorer.sensitivity, monotone=True)
            given_path.append((float(final @ published[seen]), float(final @ granularity[seen])))
        walk.append({"steps": steps, "expected_published": statistics.mean(p for p, _ in given_path),
                     "expected_arx_granularity": statistics.mean(g for _, g in given_path),
                     "lowest_expected_published": min(p for p, _ in given_path)})
    return {"exhaustive": exhaustive, "walk": walk}


def line(name: str, s: dict) -> str:
    return (f"| {name} | {s['mean_published']:,.0f} ({s['min_published']:,}–{s['max_published']:,}) "
            f"| {100 * s['mean_suppressed_share']:.1f} % | {s['mean_arx_granularity']:.4f} | {s['mean_granularity']:.4f} "
            f"| {s['seconds']:.2f} ({s['cpu_seconds']:.2f}) | {s['nodes_scored']:,.0f} |")


def main() -> None:
    shipped = load_spec(SPEC)
    base = shipped.model_dump(mode="json")
    source = read_source(shipped.source)
    frame = classify(source.frame, shipped).frame
    search = shipped.dp_settings().search
    if search is None:
        raise ValueError(f"{SPEC} must choose its node with the DP search")
    epsilon_search = search.epsilon
    steps = plan(frame, shipped).steps
    cases = {f"{search.strategy}, {search.quality}, ε_search {epsilon_search:g}"
             + (f", {steps} steps" if steps else "") + " (releases/adult-dp.yaml)": shipped}
    for name in ("balanced", "granularity", "precision", "records"):
        cases[f"exhaustive, {name}, ε_search {epsilon_search:g}"] = variant(base, strategy="exhaustive", steps=None, quality=name)
    cases[f"walk, balanced, ε_search {epsilon_search:g}, 111 steps (SafePub's)"] = variant(base, strategy="walk", steps=111)
    cases[f"walk, balanced, ε_search 0.1 (SafePub's split), {steps} steps"] = variant(base, strategy="walk", epsilon=0.1)
    cases["exhaustive, balanced, ε_search 0.1 (SafePub's split)"] = variant(base, strategy="exhaustive", steps=None, epsilon=0.1)
    results = {name: summary([run_release(frame, spec, r) for r in range(RUNS)]) for name, spec in cases.items()}

    print(f"UCI Adult, {len(frame):,} records, ε = 1, δ ≤ 1e-6, k = {shipped.k}; mean over {RUNS} seeds (range)\n")
    print("| strategy, quality model, ε_search | records published | suppressed (share of sample) | ARX Granularity "
          "| kepsilon granularity | DP stage, s (CPU s) | nodes scored |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, s in results.items():
        print(line(name, s))
    for name, s in SAFEPUB.items():
        print(f"| {name} | {s['mean_published']:,} | | {s['arx_granularity']:.4f} | | | |")
    print("\nNodes chosen (levels in the order of the spec's columns):")
    for name, s in results.items():
        counts = pd.Series([tuple(n) for n in s["nodes"]]).value_counts()
        print(f"- {name}: " + "; ".join(f"{node} ×{n}" for node, n in counts.items()))

    sweep = budget_sweep(frame, shipped)
    print(f"\nThe walk's budget (quality {search.quality}; expectations exact per node, "
          f"{SWEEP_DRAWS} draws of the search each):\n")
    print("| steps | expected records published | lowest walk's expectation | expected ARX Granularity |")
    print("|---:|---:|---:|---:|")
    for row in sweep["walk"]:
        print(f"| {row['steps']} | {row['expected_published']:,.0f} | {row['lowest_expected_published']:,.0f} "
              f"| {row['expected_arx_granularity']:.4f} |")
    exhaustive = sweep["exhaustive"]
    print(f"| exhaustive | {exhaustive['expected_published']:,.0f} | | {exhaustive['expected_arx_granularity']:.4f} |")

    document = {"records_in": len(frame), "k": shipped.k, "epsilon": shipped.epsilon, "epsilon_search": epsilon_search,
                "delta": shipped.dp_delta(), "runs": RUNS, "strategies": results, "safepub": SAFEPUB,
                "walk_budget_sweep": sweep}
    temporary = JSON_OUT.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(document, indent=2) + "\n")
    os.replace(temporary, JSON_OUT)
    print(f"\nWritten: {JSON_OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
