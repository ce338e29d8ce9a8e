"""Keep the tracebacks of failed tasks off the terminal in Dask worker processes too.

``kepsilon release`` drops from its console the records Prefect makes of a task or flow that stopped
on an exception (``kepsilon.cli.RefusalTracebacks``): the CLI itself prints the one line, or the
traceback of a real crash. The dask engine's local workers are processes of their own that write to
the same terminal, where each failed partition added its own traceback before that line (a bad
Parquet column, a full disk: one per partition). When the CLI asks for it (env
``KEPSILON_WORKER_TRACEBACKS=hidden``, set by ``kepsilon release`` and ``kepsilon check`` without
``--debug`` and inherited by the local cluster's workers), a worker's Prefect console handler drops them
the same way, whichever task failed (intake, shards, certificate, publication). The records
still reach the Prefect server (the run's logs); workers of a cluster of your own are left as they are.
"""

from __future__ import annotations

import logging

from distributed.diagnostics.plugin import WorkerPlugin

from kepsilon import settings

ENV_WORKER_TRACEBACKS = "KEPSILON_WORKER_TRACEBACKS"


class NoTracebacks(logging.Filter):
    """Console filter: passes every record but those carrying an exception (a failed task's traceback)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.exc_info or record.exc_info[1] is None


def filter_console_handlers() -> None:
    """Add ``NoTracebacks`` to this process's Prefect console handlers (idempotent)."""
    from prefect.logging.handlers import PrefectConsoleHandler

    for handler in logging.getLogger().handlers:
        if isinstance(handler, PrefectConsoleHandler) and not any(isinstance(f, NoTracebacks) for f in handler.filters):
            handler.addFilter(NoTracebacks())




class HideTracebacks(WorkerPlugin):
    """Worker plugin: filters the console of every worker of the cluster, those that join later included."""

    name = "kepsilon-hide-tracebacks"

    def setup(self, worker) -> None:
        # Prefect configures logging once, when ``prefect.main`` is first imported; later setups are
        # incremental and keep the handlers. Configure it now, so the filter lands on the handler that stays.
        import prefect.main  # noqa: F401

        filter_console_handlers()


def hide_worker_tracebacks(client) -> None:
    """Quieten the local cluster's workers' consoles when the CLI asked for it (env); else do nothing."""
    if client is None or settings.current().worker_tracebacks != "hidden":
        return
    client.register_plugin(HideTracebacks())
