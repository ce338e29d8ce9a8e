"""What summing ε in the ledger means for diameter-mode re-releases: noise that averages out.

A nightly release of the same people draws fresh noise every night. In diameter mode this is not
differential privacy, so the ledger's sum of ε is bookkeeping, not a composition theorem; an
adversary who can follow a record across releases (its k-quasi labels and sensitive values are
published unchanged, so a record unique in its group on those is easy to follow) averages its noisy
values and the noise shrinks like 1/√releases. This script measures the linking risk (method.md §6)
of the averaged value after 1…10 releases, on the bundled paper-synthetic sample with the shipped
spec (Mondrian, k = 10, ε = 1), in the worst case where every record is followed.

    .venv/bin/python -m reliability.averaging [--releases 10] [--epsilon 1.0]
"""

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from kepsilon.engine.anonymise import k_anonymise
from kepsilon.engine.metrics import linking_risk
from kepsilon.engine.perturb import perturb
from kepsilon.flows.spec import load_spec

SPEC = Path(__file__).resolve().parent.parent / "releases" / "paper-synthetic.yaml"


def averaged_linking_risk(releases: int, epsilon: float, seed: int = 2026) -> list[float]:
    """Linking risk of the mean of the first r noisy releases, for r = 1..releases (same partition)."""
    spec = load_spec(SPEC, epsilon=epsilon)
    roles = spec.roles.names()
    frame = pd.read_csv(spec.source.path, sep=spec.source.delimiter, usecols=roles["k_quasi"] + roles["e_quasi"])
    partition = k_anonymise(frame, spec)
    kept = frame[partition.kept]
    class_ids = partition.class_ids[partition.kept]
    column = roles["e_quasi"][0]
    original = kept[column].to_numpy(dtype=np.float64)
    rng = np.random.default_rng(seed)
    total = np.zeros(len(kept))
    risks = []
    for r in range(1, releases + 1):
        noisy = perturb(kept, class_ids, spec.roles.e_quasi, spec.epsilon_split(), spec.scale_basis, rng)
        total += noisy.frame[column].to_numpy(dtype=np.float64)
        risks.append(linking_risk(original, total / r, class_ids))
    return risks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", type=int, default=10)
    parser.add_argument("--epsilon", type=float, default=1.0)
    args = parser.parse_args()
    for r, risk in enumerate(averaged_linking_risk(args.releases, args.epsilon), start=1):
        print(f"releases averaged: {r:2d}   linking risk: {100 * risk:5.2f} %   (ledger: ε {r * args.epsilon:g})")


if __name__ == "__main__":
    main()
