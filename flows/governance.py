"""The governance of a release, written once: what every release does, whatever its engine and privacy model.

``govern(spec, engine)`` is the process, in the one order every combination of engine (memory, dask) and
privacy model (kepsilon, dp) refuses in:

1. the checks that read no record — the private report folder, the signer, the source's fingerprint
   (``engine.read_source``), the audit store (its chain against the published witnesses), the release id
   (already published: nothing to do; published by another logical release: refused), an unchanged
   source (nothing to do), the output folder, the engine's own room (``engine.workspace``: the Dask
   engine's scratch folder), the roles against the source's column names;
2. the checks that read the records — intake and classification (``engine.intake``), then the anonymiser
   and the checks before ε (``engine.anonymise``: hierarchies, the anonymiser's classes, the shared checks
   of ``tasks/preflight.pre_epsilon_checks``, the DP mode's plan and seed key);
3. the approval (two-person rule: a missing one is recorded as refused), the reservation (over the cap:
   recorded as refused), and only then the stages on the reserved budget (``spend``);
4. the record (every failure after the reservation recorded, of any type, with the engine's own cleanup
   first), the rename into place, the report artifacts, the private figures and the certificate.

The engine is a strategy object (``Engine``): it reads the source, anonymises and returns what runs on the
reserved budget; within it the privacy model (the in-memory engine's ``kepsilon`` or ``dp``) is another.
Nothing here knows how a table is read or anonymised, and no engine decides when anything is refused,
approved, reserved, recorded or published.
"""

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from prefect import get_run_logger
from prefect.runtime import flow_run

from kepsilon.faults import fault_point
from kepsilon.flows.manifest import base_record, content_key, idempotency_key
from kepsilon.flows.report import publish_figure_artifact, publish_report_artifacts
from kepsilon.flows.spec import ReleaseSpec
from kepsilon.record import ReleaseRecord
from kepsilon.tasks.certificate import write_release_certificate
from kepsilon.tasks.classify import check_roles
from kepsilon.tasks.errors import ReleaseFailed, ValidationFailed, describe_failure
from kepsilon.tasks.figure_inputs import FigureInputs
from kepsilon.tasks.figures import RELEASE_CAPTIONS, private_report_dir, release_figures, write_figures
from kepsilon.tasks.preflight import check_output, find_published, unchanged_release
from kepsilon.tasks.publish import move_into_place
from kepsilon.tasks.record import (
    check_approval,
    record_outcome,
    reserve_epsilon,
    run_operator,
    store_location,
    verify_store,
)

# What runs on the reserved budget: (reservation, record) -> (record, staged publication, the private
# figures' inputs or None). Every failure it raises is recorded by ``govern``.
Spend = Callable[[Any, ReleaseRecord], tuple[ReleaseRecord, Any, FigureInputs | None]]


@dataclass(frozen=True)
class SourceFacts:
    """What the governance needs of the source before reading its records: its keyed fingerprint, its
    column names (checked against the roles), the bytes to size the output from, and what the record
    keeps of it (``rows`` may be missing: the Dask engine counts them at intake)."""

    sha256: str
    columns: tuple[str, ...]
    size_basis: int
    report: dict


class Engine(Protocol):
    """How a release reads and anonymises its table: in one process (``flows/release.MemoryEngine``) or
    partition by partition on Dask (``flows/release_dask.DaskEngine``). One object per run: it keeps the
    table between its steps."""

    def read_source(self, spec: ReleaseSpec) -> SourceFacts:
        """Fingerprint the source (and, where cheap, read it); refuse a source that cannot be read."""
        ...

    def workspace(self, spec: ReleaseSpec, output_dir: str) -> AbstractContextManager[None]:
        """What the engine holds for the rest of the run (its scratch, its progress); refused on entry when
        there is no room for it; released, whatever happens, on exit."""
        ...

    def intake(self, spec: ReleaseSpec) -> int:
        """Read and classify the records (refusing bad values by column); return how many came in."""
        ...

    def execution(self, spec: ReleaseSpec) -> dict:
        """The engine's entries of the record's ``execution`` (where the release ran)."""
        ...

    def anonymise(self, spec: ReleaseSpec, store: str, key: str, record: ReleaseRecord, output_dir: str) -> Spend:
        """Anonymise and run the checks before ε: fill the record's ``anonymiser``, ``hierarchies`` and
        (where the model has them) ``pre_epsilon``; refuse as the first failed check says. Returns what runs
        on the reserved budget."""
        ...

    def discard(self, spec: ReleaseSpec, output_dir: str, failure: BaseException) -> None:
        """Remove what the failed spend left that must not stay (before the failure is recorded)."""
        ...


def run_day() -> str:
    """The day of the flow run (its scheduled start, else now), in UTC: fills a ``{date}`` release id."""
    scheduled = flow_run.scheduled_start_time
    moment = scheduled if scheduled is not None else datetime.now(UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%d")


def govern(spec: ReleaseSpec, engine: Engine) -> ReleaseRecord:
    """Run one governed release on ``engine`` (see the module docstring); return its private record.

    For a release already published, the stored record marked ``already_published``; for an unchanged
    source, the current release's record marked ``unchanged_source``. Refusals before ε raise the check's
    own error (one line, naming a column or parameter); failures after it are recorded first.
    """
    logger = get_run_logger()
    store = store_location()
    operator = run_operator(spec, store, str(flow_run.id))  # the signer; a refusal is recorded (docs/identity.md)
    started_at = datetime.now(UTC).isoformat()

    # 1. Refusals that read no record.
    figures_dir = private_report_dir(spec.release_id, spec.output_dir)  # refused before any work if misplaced
    facts = engine.read_source(spec)
    key = idempotency_key(spec, facts.sha256)
    verify_store(store, spec.output_dir, spec.population_id)  # the chain against its published witnesses too
    done = find_published(store, spec.release_id, key)
    if done is not None:
        logger.info("release %s was already published at %s; nothing to do", spec.release_id, done["published_at"])
        return done
    current = unchanged_release(store, spec, content_key(spec, facts.sha256))
    if current is not None:
        return unchanged_outcome(spec, current)
    output_dir = check_output(spec.output_dir, spec.release_id, facts.size_basis)
    with engine.workspace(spec, output_dir):  # the engine's own room (Dask: the scratch folder) refused here
        check_roles(list(facts.columns), spec.roles)  # the spec against the source's names: no record read yet
        # 2. Refusals that read the records, the checks before ε last.
        rows = engine.intake(spec)
        record = base_record(spec, {**facts.report, "rows": rows}, key)
        record["execution"] = {
            "flow_run_id": str(flow_run.id), "operator": operator, "started_at": started_at, **engine.execution(spec),
        }
        logger.info("release %s: %d records in", spec.release_id, rows)
        spend = engine.anonymise(spec, store, key, record, output_dir)

        # 3. Approve, reserve: each refusal recorded; nothing is drawn before both pass.
        record["approval"] = check_approval(spec, operator, store, record)
        reservation = reserve_epsilon(spec, key, operator, store, record)
        record["budget"] = {"reservation_id": reservation.id, "epsilon_reserved": spec.epsilon, "reused": reservation.reused}
        if reservation.delta is not None:
            record["budget"]["delta_reserved"] = reservation.delta
        fault_point("after-reservation")

        # 4. Spend, record, publish.
        record["private_figures"] = str(figures_dir)
        try:
            record, publication, figure_inputs = spend(reservation, record)
            fault_point("before-audit-commit")
            record_outcome(record, "published", reservation.id, store)
        except BaseException as failure:  # noqa: B036 - ε is reserved: every failure, of any type, is recorded
            engine.discard(spec, output_dir, failure)
            fail_after_reservation(record, failure, reservation.id, store)
        fault_point("after-audit-commit")
        move_publication_into_place(spec.release_id, publication)
        publish_report_artifacts(record)
        if figure_inputs is not None:
            release_figures_for(spec, figure_inputs, figures_dir)
        write_release_certificate(record, store, figures_dir)  # docs/certificate.md (every engine and model)
        logger.info("release %s published: %d records", spec.release_id, record["rows_published"])
        return record


def unchanged_outcome(spec: ReleaseSpec, current: ReleaseRecord) -> ReleaseRecord:
    """A run over an unchanged source (``tasks/preflight.unchanged_release``): nothing published, nothing spent,
    nothing recorded; the current release's record, marked so the CLI says where it is."""
    where = current.get("output_dir") or current.get("directory") or "?"
    get_run_logger().info(
        "release %s: the source and spec are unchanged since release %s (%s); nothing published, no ε spent "
        "(rerelease_unchanged: true publishes anyway)", spec.release_id, current.get("release_id"), where,
    )
    return {**current, "unchanged_source": True, "requested_release_id": spec.release_id, "published_at": where}


def release_figures_for(spec: ReleaseSpec, inputs: FigureInputs, folder) -> None:
    """Draw the private figures into the private report folder and onto the run's page.

    The release is published and recorded by now: a figure that cannot be drawn or written is logged
    (its error class only) and does not turn a published release into a failed run.
    """
    logger = get_run_logger()
    try:
        figures = release_figures(inputs, spec.k)
        write_figures(figures, folder)
        publish_figure_artifact("release-" + spec.release_id, figures, RELEASE_CAPTIONS, "private figures of the release")
    except Exception as failure:  # noqa: BLE001 - see the docstring
        logger.warning("release %s: private figures not made (%s)", spec.release_id, type(failure).__name__)


def fail_after_reservation(record: ReleaseRecord, failure: BaseException, reservation_id: int, store: str) -> None:
    """Record a failure that came after the reservation, then stop with one clear error.

    The record holds the error's class and a message that quotes no value (``describe_failure``). If
    the store cannot take the record either (locked, read-only, full), the reservation stands and a
    rerun of the same release resumes it: the error says so. A failed check is raised as it is; any
    other error (the store locked past its busy timeout included) becomes ``ReleaseFailed``.
    """
    reason = describe_failure(failure)
    record["failure"] = reason.split(": ", 1)[-1]
    record["failure_class"] = type(failure).__name__
    release_id = record["release_id"]
    try:
        record_outcome(record, "failed", reservation_id, store)
    except Exception as unrecorded:
        raise ReleaseFailed(
            f"release {release_id!r} failed after its ε was reserved ({reason}) and the audit store could not "
            f"record it ({describe_failure(unrecorded)}); the reservation stands: rerun the same release to resume "
            "it (same reservation, same noise, no new spend)"
        ) from None
    # A failed check keeps its own error (it names the checks); an interrupt stays an interrupt.
    if isinstance(failure, ValidationFailed) or not isinstance(failure, Exception):
        raise failure
    raise ReleaseFailed(
        f"release {release_id!r} failed after its ε was reserved ({reason}); recorded as failed "
        "(`kepsilon audit failures`); rerun the same release to resume its reservation and noise"
    ) from None


def move_publication_into_place(release_id: str, publication) -> None:
    """Rename the staged release to its final name; its record is committed already."""
    try:
        move_into_place(publication.staging, publication.directory)
    except Exception as failure:
        raise ReleaseFailed(
            f"release {release_id!r} is recorded as published but its folder could not be moved into place "
            f"({describe_failure(failure)}); it waits, complete, in {str(publication.staging)!r}: rerun the same "
            "release to finish it (nothing is redrawn or recorded again)"
        ) from None
