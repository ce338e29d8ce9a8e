"""The officers' Datasette (``make audit-ui``), against a real server on a real store: canned questions answer;
arbitrary SQL, table pages, the sealed seeds and the source fingerprints are refused; writes answer 4xx, never 500
(issues 21.3 and 22.8)."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from kepsilon.audit import queries
from kepsilon.audit.store import open_store

from .test_audit_cli import S1, S2, build_store

ROOT = Path(__file__).resolve().parents[1]
DATASETTE = str(Path(sys.executable).with_name("datasette"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _request(url: str, method: str = "GET", data: bytes | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, method=method, data=data)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``datasette serve`` as ``make audit-ui`` starts it, over a store built by real API calls."""
    work = tmp_path_factory.mktemp("audit-ui")
    os.chmod(work, 0o700)
    previous = os.environ.get("KEPSILON_SEED_KEY_FILE")
    os.environ["KEPSILON_SEED_KEY_FILE"] = str(work / "keys" / "seed.key")
    try:
        (work / "build").mkdir(mode=0o700)
        build_store(work / "build" / "audit.db")
    finally:
        if previous is None:
            os.environ.pop("KEPSILON_SEED_KEY_FILE")
        else:
            os.environ["KEPSILON_SEED_KEY_FILE"] = previous
    store = work / "build" / "audit.db"
    port = _free_port()
    process = subprocess.Popen(
        [DATASETTE, "serve", str(store), "--metadata", str(ROOT / "audit" / "datasette.yaml"),
         "--plugins-dir", str(ROOT / "audit" / "datasette_plugins"), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"datasette exited: {process.stderr.read().decode()[-2000:]}")
        try:
            if _request(base + "/-/versions.json")[0] == 200:
                break
        except (urllib.error.URLError, ConnectionError):
            pass
        if time.monotonic() > deadline:
            process.kill()
            raise RuntimeError("datasette did not answer within 90 s")
        time.sleep(0.3)
    yield base, store
    process.terminate()
    stderr = process.communicate(timeout=30)[1].decode()
    assert "Traceback" not in stderr, stderr[-3000:]  # no request made the server fail


def _tables(store: Path) -> list[str]:
    db = open_store(store)
    names = db.table_names()
    db.close()
    return names


def test_arbitrary_sql_is_refused_on_every_table_the_sealed_seeds_first(server):
    base, store = server
    for table in ["sealed_seeds", *_tables(store)]:
        sql = urllib.parse.quote(f"select * from {table}")
        for path in (f"/audit.json?sql={sql}", f"/audit?sql={sql}", f"/audit.csv?sql={sql}"):
            status, body = _request(base + path)
            assert status == 403, (path, status)
            assert b"gAAAA" not in body  # no Fernet ciphertext, whatever the page says


def test_table_pages_are_refused_and_the_file_is_not_downloadable(server):
    base, store = server
    tables = _tables(store)
    assert {"sealed_seeds", "releases", "ledger", "advice_events"} <= set(tables)
    for table in tables:
        for path in (f"/audit/{table}", f"/audit/{table}.json", f"/audit/{table}.json?_where=1", f"/audit/{table}/1"):
            assert _request(base + path)[0] == 403, path
    assert _request(base + "/audit.db")[0] == 403
    status, page = _request(base + "/audit")
    assert status == 200 and b"sealed_seeds" not in page and b'id="sql-editor"' not in page


def test_every_canned_question_still_answers_and_none_shows_a_source_fingerprint(server):
    base, _ = server
    parameters = {"budget": "population=adult", "who": "release=R2", "provenance": "release=R2",
                  "impact": "version=numpy%3D2.4.5", "advice": "population=adult", "release_list": "population=adult"}
    answers = {}
    for name in queries.QUERIES:
        status, body = _request(f"{base}/audit/{name}.json?_shape=array&{parameters.get(name, '')}")
        assert status == 200, (name, status, body[:300])
        answers[name] = json.loads(body)
    assert answers["budget"][0]["remaining"] == pytest.approx(0.15)
    assert [row["release_id"] for row in answers["impact"]] == ["R2"]
    assert answers["provenance"][0]["source_rows"] == 100
    assert {row["release_id"] for row in answers["release_list"]} >= {"R1", "R2", "R3", "R4"}
    for name, answer in answers.items():
        for row in answer:
            assert not {"source_sha256", "ciphertext", "key_fingerprint"} & set(row), name
            # the builder's source fingerprints (its spec hashes happen to repeat the same digits)
            shown = " ".join(str(value) for column, value in row.items() if column != "spec_hash")
            assert S1 not in shown and S2 not in shown, name


@pytest.mark.parametrize("path", ["/audit/budget", "/audit/budget.json", "/audit/failures?x=1", "/audit/ledger",
                                  "/audit/sealed_seeds", "/audit/releases.json", "/audit/ledger/-/insert",
                                  "/audit/ledger/1/-/delete", "/audit", "/audit.json?sql=select+1", "/-/messages"])
def test_refused_writes_answer_4xx_never_500(server, path):
    base, _ = server
    for data in (b"a=b", b'{"rows": [{"id": 1}]}'):
        status, body = _request(base + path, method="POST", data=data)
        assert 400 <= status < 500, (path, status)
        assert status == 405 and b"read-only" in body
