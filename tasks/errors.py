"""Errors a release can stop with.

Every error names the column or parameter at fault and never quotes a data value: messages reach
logs and the Prefect UI, where raw records must not go. The input and parameter errors are the
engine's (``kepsilon.engine.errors``); the release adds its own below.
"""

from kepsilon.engine.errors import HierarchyError, InputError, KepsilonError, SpecError

__all__ = ["HierarchyError", "InputError", "KepsilonError", "SpecError", "ValidationFailed", "ReleaseFailed",
           "ClusterLost", "describe_failure"]


class ValidationFailed(KepsilonError):
    """A release check failed; the release was not published."""

    def __init__(self, failed_checks: list[str], details: str | None = None):
        self.failed_checks = failed_checks
        self.details = details  # the failed checks with their figures and limits, and the next step (private)
        super().__init__("release checks failed: " + (details or ", ".join(failed_checks)))

    def __reduce__(self):
        return (type(self), (self.failed_checks, self.details))


class ClusterLost(KepsilonError):
    """The Dask cluster had no worker for too long while a stage waited on its tasks."""

    def __init__(self, stage: str, seconds: float):
        self.stage, self.seconds = stage, seconds
        super().__init__(f"the cluster lost every worker during stage {stage!r} and none joined within {seconds:.0f} s: "
                         "its tasks were cancelled (start the cluster's workers, then run the release again)")

    def __reduce__(self):
        return (type(self), (self.stage, self.seconds))


class ReleaseFailed(KepsilonError):
    """A release stopped after its ε was reserved; the message says what was recorded and how to resume."""


# Exception types whose messages are written by this project, the OS or SQLite's own codes, never
# from the data; any other message (pandas, numpy, Great Expectations…) may quote a value and is withheld.
def describe_failure(error: BaseException) -> str:
    """``Class: message`` for a failure record and the CLI's one line, never quoting a data value.

    ``KepsilonError`` messages name columns and parameters only; an ``OSError`` is told by its errno,
    strerror and file name; a SQLite error by what it says about the store and its code (its own text
    can quote stored bytes). Other messages are withheld (``--debug`` shows the traceback).
    """
    import sqlite3

    from kepsilon.audit.errors import error_label, sqlite_cause

    name = type(error).__name__
    if isinstance(error, KepsilonError):
        return f"{name}: {error}"
    if isinstance(error, sqlite3.Error):
        cause = sqlite_cause(error)
        return f"{error_label(error)}: the audit store {cause}" if cause else error_label(error)
    if isinstance(error, OSError):
        parts = [f"[Errno {error.errno}] {error.strerror}" if error.errno else "OS error"]
        if error.filename:
            parts.append(repr(str(error.filename)))
        return f"{name}: " + ": ".join(parts)
    if isinstance(error, (KeyboardInterrupt, SystemExit)):
        return f"{name}: interrupted"
    module = type(error).__module__
    qualified = name if module in ("builtins", None) else f"{module}.{name}"
    return f"{qualified}: message withheld (it may quote data; --debug shows the traceback)"
