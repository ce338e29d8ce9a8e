"""The ``governed-release`` flow: one (k,ε)-anonymised release, from spec to published files and audit record.

ingest → classify → k-anonymise → (approve, verify the store, reserve ε) → perturb → suppress → label →
validate → publish → record

Nothing is published unless every check passes, and no ε is reserved until the input has passed
every check that does not need noise. Data moves between tasks in memory only: every task here is
``NO_CACHE`` and ``persist_result=False``, and the flow's only parameter is the spec (no data, no seed).
"""

import getpass
from datetime import datetime, timezone

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from kepsilon.faults import fault_point
from kepsilon.flows.manifest import base_manifest, idempotency_key, public_manifest, published_groups
from kepsilon.flows.report import guarantee_statement, publish_figure_artifact, publish_report_artifacts
from kepsilon.flows.spec import ReleaseSpec
from kepsilon.tasks.classify import classify_attributes
from kepsilon.tasks.errors import ValidationFailed
from kepsilon.tasks.ingest import ingest_source
from kepsilon.tasks.k_anonymise import k_anonymise_records
from kepsilon.tasks.figures import RELEASE_CAPTIONS, private_report_dir, release_figures, write_figures
from kepsilon.tasks.metrics import errors_by_class, measure_release
from kepsilon.tasks.perturb import perturb_records, public_grid
from kepsilon.tasks.publish import merge_and_shuffle, publish_release, published_columns
from kepsilon.tasks.record import check_approval, record_outcome, reserve_epsilon, store_location, verify_store
from kepsilon.tasks.suppress import suppress_linkable
from kepsilon.tasks.validate import check_release


def _run_day() -> str:
    scheduled = flow_run.scheduled_start_time
    moment = scheduled if scheduled is not None else datetime.now(timezone.utc)
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d")


@flow(name="governed-release", persist_result=False, log_prints=False, validate_parameters=True)
def governed_release(spec: ReleaseSpec) -> dict:
    """Run one governed (k,ε)-anonymised release and return its private record (which holds no data).

    Two documents come out of a release: the public ``manifest.json`` beside the data (parameters,
    counts, hashes of the outputs, the guarantee) and the private record in the audit store, which
    adds every figure computed from private values. The returned record is the private one.
    """
    logger = get_run_logger()
    spec = spec.for_date(_run_day())
    operator = spec.operator or getpass.getuser()
    store = store_location()
    started_at = datetime.now(timezone.utc).isoformat()

    figures_dir = private_report_dir(spec.release_id, spec.output_dir)  # refused before any work if misplaced
    source = ingest_source(spec.source)
    key = idempotency_key(spec, source.sha256)
    record = base_manifest(spec, source.report(), key)
    record["execution"] = {"flow_run_id": str(flow_run.id), "operator": operator, "started_at": started_at}
    logger.info("release %s: %d records in", spec.release_id, source.rows)

    table = classify_attributes(source.frame, spec)
    partition = k_anonymise_records(table.frame, spec)
    record["anonymiser"] = partition.report
    record["hierarchies"] = partition.report.get("hierarchies", {})

    approval = check_approval(spec, operator, store, record)
    record["approval"] = approval
    verify_store(store)
    reservation = reserve_epsilon(spec, key, operator, store, record)
    record["budget"] = {"reservation_id": reservation.id, "epsilon_reserved": spec.epsilon, "reused": reservation.reused}
    fault_point("after-reservation")

    record["private_figures"] = str(figures_dir)
    try:
        record, figure_inputs = _perturb_check_publish(spec, key, table, partition, reservation, store, record)
    except Exception as failure:
        # ε was reserved (and possibly spent): whatever went wrong, the attempt is recorded.
        record["failure"] = str(failure)
        record["failure_class"] = type(failure).__name__
        record_outcome(record, "failed", reservation.id, store)
        raise
    fault_point("before-audit-commit")
    record_outcome(record, "published", reservation.id, store)
    publish_report_artifacts(record)
    _release_figures(spec, figure_inputs, figures_dir)
    logger.info("release %s published: %d records", spec.release_id, record["rows_published"])
    return record


def _release_figures(spec: ReleaseSpec, inputs: dict, folder) -> None:
    """Draw the private figures into the private report folder and onto the run's page.

    The release is published and recorded by now: a figure that cannot be drawn or written is logged
    (its error class only) and does not turn a published release into a failed run.
    """
    logger = get_run_logger()
    try:
        figures = release_figures(inputs["group_sizes"], inputs["predicted"], inputs["measured"], spec.k)
        write_figures(figures, folder)
        publish_figure_artifact("release-" + spec.release_id, figures, RELEASE_CAPTIONS, "private figures of the release")
    except Exception as failure:  # noqa: BLE001 - see the docstring
        logger.warning("release %s: private figures not made (%s)", spec.release_id, type(failure).__name__)


def _perturb_check_publish(spec, key, table, partition, reservation, store, record) -> tuple[dict, dict]:
    """The stages that run on reserved budget: noise, suppression, labels, checks, publication.

    Returns the private record and what the private figures need (group sizes, per-class errors).
    """
    kept = table.frame[partition.kept]
    class_ids = partition.class_ids[partition.kept]
    perturbation = perturb_records(kept, class_ids, spec, key, reservation.id, store)
    record["perturbation"] = perturbation.report
    record["seed_commitment"] = perturbation.seed_commitment

    suppression = suppress_linkable(kept, perturbation.frame, class_ids, perturbation.scales, spec)
    release = merge_and_shuffle(partition, kept, class_ids, perturbation, suppression, table.roles)
    record.update(measure_release(kept, perturbation.frame, class_ids, partition, suppression, spec, perturbation.scales))
    record["groups"] = published_groups(release, table.roles["k_quasi"], record["rows_in"])
    predicted, measured = errors_by_class(kept, perturbation.frame, class_ids, perturbation.scales, spec)
    figure_inputs = {
        "group_sizes": release.groupby(table.roles["k_quasi"], sort=False, dropna=False).size().to_numpy(),
        "predicted": predicted,
        "measured": measured,
    }
    record["columns"] = published_columns(release, table.roles)

    validation = check_release(release, spec, record["rows_in"], sum(record["rows_removed"].values()))
    record["checks"] = validation.checks
    if not validation.success:
        raise ValidationFailed(validation.failed_checks)

    grids = {q.column: public_grid(q.lower, q.upper, epsilon) for q, epsilon in zip(spec.roles.e_quasi, spec.epsilon_split().values())}
    public = public_manifest(record, spec, grids, guarantee_statement(spec.scale_basis))
    publication = publish_release(release, public, spec.output_dir)
    record.update(publication.report())
    record["output_dir"] = str(publication.directory)
    record["public_manifest"] = {**public, "outputs": dict(publication.outputs)}
    record["execution"]["finished_at"] = datetime.now(timezone.utc).isoformat()
    return record, figure_inputs
