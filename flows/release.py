"""The ``governed-release`` flow: one anonymised release, from spec to published files and audit record.

The governance (refusals → approve → reserve → spend → record → rename into place) is written once, in
``flows/governance.govern``, for both engines; this module is the in-memory engine (``MemoryEngine``) and its
two privacy models, and hands a spec with ``execution.engine: dask`` to ``flows/release_dask.py``.

The method's own mode (``privacy_model: kepsilon``, (k,ε)-anonymity):
ingest → (verify the store; already published? unchanged?) → check the output folder → roles → classify →
k-anonymise → the checks before ε (``tasks/preflight.pre_epsilon_checks``: noise grid, seed key, certain
linking, predicted error and linking risk) → approve → reserve ε → perturb → suppress (confidence, then
diversity) → label → validate → stage → record → rename into place

The DP mode (``privacy_model: dp``, (ε,δ)-differential privacy; docs/dp-mode.md):
ingest → (verify the store; already published? unchanged?) → check the output folder → roles → classify →
plan (hierarchies, node levels) → seed key → approve → reserve (ε, δ) → sample, search and safe-k-anonymise
from the sealed seed → validate (every released column in the group key) → stage → record → rename into place

Nothing is published unless every check passes, and no ε is reserved until every check that does not
need noise has passed: input, release id, output folder, approval, store. The files are staged under a
hidden name and renamed to the release's final name only after its audit record is committed, so a
folder under a release's name always has its record. Every failure after the reservation, of any
type, is recorded (class and message, never a value) and ends in ``ReleaseFailed``. A rerun of a
published release does nothing but say where it is. Data moves between tasks in memory only: every
task here is ``NO_CACHE`` and ``persist_result=False``, and the flow's only parameter is the spec.
"""

from contextlib import nullcontext
from datetime import UTC, datetime
from typing import cast

from prefect import flow
from prefect.runtime import flow_run

from kepsilon.audit.claims import release_claim
from kepsilon.audit.witness import with_chain_witness
from kepsilon.engine.criteria import disclosure_report
from kepsilon.engine.metrics import certain_linking_risk, errors_by_class
from kepsilon.engine.perturb import public_grid
from kepsilon.engine.predict import design_for, predict
from kepsilon.engine.stages import release_sequence
from kepsilon.flows.governance import SourceFacts, Spend, govern, run_day
from kepsilon.flows.manifest import public_manifest, published_groups
from kepsilon.flows.spec import ReleaseSpec
from kepsilon.guarantee import Guarantee
from kepsilon.record import PublicManifest, ReleaseMetrics, ReleaseRecord
from kepsilon.tasks.certificate import certificate_figures, dp_certificate_figures, refuse_risk_over_limits
from kepsilon.tasks.classify import ClassifiedTable, classify_attributes
from kepsilon.tasks.dp_release import draw_dp_release, plan_dp_release
from kepsilon.tasks.figure_inputs import FigureInputs
from kepsilon.tasks.ingest import SourceTable, ingest_source
from kepsilon.tasks.k_anonymise import k_anonymise_records
from kepsilon.tasks.metrics import measure_release
from kepsilon.tasks.perturb import perturb_records, release_streams
from kepsilon.tasks.preflight import Verdicts, fresh_generator, pre_epsilon_checks
from kepsilon.tasks.progress import release_progress, stage
from kepsilon.tasks.publish import merge_and_shuffle, published_columns, stage_release
from kepsilon.tasks.record import check_seed_key, store_location
from kepsilon.tasks.scratch import sweep_leftover_scratch
from kepsilon.tasks.suppress import suppress_linkable, suppress_undiverse

_run_day = run_day  # flows/check.py's name for it


@flow(name="governed-release", persist_result=False, log_prints=False, validate_parameters=True)
def governed_release(spec: ReleaseSpec) -> ReleaseRecord:
    """Run one governed (k,ε)-anonymised release and return its private record (which holds no data).

    Two documents come out of a release: the public ``manifest.json`` beside the data (parameters,
    counts, hashes of the outputs, the guarantee) and the private record in the audit store, which
    adds every figure computed from private values. The returned record is the private one; for a
    release that was already published it is the stored record, marked ``already_published``.
    """
    spec = spec.for_run(run_day(), flow_run.name or "run")
    sweep_leftover_scratch(spec)  # a killed Dask run's sealed scratch, whatever its id or engine
    # Held for the whole run: a second run of the same release is refused while this one lives.
    with release_claim(store_location(), spec.release_id):
        if spec.execution.engine == "dask":
            # The partitioned path: the same governance, partition by partition on Dask (flows/release_dask.py).
            from kepsilon.flows.release_dask import release_on_dask

            return release_on_dask(spec)
        with release_progress(len(MEMORY_STAGES), f"release {spec.release_id}") as progress:
            record = govern(spec, MemoryEngine())
            progress.step(progress.steps)
    return record


MEMORY_STAGES = ("ingest", "classify", "k-anonymise", "perturb", "suppress", "merge", "validate", "stage")


class MemoryEngine:
    """The release in one process, stage by stage (each reported to the run's progress and the terminal);
    the privacy model (``KEpsilonInMemory``, ``DpInMemory``) anonymises and spends."""

    def __init__(self) -> None:
        self.source: SourceTable | None = None
        self.table: ClassifiedTable | None = None

    def read_source(self, spec: ReleaseSpec) -> SourceFacts:
        self.source = source = _in_stage("ingest", ingest_source, spec.source)
        return SourceFacts(sha256=source.sha256, columns=tuple(source.frame.columns),
                           size_basis=_estimate_basis(source, spec), report=source.report())

    def workspace(self, spec: ReleaseSpec, output_dir: str):
        return nullcontext()  # the table is in memory: nothing to hold or to clean

    def intake(self, spec: ReleaseSpec) -> int:
        assert self.source is not None, "read_source runs first"
        self.table = _in_stage("classify", classify_attributes, self.source.frame, spec)
        return self.source.rows

    def execution(self, spec: ReleaseSpec) -> dict:
        return {}

    def anonymise(self, spec: ReleaseSpec, store: str, key: str, record: ReleaseRecord, output_dir: str) -> Spend:
        model = DpInMemory() if spec.privacy_model == "dp" else KEpsilonInMemory()
        spend = model.anonymise(spec, store, key, self.table, record, output_dir)
        # The checks' library (Great Expectations, 1.3-1.6 s to import) is loaded here, once the records' own
        # refusals have passed and before ε is reserved: a release refused by its data answers without it, and
        # an installation where it cannot load fails before any budget is reserved, not after the noise.
        import kepsilon.tasks.validate  # noqa: F401
        return spend

    def discard(self, spec: ReleaseSpec, output_dir: str, failure: BaseException) -> None:
        pass  # the in-memory path stages its files only after its checks pass: nothing to remove


class KEpsilonInMemory:
    """The method's own mode: k-anonymise, the checks before ε; on the reserved budget, perturb, suppress,
    label, validate and stage."""

    def anonymise(self, spec, store: str, key: str, table, record: ReleaseRecord, output_dir: str) -> Spend:
        partition = _in_stage("k-anonymise", k_anonymise_records, table.frame, spec)
        record["anonymiser"] = partition.report
        record["hierarchies"] = partition.report.get("hierarchies", {})
        record["pre_epsilon"] = pre_epsilon_in_memory(Verdicts(), spec, store, key, table, partition)

        def spend(reservation, record):
            return _perturb_check_stage(spec, key, table, partition, reservation, store, record, output_dir)

        return spend


class DpInMemory:
    """The DP mode: its plan (hierarchies, node levels) replaces k-anonymise and refuses before ε; on the
    reserved budget, sample, search and safe-k-anonymise from the sealed seed, validate and stage."""

    def anonymise(self, spec, store: str, key: str, table, record: ReleaseRecord, output_dir: str) -> Spend:
        dp_plan = _in_stage("k-anonymise", plan_dp_release, table.frame, spec)
        record["anonymiser"] = dp_plan.report()
        record["hierarchies"] = dp_plan.hierarchy_hashes()
        record["dp"]["search_steps"] = dp_plan.steps
        check_seed_key(store, key)  # the DP mode draws from a sealed seed too

        def spend(reservation, record):
            return _dp_check_stage(spec, key, table, dp_plan, reservation, store, record, output_dir)

        return spend


def _in_stage(name: str, task, *args):
    """Run one stage's task as a one-step stage of the release's progress (``tasks/progress.py``)."""
    with stage(name, 1) as progress:
        result = task(*args)
        progress.advance()
    return result


def _estimate_basis(source, spec) -> int:
    """Bytes to size the output from: the source file, or for Parquet (compressed) its size in memory."""
    if spec.source.resolved_format().value == "parquet":
        return max(source.size, int(source.frame.memory_usage(deep=True).sum()))
    return source.size


def pre_epsilon_in_memory(verdicts: Verdicts, spec, store: str, key: str, table, partition) -> dict:
    """The shared checks before ε (``tasks/preflight.pre_epsilon_checks``) on the in-memory partition: the
    certain linking share, and the exact predicted errors and the throw-away draws' linking risk of the kept
    records. Returns the private summary for the record."""
    kept = table.frame[partition.kept]
    class_ids = partition.class_ids[partition.kept]
    columns = [q.column for q in spec.roles.e_quasi]
    summary = pre_epsilon_checks(
        verdicts, spec, store=store, key=key, rows_in=len(table.frame), rows_kept=len(kept),
        certain_share=certain_linking_risk(kept, class_ids, spec),
        predict=lambda: _predict(kept[columns], class_ids, spec),
    )
    # The certificate's optional gates (max_journalist_risk, max_marketer_risk): on the anonymiser's groups,
    # which depend on the partition only, so they may refuse in bounds mode too.
    verdicts.attempt("journalist and marketer risk", refuse_risk_over_limits, table, partition, spec)
    return summary


def _predict(kept, class_ids, spec):
    """The throw-away draws' prediction of the kept records, on the design their count calls for (``design_for``)."""
    design = design_for(len(kept))
    return predict(kept, class_ids, spec, design.draws, fresh_generator(), share=design.share)


# The engine's stage sequence (``kepsilon.engine.stages``) as this flow runs it: each step as its Prefect task
# (the engine function's arguments), inside the progress stage named here (None: none of its own).
FLOW_STEPS = {
    "perturb": (perturb_records, "perturb"),
    "suppress": (suppress_linkable, "suppress"),
    "diversity-suppress": (suppress_undiverse, None),
    "merge": (merge_and_shuffle, "merge"),
    "metrics": (measure_release, None),
}


def _perturb_check_stage(
    spec, key, table, partition, reservation, store, record: ReleaseRecord, output_dir
) -> tuple[ReleaseRecord, object, FigureInputs]:
    """The stages that run on reserved budget: noise, suppression, labels, checks, staging the files.

    Returns the private record, the staged publication, and what the private figures need (group
    sizes, per-class errors).
    """
    kept = table.frame[partition.kept]
    class_ids = partition.class_ids[partition.kept]
    sealed = release_streams(spec, key, reservation.id, store)

    def step(name, function, *args):
        """Each step of the engine's sequence as its Prefect task, in its progress stage if it has one."""
        task, progress_stage = FLOW_STEPS[name]
        result = _in_stage(progress_stage, task, *args) if progress_stage else task(*args)
        if name == "perturb":  # recorded once the noise is drawn: a later failure's record holds them
            record["perturbation"] = result.report
            record["seed_commitment"] = sealed.commitment
        return result

    outcome = release_sequence(kept, class_ids, partition, spec, sealed.streams, run=step)
    release, perturbation, suppression = outcome.released, outcome.perturbed, outcome.suppression
    record.update(cast(ReleaseMetrics, outcome.metrics))  # the metrics step is measure_release: ReleaseMetrics
    record["groups"] = published_groups(release, table.roles["k_quasi"], record["rows_in"])
    predicted, measured = errors_by_class(kept, perturbation.frame, class_ids, perturbation.scales, spec)
    figure_inputs = FigureInputs.of_arrays(
        release.groupby(table.roles["k_quasi"], sort=False, dropna=False).size().to_numpy(), predicted, measured)
    record["columns"] = published_columns(release, table.roles)
    # Private: what the published groups achieve on the sensitive columns, and their prosecutor risk.
    record["disclosure"] = disclosure_report(release, table.roles["k_quasi"], partition.criteria)
    # Private: the officer's certificate's risk models and utility report (docs/certificate.md).
    record["certificate"] = certificate_figures(spec, table, partition, kept, class_ids, perturbation.frame, suppression.removed)

    from kepsilon.tasks.validate import check_release, validation_failure  # loaded before ε: MemoryEngine.anonymise

    validation = _in_stage(
        "validate",
        check_release,
        release, spec, record["rows_in"], sum(record["rows_removed"].values()), table.frame, record["linking_risk"]
    )
    record["checks"] = validation.checks
    if not validation.success:
        raise validation_failure(validation)

    grids = {q.column: public_grid(q.lower, q.upper, epsilon) for q, epsilon in zip(spec.roles.e_quasi, spec.epsilon_split().values())}
    public = with_chain_witness(public_manifest(record, spec, grids, Guarantee.for_spec(spec).statement()), store, key)
    publication = _stage_publication(record, release, public, output_dir)
    return record, publication, figure_inputs


def _stage_publication(record: ReleaseRecord, release, public: PublicManifest, output_dir):
    """Stage the release's files and note in the private record where they are and what they hold."""
    publication = _in_stage("stage", stage_release, release, public, output_dir)
    record.update(publication.report())
    record["output_dir"] = str(publication.directory)
    record["public_manifest"] = {**public, "outputs": dict(publication.outputs)}
    record["execution"]["finished_at"] = datetime.now(UTC).isoformat()
    return publication


def _dp_check_stage(
    spec, key, table, dp_plan, reservation, store, record: ReleaseRecord, output_dir
) -> tuple[ReleaseRecord, object, None]:
    """The DP mode's stages on reserved budget: sample, search and safe-k-anonymise, check, stage.

    Returns the private record and the staged publication (no figures: they plot the noise of the
    method's own mode). The gate groups on every released column, the groups the theorem speaks of.
    """
    outcome = _in_stage("perturb", draw_dp_release, table.frame, dp_plan, spec, key, reservation.id, store)
    release = outcome.frame
    record["seed_commitment"] = outcome.seed_commitment
    record["anonymiser"] = {**record["anonymiser"], **outcome.report}
    record["dp"]["node"] = outcome.node
    record["rows_removed"] = {
        "sampling": outcome.report["rows_in"] - outcome.report["rows_sampled"],
        "safe_k_suppression": outcome.report["rows_suppressed"],
    }
    record["rows_published"] = outcome.report["rows_published"]
    record["groups"] = published_groups(release, list(release.columns), record["rows_in"])
    record["columns"] = published_columns(release, table.roles)
    # Private: the officer's certificate's risk models and utility report (docs/certificate.md).
    record["certificate"] = dp_certificate_figures(spec, table.frame, dp_plan, release, outcome.rows)

    from kepsilon.tasks.validate import check_dp_release, validation_failure  # loaded before ε: MemoryEngine.anonymise

    validation = check_dp_release(release, spec, outcome.report["rows_sampled"], outcome.report["rows_suppressed"])
    record["checks"] = validation.checks
    if not validation.success:
        raise validation_failure(validation)

    public = with_chain_witness(public_manifest(record, spec, {}, Guarantee.for_spec(spec).statement()), store, key)
    publication = _stage_publication(record, release, public, output_dir)
    return record, publication, None
