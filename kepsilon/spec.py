"""The release spec: one YAML file per release, validated by the model that is also the flow's parameter.

Because ``ReleaseSpec`` is the parameter of the ``governed-release`` flow, the Prefect UI renders it as
the deployment's run form, so an operator can rerun a release with a changed k or ε. It holds no seed
and no data: Prefect stores flow parameters in its database.
"""

import hashlib
import json
import math
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from kepsilon.engine.dp import minimum_epsilon, safe_k_delta, sampling_rate_for, smallest_k
from kepsilon.engine.errors import SpecError
from kepsilon.engine.hierarchy_builders import HierarchyBuilder
from kepsilon.run_form import FormModel

# Strict, with the run form's schema hook (kepsilon.flows.run_form); every model derives from FormModel.
_STRICT = FormModel.model_config


class SourceFormat(str, Enum):
    csv = "csv"
    parquet = "parquet"


class SourceSpec(FormModel):
    """Where the table of people is and how to read it."""

    model_config = _STRICT
    form_title = "source data"

    path: str = Field(
        description="CSV or Parquet file, or a folder of Parquet files (a dataset), relative to the spec file or absolute"
    )
    format: SourceFormat | SkipJsonSchema[None] = Field(default=None, description="csv or parquet; inferred from the suffix if empty")
    delimiter: str = Field(default=",", min_length=1, max_length=1, description="CSV field separator")
    header: bool = Field(default=True, description="whether the CSV's first line names the columns")
    columns: list[str] | SkipJsonSchema[None] = Field(default=None, description="column names, for a CSV without a header")
    missing: list[str] = Field(
        default=[""],
        description=(
            "CSV cells whose exact text means a missing value (default: the empty cell only); "
            "e.g. add NA to treat it as missing. Parquet: a null is missing, this list is not used"
        ),
    )

    @model_validator(mode="after")
    def _columns_when_headerless(self):
        if not self.header and not self.columns:
            raise ValueError("a CSV without a header needs `columns`")
        return self

    def resolved_format(self) -> SourceFormat:
        if self.format is not None:
            return self.format
        if Path(self.path).is_dir():
            return SourceFormat.parquet  # a folder is read as a Parquet dataset (its *.parquet files)
        suffix = Path(self.path).suffix.lower()
        if suffix == ".parquet":
            return SourceFormat.parquet
        if suffix in {".csv", ".txt", ".tsv"}:
            return SourceFormat.csv
        raise SpecError("source.format", f"cannot infer the format of {self.path!r}; set csv or parquet")


IdentifierReason = Literal["email", "phone", "national_id", "ip_address", "url", "near_unique"]
# One field definition shared by three models; pydantic types Field() as the default's type, the models' annotation.
_ACKNOWLEDGE: Any = Field(
    default=[],
    description=(
        "identifier checks this column is known to trip and is released anyway (classification refuses "
        "otherwise): email, phone, national_id, ip_address, url, near_unique"
    ),
)


class KQuasi(FormModel):
    """A quasi-identifier that is generalised until every group has at least k members."""

    model_config = _STRICT
    form_title = "k-quasi column"
    form_required = ("hierarchy",)  # Roles refuses a k-quasi without one

    column: str
    acknowledge_identifier: list[IdentifierReason] = _ACKNOWLEDGE
    hierarchy: str | HierarchyBuilder | SkipJsonSchema[None] = Field(
        default=None,
        description=(
            "hierarchy CSV file (leaf;level1;…;*), or a public builder: "
            "`{kind: intervals, lower, upper, widths}`, `{kind: masking, length}`, `{kind: dates, levels}`, "
            "`{kind: categories}` or `{kind: categories, groups: {label: [values]}}`"
        ),
    )


class EQuasi(FormModel):
    """A numeric quasi-identifier that is kept but perturbed with Laplace noise per equivalence class.

    In the DP mode (``privacy_model: dp``) it is generalised through its public ``hierarchy`` instead
    of noised, and its bounds and ε share do not apply.
    """

    model_config = _STRICT
    form_title = "ε-quasi column"
    # The method's own mode refuses an ε-quasi without bounds; the DP mode's generalised ε-quasi has none
    # and is therefore not run from the form (see docs/run-form.md).
    form_required = ("lower", "upper")

    column: str
    lower: float | SkipJsonSchema[None] = Field(default=None, description="public lower bound of the column's plausible values")
    upper: float | SkipJsonSchema[None] = Field(default=None, description="public upper bound of the column's plausible values")
    out_of_bounds: Literal["refuse", "clamp"] = Field(
        default="refuse", description="a value outside the bounds refuses the release, or is clamped to them"
    )
    epsilon_share: Annotated[float, Field(gt=0)] | SkipJsonSchema[None] = Field(
        default=None, description="relative share of the record's ε; equal shares if empty"
    )
    acknowledge_identifier: list[IdentifierReason] = _ACKNOWLEDGE
    hierarchy: str | HierarchyBuilder | SkipJsonSchema[None] = Field(
        default=None,
        description="privacy_model dp only: the public hierarchy (file or builder) the column is generalised through",
    )
    max_relative_error: Annotated[float, Field(gt=0)] | SkipJsonSchema[None] = Field(
        default=None,
        description="largest predicted mean relative error of the published column (0.2 = 20 %); checked before ε "
        "is reserved (diameter scale basis; reported only in bounds mode); none by default",
    )

    def bounds(self) -> tuple[float, float]:
        """The public (lower, upper) bounds the noise is drawn within (the method's own mode, which requires them)."""
        if self.lower is None or self.upper is None:
            raise SpecError(f"roles.e_quasi.{self.column}", "needs public lower and upper bounds")
        return self.lower, self.upper

    @model_validator(mode="after")
    def _bounds_ordered(self):
        if self.hierarchy is not None and self.lower is None and self.upper is None:
            return self  # the DP mode's generalised ε-quasi; ReleaseSpec checks the mode
        # Public bounds set the plausibility range and the public snapping grid in both scale bases.
        if self.lower is None or self.upper is None:
            raise ValueError(f"ε-quasi {self.column!r}: needs public lower and upper bounds")
        if not (math.isfinite(self.lower) and math.isfinite(self.upper)):
            raise ValueError(f"ε-quasi {self.column!r}: bounds must be finite")
        if self.lower >= self.upper:
            raise ValueError(f"ε-quasi {self.column!r}: lower bound must be below upper bound")
        return self


class LDiversity(FormModel):
    """ℓ-diversity of a sensitive column in every published group (Machanavajjhala et al. 2007)."""

    model_config = _STRICT
    form_title = "ℓ-diversity"

    l: int = Field(ge=2, description="distinct: ≥ ℓ values; entropy: entropy ≥ log ℓ; recursive: r_1 below c·(r_ℓ+…+r_m)")
    variant: Literal["distinct", "entropy", "recursive"] = "distinct"
    c: Annotated[float, Field(gt=0)] | SkipJsonSchema[None] = Field(default=None, description="c of recursive (c,ℓ)-diversity (required for it)")

    @model_validator(mode="after")
    def _c_for_recursive(self):
        if self.variant == "recursive" and (self.c is None or not math.isfinite(self.c)):
            raise ValueError("recursive (c,ℓ)-diversity needs a finite c > 0")
        if self.variant != "recursive" and self.c is not None:
            raise ValueError("c applies to the recursive variant only")
        return self


class TCloseness(FormModel):
    """t-closeness of a sensitive column: EMD (Li, Li, Venkatasubramanian 2007) to the whole table ≤ t."""

    model_config = _STRICT
    form_title = "t-closeness"

    t: float = Field(gt=0, le=1, description="largest Earth Mover's Distance allowed")
    distance: Literal["equal", "ordered", "numeric", "hierarchical"] | SkipJsonSchema[None] = Field(
        default=None,
        description="ground distance: equal (nominal), ordered (needs `order`), numeric, hierarchical "
        "(needs the column's `hierarchy`); default hierarchical when the column has one, else equal",
    )
    order: list[str] | SkipJsonSchema[None] = Field(default=None, description="the values in their order, for ordered distance")


class SensitiveColumn(FormModel):
    """A sensitive column with the disclosure criteria the anonymiser enforces on every published group."""

    model_config = _STRICT
    form_title = "sensitive column with criteria"

    column: str
    l_diversity: LDiversity | SkipJsonSchema[None] = None
    t_closeness: TCloseness | SkipJsonSchema[None] = None
    hierarchy: str | SkipJsonSchema[None] = Field(default=None, description="hierarchy file, for t-closeness's hierarchical distance")
    acknowledge_identifier: list[IdentifierReason] = _ACKNOWLEDGE

    @model_validator(mode="after")
    def _distance(self):
        if self.t_closeness is not None:
            distance = self.t_closeness.distance or ("hierarchical" if self.hierarchy else "equal")
            if distance == "hierarchical" and not self.hierarchy:
                raise ValueError(f"sensitive {self.column!r}: hierarchical distance needs a `hierarchy`")
            if distance == "ordered" and not self.t_closeness.order:
                raise ValueError(f"sensitive {self.column!r}: ordered distance needs `order`")
            self.t_closeness.distance = distance
        return self


class Roles(FormModel):
    """Every column of the source gets exactly one role; a column with none is an error."""

    model_config = _STRICT
    form_title = "column roles"

    explicit: list[str] = Field(default=[], description="direct identifiers, removed first")
    k_quasi: list[KQuasi] = Field(default=[], description="generalised to k-anonymity")
    e_quasi: list[EQuasi] = Field(default=[], description="numeric, perturbed per class")
    sensitive: list[str | SensitiveColumn] = Field(
        default=[],
        description="released as they are; a column name, or `{column, l_diversity, t_closeness}` to enforce criteria",
    )

    def names(self) -> dict[str, list[str]]:
        """Column names per role, in the manifest's shape."""
        return {
            "explicit": list(self.explicit),
            "k_quasi": [q.column for q in self.k_quasi],
            "e_quasi": [q.column for q in self.e_quasi],
            "sensitive": [s if isinstance(s, str) else s.column for s in self.sensitive],
        }

    def generalised(self, column: str) -> "KQuasi | EQuasi":
        """The k-quasi or ε-quasi entry of ``column`` (the DP mode generalises both through their hierarchy)."""
        entries: list[KQuasi | EQuasi] = [*self.k_quasi, *self.e_quasi]
        return next(entry for entry in entries if entry.column == column)

    def column_entries(self) -> list["KQuasi | EQuasi | SensitiveColumn"]:
        """The k-quasi, ε-quasi and sensitive entries that are models (a plain sensitive name is not), in order."""
        return [*self.k_quasi, *self.e_quasi, *(s for s in self.sensitive if not isinstance(s, str))]

    def acknowledged_identifiers(self) -> dict[str, set[str]]:
        """Per column, the identifier checks the spec acknowledges (classification does not refuse them)."""
        return {entry.column: set(entry.acknowledge_identifier) for entry in self.column_entries()}

    def sensitive_criteria(self) -> dict[str, dict]:
        """The declared ℓ-diversity and t-closeness per sensitive column (public parameters, like k)."""
        declared = {}
        for entry in self.sensitive:
            if isinstance(entry, str) or (entry.l_diversity is None and entry.t_closeness is None):
                continue
            criteria: dict[str, Any] = {}
            if entry.l_diversity is not None:
                criteria["l_diversity"] = entry.l_diversity.model_dump(mode="json", exclude_none=True)
            if entry.t_closeness is not None:
                criteria["t_closeness"] = entry.t_closeness.model_dump(mode="json", exclude_none=True)
            if entry.hierarchy:
                criteria["hierarchy"] = Path(entry.hierarchy).name
            declared[entry.column] = criteria
        return declared

    @model_validator(mode="after")
    def _one_role_per_column(self):
        seen: dict[str, str] = {}
        for role, columns in self.names().items():
            for column in columns:
                if column in seen:
                    raise ValueError(f"column {column!r} has two roles ({seen[column]} and {role})")
                seen[column] = role
        if not self.k_quasi:
            raise ValueError("at least one k_quasi column is needed")
        for quasi in self.k_quasi:
            if quasi.hierarchy is None:
                # Without public labels a class could only be released as its true values or extremes.
                raise ValueError(
                    f"k-quasi {quasi.column!r} needs a hierarchy: a file, or a builder "
                    "(intervals for numbers, masking for codes, dates, categories)"
                )
        return self


class DPSearch(FormModel):
    """The differentially private choice of the node (SafePub's idea): the exponential mechanism, on
    the full data before sampling, scores nodes by the quality a release at them publishes in
    expectation (docs/dp-mode.md)."""

    model_config = _STRICT
    form_title = "DP search of the node"

    epsilon: float = Field(gt=0, description="ε_search: the part of the release's ε the search spends, split equally over its draws")
    strategy: Literal["exhaustive", "walk"] = Field(
        default="exhaustive",
        description="exhaustive: one draw among every node of the lattice (up to 100,000 nodes); "
        "walk: SafePub's walk from the top, `steps` draws among every node seen, then one among every node seen (any lattice size)",
    )
    steps: Annotated[int, Field(ge=1)] | SkipJsonSchema[None] = Field(
        default=None, description="walk only: its steps (each draws the next pivot among every node seen, with ε_search/10/steps; a last draw with 9·ε_search/10 chooses among every node seen); default: 8 × the lattice's height, at most its size − 1"
    )
    quality: Literal["balanced", "granularity", "precision", "records"] = Field(
        default="balanced",
        description="what the search maximises, in expectation over the sampling: granularity (labels' share of "
        "their hierarchy's leaves, ARX's Loss), precision (levels), records (published records only), or balanced "
        "(a quarter records, three quarters granularity)",
    )

    @model_validator(mode="after")
    def _steps_for_the_walk(self):
        if self.steps is not None and self.strategy != "walk":
            raise ValueError("steps applies to strategy walk only")
        return self


class DPSettings(FormModel):
    """The parameters of the DP mode: sampling, the node (fixed or searched), and the δ allowed."""

    model_config = _STRICT
    form_title = "DP mode settings"

    max_delta: float = Field(gt=0, lt=1, description="largest δ the release may have; refused before any ε if δ(k, β, ε_anon) is above it")
    beta: Annotated[float, Field(gt=0, lt=1)] | SkipJsonSchema[None] = Field(
        default=None, description="sampling probability β; default 1 − e^(−ε_anon), the largest the theorem admits (SafePub)"
    )
    node: dict[str, Annotated[int, Field(ge=0)]] | SkipJsonSchema[None] = Field(
        default=None, description="a fixed full-domain node: the hierarchy level of every k-quasi and ε-quasi, chosen without looking at the data"
    )
    search: DPSearch | SkipJsonSchema[None] = Field(default=None, description="or: choose the node with the DP search")
    sensitive_levels: dict[str, Annotated[int, Field(ge=0)]] = Field(
        default={}, description="hierarchy level a sensitive column is released at (default 0, its values as read)"
    )

    @model_validator(mode="after")
    def _one_way_to_the_node(self):
        if (self.node is None) == (self.search is None):
            raise ValueError("give either `node` (fixed) or `search` (DP search), not both and not neither")
        return self

class Execution(FormModel):
    """Where a release runs: in one process (``memory``), or partitioned on a Dask cluster (``dask``).

    Not part of what a release *is*: the two engines publish the same values in the same order for the
    same seed, so ``execution`` is left out of the spec's hash (a release resumed on the other engine is
    the same logical release).
    """

    model_config = _STRICT
    form_title = "execution engine"

    engine: Literal["memory", "dask"] = Field(
        default="memory",
        description="memory: the whole table in one process; dask: partition by partition on a Dask cluster, "
        "for tables larger than one machine's memory",
    )
    partitions: Annotated[int, Field(ge=1, le=100_000)] | SkipJsonSchema[None] = Field(
        default=None,
        description="dask: how many partitions the table is processed in; default one per 64 MB of CSV or "
        "500,000 Parquet records",
    )
    scheduler: str = Field(
        default="",
        description="dask: address of an existing Dask scheduler (e.g. tcp://10.0.0.5:8786); empty: a local "
        "cluster of `workers` processes on this machine, started and stopped with the run",
    )
    workers: int = Field(default=2, ge=1, le=1024, description="dask: worker processes of the local cluster")
    threads: int = Field(
        default=1,
        ge=1,
        le=256,
        description="dask: threads per worker process of the local cluster; each thread holds a partition, so "
        "a worker's memory grows with them (docs/performance.md)",
    )
    csv: bool = Field(
        default=False,
        description="dask: also write data.csv (one file, in the published order) beside the Parquet dataset; "
        "the memory engine always writes it",
    )
    scratch: str = Field(
        default="",
        description="dask: folder for the intermediate partitions (private data, encrypted, removed after the run; "
        "never inside the output folder); empty: a private folder in the system's temporary folder; on a cluster "
        "of several machines, a folder every worker can reach",
    )


class Population(FormModel):
    """The population a journalist or marketer matches the release against (docs/certificate.md).

    Without it the released table is taken to be the whole population (journalist risk = prosecutor
    risk). Give a sampling fraction, or a population table, and optionally a column of sampling weights.
    """

    model_config = _STRICT

    sampling_fraction: Annotated[float, Field(gt=0, le=1)] | SkipJsonSchema[None] = Field(
        default=None, description="share of the population the source holds (e.g. 0.01 for a 1 % sample)"
    )
    table: str | SkipJsonSchema[None] = Field(
        default=None,
        description="CSV of the population: the k-quasi columns (values as in the source) and a `count` column",
    )
    weight_column: str | SkipJsonSchema[None] = Field(
        default=None,
        description="source column of sampling weights (people each record stands for), for the individual risk",
    )

    @model_validator(mode="after")
    def _something_declared(self):
        if self.sampling_fraction is None and self.table is None and self.weight_column is None:
            raise ValueError("give a sampling_fraction, a table or a weight_column")
        if self.sampling_fraction is not None and self.table is not None:
            raise ValueError("give a sampling_fraction or a table, not both")
        return self


class CertificateSettings(FormModel):
    """What the officer's certificate computes beyond the defaults (docs/certificate.md)."""

    model_config = _STRICT

    utility_target: str | SkipJsonSchema[None] = Field(
        default=None, description="released column a classifier predicts, for the classifier utility (ARX's)"
    )
    risk_threshold: float = Field(default=0.2, gt=0, le=1, description="a record is at risk above this re-identification probability")
    suda_max_size: int = Field(default=3, ge=1, le=6, description="largest column combination SUDA searches for special uniques")


class ReleaseSpec(FormModel):
    """Everything that defines one governed (k,ε)-anonymised release."""

    model_config = _STRICT
    form_title = "release spec"
    # What an operator changes on a rerun first; the DP mode's block and the engine last.
    form_first = ("k", "epsilon", "release_id", "source", "population_id", "roles", "privacy_model")
    form_last = ("dp", "execution")

    release_id: str = Field(
        pattern=r"^[A-Za-z0-9]([A-Za-z0-9._-]|\{date\}|\{run\}){0,127}$",
        description=(
            "names the folder `output_dir/release_id`; `{date}` becomes the run's scheduled date (YYYY-MM-DD), "
            "`{run}` the flow run's name (unique per run)"
        ),
    )
    population_id: str = Field(min_length=1, description="the set of people whose ε budget this release spends")
    source: SourceSpec
    roles: Roles
    k: int = Field(ge=2, description="minimum equivalence-class size")
    epsilon: float = Field(gt=0, description="ε per record, split across the ε-quasis (dp: the release's total ε)")
    privacy_model: Literal["kepsilon", "dp"] = Field(
        default="kepsilon",
        description="kepsilon: the method's (k,ε)-anonymity; dp: (ε,δ)-differential privacy by sampling and safe k-anonymisation",
    )
    dp: DPSettings | SkipJsonSchema[None] = Field(default=None, description="parameters of privacy_model dp")
    algorithm: Literal["mondrian", "ola"] = "mondrian"
    ola_metric: Literal["precision", "loss", "discernibility", "dm_star"] = Field(
        default="precision",
        description=(
            "information-loss metric OLA minimises; dm_star: Σ|ec|² over every class, suppressed ones "
            "included (the method's authors' criterion)"
        ),
    )
    scale_basis: Literal["diameter", "bounds"] = Field(
        default="diameter",
        description="noise scale from the class diameter (the paper's method) or from public bounds (ε-DP given the partition)",
    )
    confidence: float = Field(default=0.99, gt=0, lt=1, description="confidence c of confidence-based suppression")
    suppression_budget: float = Field(default=0.05, ge=0, le=1, description="largest fraction of records removed")
    output_dir: str = Field(
        default="out",
        description="published files go to `output_dir/release_id`; in a spec file, relative to the spec file",
    )
    publish_statistics: list[Literal["information_loss", "linking_risk", "k_quasi_precision", "disclosure"]] = Field(
        default=[],
        description=(
            "statistics computed from the private data to add to the public manifest; "
            "they are not protected by the method (an adversary who knows the other records can solve them)"
        ),
    )
    max_linking_risk: float = Field(
        default=0.10,
        ge=0,
        le=1,
        description="largest linking risk the gate lets through (the method's paper: above 10 % is too risky); "
        "checked after the noise, so a release over it has spent its ε",
    )
    max_prosecutor_risk: Annotated[float, Field(gt=0, le=1)] | SkipJsonSchema[None] = Field(
        default=None, description="largest 1/|group| of the published groups the gate lets through; none by default"
    )
    max_journalist_risk: Annotated[float, Field(gt=0, le=1)] | SkipJsonSchema[None] = Field(
        default=None,
        description="largest journalist risk (1/population group size) of the anonymiser's groups, checked before ε; none by default",
    )
    max_marketer_risk: Annotated[float, Field(gt=0, le=1)] | SkipJsonSchema[None] = Field(
        default=None,
        description="largest marketer risk (expected share of records re-identified) of the anonymiser's groups, checked before ε",
    )
    population: Population | SkipJsonSchema[None] = Field(
        default=None, description="the population the journalist and marketer models match against; default: the table itself"
    )
    certificate: CertificateSettings | SkipJsonSchema[None] = Field(
        default=None, description="the officer's certificate: classifier target, risk threshold, SUDA search size"
    )
    operator: str | SkipJsonSchema[None] = Field(default=None, description="who runs the release; defaults to the OS user")
    approval_required: bool = Field(
        default=False, description="two-person rule: refuse the release without an approval by someone other than the operator"
    )
    execution: Execution = Field(
        default=Execution(), description="where the release runs (not part of the release's identity)"
    )
    rerelease_unchanged: bool = Field(
        default=False,
        description="publish a new release even when the population's last published release has the same source "
        "and spec (default: such a run publishes nothing, spends nothing and says where the current release is)",
    )

    @field_validator("epsilon")
    @classmethod
    def _finite_epsilon(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("ε must be finite")
        return value

    @model_validator(mode="after")
    def _privacy_model_parameters(self):
        # Raised as SpecError (not ValueError) so that the error names the nested parameter.
        if self.privacy_model == "dp":
            if self.execution.engine == "dask":
                raise SpecError("execution.engine", "the DP mode runs in memory only (engine memory)")
            check_dp_parameters(self)
        else:
            check_kepsilon_parameters(self)
        return self

    @model_serializer(mode="wrap")
    def _one_privacy_model(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        # A DP spec's dump leaves out the method's own fields (their defaults would be refused when read back);
        # the hash asks for every field, as it was computed before the split.
        data: dict[str, Any] = handler(self)
        if self.privacy_model != "dp" or (info.context or {}).get(EVERY_FIELD):
            return data
        for name in FIELDS_OF_THE_METHODS_MODE:
            if name not in self.model_fields_set:
                data.pop(name, None)
        for quasi, dumped in zip(self.roles.e_quasi, data.get("roles", {}).get("e_quasi", [])):
            for name in E_QUASI_NOISE_ONLY:
                if name not in quasi.model_fields_set:
                    dumped.pop(name, None)
        return data

    @model_validator(mode="after")
    def _certificate_columns(self):
        # A weight or classifier target must be a column of the spec; named, never quoted.
        names = self.roles.names()
        if self.population is not None and self.population.weight_column is not None:
            if self.population.weight_column not in names["k_quasi"] + names["e_quasi"] + names["sensitive"]:
                raise SpecError("population.weight_column", "must be a column named in roles (not explicit: those are removed first)")
        if self.certificate is not None and self.certificate.utility_target is not None:
            if self.certificate.utility_target not in names["k_quasi"] + names["e_quasi"] + names["sensitive"]:
                raise SpecError("certificate.utility_target", "must be a released column (k_quasi, e_quasi or sensitive)")
        return self

    def generalised_columns(self) -> list[str]:
        """DP mode: the columns generalised at the node, k-quasis then ε-quasis (the node's order)."""
        return [q.column for q in self.roles.k_quasi] + [q.column for q in self.roles.e_quasi]

    def dp_settings(self) -> DPSettings:
        """DP mode: the `dp` block, which a DP-mode spec must have (``check_dp_parameters``)."""
        if self.dp is None:
            raise SpecError("dp", "privacy_model dp needs its parameters: max_delta, and a fixed node or a search")
        return self.dp

    def dp_epsilons(self) -> tuple[float, float]:
        """DP mode: (ε_search, ε_anon), the search's share and the anonymisation's; they sum to ε."""
        dp = self.dp_settings()
        search = dp.search.epsilon if dp.search is not None else 0.0
        return search, self.epsilon - search

    def dp_beta(self) -> float:
        """DP mode: the sampling probability β, given or 1 − e^(−ε_anon)."""
        beta = self.dp_settings().beta
        return beta if beta is not None else sampling_rate_for(self.dp_epsilons()[1])

    def dp_delta(self) -> float:
        """DP mode: the release's δ = d(k, β, ε_anon) (Li, Qardaji and Su)."""
        return safe_k_delta(self.k, self.dp_beta(), self.dp_epsilons()[1])

    def epsilon_split(self) -> dict[str, float]:
        """ε per ε-quasi: the record's ε divided by the declared shares (equal by default); none in the
        DP mode, where nothing is noised (its split is ``dp_epsilons``)."""
        if self.privacy_model == "dp":
            return {}
        shares = [q.epsilon_share or 1.0 for q in self.roles.e_quasi]
        total = sum(shares)
        return {q.column: self.epsilon * share / total for q, share in zip(self.roles.e_quasi, shares)}

    def spec_hash(self) -> str:
        """SHA-256 of the canonical JSON of what defines the release's content.

        The operator, the output folder, the execution engine and ``rerelease_unchanged`` are left out: a rerun by another
        operator, into a corrected output folder, or on the other engine (which publishes the same values)
        is the same logical release (one spend, one noise draw).
        """
        content = _without_new_defaults(
            self.model_dump(
                mode="json",
                exclude={"operator", "output_dir", "execution", "rerelease_unchanged"},
                context={EVERY_FIELD: True},
            )
        )
        canonical = json.dumps(content, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def for_date(self, day: str) -> "ReleaseSpec":
        """A copy whose release id has ``{date}`` replaced by ``day`` (YYYY-MM-DD)."""
        return self.model_copy(update={"release_id": self.release_id.replace("{date}", day)})

    def for_run(self, day: str, run_name: str) -> "ReleaseSpec":
        """A copy whose release id has ``{date}`` replaced by ``day`` and ``{run}`` by the flow run's name.

        The run name (Prefect's, e.g. ``clever-fox``) is made safe for a folder name. A form that keeps
        ``{run}`` gets a fresh release id per run, so a custom run from the UI never collides with a
        release already published under the day's id.
        """
        safe = "".join(c if c.isalnum() or c in "._-" else "-" for c in run_name).strip("-.") or "run"
        return self.for_date(day).model_copy(update={"release_id": self.release_id.replace("{date}", day).replace("{run}", safe)})


def _without_new_defaults(content: dict) -> dict:
    """The spec's JSON without the DP mode's fields where they hold their defaults.

    They were added after releases had been approved and recorded under their spec hash: leaving
    them out while unused keeps every existing spec's hash, hence its approvals and idempotency keys.
    """
    if content.get("privacy_model") == "kepsilon":
        del content["privacy_model"]
    if content.get("dp") is None:
        content.pop("dp", None)
    for quasi in content["roles"]["e_quasi"]:
        for added in ("hierarchy", "max_relative_error"):
            if quasi.get(added) is None:
                quasi.pop(added, None)
    for name in ("max_journalist_risk", "max_marketer_risk", "population", "certificate"):
        if content.get(name) is None:
            content.pop(name, None)
    return content


def require_kepsilon_mode(spec: "ReleaseSpec", what: str) -> None:
    """Refuse a DP-mode spec where only the method's own mode makes sense (e.g. the noise advisor)."""
    if spec.privacy_model == "dp":
        raise SpecError(
            "privacy_model",
            f"{what} applies to privacy_model kepsilon (its noise and classes); a DP-mode release is set by k, ε "
            "and δ alone (kepsilon.engine.dp.smallest_k gives the k for a δ)",
        )


# The two privacy models' own fields. The spec is one model (the flow's parameter, rendered as the run form),
# split by ``privacy_model`` as a tagged union would be: a field of one model stated in a spec of the other is
# refused whatever its value, even the default (a DP spec saying ``confidence: 0.99`` is refused like one saying
# 0.98), so that a spec never states a parameter that does nothing. A dump of a DP spec leaves the method's
# fields out (``ReleaseSpec._one_privacy_model``), so a spec read back from its dump (Prefect's stored
# parameters, ``resolve_paths``) is the same spec.
FIELDS_OF_THE_METHODS_MODE = {
    "algorithm": "the node is fixed in the spec or chosen by the DP search",
    "ola_metric": "the DP search scores nodes by granularity",
    "scale_basis": "nothing is noised: every column is generalised",
    "confidence": "there is no confidence suppression (it reads true values)",
    "suppression_budget": "groups below k are suppressed whatever their number (a budget would depend on the data)",
    "max_linking_risk": "no ε-quasi is noised, so there is no noisy value to link",
    "max_journalist_risk": "the groups are drawn from the sample, not decided before the noise",
    "max_marketer_risk": "the groups are drawn from the sample, not decided before the noise",
    "publish_statistics": "privacy_model dp publishes no statistic computed from the private data",
}
# An ε-quasi's fields that set its noise (the DP mode generalises it through a hierarchy instead).
E_QUASI_NOISE_ONLY = ("lower", "upper", "out_of_bounds", "epsilon_share", "max_relative_error")
# Where the model's own validators need every field of a DP spec (its hash, unchanged since before the split).
EVERY_FIELD = "every_field"


def check_kepsilon_parameters(spec: "ReleaseSpec") -> None:
    """The method's own mode: no DP parameters, every ε-quasi noised within its public bounds."""
    if spec.dp is not None:
        raise SpecError("dp", "applies to privacy_model dp only")
    for quasi in spec.roles.e_quasi:
        if quasi.hierarchy is not None:
            raise SpecError(
                f"roles.e_quasi.{quasi.column}.hierarchy",
                "applies to privacy_model dp only; here an ε-quasi is noised within its public bounds",
            )


def check_dp_parameters(spec: "ReleaseSpec") -> None:
    """Refuse a DP-mode spec the theorem does not cover, naming the parameter, before anything runs."""
    if spec.dp is None:
        raise SpecError("dp", "privacy_model dp needs its parameters: max_delta, and a fixed node or a search")
    for name, why in FIELDS_OF_THE_METHODS_MODE.items():
        if name in spec.model_fields_set:
            raise SpecError(name, f"does not apply to privacy_model dp: {why}")
    _check_dp_roles(spec)
    _check_dp_levels(spec)
    _check_dp_budget(spec)


def _check_dp_roles(spec: "ReleaseSpec") -> None:
    """ε-quasis generalised through a hierarchy; no sensitive criterion (each group holds one value)."""
    for quasi in spec.roles.e_quasi:
        where = f"roles.e_quasi.{quasi.column}"
        if quasi.hierarchy is None:
            raise SpecError(where, "privacy_model dp generalises an ε-quasi through a public `hierarchy` (a file or a builder)")
        stated = [name for name in E_QUASI_NOISE_ONLY if name in quasi.model_fields_set]
        if stated:
            raise SpecError(where, f"`{stated[0]}` applies to the noise of privacy_model kepsilon only")
    for entry in spec.roles.sensitive:
        if not isinstance(entry, str) and (entry.l_diversity is not None or entry.t_closeness is not None):
            raise SpecError(
                f"roles.sensitive.{entry.column}",
                "ℓ-diversity and t-closeness do not apply to privacy_model dp: every released column is part of "
                "the group key, so each published group holds a single value of it",
            )


def _check_dp_levels(spec: "ReleaseSpec") -> None:
    """A fixed node names every generalised column; a sensitive level above 0 needs a hierarchy.

    Levels are checked against the hierarchies' heights when they are loaded, still before any ε.
    """
    generalised = spec.generalised_columns()
    dp = spec.dp_settings()
    if dp.node is not None:
        unknown = [column for column in dp.node if column not in generalised]
        missing = [column for column in generalised if column not in dp.node]
        if unknown:
            raise SpecError(f"dp.node.{unknown[0]}", "is not a k-quasi or ε-quasi column")
        if missing:
            raise SpecError(f"dp.node.{missing[0]}", "needs a level: a fixed node gives one to every k-quasi and ε-quasi")
    sensitive = {entry if isinstance(entry, str) else entry.column: entry for entry in spec.roles.sensitive}
    for column, level in dp.sensitive_levels.items():
        if column not in sensitive:
            raise SpecError(f"dp.sensitive_levels.{column}", "is not a sensitive column")
        entry = sensitive[column]
        if level > 0 and (isinstance(entry, str) or not entry.hierarchy):
            raise SpecError(
                f"dp.sensitive_levels.{column}",
                "a level above 0 needs the column's `hierarchy` in roles.sensitive (`{column, hierarchy}`)",
            )


def _check_dp_budget(spec: "ReleaseSpec") -> None:
    """ε_search below ε, ε_anon ≥ −ln(1 − β), and δ(k, β, ε_anon) within max_delta."""
    search, anonymisation = spec.dp_epsilons()
    if anonymisation <= 0:
        raise SpecError("dp.search.epsilon", "must be below the release's epsilon: the rest pays for the anonymisation")
    beta = spec.dp_beta()
    if anonymisation < minimum_epsilon(beta):
        raise SpecError(
            "dp.beta",
            f"sampling at β = {beta:g} needs ε_anon ≥ −ln(1 − β) = {minimum_epsilon(beta):.4g}, and ε_anon = ε − ε_search "
            f"is {anonymisation:.4g}: lower beta (or leave it out for 1 − e^(−ε_anon)) or raise epsilon",
        )
    delta = safe_k_delta(spec.k, beta, anonymisation)
    max_delta = spec.dp_settings().max_delta
    if delta > max_delta:
        raise SpecError(
            "dp.max_delta",
            f"δ(k = {spec.k}, β = {beta:.4g}, ε_anon = {anonymisation:.4g}) = {delta:.3g} is above max_delta = "
            f"{max_delta:g}; {_k_hint(max_delta, beta, anonymisation)}",
        )


def _k_hint(max_delta: float, beta: float, epsilon: float) -> str:
    try:
        return f"the smallest k that meets it at this β and ε_anon is {smallest_k(max_delta, beta, epsilon)}"
    except ValueError:
        return "no k meets it at this β and ε_anon: raise epsilon or max_delta"


def load_spec(path: str | Path, **overrides) -> ReleaseSpec:
    """Read a YAML spec; every relative path in it is resolved against the spec file's folder.

    ``overrides`` (e.g. ``k=5``) replace top-level fields before validation. Validation errors are
    re-raised as ``SpecError`` naming the offending parameter.
    """
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SpecError("spec", f"cannot read {str(path)!r} ({exc.strerror})") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise SpecError("spec", f"{str(path)!r} is not valid YAML ({type(exc).__name__})") from None
    if not isinstance(raw, dict):
        raise SpecError("spec", f"{str(path)!r} must hold a mapping of parameters")
    raw.update({key: value for key, value in overrides.items() if value is not None})
    spec = parse_spec(raw)
    return resolve_paths(spec, path.parent)


def parse_spec(raw: dict) -> ReleaseSpec:
    """Validate a mapping as a ReleaseSpec, naming the first bad parameter in the error."""
    try:
        return ReleaseSpec.model_validate(raw)
    except ValidationError as exc:
        first, loc = _most_specific(exc.errors())
        location = ".".join(str(part) for part in loc if not _is_branch_tag(part)) or "spec"
        message = first["msg"]
        if first["type"] == "extra_forbidden":
            message = "unknown field"
        raise SpecError(location, message) from None


_NOT_THIS_BRANCH = {"string_type", "none_required", "model_type", "model_attributes_type", "dict_type", "list_type"}


def _most_specific(errors: list) -> tuple[dict, tuple]:
    """The error to show, and its location without the union's branch tag.

    A field such as ``hierarchy: str | builder | None`` fails on every branch; pydantic lists "not a
    string" first, but for a builder written as a mapping the useful error is the builder's own
    (``…hierarchy.categories.groups: quote yes/no``), the one that went deepest into the input.
    """
    first = errors[0]
    if first["type"] not in _NOT_THIS_BRANCH or len(first["loc"]) < 2:
        return first, first["loc"]
    union = first["loc"][:-1]
    deeper = [e for e in errors if e["loc"][: len(union)] == union and len(e["loc"]) > len(union) + 1]
    if not deeper:
        return first, first["loc"]
    chosen = max(deeper, key=lambda e: len(e["loc"]))
    inner = [part for part in chosen["loc"][len(union) + 1 :] if not _is_branch_tag(part)]
    return chosen, (*union, *inner)


def _is_branch_tag(part) -> bool:
    """Whether a location part names a union's branch or a validator (pydantic's), not a field."""
    text = str(part)
    if text.startswith(("function-after[", "function-before[", "function-wrap[", "tagged-union[")):
        return True
    model = globals().get(text)
    return isinstance(model, type) and issubclass(model, BaseModel)


def resolve_paths(spec: ReleaseSpec, base: Path) -> ReleaseSpec:
    """A copy of the spec whose paths are all absolute, relative ones taken from ``base``.

    One rule for every path a spec file holds (the source, each hierarchy file, ``output_dir``, the
    Dask engine's ``scratch``): it
    is relative to the spec file, so a spec means the same wherever it is run from. A spec given
    directly as the flow's parameter (a deployment, the UI form) has no file: its relative paths are
    taken from the flow's working directory (for the deployments, the project root).
    """

    def absolute(p: str | None) -> str | None:
        if p is None:
            return None
        candidate = Path(p)
        return str(candidate if candidate.is_absolute() else (base / candidate).resolve())

    data = spec.model_dump()
    data["source"]["path"] = absolute(data["source"]["path"])
    data["output_dir"] = absolute(data["output_dir"])
    if data["execution"]["scratch"]:
        data["execution"]["scratch"] = absolute(data["execution"]["scratch"])
    for quasi in data["roles"]["k_quasi"] + data["roles"]["e_quasi"]:
        if isinstance(quasi["hierarchy"], str):
            quasi["hierarchy"] = absolute(quasi["hierarchy"])
    for entry in data["roles"]["sensitive"]:
        if isinstance(entry, dict) and entry.get("hierarchy"):
            entry["hierarchy"] = absolute(entry["hierarchy"])
    if data.get("population") and data["population"].get("table"):
        data["population"]["table"] = absolute(data["population"]["table"])
    return ReleaseSpec.model_validate(data)
