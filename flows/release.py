"""The ``governed-release`` flow: one (k,ε)-anonymised release, from spec to published files and audit record.

ingest → classify → k-anonymise → (approve, reserve ε) → perturb → suppress → validate → publish → record

Nothing is published unless every check passes, and no ε is reserved until the input has passed
every check that does not need noise. Data moves between tasks in memory only: every task here is
``NO_CACHE`` and ``persist_result=False``, and the flow's only parameter is the spec (no data, no seed).
"""

import getpass
from datetime import datetime, timezone

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from kepsilon.faults import fault_point
from kepsilon.flows.manifest import base_manifest, idempotency_key
from kepsilon.flows.report import publish_report_artifacts
from kepsilon.flows.spec import ReleaseSpec
from kepsilon.tasks.classify import classify_attributes
from kepsilon.tasks.errors import KepsilonError, ValidationFailed
from kepsilon.tasks.ingest import ingest_source
from kepsilon.tasks.k_anonymise import k_anonymise_records
from kepsilon.tasks.metrics import measure_release
from kepsilon.tasks.perturb import perturb_records
from kepsilon.tasks.publish import merge_and_shuffle, publish_release
from kepsilon.tasks.record import check_approval, record_outcome, reserve_epsilon, store_location
from kepsilon.tasks.suppress import suppress_linkable
from kepsilon.tasks.validate import check_release


def _run_day() -> str:
    scheduled = flow_run.scheduled_start_time
    moment = scheduled if scheduled is not None else datetime.now(timezone.utc)
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d")


@flow(name="governed-release", persist_result=False, log_prints=False, validate_parameters=True)
def governed_release(spec: ReleaseSpec) -> dict:
    """Run one governed (k,ε)-anonymised release and return its manifest (which holds no data)."""
    logger = get_run_logger()
    spec = spec.for_date(_run_day())
    operator = spec.operator or getpass.getuser()
    store = store_location()
    started_at = datetime.now(timezone.utc).isoformat()

    source = ingest_source(spec.source)
    key = idempotency_key(spec, source.sha256)
    manifest = base_manifest(spec, source.report(), key)
    manifest["execution"] = {"flow_run_id": str(flow_run.id), "operator": operator, "started_at": started_at}
    logger.info("release %s: %d records in", spec.release_id, source.rows)

    table = classify_attributes(source.frame, spec)
    partition = k_anonymise_records(table.frame, spec)
    manifest["anonymiser"] = partition.report
    manifest["hierarchies"] = partition.report.get("hierarchies", {})

    approval = check_approval(spec, operator, store, manifest)
    manifest["approval"] = approval
    reservation = reserve_epsilon(spec, key, operator, store, manifest)
    manifest["budget"] = {"reservation_id": reservation.id, "epsilon_reserved": spec.epsilon, "reused": reservation.reused}
    fault_point("after-reservation")

    try:
        manifest = _perturb_check_publish(spec, key, table, partition, reservation, store, manifest)
    except KepsilonError as failure:
        # ε was reserved (and possibly spent); the attempt is recorded, nothing was published.
        manifest["failure"] = str(failure)
        record_outcome(manifest, "failed", reservation.id, store)
        raise
    fault_point("before-audit-commit")
    record_outcome(manifest, "published", reservation.id, store)
    publish_report_artifacts(manifest)
    logger.info("release %s published: %d records", spec.release_id, manifest["rows_published"])
    return manifest


def _perturb_check_publish(spec, key, table, partition, reservation, store, manifest) -> dict:
    """The stages that run on reserved budget: noise, suppression, checks, publication."""
    kept = table.frame[partition.kept]
    class_ids = partition.class_ids[partition.kept]
    perturbation = perturb_records(kept, class_ids, spec, key, reservation.id, store)
    manifest["perturbation"] = perturbation.report
    manifest["seed_commitment"] = perturbation.seed_commitment

    suppression = suppress_linkable(kept, perturbation.frame, class_ids, perturbation.scales, spec)
    release = merge_and_shuffle(partition, kept, perturbation, suppression, table.roles)
    manifest.update(measure_release(kept, perturbation.frame, class_ids, partition, suppression, spec))

    validation = check_release(release, spec, manifest["rows_in"], sum(manifest["rows_removed"].values()))
    manifest["checks"] = validation.checks
    if not validation.success:
        raise ValidationFailed(validation.failed_checks)

    publication = publish_release(release, manifest, spec.output_dir)
    manifest.update(publication.report())
    manifest["execution"]["finished_at"] = datetime.now(timezone.utc).isoformat()
    return manifest
