"""When the Prefect server dies under a release: keep the terminal quiet, and tell the outcome from the audit store.

The release flow runs in the CLI's own process; its tasks need nothing from the Prefect server, so a
release whose server is killed goes on and publishes (or fails, recorded) on its own. What does need the
server is bookkeeping: the flow run's state, its logs and its events. Left alone, Prefect retries each of
those for minutes, prints an event dump per queued event, and finally raises ``ConnectError`` — which the
CLI used to report as ``release failed`` for a release that was in fact published.

Here: :class:`ConnectionNoise` drops Prefect's own connection-failure records from the console while the
server does not answer; :func:`discard_undeliverable` empties Prefect's log and event queues once the
server is known to be gone (they could only be retried, 7 s per event, at exit); :func:`store_outcome`
reads what happened to the release from the audit store (read-only), which is what the user is told.
"""

from __future__ import annotations

import base64
import json
import logging
import sqlite3
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

# Loggers that only speak, at WARNING and above, when the Prefect API cannot be reached: the events
# client ("Unable to connect to ws://…"), the service loop ("Service 'EventsWorker' failed to process
# item Event(…)"), and the queue services' exit-time drain ("Still processing items").
_CONNECTION_LOGGERS = ("prefect.events.clients", "prefect._internal.concurrency", "EventsWorker", "APILogWorker")


def api_answers(api_url: str, seconds: float = 3) -> bool:
    """Whether a Prefect API answers its health check at ``api_url``, with the configured credentials."""
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    headers = {}
    if settings.api.key:
        headers["Authorization"] = f"Bearer {settings.api.key.get_secret_value()}"
    elif settings.api.auth_string:
        token = base64.b64encode(settings.api.auth_string.get_secret_value().encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    try:
        request = urllib.request.Request(f"{api_url.rstrip('/')}/health", headers=headers)
        with urllib.request.urlopen(request, timeout=seconds) as response:
            return response.status == 200 and response.read().strip() == b"true"
    except (OSError, ValueError):
        return False


def accepts_login(api_url: str, auth_string: str | None, seconds: float = 5) -> bool:
    """Whether the Prefect API at ``api_url`` answers an authenticated request sent with ``auth_string``.

    ``/health`` answers everyone; ``/admin/version`` needs the login when the server has one
    (``server.api.auth_string``), so a run is not started against a server that would refuse its reports.
    """
    from kepsilon.prefect_login import authorization_header

    try:
        request = urllib.request.Request(f"{api_url.rstrip('/')}/admin/version", headers=authorization_header(auth_string))
        with urllib.request.urlopen(request, timeout=seconds) as response:
            return response.status == 200
    except (OSError, ValueError):
        return False


class ConnectionNoise(logging.Filter):
    """Console filter: drops Prefect's connection-failure records while the API does not answer.

    The API is asked at most every ``recheck`` seconds; while it answers nothing is dropped (a warning
    that websockets are blocked is worth seeing when the server is up). ``lost`` tells whether a record
    was dropped because the server was gone.
    """

    def __init__(self, api_url: str | None, recheck: float = 5.0):
        super().__init__()
        self.api_url = api_url
        self.recheck = recheck
        self.lost = False
        self._checked_at = -recheck
        self._answering = True

    def api_down(self) -> bool:
        if self.api_url is None:  # no API configured (Prefect's settings allow it): nothing to lose contact with
            return False
        now = time.monotonic()
        if now - self._checked_at >= self.recheck:
            self._answering = api_answers(self.api_url, seconds=2)
            self._checked_at = now
        return not self._answering

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or not record.name.startswith(_CONNECTION_LOGGERS):
            return True
        if self.api_down():
            self.lost = True
            return False
        return True


def discard_undeliverable() -> int:
    """Empty the queues of Prefect's log and event services, whose server is gone; returns the items dropped.

    Each queued event would otherwise be retried for about 7 s when the interpreter exits. The item being
    sent still is, once; the loggers that would report its failure are switched off for the rest of the
    process, which is about to end (the console filters are gone by then). Uses the
    services' queue (a private attribute of Prefect 3's ``QueueService``, pinned in constraints.txt);
    if that changes, nothing is dropped and the exit is only slower.
    """
    import queue

    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for name in _CONNECTION_LOGGERS:
        logging.getLogger(name).disabled = True
    dropped = 0
    for service in (EventsWorker, APILogWorker):
        for instance in list(getattr(service, "_instances", {}).values()):
            pending = getattr(instance, "_queue", None)
            while pending is not None:
                try:
                    pending.get_nowait()
                except queue.Empty:
                    break
                pending.task_done()
                dropped += 1
    return dropped


@dataclass(frozen=True)
class Outcome:
    """What the audit store says happened to a release: ``published``, ``failed``, ``reserved`` or ``nothing``."""

    state: str
    line: str
    exit_code: int


def store_outcome(store: Path, release_id: str, since: str) -> Outcome:
    """The release's outcome as the audit store records it (read-only): the line a user is told.

    ``since``: the store timestamp when this run began; a failure recorded before it belongs to an
    earlier run. A published record is final whenever it was made (a release id is published once).
    """
    quoted = json.dumps(release_id)
    try:
        conn = sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=30)
    except sqlite3.Error:
        return Outcome("unknown", f"release {quoted}: the audit store {store} cannot be read; "
                       "`kepsilon audit reruns` will say what happened", 1)
    try:
        published = conn.execute(
            "SELECT manifest FROM releases WHERE release_id = ? AND outcome = 'published' ORDER BY id DESC LIMIT 1",
            (release_id,),
        ).fetchone()
        conn.row_factory = sqlite3.Row
        failed = conn.execute(  # * : failure_reason is a later column; a store from before it has outcome_detail
            "SELECT * FROM releases WHERE release_id = ? AND outcome = 'failed' AND recorded_at >= ? "
            "ORDER BY id DESC LIMIT 1",
            (release_id, since),
        ).fetchone()
        conn.row_factory = None
        reserved = conn.execute(
            "SELECT r.nano_epsilon, EXISTS (SELECT 1 FROM ledger s WHERE s.reservation_id = r.id AND s.kind = 'spend') "
            "FROM ledger r WHERE r.release_id = ? AND r.kind = 'reserve' "
            "AND NOT EXISTS (SELECT 1 FROM ledger v WHERE v.reservation_id = r.id AND v.kind = 'void') "
            "ORDER BY r.id DESC LIMIT 1",
            (release_id,),
        ).fetchone()
    except sqlite3.Error:
        return Outcome("unknown", f"release {quoted}: the audit store {store} cannot be read; "
                       "`kepsilon audit reruns` will say what happened", 1)
    finally:
        conn.close()
    if published:
        folder = json.loads(published[0]).get("output_dir") or "its output folder"
        there = "" if Path(folder).is_dir() else " (folder not in place yet: rerun the same release to complete it)"
        return Outcome("published", f"release {quoted} published at {folder}{there} (recorded in the audit store)", 0)
    if failed:
        reason = next((failed[c] for c in ("failure_reason", "outcome_detail") if c in failed.keys() and failed[c]),
                      "no detail")
        return Outcome("failed", f"release {quoted} failed, recorded in the audit store ({reason}); "
                       "`kepsilon audit failures` has the record", 2)
    if reserved:
        epsilon = reserved[0] / 10**9
        spent = "spent: its noise was drawn" if reserved[1] else "not yet spent"
        return Outcome("reserved", f"release {quoted} is not published and not recorded; its ε {epsilon:g} stays "
                       f"reserved ({spent}); rerun the same release to resume it", 2)
    return Outcome("nothing", f"release {quoted}: nothing reserved, recorded or published; no ε spent", 2)
