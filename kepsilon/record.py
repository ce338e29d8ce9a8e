"""The types of a release's two documents: the private record and the public manifest projected from it.

``ReleaseRecord`` is the private record: every key any step of a release writes into it, from
``flows/manifest.base_record`` (identity and parameters, known before any stage runs) to the engines'
outcome figures and the governance's approval, budget, failure or refusal. It goes to the audit store only
(``audit/records.record_release``), never beside the data. Every key is optional (``total=False``): a
refused or failed release's record stops wherever the release stopped.

``PublicManifest`` is what is published beside the data (``manifest.json``), built from the record by
``flows/manifest.public_manifest``. Its fields are the public ones, and only those: ``PUBLIC_FIELDS``, the runtime
allow-list the publish step checks every manifest against (``flows/manifest.check_public_fields``), is
derived from these types (``allowed_fields``), so the list and the type cannot drift apart.

Plain types only: no module of kepsilon is imported here, so flows/, tasks/ and audit/ can import it without a
cycle (and kepsilon.engine does not: the engine knows nothing of records).
"""

from collections.abc import Mapping
from types import NoneType, UnionType
from typing import Any, Union, get_args, get_origin

# typing_extensions' TypedDict: the one pydantic accepts on Python 3.11, should a model ever see these types.
from typing_extensions import TypedDict, get_type_hints, is_typeddict

# --- the parts the record and the manifest share -----------------------------------------------------


class DpParameters(TypedDict):
    """The DP mode's ``dp`` entry (``flows/manifest.dp_parameters``): its (ε, δ) and every parameter they
    follow from. All public (spec, theorem), the node included — fixed in the spec, or the DP search's output,
    which the guarantee covers — so the manifest's ``method.dp`` is a copy of the record's."""

    epsilon_search: float
    epsilon_anonymisation: float
    beta: float
    beta_chosen_by: str
    delta: float
    max_delta: float
    node: dict[str, int] | None
    node_chosen_by: str
    search_strategy: str | None
    search_steps: int | None
    sensitive_levels: dict[str, int]


# --- the public manifest ---------------------------------------------------------------------------
#
# Only public fields. Anything computed from private values (errors, risks, scales, widths, diameters,
# clamped or zero counts, the source's SHA-256, the idempotency key, the operator, paths) is not here: an
# adversary who knows every other record can solve such a figure for the one they do not know, and a hash
# of a guessable source confirms a guess offline. A mapping-valued field (``dict[str, ...]``) allows any
# keys below it (column names, file names, package names, stages); a TypedDict-valued one lists its own.


class PublicMethod(TypedDict, total=False):
    """``method``: the method's name and its public parameters (those of the release's mode only)."""

    name: str
    k: int
    epsilon: float
    epsilon_split: dict[str, float]
    algorithm: str
    ola_metric: str
    confidence: float | None
    confidence_suppression: str
    suppression_budget: float | None
    scale_basis: str | None
    mechanism: str
    privacy_unit: str
    e_quasi: dict[str, dict[str, Any]]
    # Declared parameters, like k: the criteria enforced and the risk limits the gate applied.
    sensitive_criteria: dict[str, dict[str, Any]]
    max_linking_risk: float | None
    max_prosecutor_risk: float | None
    # The DP mode's guarantee and its parameters: all public (spec, theorem), the node included.
    privacy_model: str
    neighbouring_relation: str
    dp: DpParameters


# In the DP mode only "published" (a function of the output); "in" and "removed" would break the guarantee.
# ("in" is a keyword: the functional form.)
PublicRecords = TypedDict("PublicRecords", {"in": int, "removed": dict[str, int], "published": int}, total=False)
"""``records``: the records read, removed per stage and published."""


class PublicGroups(TypedDict):
    """``groups``: how many groups the published table has, and the smallest one's size."""

    published: int
    smallest: int


class PublicCheck(TypedDict):
    """One entry of ``checks``: a check's name and whether it passed (its figures stay private)."""

    name: str
    success: bool


class AuditChain(TypedDict):
    """``audit_chain``: the audit chain's entry of the release's sealed seed (``audit/witness.py``), a witness
    of the private store outside it, so a store put back from a backup is caught. The hash covers sealed
    seeds and microsecond timestamps, so it confirms no guess; the count says how many audit events the
    store had."""

    entries: int
    head_hash: str


class PublicManifest(TypedDict, total=False):
    """The manifest published beside the data (``manifest.json``): public fields only."""

    release_id: str
    population_id: str
    method: PublicMethod
    roles: dict[str, list[str]]
    columns: dict[str, dict[str, Any]]
    hierarchies: dict[str, dict[str, Any]]
    guarantee: str
    records: PublicRecords
    groups: PublicGroups
    outputs: dict[str, str]
    software: dict[str, str | None]
    checks: list[PublicCheck]
    # Opted in by the spec's ``publish_statistics``: computed from the private data, not protected by the method.
    unprotected_statistics: dict[str, Any]
    audit_chain: AuditChain


# --- the private record ----------------------------------------------------------------------------


class ReleaseRecord(TypedDict, total=False):
    """The release's private record, for the audit store only (see the module's docstring)."""

    # Known before any stage runs (``flows/manifest.base_record``): identity and parameters.
    release_id: str
    population_id: str
    idempotency_key: str
    spec_hash: str
    k: int
    epsilon: float
    epsilon_split: dict[str, float]
    algorithm: str
    scale_basis: str | None
    mechanism: str
    privacy_unit: str
    neighbouring_relation: str
    confidence: float | None
    suppression_budget: float | None
    sensitive_criteria: dict[str, dict[str, Any]]
    max_linking_risk: float | None
    max_prosecutor_risk: float | None
    roles: dict[str, list[str]]
    source: dict[str, Any]
    rows_in: int
    content_key: str
    software: dict[str, str | None]
    privacy_model: str
    dp: DpParameters  # the DP mode's only (``flows/manifest.dp_parameters``)
    # The governance (``flows/governance.govern``): where and by whom it ran, approval, reservation.
    execution: dict[str, Any]
    approval: dict[str, Any] | None
    budget: dict[str, Any]
    private_figures: str
    # The engine's anonymiser and its checks before ε.
    anonymiser: dict[str, Any]
    hierarchies: dict[str, Any]
    pre_epsilon: dict[str, Any]
    # On the reserved budget: the noise (or the DP mode's draw) and the outcome figures (``ReleaseMetrics``).
    seed_commitment: str
    perturbation: dict[str, Any]
    rows_removed: dict[str, int]
    rows_published: int
    information_loss: dict[str, Any]
    linking_risk: float
    classes: dict[str, Any]
    groups: dict[str, int]
    columns: dict[str, dict[str, Any]]
    disclosure: dict[str, Any]
    certificate: dict[str, Any]
    checks: list[dict[str, Any]]
    # The staged publication (``Publication.report``) and the manifest published with it.
    directory: str
    outputs: dict[str, str]
    output_dir: str
    public_manifest: PublicManifest
    # A failure after the reservation (``flows/governance.fail_after_reservation``), or a refusal before it
    # (``tasks/record``: approval missing, over a cap, an operator not authenticated).
    failure: str
    failure_class: str
    refusal: str
    refusal_class: str
    # Not stored: how a run that published nothing returns the record it found (``tasks/preflight.find_published``,
    # ``flows/governance.unchanged_outcome``).
    already_published: bool
    published_at: str
    folder_present: bool
    unchanged_source: bool
    requested_release_id: str


class DpEntries(TypedDict):
    """The DP mode's entries of the record (``flows/manifest.dp_parameters``): those of the method's own
    mode it replaces (None where they mean nothing here) and its ``dp`` parameters."""

    # scale_basis, confidence, suppression_budget and max_linking_risk are None here; typed as the record
    # types them, so that ``ReleaseRecord.update`` takes these entries.
    algorithm: str
    scale_basis: str | None
    mechanism: str
    neighbouring_relation: str
    confidence: float | None
    suppression_budget: float | None
    max_linking_risk: float | None
    dp: DpParameters


class ReleaseMetrics(TypedDict):
    """The record's outcome figures of the method's own mode (``kepsilon.engine.metrics.metrics_summary``),
    one shape for the in-memory and the partitioned paths."""

    rows_removed: dict[str, int]
    rows_published: int
    information_loss: dict[str, Any]
    linking_risk: float
    classes: dict[str, Any]


class PublicationEntries(TypedDict):
    """Where a staged publication goes and what it holds (``tasks/publish.Publication.report``)."""

    directory: str
    outputs: dict[str, str]


# --- the public field list, from the type ------------------------------------------------------------


def allowed_fields(typed: Any) -> dict[str, Any]:
    """The allow-list of a TypedDict's keys, as ``check_public_fields`` reads it: a TypedDict-valued field
    lists the keys below it (a nested dict), a mapping-valued one allows any (``"*"``), any other is a leaf
    (None). ``X | None`` is read as ``X``."""
    return {name: _allowed_below(hint) for name, hint in get_type_hints(typed).items()}


def _allowed_below(hint: Any) -> dict[str, Any] | str | None:
    if get_origin(hint) in (Union, UnionType):
        present = [arg for arg in get_args(hint) if arg is not NoneType]
        return _allowed_below(present[0]) if len(present) == 1 else None
    if is_typeddict(hint):
        return allowed_fields(hint)
    origin = get_origin(hint) or hint
    if isinstance(origin, type) and issubclass(origin, Mapping):
        return "*"
    return None
