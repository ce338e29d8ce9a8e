"""The ``release-check`` flow (``kepsilon check SPEC``): everything a release would decide without noise.

It runs the release's own steps up to the reservation, in the release's order — the store, ingest, the
release id, the output folder (and the Dask engine's scratch folder), roles and identifiers, hierarchies and
the anonymiser's classes and suppression, and the shared
checks before ε (``tasks/preflight.pre_epsilon_checks``, the very function the release calls: noise grid,
seed key, certain linking, the exact predicted relative error per ε-quasi, the linking risk and the
suppression predicted from throw-away draws) — then the approval and the cap left, read only. Where the
release stops at the first refusal, the check collects every verdict, and ends with one line: ``would
publish``, or ``would be refused: <check> <figure> (limit <limit>); try <change>``, the change found by
re-running the same checks on a k or an ε of the advisor's kind (a larger k or smaller ε for the linking
risk and the suppression, a larger ε for the error).

It spends nothing, seals or draws no seed, writes nothing under the output folder (the folder check makes
the folder if missing and probes it with a hidden file it removes, as the release's does) and is recorded in the audit store as an advice
event (it reads the private data). The table is read in memory whatever ``execution.engine`` says. The
figures are the steward's: private, never in a public file.
"""

import getpass
from typing import Any

from prefect import flow
from prefect.runtime import flow_run

from kepsilon.flows.manifest import idempotency_key
from kepsilon.flows.release import _estimate_basis, _run_day, pre_epsilon_in_memory
from kepsilon.flows.spec import ReleaseSpec
from kepsilon.tasks.errors import KepsilonError
from kepsilon.tasks.preflight import Verdict, Verdicts, check_output_dir, published_record

DATA_CHECKS = ("records kept", "certain linking risk", "linking risk", "records published", "suppression")


@flow(name="release-check", persist_result=False, log_prints=False, validate_parameters=True)
def release_check(spec: ReleaseSpec, via: str = "flow") -> dict:
    """Check ``spec`` as a release would, without noise or spend; return the verdicts and the final line."""
    return check_release(spec.for_run(_run_day(), flow_run.name or "run"), via=via, flow_run_id=str(flow_run.id))


def check_release(spec: ReleaseSpec, *, via: str, flow_run_id: str | None = None) -> dict:
    """The check itself (see the module docstring); ``via``: 'cli' or 'flow', for the advice event."""
    from kepsilon.engine.anonymise import k_anonymise
    from kepsilon.tasks.certificate import predicted_risk
    from kepsilon.tasks.classify import classify
    from kepsilon.tasks.ingest import read_source
    from kepsilon.tasks.record import release_operator, store_location

    store = store_location()
    verdicts = Verdicts(collect=True)
    result: dict[str, Any] = {"release_id": spec.release_id, "population_id": spec.population_id, "event_id": None}
    store_ok, _ = verdicts.attempt("audit store", _verify, store)
    # The signer, in a store with principals: the release would be refused without the steward's key.
    authenticated, signer = verdicts.attempt("operator", release_operator, spec, store) if store_ok else (False, None)
    if authenticated:
        assert signer is not None  # release_operator returns a name whenever it passes
        operator: str = signer
    else:
        operator = spec.operator or getpass.getuser()
    read, source = verdicts.attempt("ingest", read_source, spec.source)
    if read and store_ok:
        result["event_id"] = _record_read(spec, source, operator, via, flow_run_id, store)
    table = partition = key = None
    if read:
        key = idempotency_key(spec, source.sha256)
        if store_ok:
            _, done = verdicts.attempt("release id", published_record, store, spec.release_id, key)
            if done is not None:
                result["already_published"] = done.get("output_dir") or done.get("directory")
    # The release's order (flows/governance.py): the folders before anything that reads the records.
    verdicts.attempt("output folder", check_output_dir, spec.output_dir, spec.release_id,
                     _estimate_basis(source, spec) if read else 0)
    if spec.execution.engine == "dask":  # the check reads in memory, but the release would need its scratch
        verdicts.attempt("scratch folder", _check_scratch, spec, source.frame if read else None)
    if read:
        _, table = verdicts.attempt("roles and identifiers", classify, source.frame, spec)
    if table is not None and spec.privacy_model == "kepsilon":
        _, partition = verdicts.attempt("anonymiser", k_anonymise, table.frame, spec)
    if partition is not None and store_ok and key is not None:
        result["predicted"] = pre_epsilon_in_memory(verdicts, spec, store, key, table, partition)
    if partition is not None:
        # The certificate's risk models on the anonymiser's groups (docs/certificate.md): shown, never a verdict
        # (they gate only through max_journalist_risk / max_marketer_risk above); one that cannot be computed
        # is left out, as the certificate leaves it out of a release.
        try:
            result["risk"] = predicted_risk(table, partition, spec)
        except KepsilonError:
            pass
    if store_ok:
        verdicts.add(_approval_verdict(spec, operator, store))
        verdicts.add(_cap_verdict(spec, key, store))
    result["verdicts"] = verdicts.report()
    result["line"] = _final_line(spec, verdicts, table, store, key, result.get("already_published"))
    result["would_publish"] = not verdicts.refusals and "already_published" not in result
    return result


def _verify(store: str) -> None:
    from kepsilon.audit.integrity import check_store

    check_store(store)


def _check_scratch(spec, frame) -> None:
    """The Dask engine's scratch folder as the release prepares it, sized by the table read in memory."""
    from pathlib import Path

    from kepsilon.flows.release_dask import check_scratch

    table_bytes = int(frame.memory_usage(deep=True).sum()) if frame is not None else 0
    check_scratch(spec, str(Path(spec.output_dir).absolute()), table_bytes)


def _record_read(spec, source, operator: str, via: str, flow_run_id, store: str) -> int:
    """The check read the private table: recorded as an advice event (one cell: the spec's k and ε)."""
    from kepsilon.audit.advice import record_advice
    from kepsilon.audit.store import open_store
    from kepsilon.engine.predict import draws_for

    db = open_store(store)
    try:
        return record_advice(
            db, population_id=spec.population_id, spec_hash=spec.spec_hash(), source_sha256=source.sha256,
            source_rows=source.rows, actor=operator, via=via, flow_run_id=flow_run_id, k_values=[spec.k],
            epsilon_values=[spec.epsilon], draws=draws_for(source.rows), report_dir=None,
        )
    finally:
        db.close()


def _approval_verdict(spec, operator: str, store: str) -> Verdict:
    """The two-person rule, read only (the release records a refusal; the check does not)."""
    from kepsilon.audit.approvals import require_approval
    from kepsilon.audit.store import open_store

    if not spec.approval_required:
        return Verdict("approval", True, detail="not required")
    db = open_store(store)
    try:
        require_approval(db, release_id=spec.release_id, spec_hash=spec.spec_hash(), operator=operator)
    except KepsilonError as missing:
        return Verdict("approval", False, parameter="approval_required", detail=str(missing))
    finally:
        db.close()
    return Verdict("approval", True)


def _cap_verdict(spec, key: str | None, store: str) -> Verdict:
    """The ε left under the population's cap (or the default cap it would get), read only."""
    from kepsilon import settings
    from kepsilon.audit.ledger import ENV_DEFAULT_CAP, budget, from_nano, to_nano
    from kepsilon.audit.store import open_store

    db = open_store(store)
    try:
        if key is not None and db.conn.execute(
            "SELECT 1 FROM ledger WHERE kind = 'reserve' AND idempotency_key = ? LIMIT 1", (key,)
        ).fetchone():
            return Verdict("ε cap", True, detail="this release's reservation exists: a rerun spends nothing more")
        state = budget(db, spec.population_id)
    finally:
        db.close()
    if state["cap"] is None:
        raw = settings.current().default_cap
        if not raw:
            return Verdict("ε cap", False, parameter="population_id",
                           detail=f"population {spec.population_id!r} has no ε cap (an officer sets one)")
        left = from_nano(to_nano(ENV_DEFAULT_CAP, raw, round_up=False) - state["in_use"])
    else:
        left = from_nano(state["remaining"])
    return Verdict("ε cap", spec.epsilon <= left + 1e-12, figure=spec.epsilon, limit=max(left, 0.0), parameter="epsilon",
                   detail=f"ε {spec.epsilon:g} of {max(left, 0.0):g} left")


def _final_line(spec, verdicts: Verdicts, table, store, key, already) -> str:
    if already:
        return f"already published at {already}: a release would do nothing (no ε, no noise)"
    if not verdicts.refusals:
        return "would publish"
    first = verdicts.refusals[0]
    return f"would be refused: {first.summary()}; try {_suggestion(spec, first, table, store, key)}"


def _suggestion(spec, verdict: Verdict, table, store, key) -> str:
    """A concrete change that passes the checks that refused, found by re-running them (no noise, no spend)."""
    from kepsilon.engine.perturb import check_noise_grid

    if verdict.name == "noise grid":
        for factor in (2.0 ** j for j in range(1, 40)):
            for epsilon in (spec.epsilon * factor, spec.epsilon / factor):
                try:
                    check_noise_grid(spec.roles.e_quasi, spec.model_copy(update={"epsilon": epsilon}).epsilon_split())
                except KepsilonError:
                    continue
                return f"epsilon {epsilon:.3g}"
    if verdict.name == "ε cap":
        if verdict.limit:
            return f"epsilon {verdict.limit:.3g} (the ε left), or a higher cap set by an officer (`kepsilon audit set-cap`)"
        return "a cap set by an officer: `kepsilon audit set-cap POPULATION CAP --by OFFICER --reason WHY`"
    if verdict.name == "approval":
        return (f"an approval by someone else: `kepsilon audit approve {spec.release_id} --spec-hash {spec.spec_hash()} "
                "--by APPROVER --reason WHY`")
    if table is not None and (verdict.name in DATA_CHECKS or verdict.name.startswith("relative error of ")):
        found = _search(spec, verdict, table, store, key)
        if found:
            return found
        return "`kepsilon advise SPEC` (no k or ε near the spec's passes every check)"
    if "give this one a new release_id" in verdict.detail:
        return "a new release id (`--release-id`, or `release_id` in the spec)"
    return f"fixing parameter {verdict.parameter!r}" if verdict.parameter else "fixing what the line above says"


def _search(spec, verdict: Verdict, table, store, key) -> str | None:
    """The first variant of k or ε (the advisor's kind of grid) whose checks before ε all pass."""
    from kepsilon.engine.anonymise import k_anonymise

    if verdict.name.startswith("relative error of "):
        variants = [("epsilon", spec.epsilon * f) for f in (1.5, 2, 3, 4, 6, 8, 12, 16)]
        variants += [("k", k) for k in sorted({max(2, spec.k // d) for d in (2, 4)}) if k < spec.k]
    else:
        variants = [("k", k) for k in sorted({2 * spec.k, 3 * spec.k, 5 * spec.k, 20, 50, 100}) if k > spec.k]
        variants += [("epsilon", spec.epsilon / f) for f in (2, 4, 8)]
    for name, value in variants:
        variant = spec.model_copy(update={name: value})
        try:
            partition = k_anonymise(table.frame, variant)
            trial = Verdicts(collect=True)
            predicted = pre_epsilon_in_memory(trial, variant, store, key, table, partition)
        except KepsilonError:
            continue
        if not trial.refusals:
            shown = f"{value:.3g}" if isinstance(value, float) else str(value)
            figures = []
            if verdict.name.startswith("relative error of "):
                column = verdict.name.removeprefix("relative error of ")
                figures.append(f"predicted error {100 * predicted['predicted_relative_error'][column]:.2f} %")
            else:
                figures.append(f"predicted linking risk {100 * predicted['predicted_linking_risk']:.2f} %")
                figures.append(f"suppression {100 * predicted['predicted_suppression']:.2f} %")
            return f"{name} {shown} ({', '.join(figures)})"
    return None


def verdict_lines(result: dict) -> list[str]:
    """One line per verdict, for the terminal: ✓/✗ (or 'reported' where a figure does not gate)."""
    lines = []
    for verdict in result["verdicts"]:
        item = Verdict(**{k: v for k, v in verdict.items()})
        mark = "ok " if item.success else ("-- " if not item.gates else "NO ")
        text = item.summary() if item.figure is not None else item.name + (f": {item.detail}" if item.detail else "")
        note = "  (reported only: bounds mode)" if not item.gates else ""
        lines.append(f"{mark} {text}{note}")
    return lines


