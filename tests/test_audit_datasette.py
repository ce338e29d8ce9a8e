"""The officers' Datasette (``make audit-ui``), against a real server on a real store: canned questions answer;
arbitrary SQL, table pages, the sealed seeds and the source fingerprints are refused; writes answer 4xx, never 500
(issues 21.3 and 22.8)."""

import http.cookiejar
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from kepsilon.audit import officers, queries
from kepsilon.audit.store import open_store

from .test_audit_cli import S1, S2, build_store

ROOT = Path(__file__).resolve().parents[1]
DATASETTE = str(Path(sys.executable).with_name("datasette"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # a refusal's 302 to the login form is the answer under test


def _request(url: str, method: str = "GET", data: bytes | None = None, session: "Session | None" = None
             ) -> tuple[int, bytes]:
    """One request; with ``session`` its officer's cookies go with it. Redirects are not followed."""
    request = urllib.request.Request(url, method=method, data=data)
    opener = session.opener if session else urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


OFFICER, PASSWORD = "olivia", "correct horse battery"


class Session:
    """An officer's browser-like session: a cookie jar, logged in through the form ``/-/login``."""

    def __init__(self, base: str):
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar), _NoRedirect)

    def log_in(self, name: str, password: str, next_path: str = "/") -> tuple[int, str]:
        """Fill and post the login form; (status, Location) of the answer."""
        status, page = _request(f"{self.base}/-/login?next={urllib.parse.quote(next_path)}", session=self)
        assert status == 200, status
        found = re.search(rb'name="csrftoken" value="([^"]+)"', page)
        assert found is not None, "the login page carries no csrftoken field"
        token = found.group(1).decode()
        form = urllib.parse.urlencode({"csrftoken": token, "username": name, "password": password,
                                       "next": next_path}).encode()
        request = urllib.request.Request(f"{self.base}/-/login", data=form, method="POST")
        try:
            with self.opener.open(request, timeout=30) as response:
                return response.status, response.headers.get("Location", "")
        except urllib.error.HTTPError as error:
            return error.code, error.headers.get("Location", "")

    def cookie(self, name: str) -> str | None:
        return next((c.value for c in self.jar if c.name == name), None)


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
    accounts = work / "private" / "audit-ui-accounts.json"
    officers.set_password(OFFICER, PASSWORD, accounts)
    officers.set_password("leaver", "a password to be revoked", accounts)
    port = _free_port()
    process = subprocess.Popen(
        [DATASETTE, "serve", str(store), "--metadata", str(ROOT / "audit" / "datasette.yaml"),
         "--plugins-dir", str(ROOT / "audit" / "datasette_plugins"), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={**os.environ, officers.ENV_ACCOUNTS: str(accounts)},
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"datasette exited: {process.stderr.read().decode()[-2000:]}")
        try:
            if _request(base + "/-/login")[0] == 200:
                break
        except (urllib.error.URLError, ConnectionError):
            pass
        if time.monotonic() > deadline:
            process.kill()
            raise RuntimeError("datasette did not answer within 90 s")
        time.sleep(0.3)
    session = Session(base)
    assert session.log_in(OFFICER, PASSWORD)[0] == 302
    yield base, store, session, accounts
    process.terminate()
    stderr = process.communicate(timeout=30)[1].decode()
    assert "Traceback" not in stderr, stderr[-3000:]  # no request made the server fail


def _tables(store: Path) -> list[str]:
    db = open_store(store)
    names = db.table_names()
    db.close()
    return names


def test_arbitrary_sql_is_refused_on_every_table_the_sealed_seeds_first(server):
    base, store, session, _ = server
    for table in ["sealed_seeds", *_tables(store)]:
        sql = urllib.parse.quote(f"select * from {table}")
        for path in (f"/audit.json?sql={sql}", f"/audit?sql={sql}", f"/audit.csv?sql={sql}"):
            status, body = _request(base + path, session=session)
            assert status == 403, (path, status)
            assert b"gAAAA" not in body  # no Fernet ciphertext, whatever the page says


def test_table_pages_are_refused_and_the_file_is_not_downloadable(server):
    base, store, session, _ = server
    tables = _tables(store)
    assert {"sealed_seeds", "releases", "ledger", "advice_events"} <= set(tables)
    for table in tables:
        for path in (f"/audit/{table}", f"/audit/{table}.json", f"/audit/{table}.json?_where=1", f"/audit/{table}/1"):
            assert _request(base + path, session=session)[0] == 403, path
    assert _request(base + "/audit.db", session=session)[0] == 403
    status, page = _request(base + "/audit", session=session)
    assert status == 200 and b"sealed_seeds" not in page and b'id="sql-editor"' not in page


def test_every_canned_question_still_answers_and_none_shows_a_source_fingerprint(server):
    base, _, session, _ = server
    parameters = {"budget": "population=adult", "who": "release=R2", "provenance": "release=R2",
                  "impact": "version=numpy%3D2.4.5", "advice": "population=adult", "release_list": "population=adult"}
    answers = {}
    for name in queries.QUERIES:
        status, body = _request(f"{base}/audit/{name}.json?_shape=array&{parameters.get(name, '')}", session=session)
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
    base, _, session, _ = server
    for data in (b"a=b", b'{"rows": [{"id": 1}]}'):
        status, body = _request(base + path, method="POST", data=data, session=session)
        assert 400 <= status < 500, (path, status)
        assert status == 405 and b"read-only" in body
        # without a login: refused too, by the login or the read-only rule, whichever answers first
        assert _request(base + path, method="POST", data=data)[0] in (401, 405), path


# ---------------------------------------------------------------------------------------------------------
# The login (issue 26.4): nothing is answered to a visitor who has not logged in as an officer.

def _every_path(store: Path) -> list[str]:
    """Every kind of page the server has: index, database, each canned query (HTML, JSON, CSV), each table,
    the file download, arbitrary SQL, and Datasette's introspection pages."""
    paths = ["/", "/audit", "/audit.json", "/audit.db", "/audit.json?sql=select+1", "/audit?sql=select+1"]
    for name in queries.QUERIES:
        paths += [f"/audit/{name}?population=adult&release=R2", f"/audit/{name}.json?population=adult&release=R2",
                  f"/audit/{name}.csv?population=adult&release=R2", f"/audit/{name}?_format=json&population=adult"]
    for table in _tables(store):
        paths += [f"/audit/{table}", f"/audit/{table}.json", f"/audit/{table}/1"]
    paths += [f"/-/{page}" for page in ("versions.json", "metadata.json", "databases.json", "plugins.json",
                                        "settings.json", "actor.json", "threads.json", "permissions", "messages",
                                        "allow-debug", "config.json", "patterns")]
    return paths


def test_every_page_table_json_and_canned_query_is_refused_without_a_login(server):
    base, store, session, _ = server
    for path in _every_path(store):
        status, body = _request(base + path)
        assert status in (302, 401), (path, status)
        # nothing of the store: no population, release or seed in the answer
        assert b"adult" not in body and b"R2" not in body and b"gAAAA" not in body, path
    # the same paths answer an officer (a canned query: 200; tables and SQL: still 403; never 401 or 500)
    for path in _every_path(store):
        status, _ = _request(base + path, session=session)
        assert status in (200, 301, 302, 403, 404), (path, status)
    assert _request(base + "/audit/budget.json?population=adult", session=session)[0] == 200
    # a browser asking for a page is sent to the login form, which leads back to it
    status, _ = _request(base + "/audit/budget?population=adult")
    assert status == 302


def test_a_wrong_password_an_unknown_officer_and_a_forged_cookie_get_nothing(server):
    base, _, _, _ = server
    for name, password in ((OFFICER, "not the password"), ("mallory", PASSWORD), ("", "")):
        visitor = Session(base)
        status, _ = visitor.log_in(name, password)
        assert status == 401 and visitor.cookie("ds_actor") is None, name
        assert _request(base + "/audit/budget.json?population=adult", session=visitor)[0] == 401
    # a cookie made up by the visitor (Datasette's format, but not signed with this server's secret)
    forger = Session(base)
    forged = http.cookiejar.Cookie(0, "ds_actor", 'eyJhIjp7ImlkIjoib2xpdmlhIn19.forged', None, False, "127.0.0.1",
                                   False, False, "/", True, False, None, False, None, None, {})
    forger.jar.set_cookie(forged)
    assert _request(base + "/audit/budget.json?population=adult", session=forger)[0] == 401


def test_a_removed_officer_is_refused_at_the_next_request_and_login_never_redirects_elsewhere(server):
    base, _, _, accounts = server
    leaver = Session(base)
    assert leaver.log_in("leaver", "a password to be revoked", next_path="//evil.example/x") == (302, "/")
    assert _request(base + "/audit/budget.json?population=adult", session=leaver)[0] == 200
    officers.remove("leaver", accounts)
    assert _request(base + "/audit/budget.json?population=adult", session=leaver)[0] == 401


def test_the_accounts_file_is_owner_only_and_holds_no_password(server):
    _, _, _, accounts = server
    assert accounts.stat().st_mode & 0o777 == 0o600
    assert accounts.parent.stat().st_mode & 0o777 == 0o700
    text = accounts.read_text()
    assert PASSWORD not in text and "scrypt$" in text
