"""A store only its owner reads (issue 21.3): modes of every private file, shared folders refused, a keyed
source fingerprint, and processes opening a fresh store together (issue 22.9)."""

import hashlib
import hmac
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from kepsilon.audit.fingerprint import file_fingerprint, fingerprint_key
from kepsilon.audit.headlog import head_log_path
from kepsilon.audit.ledger import reserve, set_cap
from kepsilon.audit.private import PrivateFolderError
from kepsilon.audit.seeds import seal_seed
from kepsilon.audit.store import open_store
from kepsilon.flows.manifest import idempotency_key
from kepsilon.flows.spec import SourceSpec, parse_spec
from kepsilon.tasks.figures import Figure, private_report_dir, write_figures
from kepsilon.tasks.ingest import read_source

from .conftest import SYNTHETIC, release_spec_dict

KEPSILON = str(Path(sys.executable).with_name("kepsilon"))


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def keys(tmp_path, monkeypatch):
    """Seed and fingerprint keys under ``tmp_path/keys`` (never the checkout's ./.kepsilon)."""
    for name in ("KEPSILON_SEED_KEY", "KEPSILON_FINGERPRINT_KEY", "KEPSILON_FINGERPRINT_KEY_FILE",
                 "KEPSILON_AUDIT_HEAD_LOG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KEPSILON_SEED_KEY_FILE", str(tmp_path / "keys" / "seed.key"))
    return tmp_path / "keys"


@pytest.fixture(params=[0o000, 0o022], ids=["umask-000", "umask-022"])
def umask(request):
    previous = os.umask(request.param)
    yield request.param
    os.umask(previous)


def test_the_store_its_wal_shm_and_head_log_are_0600_in_a_0700_folder_whatever_the_umask(tmp_path, keys, umask):
    store = tmp_path / "private" / "audit.db"
    db = open_store(store)
    set_cap(db, "pop", 1.0, "alice", "initial")
    seal_seed(db, idempotency_key="k", release_id="r", seed=os.urandom(32))
    files = {name: store.with_name(name) for name in ("audit.db", "audit.db-wal", "audit.db-shm")}
    files["heads"] = head_log_path(store)
    assert all(path.exists() for path in files.values()), files  # WAL mode, a commit logged: all four exist
    assert {name: oct(mode(path)) for name, path in files.items()} == {name: "0o600" for name in files}
    assert oct(mode(store.parent)) == "0o700"
    # The head log lives outside the store's folder (a backup of that folder does not hold it), 0700 too.
    assert store.parent not in files["heads"].parents and oct(mode(files["heads"].parent)) == "0o700"
    assert oct(mode(keys)) == "0o700" and oct(mode(keys / "seed.key")) == "0o600"
    db.close()


def test_an_older_store_readable_by_others_is_narrowed_to_its_owner_when_opened(tmp_path, keys):
    store = tmp_path / "audit.db"
    db = open_store(store)
    set_cap(db, "pop", 1.0, "alice", "initial")
    db.close()
    for path in (store, head_log_path(store)):
        os.chmod(path, 0o644)  # as an earlier version left them
    db = open_store(store)
    set_cap(db, "pop", 2.0, "alice", "raised")
    assert {str(path): oct(mode(path)) for path in (store, tmp_path / "audit.db-wal", head_log_path(store))} == {
        str(store): "0o600", str(tmp_path / "audit.db-wal"): "0o600", str(head_log_path(store)): "0o600"}
    db.close()


@pytest.mark.parametrize("folder_mode", [0o777, 0o775, 0o1777], ids=["world", "group", "sticky-world"])
def test_a_store_in_a_folder_others_can_write_is_refused_by_the_cli_in_one_line(tmp_path, keys, folder_mode):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, folder_mode)
    env = {**os.environ, "KEPSILON_AUDIT_DB": str(shared / "audit.db")}
    done = subprocess.run([KEPSILON, "audit", "set-cap", "pop", "1", "--by", "alice", "--reason", "r"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "KEPSILON_AUDIT_DB" in lines[0] and "writable by group or others" in lines[0], lines
    assert "Traceback" not in done.stderr and list(shared.iterdir()) == []  # nothing created, nothing spent


@pytest.mark.flow
@pytest.mark.usefixtures("prefect_harness")
def test_a_release_into_a_shared_store_folder_is_refused_before_anything_is_read_or_reserved(tmp_path, keys,
                                                                                           monkeypatch):
    from kepsilon.flows.release import governed_release

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv("KEPSILON_AUDIT_DB", str(shared / "audit.db"))
    monkeypatch.setenv("KEPSILON_REPORTS_DIR", str(tmp_path / "reports"))
    spec = release_spec_dict("paper-synthetic", release_id="r", population_id="p", output_dir=str(tmp_path / "out"))
    with pytest.raises(PrivateFolderError, match="KEPSILON_AUDIT_DB") as refused:
        governed_release(parse_spec(spec))
    assert "\n" not in str(refused.value) and "writable by group or others (mode 0777)" in str(refused.value)
    assert list(shared.iterdir()) == [] and not (tmp_path / "out").exists()  # no store, no ledger, nothing published


def test_the_old_default_store_is_refused_by_name_not_silently_replaced_by_an_empty_one(tmp_path, keys):
    (tmp_path / "audit.db").write_bytes(b"")  # where earlier versions kept the store
    env = {k: v for k, v in os.environ.items() if k != "KEPSILON_AUDIT_DB"}
    done = subprocess.run([KEPSILON, "audit", "budget", "pop"], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "KEPSILON_AUDIT_DB" in line and "./audit.db" in line and ".kepsilon" in line
    assert not (tmp_path / ".kepsilon" / "audit.db").exists()


def test_the_default_store_lives_in_the_private_folder(tmp_path, keys):
    env = {k: v for k, v in os.environ.items() if k != "KEPSILON_AUDIT_DB"}
    done = subprocess.run([KEPSILON, "audit", "set-cap", "pop", "1", "--by", "alice", "--reason", "r"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    private = tmp_path / ".kepsilon"
    assert oct(mode(private)) == "0o700" and oct(mode(private / "audit.db")) == "0o600"
    assert not (tmp_path / "audit.db").exists()


def test_a_head_log_in_a_folder_others_can_write_is_refused_before_anything_is_written(tmp_path, keys, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv("KEPSILON_AUDIT_HEAD_LOG", str(shared / "heads"))
    with pytest.raises(PrivateFolderError, match="KEPSILON_AUDIT_HEAD_LOG"):
        open_store(tmp_path / "private" / "audit.db")


def test_keys_and_private_reports_are_0600_in_0700_folders_whatever_the_umask(tmp_path, keys, monkeypatch, umask):
    fingerprint_key()
    assert oct(mode(keys)) == "0o700" and oct(mode(keys / "fingerprint.key")) == "0o600"
    monkeypatch.setenv("KEPSILON_REPORTS_DIR", str(tmp_path / "reports" / "private"))
    folder = private_report_dir("r1", tmp_path / "out")
    assert oct(mode(tmp_path / "reports" / "private")) == "0o700"
    (written,) = write_figures({"groups": Figure(lambda size: b"\x89PNG fake")}, folder)
    assert oct(mode(folder)) == "0o700" and oct(mode(written)) == "0o600"


def test_a_seed_key_in_a_folder_others_can_write_is_refused(tmp_path, keys, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv("KEPSILON_SEED_KEY_FILE", str(shared / "seed.key"))
    db = open_store(tmp_path / "private" / "audit.db")
    with pytest.raises(PrivateFolderError, match="KEPSILON_SEED_KEY_FILE"):
        seal_seed(db, idempotency_key="k", release_id="r", seed=os.urandom(32))
    assert not (shared / "seed.key").exists()
    db.close()


# --- The keyed source fingerprint ------------------------------------------------------------------------


def test_the_source_fingerprint_is_keyed_and_stable_so_reruns_find_their_reservation(tmp_path, keys, monkeypatch):
    spec = parse_spec(release_spec_dict("paper-synthetic", output_dir=str(tmp_path / "out")))
    raw = Path(spec.source.path).read_bytes()
    first = read_source(spec.source)
    again = read_source(spec.source)
    key = bytes.fromhex((keys / "fingerprint.key").read_text())
    assert first.sha256 == again.sha256 == hmac.new(key, raw, hashlib.sha256).hexdigest()
    assert first.sha256 != hashlib.sha256(raw).hexdigest()
    assert file_fingerprint(spec.source.path) == first.sha256  # what `kepsilon audit impact --source` computes

    db = open_store(tmp_path / "audit.db")
    set_cap(db, spec.population_id, 5.0, "alice", "initial")
    reservation = reserve(db, population_id=spec.population_id, epsilon=1.0,
                          idempotency_key=idempotency_key(spec, first.sha256), release_id=spec.release_id, operator="op")
    rerun = reserve(db, population_id=spec.population_id, epsilon=1.0,
                    idempotency_key=idempotency_key(spec, again.sha256), release_id=spec.release_id, operator="op")
    assert rerun.id == reservation.id  # the rerun found its reservation: nothing more spent
    db.close()

    monkeypatch.setenv("KEPSILON_FINGERPRINT_KEY", os.urandom(32).hex())  # another installation
    assert read_source(spec.source).sha256 != first.sha256


def test_a_malformed_fingerprint_key_is_refused_by_name(tmp_path, keys, monkeypatch):
    monkeypatch.setenv("KEPSILON_FINGERPRINT_KEY", "not hex")
    with pytest.raises(Exception, match="KEPSILON_FINGERPRINT_KEY"):
        read_source(SourceSpec(path=str(SYNTHETIC / "people.csv"), delimiter=";"))


@pytest.mark.flow
@pytest.mark.usefixtures("prefect_harness")
def test_a_copy_of_the_store_after_a_release_holds_no_plain_source_hash(tmp_path, keys, monkeypatch):
    """The store (file, WAL, head log) and the CLI's answers never hold the SHA-256 a guesser would compute."""
    from kepsilon.flows.release import governed_release

    from .conftest import capped_store

    capped_store(tmp_path, monkeypatch, "test-population").close()
    spec = release_spec_dict("paper-synthetic", release_id="test-release", population_id="test-population",
                             output_dir=str(tmp_path / "out"))
    record = governed_release(parse_spec(spec))
    plain = hashlib.sha256(Path(spec["source"]["path"]).read_bytes()).hexdigest()
    assert record["source"]["sha256"] != plain
    stored = b"".join(path.read_bytes() for path in tmp_path.glob("audit.db*") if path.is_file())  # not audit.db.claims/
    assert plain.encode() not in stored and record["source"]["sha256"].encode() in stored
    published = b"".join(path.read_bytes() for path in (tmp_path / "out").rglob("*") if path.is_file())
    assert plain.encode() not in published and record["source"]["sha256"].encode() not in published
    answer = subprocess.run([KEPSILON, "audit", "provenance", "test-release", "--format", "json"],
                            capture_output=True, text=True, env={**os.environ}, timeout=120)
    assert answer.returncode == 0 and plain not in answer.stdout
    assert json.loads(answer.stdout)[0]["source_sha256"] == record["source"]["sha256"]
