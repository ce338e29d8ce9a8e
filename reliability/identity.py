"""Issue 26.5: the attacks on who did what, through the real CLI (``kepsilon audit …``, ``kepsilon release --key``).

One store with principals (root admin, alice approver, bob steward, olga officer; mallory's key never
registered, carol's revoked), a cap of 3 signed by olga, and a release that needs an approval. Each attack
must be refused with one line and exit 2 and leave the ledger as it was (no reservation, no seed, no
folder):

1. an approval signed with an unregistered key; 2. with a revoked key; 3. an approval by the operator's own
key; 4. alice's approval replayed for another spec hash and 5. for another release, submitted to the store;
6. the same replay written straight into the SQLite file (chained and head-logged, as a careful forger
with write access would), caught by the check a release runs before ε; 7. an operator spoofed through the
spec (``operator: alice`` with bob's key) and 8. a release with no key at all; 9. a forged signature
written straight into the file. Then alice approves with her key and bob's release is published
(the attacks were refused for what they were, not because everything is).

Then the deployment's run form (``_form_attacks``): ``deployments/serve.sh`` as ``make serve`` runs it, over a
signed store whose service principal svc-prefect's key is in KEPSILON_SERVICE_KEY, the release deployment's
"Custom run" form submitted in headless Chromium (the helpers of tests/test_service_principal_ui.py): 10. the
untouched form must be published as svc-prefect, its one reservation signed by svc-prefect's key (the control),
and 11. the form with ``operator: alice`` must be refused before ε and recorded as refused in the store.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from .harness import Results, copy_head_log, kepsilon, spec_dict, store_env, write_spec
from .scenarios import NO_BUDGET_FAILURES, BadDay, _figures, _flat, _one_line

CATEGORY = "identity"


class IdentityDay(BadDay):
    """A bad day whose checks are filed under this scenario's category."""

    def check(self, what: str, ok: bool, detail: str = "") -> bool:
        return self.results.add(CATEGORY, f"{self.name}: {what}", ok, detail)

    def spec(self, release_id: str, **changes) -> Path:
        spec = spec_dict(self.work, release_id, source={"path": str(self.source), "delimiter": ";"},
                         **NO_BUDGET_FAILURES, approval_required=True, epsilon=1.0)
        spec["operator"] = None  # a store with principals believes the signer, not this field
        spec.update(changes)
        return write_spec(self.work, spec)


def identity_scenario(results: Results, env: dict, base: Path, source: Path) -> dict:
    """Every attack of issue 26.5 through the CLI; returns the counts for the report."""
    day = IdentityDay(results, env, base, "identity", source)
    keys = _set_up(day)
    attacks = 0

    def refused_approval(what: str, run, mentions: str) -> None:
        nonlocal attacks
        attacks += 1
        line = _one_line(run.stderr, "error:")
        day.check(f"{what}: `kepsilon audit approve` exits 2 with one line naming '{mentions}'",
                  run.returncode == 2 and mentions in line and run.stderr.strip().count("\n") == 0, f"exit {run.returncode}: {line[:240]}")

    def refused_release(what: str, release_id: str, mentions: str, key: str | None = "bob", work: IdentityDay | None = None,
                        **changes) -> None:
        nonlocal attacks
        attacks += 1
        target = work or day
        before = _figures(target.db)
        args = ["release", str(target.spec(release_id, **changes))] + (["--key", str(keys[key])] if key else [])
        run = kepsilon(args, target.env, target.work)
        target.name = f"identity: {what}"
        target.refused_cleanly(run, release_id, mentions, before)
        target.name = "identity"

    spec_hash = _spec_hash(day.spec("id-1"))
    approve = ["audit", "approve", "id-1", "--spec-hash", spec_hash, "--reason", "reviewed", "--key"]

    refused_approval("an unregistered key", kepsilon(approve + [str(keys["mallory"])], day.env, day.work), "not registered")
    refused_approval("a revoked key", kepsilon(approve + [str(keys["carol"])], day.env, day.work), "revoked")
    refused_release("no approval after those two", "id-1", "needs an approval")

    own = kepsilon(approve + [str(keys["bob"])], day.env, day.work)
    day.check("bob, steward and approver, may record an approval with his key", own.returncode == 0, _flat(own.stderr)[-200:])
    refused_release("approved by the operator's own key", "id-1", "own operator's key")

    other = _spec_hash(day.spec("id-1", k=6))
    signed = kepsilon(["audit", "approve", "id-2", "--spec-hash", other, "--reason", "reviewed", "--key", str(keys["alice"])],
                      day.env, day.work)
    day.check("alice approves id-2 (another spec hash, k = 6)", signed.returncode == 0, _flat(signed.stderr)[-200:])
    for what, release, target_hash, mentions in (
        ("replayed for another spec hash", "id-2", spec_hash, "another spec hash"),
        ("replayed for another release", "id-1", other, "another release id"),
    ):
        attacks += 1
        problem = _replay(day.db, release, target_hash)
        day.check(f"alice's approval {what}, submitted to the store: refused", mentions in problem, problem[:240])
    refused_release("after the replays", "id-1", "needs an approval")

    copy = _copy(day, base, "replay into the file")
    _write_replay(copy.db, "id-1", spec_hash)  # alice's signature over id-2 / k = 6, as an approval of id-1 / k = 5
    refused_release("alice's approval of id-2 copied into the file as one of id-1", "id-1", "signature", work=copy)
    _verify_names(copy, "does not match what was signed", "replay into the file")

    refused_release("operator spoofed through the spec (operator: alice, bob's key)", "id-1",
                    "'alice' is not the release's signer 'bob'", operator="alice")
    refused_release("no key at all (a spec naming bob)", "id-1", "requires signed releases", key=None, operator="bob")

    forged = _copy(day, base, "forged signature in the file")
    _write_forgery(forged.db, "id-1", spec_hash)
    refused_release("a forged approval signature written into the file", "id-1", "signature", work=forged)
    _verify_names(forged, "does not verify", "forged signature")

    good = kepsilon(approve + [str(keys["alice"])], day.env, day.work)
    day.check("alice approves id-1 with her key", good.returncode == 0, _flat(good.stderr)[-200:])
    published = kepsilon(["release", str(day.spec("id-1")), "--key", str(keys["bob"])], day.env, day.work)
    figures = _figures(day.db)
    day.check("bob's signed release, approved by alice, is published", published.returncode == 0
              and figures["published"] == 1 and figures["reserves"] == 1, _flat(published.stderr)[-300:])
    verify = kepsilon(["audit", "verify", "--format", "json"], day.env, day.work)
    day.check("`kepsilon audit verify` re-checks every signature: intact", verify.returncode == 0
              and "signature(s) verified" in verify.stdout, _flat(verify.stdout + verify.stderr)[-300:])
    form_attacks = _form_attacks(day, base / "run form")
    results.counts["identity attacks (issue 26)"] = (
        f"{attacks} attacks through the CLI and {form_attacks} through the Prefect UI's run form, {sum(not c.ok for c in results.checks if c.category == CATEGORY)} failed checks; "
        f"ledger after them all: {figures['reserves']} reservation (the legitimate release's)"
    )
    return figures


def _form_attacks(day: IdentityDay, work: Path) -> int:
    """The release deployment's run form under make serve, untouched (the control) and with operator: alice; the
    number of attacks made. Every outcome is read from the store."""
    from tests.test_prefect_ui import submit_form
    from tests.test_service_principal_ui import CHROMIUM, ServedAsServicePrincipal

    if not CHROMIUM:
        day.check("the run form's attacks: Debian's chromium is installed", False, "not run: no chromium")
        return 0
    work.mkdir(parents=True)
    served = ServedAsServicePrincipal(work)
    try:
        served.start()
        before = served.spent()
        untouched = served.wait_final(submit_form(served.release_form(), [], served.login))["id"]
        control = served.record(untouched)
        signers = served.reservations(control["release_id"])
        day.check("the untouched run form under make serve: published as the service principal svc-prefect, ε reserved "
                  "once, signed by its key", control["outcome"] == "published" and control["operator"] == "svc-prefect"
                  and signers == [("svc-prefect", "svc-prefect", served.service_key_id(), 10**9)], f"{control} {signers}")
        reserved = served.spent()
        spoofed = served.wait_final(submit_form(served.release_form(), [("Operator", 0, "alice")], served.login))["id"]
        record = served.record(spoofed)
        reason = record["failure_reason"] or ""
        day.check("the run form with operator: alice: refused before ε, recorded as refused (operator is not the signer)",
                  record["outcome"] == "refused" and record["reservation_id"] is None and served.spent() == reserved
                  and "'alice' is not the release's signer 'svc-prefect'" in reason, f"{record} {served.spent()}")
        verify = served.verify()
        day.check("after the form's runs, `kepsilon audit verify` re-checks every signature: intact",
                  verify.returncode == 0 and "signature(s) verified" in verify.stdout, _flat(verify.stdout + verify.stderr)[-300:])
        results = day.results
        results.counts["identity: the run form (issue 26)"] = (
            f"untouched form: {control['outcome']}, operator {control['operator']}, {reserved[0] - before[0]} reservation "
            f"(signed by {', '.join(sorted({row[1] for row in signers}))}); operator alice in the form: {record['outcome']}, "
            f"{served.spent()[0] - reserved[0]} reservation"
        )
    except Exception as problem:  # noqa: BLE001 - a scenario that could not run is a failed check, not a crash
        day.check("the run form's attacks ran", False, _flat(f"{type(problem).__name__}: {problem}")[-400:])
    finally:
        served.stop()
    return 1


def _set_up(day: IdentityDay) -> dict[str, Path]:
    """Keys made with `kepsilon audit keygen`, principals registered with the admin's key, a cap signed by olga."""
    folder = day.work / "holders"
    keys = {name: folder / name for name in ("root", "alice", "bob", "olga", "carol", "mallory")}
    for path in keys.values():
        _must(kepsilon(["audit", "keygen", str(path)], day.env, day.work))
    _must(kepsilon(["audit", "init", "--admin", "root", "--key", str(keys["root"])], day.env, day.work))
    for name, role in (("alice", "approver"), ("bob", "steward"), ("bob", "approver"), ("olga", "officer"), ("carol", "approver")):
        _must(kepsilon(["audit", "principal", "add", name, "--role", role, "--public-key", f"{keys[name]}.pub",
                        "--reason", "team", "--key", str(keys["root"])], day.env, day.work))
    _must(kepsilon(["audit", "principal", "revoke", "carol", "--public-key", f"{keys['carol']}.pub", "--reason", "key lost",
                    "--key", str(keys["root"])], day.env, day.work))
    _must(kepsilon(["audit", "set-cap", "reliability-people", "3", "--reason", "cap", "--key", str(keys["olga"])], day.env, day.work))
    return keys


def _must(run) -> None:
    if run.returncode != 0:
        raise RuntimeError(f"identity scenario set-up failed: {_flat(run.stderr)[-400:]}")


def _spec_hash(spec_path: Path) -> str:
    from kepsilon.flows.spec import load_spec

    return load_spec(spec_path).spec_hash()


def _stored_approval(db: Path) -> tuple[dict, str, str]:
    """Alice's stored approval: its payload, her public key and the signature (anyone who reads the file has them)."""
    import json

    conn = sqlite3.connect(db)
    try:
        payload, signature, kid = conn.execute(
            "SELECT payload, signature, key_id FROM signatures WHERE act = 'approve' AND signer = 'alice' ORDER BY id DESC LIMIT 1"
        ).fetchone()
        (public,) = conn.execute("SELECT public_key FROM principals WHERE key_id = ? LIMIT 1", (kid,)).fetchone()
    finally:
        conn.close()
    return json.loads(payload), public, signature


def _replay(db: Path, release: str, spec_hash: str) -> str:
    """Submit alice's stored signature as an approval of ``release`` / ``spec_hash``; the refusal's text."""
    from kepsilon.audit.approvals import approve
    from kepsilon.audit.signing import SignedAct
    from kepsilon.audit.store import open_store

    payload, public, signature = _stored_approval(db)
    store = open_store(db)
    try:
        approve(store, release_id=release, spec_hash=spec_hash, approver=None, reason=payload["reason"],
                signed=SignedAct(payload, public, signature))
    except Exception as refusal:  # noqa: BLE001 - the refusal's text is the outcome
        return str(refusal)
    finally:
        store.close()
    return "accepted"


def _write_replay(db: Path, release: str, spec_hash: str) -> None:
    """Copy alice's approval signature into the file as an approval of ``release`` / ``spec_hash``."""
    payload, _, signature = _stored_approval(db)
    _write_approval(db, release, spec_hash, payload, signature)


def _write_forgery(db: Path, release: str, spec_hash: str) -> None:
    """An approval by alice with a made-up signature over a well-formed payload."""
    from kepsilon.audit.store import now

    payload, _, _ = _stored_approval(db)
    payload = {**payload, "release_id": release, "spec_hash": spec_hash, "at": now()}
    _write_approval(db, release, spec_hash, payload, "A" * 86 + "==")


def _write_approval(db: Path, release: str, spec_hash: str, payload: dict, signature: str) -> None:
    """Through the store's own writer (rows chained, head log appended): what someone with write access can do."""
    from kepsilon.audit.signing import key_id
    from kepsilon.audit.store import append, canonical_json, now, open_store, write_transaction

    store = open_store(db)
    try:
        (public,) = store.conn.execute("SELECT public_key FROM principals WHERE name = 'alice' LIMIT 1").fetchone()
        with write_transaction(store) as conn:
            row = append(conn, "approvals", {"release_id": release, "spec_hash": spec_hash, "approver": "alice",
                                             "reason": payload["reason"], "created_at": now()})
            append(conn, "signatures", {"act": "approve", "table_name": "approvals", "row_id": row, "signer": "alice",
                                        "key_id": key_id(public), "payload": canonical_json(payload), "signature": signature,
                                        "created_at": now()})
    finally:
        store.close()


def _copy(day: IdentityDay, base: Path, name: str) -> IdentityDay:
    """The store (WAL merged), its head log and seed key, in a folder of its own: a tampered copy cannot spoil the rest."""
    copy = IdentityDay(day.results, day.env, base, f"identity {name}", day.source)
    copy.env = store_env(day.env, copy.work)
    conn = sqlite3.connect(day.db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    shutil.copy2(day.db, copy.db)
    shutil.copy2(day.work / "seed.key", copy.work / "seed.key") if (day.work / "seed.key").exists() else None
    copy_head_log(day.db, copy.db)
    return copy


def _verify_names(day: IdentityDay, problem: str, what: str) -> None:
    run = kepsilon(["audit", "verify", "--format", "json"], day.env, day.work)
    day.check(f"{what}: `kepsilon audit verify` exits 2 naming '{problem}'", run.returncode == 2 and problem in run.stdout,
              _flat(run.stdout + run.stderr)[-300:])


__all__ = ["CATEGORY", "identity_scenario"]
