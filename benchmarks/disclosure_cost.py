"""What ℓ-diversity and t-closeness cost on UCI Adult: extra suppression and generalisation.

``make disclosure-cost`` (or ``python -m benchmarks.disclosure_cost``) runs the engine of
``releases/adult.yaml`` (k-quasis sex, race, marital-status, education; age the ε-quasi; k = 5, ε = 1,
c = 0.99, budget 5 %) three times per algorithm — no criterion, salary-class ℓ = 2 (distinct), and
salary-class t = 0.2 (equal distance) — with the same stage functions a release's tasks call and a fixed
benchmark seed (never do that for a release), over ``RUNS`` seeds. It prints a markdown table: records
removed by the anonymiser, by confidence suppression and by the diversity stage, published groups, the
k-quasis' mean precision loss (0 = raw, 1 = fully generalised), homogeneous salary-class groups, and
the largest EMD. Every figure is counted on the released frame.
"""

import numpy as np
import pandas as pd

from kepsilon.engine.criteria import disclosure_report
from kepsilon.flows.spec import load_spec, parse_spec

from .bench_engine import SPEC, run_engine

ADULT_SPEC = SPEC.parent / "adult.yaml"
RUNS = 5
CASES = {
    "none": None,
    "ℓ = 2 (distinct)": {"l_diversity": {"l": 2, "variant": "distinct"}},
    "t = 0.2 (equal)": {"t_closeness": {"t": 0.2, "distance": "equal"}},
}


def spec_for(algorithm: str, salary: dict | None):
    """The shipped Adult spec with the algorithm and the salary-class criteria asked for."""
    data = load_spec(ADULT_SPEC).model_dump(mode="json")
    data["algorithm"] = algorithm
    if salary is not None:
        data["roles"]["sensitive"] = ["native-country", "workclass", "occupation", {"column": "salary-class", **salary}]
    return parse_spec(data)


def release_figures(frame: pd.DataFrame, spec, seed: bytes) -> dict:
    """One engine run (anonymise, perturb, confidence and diversity suppression, labels) and its figures."""
    released, metrics, partition = run_engine(frame, spec, seed)
    roles = spec.roles.names()
    disclosure = disclosure_report(released, roles["k_quasi"], partition.criteria)
    salary = disclosure["per_column"]["salary-class"]
    removed = metrics["rows_removed"]
    confidence = removed["confidence_suppression_record_rule"] + removed["confidence_suppression_class_rule"]
    return {
        "anonymiser": removed["anonymiser_suppression"],
        "confidence": confidence,
        "diversity": removed.get("diversity_suppression", 0),
        "published": len(released),
        "groups": int(released.groupby(roles["k_quasi"]).ngroups),
        "precision_loss": float(np.mean(list(partition.report["precision"].values()))),
        "homogeneous": salary["homogeneous_groups"],
        "t_max": salary["t_max"],
        "linking_risk": metrics["linking_risk"],
    }


def main() -> None:
    spec = load_spec(ADULT_SPEC)
    frame = pd.read_csv(spec.source.path, sep=spec.source.delimiter)
    print(f"UCI Adult, {len(frame)} records, k = 5, ε = 1, budget 5 %; mean of {RUNS} seeds\n")
    print("| algorithm | salary-class criterion | removed: anonymiser | removed: confidence | removed: diversity "
          "| removed, total | published groups | k-quasi precision loss | homogeneous salary groups | max EMD | linking risk |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for algorithm in ("mondrian", "ola"):
        for name, salary in CASES.items():
            runs = [release_figures(frame, spec_for(algorithm, salary), bytes([seed]) * 32) for seed in range(RUNS)]
            mean = {key: float(np.mean([r[key] for r in runs])) for key in runs[0]}
            total = mean["anonymiser"] + mean["confidence"] + mean["diversity"]
            print(f"| {algorithm} | {name} | {mean['anonymiser']:.0f} | {mean['confidence']:.1f} | {mean['diversity']:.1f} "
                  f"| {total:.1f} ({100 * total / len(frame):.2f} %) | {mean['groups']:.1f} | {mean['precision_loss']:.3f} "
                  f"| {mean['homogeneous']:.1f} | {mean['t_max']:.3f} | {100 * mean['linking_risk']:.2f} % |")


if __name__ == "__main__":
    main()
