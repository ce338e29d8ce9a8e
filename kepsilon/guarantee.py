"""What a release guarantees, as one object: its statement, its manifest entry and its ledger charge.

A release's guarantee used to be written three times — the statement in the public manifest, the DP block's
numbers, the (ε, δ) the ledger reserves — and kept in agreement by hand. Here it is computed once from the
spec's public parameters (never from the data), and each of the three is read from it:

- ``statement()``: the sentence published in ``manifest.json`` (``guarantee``) and shown in the report;
- ``charge()``: the (ε, δ) reserved in the population's ledger (δ only in the DP mode);
- ``parameters()``: the DP block's figures the statement quotes (ε_search, ε_anon, β, δ).

The method's own mode (``kepsilon``) is not differentially private as a whole; its statement says what it
does guarantee for its scale basis (method.md §7, docs/guarantees.md) and its ε in the ledger is bookkeeping
(see the statement). The DP mode's statement is Li, Qardaji and Su's theorem with the search composed.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

DP_NEIGHBOURS = "data sets that differ by one record, added or removed"


class Charge(NamedTuple):
    """What a release spends from its population's caps: ε, and δ in the DP mode (None otherwise)."""

    epsilon: float
    delta: float | None


@dataclass(frozen=True)
class DPParameters:
    """The DP mode's public figures: ε = ε_search + ε_anon, the sampling rate β and the resulting δ."""

    epsilon_search: float
    epsilon_anonymisation: float
    beta: float
    delta: float


@dataclass(frozen=True)
class Guarantee:
    """A release's guarantee, from its public parameters only.

    ``scale_basis`` is the method's own mode's noise scale basis (``diameter`` or ``bounds``); ``dp`` holds
    the DP mode's figures. Exactly one of the two is set, by ``model``.
    """

    model: Literal["kepsilon", "dp"]
    k: int
    epsilon: float
    scale_basis: Literal["diameter", "bounds"] | None = None
    dp: DPParameters | None = None

    def __post_init__(self) -> None:
        if (self.model == "dp") != (self.dp is not None) or (self.model == "kepsilon") != (self.scale_basis is not None):
            raise ValueError("a guarantee has DP figures exactly when its model is dp, a scale basis otherwise")

    @classmethod
    def for_spec(cls, spec) -> "Guarantee":
        """The guarantee of a release run with ``spec`` (a ``kepsilon.spec.ReleaseSpec``)."""
        if spec.privacy_model == "dp":
            search, anonymisation = spec.dp_epsilons()
            figures = DPParameters(search, anonymisation, spec.dp_beta(), spec.dp_delta())
            return cls("dp", spec.k, spec.epsilon, dp=figures)
        return cls("kepsilon", spec.k, spec.epsilon, scale_basis=spec.scale_basis)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> "Guarantee":
        """The guarantee a private record (or a stored manifest) was released under."""
        if record.get("privacy_model") == "dp":
            dp = record["dp"]
            figures = DPParameters(dp["epsilon_search"], dp["epsilon_anonymisation"], dp["beta"], dp["delta"])
            return cls("dp", record["k"], record["epsilon"], dp=figures)
        return cls("kepsilon", record["k"], record["epsilon"], scale_basis=record["scale_basis"])

    def charge(self) -> Charge:
        """The (ε, δ) the ledger reserves for this release."""
        return Charge(self.epsilon, self.dp.delta if self.dp is not None else None)

    def parameters(self) -> dict:
        """The DP block's figures the statement quotes (empty in the method's own mode)."""
        if self.dp is None:
            return {}
        return {
            "epsilon_search": self.dp.epsilon_search,
            "epsilon_anonymisation": self.dp.epsilon_anonymisation,
            "beta": self.dp.beta,
            "delta": self.dp.delta,
        }

    def statement(self) -> str:
        """What the release does and does not guarantee, in the words the manifest and the report publish."""
        if self.dp is not None:
            return _dp_statement(self.k, self.epsilon, self.dp)
        return _kepsilon_statement(self.scale_basis or "diameter")


def _kepsilon_statement(scale_basis: str) -> str:
    if scale_basis == "bounds":
        noise = (
            "Noise scale from public bounds: given the partition, the ε-quasis are ε-differentially private "
            "(Laplace noise of scale (upper − lower)/ε per record, values clamped to the bounds, outputs rounded "
            "to a public grid; confidence suppression is not applied because it would read the true values). "
            "The partition (Mondrian's cuts or OLA's node) is computed from the private data, so the release "
            "as a whole is not ε-DP."
        )
    else:
        noise = (
            "Noise scale from each class's diameter (the paper's method): records are indistinguishable on their "
            "ε-quasis inside their equivalence class against an adversary who knows the quasi-identifiers. The "
            "scale, the partition and confidence suppression read the private data, so the release is not "
            "ε-differentially private; a class whose members share one value (zero diameter) publishes that "
            "value exactly. The ε summed in the ledger for such releases is bookkeeping, not DP composition: "
            "re-releases with fresh noise can be averaged."
        )
    return (
        f"k-anonymity on the published k-quasi labels, which are nodes of public hierarchies. {noise} "
        "Sensitive attributes are published as they are: a group whose members share one sensitive value "
        "discloses it (homogeneity attack). Re-releasing the same people with a different partition allows "
        "intersection attacks."
    )


def _dp_statement(k: int, epsilon: float, dp: DPParameters) -> str:
    search = (
        f"the node was chosen by the exponential mechanism on the full data (ε_search = {dp.epsilon_search:g}), "
        if dp.epsilon_search > 0
        else "the node was fixed in the spec, without looking at the data, "
    )
    return (
        f"({epsilon:g}, {dp.delta:.3g})-differential privacy for each record, between data sets that differ by one "
        f"record added or removed: {search}every record was sampled with probability β = {dp.beta:.4g}, and every "
        f"group of sampled records sharing all released labels was suppressed when smaller than k = {k} (Li, Qardaji "
        f"and Su 2012: (ε_anon = {dp.epsilon_anonymisation:g}, δ)-DP; sequential composition with the search). "
        "Every released column is part of the group key and is published at a level of a public hierarchy, or as "
        "read for a sensitive column at level 0; nothing is noised and no suppression reads a value beyond its "
        "group's size. δ bounds the probability of outputs the ε bound does not hold for. Not covered: the schema "
        "(column names, roles and types), the public hierarchies, and the decision to release at all; releases of "
        "the same people compose: their ε and δ add up (the ledger's DP total)."
    )
