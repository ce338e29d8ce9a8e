"""Record: the release's dealings with the audit store — approval, ε reservation, the final record.

These tasks are the only place the flow touches the store. Each opens its own connection from the
store's path (a connection is not something to pass between tasks, and the path keeps the tasks
runnable on another worker). A refusal (no approval, budget exhausted) and a failed release are
recorded too, so officers can see what was attempted, not only what was published.
"""

import getpass
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from kepsilon import settings
from kepsilon.audit.approvals import ApprovalMissing, require_approval
from kepsilon.audit.integrity import check_store
from kepsilon.audit.ledger import BudgetExceeded, Reservation, mark_noise_drawn, reserve
from kepsilon.audit.private import check_not_shared, write_private_file
from kepsilon.audit.records import record_release
from kepsilon.audit.seeds import find_sealed_seed, seal_seed, seed_commitment, unseal_seed
from kepsilon.audit.store import ENV_PATH, open_store, store_path
from kepsilon.guarantee import Guarantee
from kepsilon.record import ReleaseRecord
from kepsilon.spec import ReleaseSpec


def store_location() -> str:
    """The audit store's path (``audit.store.store_path``: ``KEPSILON_AUDIT_DB`` or ``./.kepsilon/audit.db``),
    made absolute for workers. A folder others can write to is refused here, before the source is read."""
    path = store_path().resolve()
    if path.parent.exists():
        check_not_shared(path.parent, ENV_PATH)
    return str(path)


def release_operator(spec: ReleaseSpec, store: str) -> str:
    """Who runs this release: in a store with principals, the steward whose key signs it, else the spec's
    ``operator`` or the OS user (attributed, not authenticated).

    The key is the file named by env KEPSILON_SIGNING_KEY in the process that runs the flow — ``kepsilon
    release --key FILE`` sets it; a deployment's worker has its service principal's there — never a flow
    parameter. In a signed store ``spec.operator`` is no longer believed: set, it must name the signer, so an
    operator cannot be put in through a spec file or the run form. Refused (``SignatureRefused``, one line)
    before anything is read or reserved.
    """
    from kepsilon.audit.principals import NO_PRINCIPALS, SignatureRefused, is_signed, principal_of
    from kepsilon.audit.signing import ENV_SIGNING_KEY, key_id, key_path, load_private_key, public_key_text

    signed = False
    if Path(store).exists():
        db = open_store(store)
        try:
            signed = is_signed(db.conn)
            path, setting = key_path(None)
            if not signed:
                if path is not None:
                    raise SignatureRefused(NO_PRINCIPALS)
                return spec.operator or getpass.getuser()
            if path is None:
                raise SignatureRefused(
                    "this audit store requires signed releases: give the steward's key (`kepsilon release --key FILE`, "
                    f"or env {ENV_SIGNING_KEY} in the worker's environment for a deployment); nothing was reserved"
                )
            public = public_key_text(load_private_key(path, setting).public_key())
            state = principal_of(db.conn, public)
        finally:
            db.close()
        if state is None or state.revoked or "steward" not in state.roles:
            why = "is not registered" if state is None else "was revoked" if state.revoked else "holds no steward role"
            raise SignatureRefused(f"the release's key {key_id(public)} {why} in this audit store; nothing was reserved")
        if spec.operator is not None and " ".join(spec.operator.split()) != state.name:
            raise SignatureRefused(
                f"parameter 'operator': {spec.operator!r} is not the release's signer {state.name!r} (the operator is whoever's "
                "key signs the release); leave operator empty; nothing was reserved"
            )
        return state.name
    if key_path(None)[0] is not None:
        raise SignatureRefused(NO_PRINCIPALS)
    return spec.operator or getpass.getuser()


def run_operator(spec: ReleaseSpec, store: str, flow_run_id: str) -> str:
    """``release_operator`` for a flow run, with a refusal recorded in the store (outcome ``refused``, no reservation).

    A run whose operator is not authenticated (no key, a key that is not an active steward's, a spoofed
    ``operator``) is an attempt officers must see, wherever it came from — a run form, a schedule, a spec file —
    so the store, not only the orchestrator, says why it stopped. The record names the operator the run claimed
    (``execution.claimed_operator``) and leaves ``operator`` empty: nobody was authenticated. Written only to a store
    that exists and verifies (a refusal must not extend a chain that cannot be trusted, nor create a store).
    """
    from kepsilon.audit.integrity import inspect_store
    from kepsilon.audit.principals import SignatureRefused

    try:
        return release_operator(spec, store)
    except SignatureRefused as refusal:
        if Path(store).exists() and inspect_store(store).ok:
            attempt: ReleaseRecord = {
                "release_id": spec.release_id, "population_id": spec.population_id, "spec_hash": spec.spec_hash(),
                "k": spec.k, "epsilon": spec.epsilon, "privacy_model": spec.privacy_model,
                "execution": {"flow_run_id": flow_run_id, "operator": None, "claimed_operator": spec.operator},
                "refusal": str(refusal), "refusal_class": type(refusal).__name__,
            }
            db = open_store(store)
            try:
                record_release(db, attempt, outcome="refused", reservation_id=None)
            finally:
                db.close()
        raise


def _release_signature(db, spec: ReleaseSpec, key: str, operator: str):
    """The steward's signature over this reservation (None in a store without principals), made here from the
    key file in the environment so that the key never travels as a task parameter."""
    from kepsilon.audit.ledger import release_fields
    from kepsilon.audit.principals import is_signed, make_act
    from kepsilon.audit.signing import key_path, load_private_key

    if not is_signed(db.conn):
        return None
    path, setting = key_path(None)
    if path is None:
        return None  # the store's refusal names what is missing
    fields = release_fields(spec.population_id, spec.epsilon, key, spec.release_id,
                            spec.dp_delta() if spec.privacy_model == "dp" else None, spec.spec_hash())
    return make_act(db.conn, load_private_key(path, setting), "release", fields, by=operator)


@task(name="check-approval", cache_policy=NO_CACHE, persist_result=False)
def check_approval(spec: ReleaseSpec, operator: str, store: str, record: ReleaseRecord) -> dict | None:
    """Two-person rule: when the spec requires it, refuse without an approval by someone else."""
    if not spec.approval_required:
        return None
    db = open_store(store)
    try:
        approval = require_approval(db, release_id=spec.release_id, spec_hash=spec.spec_hash(), operator=operator)
    except ApprovalMissing:
        record_release(db, {**record, "refusal": "approval missing"}, outcome="refused", reservation_id=None)
        raise
    return {"approver": approval["approver"], "approved_at": approval.get("created_at")}


@task(name="verify-store", cache_policy=NO_CACHE, persist_result=False)
def verify_store(store: str, output_dir: str | None = None, population: str | None = None) -> None:
    """Refuse to spend from a store that does not verify (corrupt, tampered or rolled back).

    Runs right before the reservation; nothing is written to a store that failed, since a refusal
    record would extend a chain that cannot be trusted. With ``output_dir`` (the spec's), the published
    manifests of ``population`` there and in the folders the store recorded must agree with the chain:
    each witnessed the chain's head at its publication (``audit/witness.py``).
    """
    check_store(store, manifests_in=[Path(output_dir)] if output_dir else None, population=population)


@task(name="reserve-epsilon", cache_policy=NO_CACHE, persist_result=False)
def reserve_epsilon(spec: ReleaseSpec, key: str, operator: str, store: str, record: ReleaseRecord) -> Reservation:
    """Reserve the release's ε — and in the DP mode its δ — against its population's caps before any
    noise or sample is drawn.

    Over a cap, the release is recorded as refused and stops here. A rerun of the same logical
    release (same idempotency key) gets its existing reservation back and spends nothing more.
    """
    db = open_store(store)
    charge = Guarantee.for_spec(spec).charge()
    try:
        return reserve(
            db,
            population_id=spec.population_id,
            epsilon=charge.epsilon,
            idempotency_key=key,
            release_id=spec.release_id,
            operator=operator,
            delta=charge.delta,
            spec_hash=spec.spec_hash(),
            signed=_release_signature(db, spec, key, operator),
        )
    except BudgetExceeded as refusal:
        record_release(db, {**record, "refusal": str(refusal)}, outcome="refused", reservation_id=None)
        raise


@task(name="record", cache_policy=NO_CACHE, persist_result=False)
def record_outcome(record: ReleaseRecord, outcome: str, reservation_id: int | None, store: str) -> int:
    """Append the release's record and its hash-chain entry: 'published', or 'failed' after a reservation."""
    return record_release(open_store(store), record, outcome=outcome, reservation_id=reservation_id)


def escrowed_seed(store: str, key: str, release_id: str, fresh_seed) -> tuple[bytes, str]:
    """The release's seed and its commitment: the sealed one for this logical release if there is one,
    otherwise ``fresh_seed()``, sealed in the store *before* it is used.

    Re-deriving the noise from the sealed seed on a rerun means no second noise draw: the rerun's
    output is byte-identical and spends nothing more. The unseal is recorded like an officer's.
    """
    db = open_store(store)
    if find_sealed_seed(db, key) is not None:
        seed = unseal_seed(db, idempotency_key=key, by="kepsilon-flow", reason="rerun of interrupted release")
        return seed, seed_commitment(seed)
    seed = fresh_seed()
    return seed, seal_seed(db, idempotency_key=key, release_id=release_id, seed=seed)


def mark_spent(store: str, reservation_id: int) -> None:
    """ε counts as spent from the moment noise is drawn (idempotent for a rerun of the same release)."""
    mark_noise_drawn(open_store(store), reservation_id)


def check_seed_key(store: str, key: str) -> None:
    """Refuse before ε is reserved (``SpecError`` naming the variable) a seed key the release could not use.

    The key (env ``KEPSILON_SEED_KEY`` or the file ``KEPSILON_SEED_KEY_FILE``) must be readable and a valid
    Fernet key. When this logical release already has a reservation or a sealed seed (an interrupted release
    awaits its seed), the key must be there — a missing file is never silently recreated then, since a new key
    cannot unseal the old seed — and be the key the seed was sealed with (its fingerprint). Otherwise a missing
    file is created now (0600, as on first use), so that a folder it cannot be written in is known before ε.
    """
    from cryptography.fernet import Fernet

    from kepsilon.audit import seeds
    from kepsilon.tasks.errors import SpecError

    db = open_store(store)
    try:
        sealed = db.conn.execute("SELECT key_fingerprint FROM sealed_seeds WHERE idempotency_key = ?", (key,)).fetchone()
        reserved = db.conn.execute(
            "SELECT 1 FROM ledger WHERE kind = 'reserve' AND idempotency_key = ? LIMIT 1", (key,)
        ).fetchone()
    finally:
        db.close()
    raw: str | bytes | None = settings.current().seed_key
    source = seeds.ENV_KEY
    if not raw:
        path, source = seeds.key_file_path(), seeds.ENV_KEY_FILE
        if not path.exists():
            if sealed is not None or reserved is not None:
                raise SpecError(
                    seeds.ENV_KEY_FILE,
                    f"the seed key file {str(path)!r} is missing and this release has a reservation awaiting its seed; "
                    "restore the key file (a new key cannot unseal the sealed seed); nothing was reserved or drawn",
                )
            try:
                write_private_file(path, Fernet.generate_key(), seeds.ENV_KEY_FILE)  # 0600 in a 0700 folder
            except OSError as error:
                raise SpecError(seeds.ENV_KEY_FILE, f"the seed key file {str(path)!r} cannot be created ({error.strerror})") from None
        try:
            raw = path.read_bytes().strip()
        except OSError as error:
            raise SpecError(seeds.ENV_KEY_FILE, f"the seed key file {str(path)!r} cannot be read ({error.strerror})") from None
    material = raw.encode() if isinstance(raw, str) else raw
    try:
        Fernet(material)
    except (ValueError, TypeError):
        raise SpecError(source, "is not a valid urlsafe-base64 Fernet key; nothing was reserved or drawn") from None
    if sealed is not None and sealed[0] != seeds._fingerprint(material):
        raise SpecError(source, "is not the key this release's seed was sealed with; restore the original key")
