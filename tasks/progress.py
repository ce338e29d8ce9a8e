"""Progress of a long release, stage by stage and partition by partition: on the flow run and at the terminal.

A flow says what it is doing with :func:`stage`::

    with stage("perturb", total=len(partitions)) as progress:
        for future in as_completed(futures):
            ...
            progress.advance()

Each stage and each step goes to three places: the flow run's log (one line when a stage starts and one
when it ends, with its duration), a Prefect progress artifact of the flow run (the share of the release's
steps done, updated per step: ``create_progress_artifact`` / ``update_progress_artifact``), and any
listener registered in this process — the ``kepsilon release`` command registers one that draws a rich
progress bar per stage. Progress never holds a data value: stage names and counts only. A failure to
update the artifact (the API unreachable) is logged and does not stop the release.
"""

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Protocol
from uuid import UUID


class ProgressListener(Protocol):
    """What a display of progress is told (the command line's rich bars implement it)."""

    def stage_started(self, name: str, total: int) -> None: ...

    def stage_advanced(self, name: str, done: int, total: int) -> None: ...

    def stage_finished(self, name: str, done: int, total: int, seconds: float) -> None: ...


_listeners: list[ProgressListener] = []


def add_listener(listener: ProgressListener) -> None:
    """Show the progress of the releases run in this process on ``listener``."""
    _listeners.append(listener)


def remove_listener(listener: ProgressListener) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


def _logger() -> logging.Logger | logging.LoggerAdapter:
    try:
        from prefect import get_run_logger

        return get_run_logger()
    except Exception:  # outside a flow run (a notebook, a test): the module's own logger
        return logging.getLogger(__name__)


class ReleaseProgress:
    """The flow run's progress artifact: the share of the release's steps done (0–100)."""

    def __init__(self, steps: int, description: str):
        self.steps = max(int(steps), 1)
        self.done = 0
        self.description = description
        self._artifact: UUID | None = None
        self._failed = False

    def step(self, count: int = 1, note: str | None = None) -> None:
        self.done = min(self.steps, self.done + count)
        self._publish(note)

    def _publish(self, note: str | None) -> None:
        if self._failed:
            return
        try:
            from prefect.artifacts import create_progress_artifact, update_progress_artifact

            percent = 100.0 * self.done / self.steps
            description = self.description + (f": {note}" if note else "")
            if self._artifact is None:
                created = create_progress_artifact(progress=percent, description=description)
                if isinstance(created, UUID):  # always, called from sync code; the coroutine is for async callers
                    self._artifact = created
            else:
                update_progress_artifact(self._artifact, progress=percent, description=description)
        except Exception as failure:  # noqa: BLE001 - progress must not fail a release
            self._failed = True
            _logger().warning("progress artifact not updated (%s); the release goes on", type(failure).__name__)


_current: list[ReleaseProgress] = []


@contextlib.contextmanager
def release_progress(steps: int, description: str) -> Iterator[ReleaseProgress]:
    """The progress artifact of a release of ``steps`` steps (stages' partitions), for :func:`stage` to advance."""
    progress = ReleaseProgress(steps, description)
    _current.append(progress)
    try:
        progress.step(0)
        yield progress
    finally:
        _current.remove(progress)


class StageProgress:
    """One stage's progress: ``advance`` after each partition done."""

    def __init__(self, name: str, total: int, counted: bool = True):
        self.name, self.total, self.done = name, int(total), 0
        self.counted = counted  # whether its steps are steps of the release's progress artifact
        self.started = time.monotonic()

    def advance(self, count: int = 1) -> None:
        self.done += count
        for listener in list(_listeners):
            listener.stage_advanced(self.name, self.done, self.total)
        for release in _current if self.counted else ():
            release.step(count, f"{self.name} {self.done}/{self.total}")


@contextlib.contextmanager
def stage(name: str, total: int, counted: bool = True) -> Iterator[StageProgress]:
    """Report a stage of ``total`` steps (partitions) to the log, the artifact and the listeners
    (``counted``: False for a stage whose steps the release's step count does not include)."""
    progress = StageProgress(name, total, counted)
    logger = _logger()
    logger.info("%s: %d partition(s)", name, total)
    for listener in list(_listeners):
        listener.stage_started(name, progress.total)
    try:
        yield progress
    finally:
        seconds = time.monotonic() - progress.started
        for listener in list(_listeners):
            listener.stage_finished(name, progress.done, progress.total, seconds)
        logger.info("%s: %d/%d partition(s) in %.1f s", name, progress.done, progress.total, seconds)
