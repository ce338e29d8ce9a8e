"""Reliability scenarios of issue 21.3, a store only its owner reads — a separate block of ``make reliability``.

1. Modes: a real CLI release under umask 022 leaves its store, head log, lock, keys and private figures 0600
   in 0700 folders (-wal and -shm, removed when the last connection closes, are checked open in the tests).
2. A copy of the store is no guessing oracle: an adversary who knows the source except one person's height
   hashes every candidate table (the true one among them) the way a plain SHA-256 fingerprint would be made,
   and looks for each hash — and for the idempotency key built from it — in the copied store (file, WAL,
   head log). Before the fingerprint was keyed, exactly one candidate matched.
3. A store folder others can write to: the release is refused with one line naming KEPSILON_AUDIT_DB, exit 2,
   nothing created, nothing spent.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

from kepsilon.flows.spec import parse_spec

from .harness import Results, kepsilon, set_cap, spec_dict, write_spec

CATEGORY = "private store"
# Candidate heights the adversary tries for the one person they do not know: 130.00 to 210.00 cm by 0.01, as
# the table writes them (the true one is among them).
CANDIDATE_HEIGHTS = sorted({f"{cents / 100:.2f}" for cents in range(13000, 21001)}
                           | {f"{cents / 100:g}" for cents in range(13000, 21001)})


def _private_env(env: dict, folder: Path) -> dict:
    return {**env, "KEPSILON_AUDIT_DB": str(folder / "audit.db"), "KEPSILON_SEED_KEY_FILE": str(folder / "seed.key"),
            "KEPSILON_REPORTS_DIR": str(folder.parent / "reports")}


def _release(env: dict, work: Path, source: Path, release_id: str):
    spec = spec_dict(work, release_id, source={**spec_dict(work, release_id)["source"], "path": str(source)},
                     suppression_budget=1.0, max_linking_risk=1.0)
    path = write_spec(work, spec)
    return kepsilon(["release", str(path)], env, work), spec


def private_store_scenario(results: Results, env: dict, work: Path, source: Path) -> None:
    work.mkdir(parents=True, exist_ok=True)
    private = work / "private"  # created by kepsilon itself
    run_env = _private_env(env, private)
    previous = os.umask(0o022)
    try:
        set_cap(run_env, work, 5.0)
        done, spec = _release(run_env, work, source, "private-store")
    finally:
        os.umask(previous)
    results.add(CATEGORY, "a release under umask 022 publishes", done.returncode == 0, f"exit {done.returncode}")
    _modes(results, private, work / "reports")
    _no_oracle(results, private, source, spec)
    _shared_folder(results, env, work, source)


def _modes(results: Results, private: Path, reports: Path) -> None:
    files = [p for p in [*private.rglob("*"), *reports.rglob("*")] if p.is_file()]
    folders = [private, reports, *[p for p in [*private.rglob("*"), *reports.rglob("*")] if p.is_dir()]]
    wide = [f"{p.name} {stat.S_IMODE(p.stat().st_mode):04o}" for p in files if stat.S_IMODE(p.stat().st_mode) != 0o600]
    wide += [f"{p.name}/ {stat.S_IMODE(p.stat().st_mode):04o}" for p in folders if stat.S_IMODE(p.stat().st_mode) != 0o700]
    names = sorted(p.name for p in files if p.parent == private)
    # -wal and -shm are gone once the last connection closes (SQLite checkpoints and removes them); their
    # mode while open is tested in tests/test_audit_private.py.
    expected = {"audit.db", "audit.db.lock", "seed.key", "fingerprint.key"}  # the head log lives outside (state folder)
    results.add(CATEGORY, "store, head log, lock, keys, private figures: 0600 in 0700 folders",
                not wide and expected <= set(names) and any(p.suffix == ".png" for p in files),
                f"{len(files)} files, {len(folders)} folders; not private: {wide or 'none'}; in the store's folder: {names}")


def _no_oracle(results: Results, private: Path, source: Path, spec_mapping: dict) -> None:
    store_bytes = b"".join(p.read_bytes() for p in private.glob("audit.db*") if p.is_file())
    lines = source.read_text(encoding="utf-8").splitlines(keepends=True)
    header = lines[0].rstrip("\n").split(";")
    column = header.index("HEIGHT")
    target = 1 + len(lines) // 2  # the one person whose height the adversary does not know
    spec = parse_spec(spec_mapping)
    hits = keys = 0
    for height in CANDIDATE_HEIGHTS:
        fields = lines[target].rstrip("\n").split(";")
        fields[column] = height
        candidate = "".join(lines[:target] + [";".join(fields) + "\n"] + lines[target + 1:]).encode("utf-8")
        digest = hashlib.sha256(candidate).hexdigest()
        hits += digest.encode() in store_bytes
        key = hashlib.sha256(json.dumps({"population_id": spec.population_id, "release_id": spec.release_id,
                                         "spec_hash": spec.spec_hash(), "source_sha256": digest},
                                        sort_keys=True).encode()).hexdigest()
        keys += key.encode() in store_bytes
    true_height = lines[target].rstrip("\n").split(";")[column]
    results.add(CATEGORY, "a copy of the store confirms no guessed height (plain SHA-256 of each candidate table)",
                hits == 0 and keys == 0 and true_height in CANDIDATE_HEIGHTS,
                f"{len(CANDIDATE_HEIGHTS)} candidates (the true one among them): {hits} source hashes and "
                f"{keys} idempotency keys found in the store")


def _shared_folder(results: Results, env: dict, work: Path, source: Path) -> None:
    shared = work / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    run_env = _private_env(env, shared)
    done, _ = _release(run_env, work, source, "shared-store")
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    refused = (done.returncode == 2 and "KEPSILON_AUDIT_DB" in done.stderr and "Traceback" not in done.stderr
               and "writable by group or others" in done.stderr)
    results.add(CATEGORY, "a store folder others can write to: refused, one line, exit 2, nothing created",
                refused and not any(shared.iterdir()),
                f"exit {done.returncode}; {lines[-1][:160] if lines else 'no output'}")
