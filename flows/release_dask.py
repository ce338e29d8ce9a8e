"""The ``governed-release-dask`` flow: a release partition by partition on a Dask cluster.

The same governance as ``governed-release`` (``flows/governance.govern``, written once for both engines), in
the same order — plan and fingerprint the source → (verify the store; already published? unchanged?) → check
the output folder → the scratch folder → roles → intake and classify (refusals) → k-anonymise the histogram →
distribute → the checks before ε (``tasks/preflight.py``: noise grid, seed key, predicted error and linking
risk, each class partition predicted on the cluster) → approve → reserve ε → draw the seed → perturb and
suppress → diversity suppression → publish the parts → gate → stage the manifest → record → rename into
place — on a table that never has to fit in one process. The stages per partition are in
``tasks/partitioned.py``, the group checks and figures by bucket of group keys in ``tasks/group_reduction.py``;
this module (``DaskEngine``) only orders them and adds up what they return: counts, frequencies of group and
class sizes, check outcomes, disclosure figures and the error figure's points or hexagon counts — nothing that
grows with the groups or classes (docs/performance.md, "the flow's process").

Where things run: every stage is one Prefect task run in the flow's process (``stage_task``), which sends the
stage's partitions, in one batch per worker thread (``_on_cluster``; the histogram's shard steps three,
``_on_shards``), as plain Dask tasks to the cluster of the flow's ``DaskTaskRunner`` (prefect-dask): a
``LocalCluster`` of ``execution.workers`` processes, or the cluster whose scheduler is ``execution.scheduler``. The tasks that touch the audit store (verify, already published, approval,
reservation, the seed, the record) and the output-folder check are called directly, so they run in
the flow's own process, beside the store. The seed never leaves that process: the perturbation tasks
get a ``RecordStreams`` (keys derived from the seed, which its ``repr`` withholds), and Prefect records
nothing of a stage's input (one plain object, ``Stage``), not even its type. The scratch folder's key travels the same way
(``tasks/scratch.py``).

The local cluster is closed to other accounts: TLS with mutual authentication on 127.0.0.1, under a
certificate and key made for the run and held in memory only (``Security.temporary()``: the scheduler,
the workers and the flow's client present it, and accept nothing else), and no dashboard (the HTTP
endpoints Dask still opens on 127.0.0.1 serve no route). An existing scheduler (``execution.scheduler``)
is reached with the TLS files of Dask's own configuration when its address is ``tls://`` (docs/dask.md).

``governed-release`` hands a spec with ``execution.engine: dask`` to this flow (a subflow), so the CLI,
the deployments and the UI's run form need nothing else.
"""

import logging
import shutil
import threading
import time
import uuid
from collections import deque
from contextlib import contextmanager, nullcontext
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from kepsilon.audit.witness import with_chain_witness
from kepsilon.engine.criteria import add_disclosure_figures
from kepsilon.engine.perturb import public_grid
from kepsilon.faults import fault_point
from kepsilon.flows.governance import SourceFacts, Spend, govern, run_day
from kepsilon.flows.manifest import groups_from_size_counts, public_manifest
from kepsilon.flows.spec import ReleaseSpec
from kepsilon.guarantee import Guarantee
from kepsilon.record import ReleaseRecord
from kepsilon.tasks.certificate_dask import (
    CERTIFICATE_SKETCHES,
    WRITTEN_SIZES,
    dask_certificate,
    refuse_risk_over_limits_on_partitions,
    shard_sketches,
)
from kepsilon.tasks.errors import ClusterLost, SpecError, ValidationFailed
from kepsilon.tasks.figure_inputs import ErrorCells, ErrorExtremes, FigureInputs, SizeCounts
from kepsilon.tasks.group_reduction import (
    CLASSES,
    FAILING,
    GROUPS,
    WRITTEN,
    GroupCheck,
    check_groups,
    class_figures,
    gate_groups,
    load_gate_checks,
    perturb_and_hand_over,
    publish_and_hand_over,
    release_gate,
)
from kepsilon.tasks.group_reduction import STAGES as GROUP_STAGES
from kepsilon.tasks.partitioned import (
    DATA_CSV,
    DATASET,
    NUMERIC_SHUFFLE,
    ClassOutcome,
    GroupCoder,
    PartitionFailed,
    TableIntake,
    WorkerTraceback,
    combine_intakes,
    combine_perturbation,
    distinct_count,
    distribute,
    intake,
    join_csv,
    outcome_metrics,
    predict_partition,
    remove_partials,
    run_batch,
    worth_retrying,
)
from kepsilon.tasks.perturb import release_streams
from kepsilon.tasks.preflight import Verdicts, pre_epsilon_checks
from kepsilon.tasks.progress import release_progress, stage
from kepsilon.tasks.publish import (
    MANIFEST,
    Publication,
    _fsync_directory,
    csv_header,
    manifest_bytes,
    published_columns,
    refuse_existing,
    release_directory,
    staging_directory,
    write_file,
)
from kepsilon.tasks.scratch import Scratch, ScratchLease, private_root
from kepsilon.tasks.shards import PARTIAL_PLACES, PIECE_CLASSES, SHARD_CODES, ShardedClasses, anonymise_shards, merge_shard
from kepsilon.tasks.sources import SourcePlan, plan_source

# Room the scratch folder needs, as a multiple of the table's size in memory: the classified records,
# then the records by class and by order range (each stage removes its input as it goes).
SCRATCH_FACTOR = 3
# Stages that run once per partition: intake, distribute, predict, perturb-suppress, publish-part, and the
# group reduction's (check-groups, class-figures, gate-groups).
_STAGES = 5 + len(GROUP_STAGES)


# The HTTP endpoints a Dask scheduler and its workers open whatever their settings (the dashboard, and
# pages of task, worker and log details, metrics): none served. Nothing of ours reads them.
CLOSED_HTTP = {"distributed.scheduler.http.routes": [], "distributed.worker.http.routes": [],
               "distributed.dashboard.link": ""}  # and no "dashboard at …" line pointing at nothing

# Dask's logs "for developers" (``distributed.admin.low-level-log-length``, 1,000 by default) keep, among others,
# the last messages each batched comm sent: the client's every ``update-graph``, which carries the task's pickled
# graph (0.1-0.2 MB here: the spec, the hierarchies, the coder), and on the scheduler every ``compute-task`` sent to
# a worker. The flow's process held every task's graph of the release up to 1,000 tasks, so it grew with the
# partitions (1M rows: 3.6 MB of them at 2 partitions, 39 MB at 30, measured with tracemalloc). 50 messages keep
# what a developer reads of them, whatever the partitions. Set for the flow's client, and for the scheduler and
# workers of its local cluster; an existing cluster's own processes keep their configuration (docs/dask.md).
DEVELOPER_LOGS = {"distributed.admin.low-level-log-length": 50}

# What Dask's servers do beside the tasks, for the dashboard and its metrics: the workers' statistical profiler
# samples the running task's stack every 10 ms (for the dashboard's profile pages, which CLOSED_HTTP closes), and
# every scheduler, nanny and worker measures its event loop's tick every 20 ms and its process (CPU, memory,
# network, disk) every 500 ms. An idle worker spent 4.1 % of a core on them, its nanny 4.1 % and the scheduler
# 2.4 % (measured here over 30 s, 2 one-thread workers); with these settings 0.9, 1.3 and 0.5 %. A worker's
# memory limits do not depend on them (``distributed.worker.memory.monitor-interval``, 100 ms, reads its memory),
# and a loop blocked for over 3 s is still logged. Set like DEVELOPER_LOGS (docs/dask.md).
QUIET_MONITORS = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.tick.interval": "1s",
    "distributed.admin.system-monitor.interval": "5s",
}

def dask_task_runner(execution, local_directory: str | None = None, source=None):
    """The flow's ``DaskTaskRunner``: the given scheduler's cluster, else a LocalCluster of ``workers``
    processes closed to other accounts (per-run mutual TLS on 127.0.0.1, no dashboard), of ``threads``
    threads each (one by default) and a memory limit sized from ``source``'s partitions (``flows/cluster.py``).

    ``local_directory``: where the local workers keep their own files (data Dask spills to disk under
    memory pressure): the account's private scratch folder.
    """
    from distributed import Security
    from prefect_dask import DaskTaskRunner

    from kepsilon.flows.cluster import local_cluster_size

    if execution.scheduler:
        return DaskTaskRunner(address=execution.scheduler, client_kwargs={"security": scheduler_security(execution.scheduler)})
    options = {**local_cluster_size(execution, source), "processes": True, "security": Security.temporary(),
               "protocol": "tls://", "host": "127.0.0.1", "dashboard_address": None}
    if local_directory:
        options["local_directory"] = local_directory
    return DaskTaskRunner(cluster_kwargs=options)


# How long a release waits for a worker of the cluster ``execution.scheduler`` names before refusing it.
WORKERS_WAIT_SECONDS = 30.0


def require_workers(execution) -> None:
    """Refuse, before ε, a configured cluster with no worker: its scheduler accepts the release's tasks and
    would hold them forever, the release waiting on its first one. A worker that joins within
    ``WORKERS_WAIT_SECONDS`` is waited for (workers started beside the release). A local cluster starts its own."""
    client = _cluster_client() if execution.scheduler else None
    if client is None:
        return
    try:
        client.wait_for_workers(1, timeout=WORKERS_WAIT_SECONDS)
    except TimeoutError:
        raise SpecError("execution.scheduler", f"the cluster has no worker (none joined within {WORKERS_WAIT_SECONDS:.0f} s): "
                        "start its workers, or leave execution.scheduler out for a local cluster") from None


TLS_SETTINGS = ("DASK_DISTRIBUTED__COMM__TLS__CA_FILE", "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT",
                "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY")


def scheduler_security(address: str):
    """The client's ``Security`` for an existing scheduler: for ``tls://``, the CA, certificate and key of
    Dask's configuration (``distributed.comm.tls.*``, e.g. the env settings ``TLS_SETTINGS``), checked to
    be readable; for another protocol, none (the cluster is then as open as its network: docs/dask.md)."""
    import dask
    from distributed import Security

    if not address.startswith("tls://"):
        return Security()
    security = Security(require_encryption=True)
    # The keys ``Security`` itself reads its TLS files from (its fields are slots mypy cannot see).
    ca_file, client_cert, client_key = (dask.config.get(f"distributed.comm.tls.{name}")
                                        for name in ("ca-file", "client.cert", "client.key"))
    files: dict[str, str | None] = {"CA": ca_file, "certificate": client_cert}
    if client_key:
        files["key"] = client_key
    for what, path in files.items():
        if not path:
            raise SpecError("execution.scheduler", f"a tls:// scheduler needs this client's TLS {what}: set "
                                                   f"{', '.join(TLS_SETTINGS)} (docs/dask.md)")
        try:
            with open(path, "rb"):
                pass
        except OSError as error:
            raise SpecError("execution.scheduler", f"the client's TLS {what} cannot be read ({error.strerror})") from None
    return security


def check_scheduler_reachable(address: str, timeout: float = 10.0) -> None:
    """Refuse, before anything is read or reserved, a scheduler address nothing answers at.

    Only a TCP connection is tried (the scheduler itself is not asked anything), so this catches a
    wrong host or port or a stopped scheduler with a one-line refusal instead of a traceback.
    """
    import socket
    from urllib.parse import urlsplit

    from kepsilon.tasks.errors import SpecError

    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        host, port = None, None
    if not host or not port:
        raise SpecError("execution.scheduler", "needs a scheduler address such as tcp://HOST:PORT")
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as failure:
        raise SpecError(
            "execution.scheduler", f"no Dask scheduler answers at that address ({failure.strerror or 'timed out'})"
        ) from None


def release_on_dask(spec: ReleaseSpec) -> ReleaseRecord:
    """Run ``governed-release-dask`` on the task runner the spec's ``execution`` names (a subflow when
    called from a flow)."""
    import dask
    import distributed  # noqa: F401 - its import sets its loggers' levels; ours comes after

    local_directory = None
    if spec.execution.scheduler:
        check_scheduler_reachable(spec.execution.scheduler)
        scheduler_security(spec.execution.scheduler)
    else:
        local_directory = str(private_root(spec, spec.output_dir))
    # The cluster's own chatter (workers joining, leaving) is not the release's log.
    logging.getLogger("distributed").setLevel(logging.WARNING)
    runner = dask_task_runner(spec.execution, local_directory, spec.source)
    with dask.config.set({**DEVELOPER_LOGS, **QUIET_MONITORS}), \
            dask.config.set(CLOSED_HTTP) if not spec.execution.scheduler else nullcontext():
        return governed_release_dask.with_options(task_runner=runner)(spec)


def _flush_workers() -> None:
    """Send the workers' queued Prefect logs and events now and stop their senders: a worker process
    then exits as soon as its cluster closes, instead of being killed after a timeout."""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    client = getattr(getattr(context, "task_runner", None), "_client", None)
    if client is None:
        return
    try:
        client.run(_drain_prefect_services)
    except Exception as failure:  # noqa: BLE001 - a worker that cannot flush loses log lines, not the release
        get_run_logger().warning("could not flush the workers' logs (%s)", type(failure).__name__)


def _hide_worker_tracebacks() -> None:
    """Keep failed tasks' tracebacks off the terminal in the workers too (``kepsilon.worker_console``)."""
    from prefect.context import FlowRunContext

    from kepsilon.worker_console import hide_worker_tracebacks

    context = FlowRunContext.get()
    # ``client`` (not ``_client``): the runner starts its cluster on first use, which this is.
    hide_worker_tracebacks(getattr(getattr(context, "task_runner", None), "client", None))


def _drain_prefect_services() -> None:
    """On a worker: drain Prefect's log and event senders (in a thread of its own: the worker's event loop
    would turn the drain into a coroutine nobody awaits)."""
    import threading

    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    def drain() -> None:
        APILogWorker.drain_all(timeout=10)
        EventsWorker.drain_all(timeout=10)

    thread = threading.Thread(target=drain, name="kepsilon-drain")
    thread.start()
    thread.join(timeout=30)


@flow(name="governed-release-dask", persist_result=False, log_prints=False, validate_parameters=True)
def governed_release_dask(spec: ReleaseSpec) -> ReleaseRecord:
    """Run one governed release partition by partition on Dask; return its private record (no data).

    Same outcomes as ``governed_release``: the published folder (a Parquet dataset ``data.parquet/``
    of parts in the published order, ``data.csv`` when ``execution.csv``, and ``manifest.json``), the
    private record, the refusals before ε and the recorded failures after it — the same governance
    (``flows/governance.govern``), in the same order.
    """
    spec = spec.for_run(run_day(), flow_run.name or "run")
    if not spec.execution.scheduler:  # our own local cluster writes to the CLI's terminal
        _hide_worker_tracebacks()
    return govern(spec, DaskEngine())


class DaskEngine:
    """The release partition by partition on the flow's Dask cluster: the source planned in pieces, then
    intake, the histogram's shards, the anonymiser and the checks before ε on the workers; on the reserved
    budget, the seed, perturb and suppress, the parts, the gate and the manifest (``_spend_check_stage``)."""

    def __init__(self) -> None:
        # Filled in the order ``govern`` calls the steps: read_source, workspace, intake, then anonymise.
        self.plan: SourcePlan | None = None
        self.table: TableIntake | None = None
        self.scratch: Scratch | None = None

    def read_source(self, spec: ReleaseSpec) -> SourceFacts:
        require_workers(spec.execution)
        self.plan = plan = _once_on_cluster("plan-source", plan_source, spec.source, spec.execution.partitions,
                                            _cluster_threads())
        return SourceFacts(sha256=plan.sha256, columns=tuple(plan.names), size_basis=plan.memory_bytes,
                           report=plan.report())

    @contextmanager
    def workspace(self, spec: ReleaseSpec, output_dir: str):
        """The run's scratch (refused here without room), the progress of its partitions; the scratch
        removed and the workers' logs flushed whatever happens."""
        assert self.plan is not None, "govern calls read_source first"
        lease = _prepare_scratch(spec, output_dir, self.plan.memory_bytes)
        self.scratch = lease.scratch
        pieces = len(self.plan.pieces)
        get_run_logger().info("release %s: %d partition(s) on the dask engine", spec.release_id, pieces)
        try:
            with release_progress(_STAGES * pieces, f"release {spec.release_id}"):
                yield
        finally:
            lease.close()
            _flush_workers()

    def intake(self, spec: ReleaseSpec) -> int:
        assert self.plan is not None and self.scratch is not None, "govern calls read_source and workspace first"
        _load_while_the_workers_run()
        self.table = _intake(spec, self.plan, self.scratch)
        return self.table.rows

    def execution(self, spec: ReleaseSpec) -> dict:
        assert self.plan is not None, "govern calls read_source first"
        return {"engine": "dask", "partitions": len(self.plan.pieces),
                "cluster": spec.execution.scheduler or f"local, {spec.execution.workers} worker process(es)"}

    def anonymise(self, spec: ReleaseSpec, store: str, key: str, record: ReleaseRecord, output_dir: str) -> Spend:
        plan, table, scratch = self.plan, self.table, self.scratch
        assert plan is not None and table is not None and scratch is not None, "govern calls intake first"
        sharded = _anonymise(spec, plan, table, scratch)
        anonymised = sharded.anonymised()
        classes = anonymised.classes
        record["anonymiser"] = classes.report
        record["hierarchies"] = classes.report.get("hierarchies", {})
        _distribute(spec, plan, table, scratch)
        verdicts = Verdicts()
        record["pre_epsilon"] = _pre_epsilon(verdicts, spec, store, key, table, sharded, plan, scratch)
        if spec.max_journalist_risk is not None or spec.max_marketer_risk is not None:
            # The certificate's optional gates on the anonymiser's groups, counted by the class partitions.
            verdicts.attempt("journalist and marketer risk", lambda: refuse_risk_over_limits_on_partitions(
                spec, scratch, len(plan.pieces), classes.levels, anonymised.hierarchies, _on_cluster))
        coder = GroupCoder.build(spec, anonymised.hierarchies, anonymised.criteria)
        # The gate's checks are loaded before ε, where they run (a broken install is refused before anything is
        # spent): on the workers, which run every check of a Dask release. A task per worker thread, so that fresh
        # workers (a local cluster's) load them side by side, once, rather than one now and the others at publish.
        _on_every_thread("load-gate-checks", load_gate_checks)

        def spend(reservation, record):
            return _spend_check_stage(spec, key, plan, table, anonymised, coder, reservation, store, record,
                                      output_dir, scratch)

        return spend

    def discard(self, spec: ReleaseSpec, output_dir: str, failure: BaseException) -> None:
        if isinstance(failure, ValidationFailed):
            # The in-memory path writes nothing when the gate fails; here the parts were written first.
            shutil.rmtree(staging_directory(output_dir, spec.release_id), ignore_errors=True)


def _load_while_the_workers_run() -> None:
    """Import the library the flow's process needs only after the workers' stages — matplotlib, for the private
    figures and the certificate — in a thread, while the flow waits on the cluster, off the release's critical path.
    (Great Expectations, the gate's, is never loaded here: the workers run every check, ``release_gate``.)

    Started once the cluster has run the source's plan, when the flow's own imports are done. A failure here is
    not the release's: the flow's own import, where it needs it, raises it again."""

    def load() -> None:
        try:
            from kepsilon.tasks.figures import pyplot

            pyplot()
        except Exception:  # noqa: BLE001, S110 - raised again where the flow imports it
            pass

    threading.Thread(target=load, name="kepsilon-load-libraries", daemon=True).start()


# A Prefect task run costs a worker about 140 ms of CPU outside the task's own function (its contexts and settings
# rebuilt, its clients, its states sent to the API; about half of it validating the flow's whole Settings again),
# and a stage of Prefect tasks on the cluster took 0.25-0.4 s of the release's wall time even when its tasks did
# nothing, against 0.02 s for plain Dask tasks and 0.05 s for one Prefect task in the flow's process that sends
# them (measured on this project's 2-core machine with the release's loopback API). So a stage is one Prefect task
# run, in the flow's process and named after the stage (the Prefect UI shows one run per stage), whose partitions go
# to the cluster as plain Dask tasks, in batches: one per worker thread, each doing its partitions one after the
# other (``run_batch``). The partitions are of equal size, so one batch per thread finishes as evenly as three,
# which measured 5-15 % more worker CPU in three pairs of 10M-row runs.
TASKS_PER_THREAD = 1
# The histogram's shard steps (merge, Mondrian's cut statistics by depth, routing, sub-trees, numbering) keep three
# per thread: with one, the flow received half a depth's cut statistics in a single result, and its peak at 30M
# fine rows rose to 480-483 MB against 410 at 1M (+18 %, over the 15 % the flow's memory may grow).
SHARD_TASKS_PER_THREAD = 3
# A batch that failed other than on the input or the spec (``worth_retrying``) runs again, this many times, after
# this long: a worker's memory, a file system full or unreachable for a moment.
BATCH_RETRIES = 2
BATCH_RETRY_DELAY_SECONDS = 1.0


class Stage:
    """One stage's work, as its Prefect task run gets it: ``function(*a)`` for every ``a`` in ``arguments``.

    ``shown``: whether the stage reports its partitions (the log, the bars, the progress artifact when ``counted``);
    a step done once, not per partition, does not. A plain object on purpose: Prefect walks a task's lists, tuples,
    dicts and models looking for futures, and records each value it finds as a ``Constant`` of its type; one object
    is neither walked nor recorded."""

    def __init__(self, name: str, function, arguments: list[tuple], counted: bool, per_thread: int, shown: bool = True):
        self.name, self.function, self.arguments = name, function, arguments
        self.counted, self.per_thread, self.shown = counted, per_thread, shown


@task(name="stage", cache_policy=NO_CACHE, persist_result=False)
def stage_task(work: Stage) -> list:
    """Prefect task, in the flow's process: one stage's partitions in batches on the cluster (``_each``);
    their results in the order of ``work.arguments``."""
    batches = min(len(work.arguments), work.per_thread * _cluster_threads())
    dealt = [list(range(first, len(work.arguments), batches)) for first in range(batches)]
    results = _each(work, dealt)
    ordered: list = [None] * len(work.arguments)
    for numbers, batch in zip(dealt, results):
        for number, result in zip(numbers, batch):
            ordered[number] = result
    return ordered


def _on_cluster(name: str, function, arguments: list[tuple], counted: bool = False,
                per_thread: int = TASKS_PER_THREAD) -> list:
    """Stage ``name``: ``function(*a)`` for every ``a`` (one partition's, shard's or bucket's inputs), in batches
    dealt in turn (at most ``per_thread`` per worker thread), each batch one Dask task, the stage one Prefect task
    run named after it; the results in the order of ``arguments``. ``counted``: whether the stage's partitions are
    steps of the release's progress (``tasks/shards.py``'s steps are not: how many the tree's depth takes is known
    only as it grows). A failure raised is the first failing argument's, in their order."""
    if not arguments:
        return []
    return stage_task.with_options(name=name)(Stage(name, function, arguments, counted, per_thread))


def _once_on_cluster(name: str, function, *arguments):
    """Step ``name``: ``function(*arguments)`` as one task on the cluster (a task run of its own, retried as a
    stage's batch is), with no progress bar or log line of partitions: it is not done per partition."""
    work = Stage(name, function, [arguments], counted=False, per_thread=1, shown=False)
    (result,) = stage_task.with_options(name=name)(work)
    return result


def _on_every_thread(name: str, function) -> None:
    """Step ``name``: ``function()`` once per worker thread of the cluster, side by side (one task each, which Dask
    gives its idle threads), with no progress bar: a worker's preparation rather than partitions."""
    work = Stage(name, function, [()] * _cluster_threads(), counted=False, per_thread=1, shown=False)
    stage_task.with_options(name=name)(work)


def _on_shards(name: str, function, arguments: list[tuple]) -> list:
    """:func:`_on_cluster` for the histogram's shard steps: ``SHARD_TASKS_PER_THREAD`` tasks per worker thread."""
    return _on_cluster(name, function, arguments, per_thread=SHARD_TASKS_PER_THREAD)


def _cluster_client():
    """The Dask client of the flow's task runner, or None (not in a flow, or not on Dask)."""
    from prefect.context import FlowRunContext
    from prefect_dask import DaskTaskRunner

    runner = getattr(FlowRunContext.get(), "task_runner", None)
    return runner.client if isinstance(runner, DaskTaskRunner) else None


def _cluster_threads() -> int:
    """The worker threads of the flow's cluster now (1 if it cannot be asked)."""
    client = _cluster_client()
    try:
        return max(1, sum(client.nthreads().values())) if client is not None else 1
    except Exception:  # noqa: BLE001 - a count for batching only: one batch is always correct
        return 1


def _anonymise(spec: ReleaseSpec, plan, table, scratch: Scratch) -> ShardedClasses:
    """The histogram merged into shards on the workers (one per bucket of tuple hashes), then Mondrian
    (distributed) or OLA (one task) on them: the flow receives counts and the tree's cuts, never the
    histogram (``tasks/shards.py``)."""
    columns = [q.column for q in spec.roles.k_quasi]
    pieces = len(plan.pieces)
    summaries = _on_shards("merge-histogram", merge_shard, [(scratch, b, table.offsets, columns) for b in range(pieces)])
    scratch.remove("partial")
    sharded = anonymise_shards(spec, scratch, summaries, table.values, _on_shards,
                               statistics_tasks=SHARD_TASKS_PER_THREAD * _cluster_threads())
    for name in ("leaf", "local", "firsts", "numbers", "class-of", "class-table", PARTIAL_PLACES):
        scratch.remove(name)
    return sharded


def _distribute(spec: ReleaseSpec, plan, table, scratch: Scratch) -> None:
    """Stage B, before ε (it needs no noise): every record to the class partition of its class."""
    numeric = [q.column for q in spec.roles.e_quasi]
    _on_cluster("distribute", distribute, [
        (piece.index, offset, scratch, numeric) for piece, offset in zip(plan.pieces, table.offsets)
    ], counted=True)
    # The shards stay for the certificate's figures (removed after them, or with the scratch at the end).
    for name in ("classified", "targets", PIECE_CLASSES, SHARD_CODES):  # once all its partitions are done
        scratch.remove(name)


def _pre_epsilon(verdicts: Verdicts, spec, store: str, key: str, table, sharded: ShardedClasses, plan, scratch: Scratch) -> dict:
    """The shared checks before ε (``tasks/preflight.pre_epsilon_checks``), the prediction added up over the
    class partitions (each predicted on the cluster from throw-away noise). Returns the private summary."""
    import secrets

    from kepsilon.engine.predict import Prediction, design_for

    rows_kept = sharded.rows_kept
    design = design_for(rows_kept)  # the whole table's: each partition samples its classes at the table's share
    pieces = len(plan.pieces)

    def predicted() -> Prediction:
        parts = _on_cluster("predict", predict_partition, [
            (index, pieces, scratch, spec, design.draws, secrets.randbits(128), design.share) for index in range(pieces)
        ], counted=True)
        scratch.remove(NUMERIC_SHUFFLE)  # the perturbation reads the whole records (``shuffle``)
        prediction = Prediction(draws=design.draws, share=design.share, published=np.zeros(design.draws))
        for part in parts:
            prediction = prediction.add(part)
        return prediction

    return pre_epsilon_checks(
        verdicts, spec, store=store, key=key, rows_in=table.rows, rows_kept=rows_kept,
        certain_share=sharded.certain_share, predict=predicted,
    )


def _prepare_scratch(spec: ReleaseSpec, output_dir: str, table_bytes: int) -> ScratchLease:
    """The run's scratch folder, private, sealed and locked, on a file system with room for the pieces."""
    scheduler = spec.execution.scheduler
    if scheduler and not spec.execution.scratch and not _on_this_machine(scheduler):
        raise SpecError("execution.scratch", "a cluster on other machines needs a scratch folder every worker "
                                             "reaches (the default is this machine's temporary folder)")
    root = private_root(spec, output_dir)
    free = shutil.disk_usage(root).free
    needed = SCRATCH_FACTOR * max(int(table_bytes), 1)
    if free < needed:
        raise SpecError(
            "execution.scratch",
            f"{str(root)!r} has {free:,} bytes free; the intermediate partitions need {needed:,} "
            f"({SCRATCH_FACTOR} × the table's estimated size)",
        )
    try:
        return ScratchLease(root, spec.release_id)
    except OSError as error:  # e.g. an immutable (chattr +i) or read-only folder: root is not stopped by modes
        raise SpecError("execution.scratch", f"{str(root)!r} cannot be made ({error.strerror or type(error).__name__})") from None


def check_scratch(spec: ReleaseSpec, output_dir: str, table_bytes: int) -> None:
    """``kepsilon check``'s scratch verdict: the release's own preparation of its scratch folder (placement,
    owner, 0700, free space, a run folder made and locked), then that run folder removed at once."""
    _prepare_scratch(spec, output_dir, table_bytes).close()


def _on_this_machine(address: str) -> bool:
    """Whether a scheduler address is a loopback one (its workers then see this machine's folders)."""
    import ipaddress
    from urllib.parse import urlsplit

    host = urlsplit(address if "://" in address else f"tcp://{address}").hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _each(work: Stage, dealt: list[list[int]]) -> list:
    """Run a stage's batches, each doing the partitions ``dealt`` to it, one progress step per partition;
    the batches' results in their order.

    On the flow's Dask cluster each batch is a plain Dask task (``run_batch``); without one (a flow on another
    task runner: the tests of the batching), the batches run here, one after the other. A batch that failed
    other than on the input or the spec runs again (``BATCH_RETRIES``; Dask itself re-runs the task of a worker
    that died). A failed batch does not stop the others from finishing (their scratch files stay consistent);
    then the failure of the first failing partition, in partition order, is raised — the error the in-memory
    path would meet first (a batch stops at its first failure, and does its partitions in increasing order).
    """
    from distributed import as_completed

    client = _cluster_client()
    batches = [[work.arguments[i] for i in numbers] for numbers in dealt]
    results: list = [None] * len(dealt)
    failures: dict[int, BaseException] = {}

    def start(number: int):
        if client is None:
            return _Done(run_batch(work.function, batches[number], dealt[number]))
        return client.submit(run_batch, work.function, batches[number], dealt[number], pure=False,
                             key=f"kepsilon-{work.name}-{number}-{uuid.uuid4().hex}")

    running = {number: start(number) for number in range(len(dealt))}
    tries = dict.fromkeys(running, 0)
    shown = stage(work.name, sum(map(len, dealt)), work.counted) if work.shown else nullcontext(_Unshown())
    with shown as progress, WorkerWatch(work.name, client, running) as watch:
        pending = _InTurn(list(running.values())) if client is None else as_completed(list(running.values()), loop=client.loop)
        number_of = {id(future): number for number, future in running.items()}
        for future in pending:
            number = number_of.pop(id(future))
            outcome = _outcome(future, dealt[number][0])
            if isinstance(outcome, PartitionFailed) and tries[number] < BATCH_RETRIES and worth_retrying(outcome) \
                    and not watch.lost:
                tries[number] += 1
                time.sleep(BATCH_RETRY_DELAY_SECONDS)
                running[number] = again = start(number)
                number_of[id(again)] = number
                pending.add(again)
                continue
            if isinstance(outcome, PartitionFailed):
                failures[outcome.number] = _raised(outcome)
            else:
                results[number] = outcome
            progress.advance(len(dealt[number]))
            fault_point(f"dask-{work.name}")
    if watch.lost:
        raise ClusterLost(work.name, WORKERS_WAIT_SECONDS)
    if failures:
        raise failures[min(failures)]
    return results


def _outcome(future, first: int) -> list | PartitionFailed:
    """A batch's results or its ``PartitionFailed``; a batch whose own run failed (its worker lost more often than
    Dask allows, cancelled) fails as its first partition."""
    try:
        return future.result()
    except Exception as failure:  # noqa: BLE001 - a failure of the batch's run: retried or raised by the caller
        return PartitionFailed(first, failure)
    finally:
        release = getattr(future, "release", None)
        if release is not None:
            release()  # the result leaves the worker's memory now, not when the future is collected


def _raised(failed: PartitionFailed) -> BaseException:
    """The partition's own error, with its worker's traceback as its cause (where there is one)."""
    if failed.where and failed.failure.__cause__ is None:
        failed.failure.__cause__ = WorkerTraceback(failed.where)
    return failed.failure


class _Unshown:
    """The progress of a step that is not done per partition: nothing to show."""

    def advance(self, count: int = 1) -> None:
        pass


class _Done:
    """A batch run in the flow's own process, as a finished future."""

    def __init__(self, outcome):
        self.outcome = outcome

    def result(self):
        return self.outcome


class _InTurn:
    """``as_completed`` for finished futures: in the order given, those added later after them."""

    def __init__(self, futures: list):
        self.queue = deque(futures)

    def add(self, future) -> None:
        self.queue.append(future)

    def __iter__(self):
        while self.queue:
            yield self.queue.popleft()


# How often a waiting stage asks the scheduler whether it still has a worker.
WATCH_SECONDS = 5.0


class WorkerWatch:
    """While a stage waits on its tasks: every ``WATCH_SECONDS``, whether the cluster still has a worker.

    A scheduler whose workers have all left holds the stage's tasks for whenever one joins, so the
    release would wait forever, its ε reserved and nothing recorded. After ``WORKERS_WAIT_SECONDS`` with
    no worker the watch cancels the stage's running tasks (``running``: batch number → future, kept up to date
    by the stage; the wait then ends) and sets ``lost``; the stage then fails with ``ClusterLost``, recorded
    like any failure. A local cluster's nanny restarts a worker that died well within that time. Watches only
    with a Dask client (nothing when the batches run in the flow's process).
    """

    def __init__(self, name: str, client, running: dict):
        self.name, self.client, self.running, self.lost = name, client, running, False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "WorkerWatch":
        if self.client is not None and self.running:
            self._thread = threading.Thread(target=self._watch, name=f"kepsilon-watch-{self.name}", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _watch(self) -> None:
        without_workers_since = None
        while not self._stop.wait(WATCH_SECONDS):
            try:
                workers = len(self.client.nthreads())
            except Exception:  # noqa: BLE001 - the scheduler busy or gone for a moment: asked again next time
                continue
            if workers:
                without_workers_since = None
                continue
            without_workers_since = without_workers_since or time.monotonic()
            if time.monotonic() - without_workers_since >= WORKERS_WAIT_SECONDS:
                self.lost = True
                self.client.cancel(list(self.running.values()))
                return


def _intake(spec: ReleaseSpec, plan: SourcePlan, scratch: Scratch) -> TableIntake:
    """Stage A and its reduction: refusals in the in-memory order, then the whole table's histogram."""
    intakes = _on_cluster("intake", intake, [(plan, piece, spec, scratch) for piece in plan.pieces], counted=True)
    pieces = len(plan.pieces)
    table = combine_intakes(intakes, spec,
                            lambda number: _once_on_cluster("count-distinct", distinct_count, scratch, number, pieces))
    scratch.remove("hashes")
    return table


def _spend_check_stage(
    spec, key, plan, table, anonymised, coder, reservation, store, record: ReleaseRecord, output_dir, scratch
) -> tuple[ReleaseRecord, Publication, FigureInputs]:
    """The stages on reserved budget: seed, perturb and suppress, publish the parts, gate, manifest.

    Groups and classes stay on the workers (``tasks/group_reduction.py``): the flow adds up sizes, counts,
    check outcomes and figures' reductions, whose size does not grow with them.
    """
    root, pieces = scratch, len(plan.pieces)
    classes = anonymised.classes
    criteria = anonymised.criteria
    streams, commitment = release_streams(spec, key, reservation.id, store)
    record["seed_commitment"] = commitment

    parts = _on_cluster("perturb-suppress", perturb_and_hand_over, [
        (index, pieces, root, spec, streams, anonymised.hierarchies, classes.levels, coder, pieces) for index in range(pieces)
    ], counted=True)
    scratch.remove("shuffle")
    fault_point("after-noise")
    record["perturbation"] = combine_perturbation(parts)
    checked = _on_cluster("check-groups", check_groups, [(root, bucket, pieces, criteria) for bucket in range(pieces)],
                          counted=True)
    scratch.remove(GROUPS)
    errors = ErrorExtremes.add([part.error_extremes for part in parts if part.error_extremes is not None])
    extent = None if errors.as_points else errors.extent()  # the error figure's grid, the same for every partition
    outcomes = _on_cluster("class-figures", class_figures, [(root, index, pieces, spec, extent) for index in range(pieces)],
                           counted=True)
    scratch.remove(CLASSES)
    record.update(outcome_metrics(parts, outcomes, classes.report, spec, criteria))
    figure_inputs = _figure_inputs(checked, errors, extent, outcomes)

    meta = next(part.meta for part in parts if part.meta is not None)
    staging = _fresh_staging(output_dir, spec.release_id)
    published = _on_cluster("publish-part", publish_and_hand_over, [
        (index, pieces, root, str(staging), spec, meta, spec.execution.csv, len(coder.sensitive), pieces)
        for index in range(pieces)
    ], counted=True)
    scratch.remove("ordered")
    scratch.remove(FAILING)
    remove_partials(staging / DATASET)  # pieces of attempts killed mid-write
    outputs = {part.name: part.sha256 for part in published}
    if spec.execution.csv:
        outputs[DATA_CSV] = _once_on_cluster("write-csv", join_csv, str(staging), root, csv_header(meta), pieces)
        remove_partials(staging)
        scratch.remove("csv")

    # The gate recounts what was written, bucket by bucket of group keys, on the workers.
    gates = _on_cluster("gate-groups", gate_groups, [(root, bucket, pieces, spec, coder, criteria) for bucket in range(pieces)],
                        counted=True)
    scratch.remove(WRITTEN)
    written = SizeCounts.add([gate.sizes for gate in gates])
    record["groups"] = groups_from_size_counts(written.values, written.counts, record["rows_in"])
    record["columns"] = published_columns(meta, spec.roles.names())
    record["disclosure"] = add_disclosure_figures([gate.disclosure for gate in gates])
    # Private: the officer's certificate's figures, by reduction over the partitions (tasks/certificate_dask.py);
    # of the written groups it reads only their keys and sizes, which the gate's buckets left in the scratch.
    shards_failed = shard_sketches(spec, root, pieces, _on_cluster, anonymised.hierarchies)
    record["certificate"] = _once_on_cluster("certificate-figures", dask_certificate, spec, root, pieces, pieces, pieces,
                                             anonymised.hierarchies, coder, record["rows_in"] - written.records, shards_failed)
    for name in (*CERTIFICATE_SKETCHES, WRITTEN_SIZES, "shard"):
        scratch.remove(name)
    record["checks"], failure = _once_on_cluster(
        "gate", release_gate, spec, gates, [part.checks for part in published], record["rows_in"],
        sum(record["rows_removed"].values()), record["linking_risk"], criteria)
    if failure is not None:
        raise failure

    grids = {q.column: public_grid(q.lower, q.upper, eps) for q, eps in zip(spec.roles.e_quasi, spec.epsilon_split().values())}
    public = with_chain_witness(public_manifest(record, spec, grids, Guarantee.for_spec(spec).statement()), store, key)
    write_file(staging / MANIFEST, manifest_bytes({**public, "outputs": outputs}))
    _fsync_directory(staging / DATASET)
    _fsync_directory(staging)
    _fsync_directory(staging.parent)
    publication = Publication(directory=release_directory(output_dir, spec.release_id), outputs=outputs, staging=staging)
    record.update(publication.report())
    record["output_dir"] = str(publication.directory)
    record["public_manifest"] = {**public, "outputs": dict(outputs)}
    record["execution"]["finished_at"] = datetime.now(UTC).isoformat()
    return record, publication, figure_inputs


def _figure_inputs(checked: list[GroupCheck], errors: ErrorExtremes, extent, outcomes: list[ClassOutcome]) -> FigureInputs:
    """The private figures' inputs added up: the published groups' sizes after diversity suppression, and the
    classes' errors as points (class partitions in order: classes in order) or counts per hexagon."""
    sizes = SizeCounts.add([check.sizes for check in checked])
    if extent is None:
        points = [outcome.points for outcome in outcomes if outcome.points is not None]
        joined = (np.concatenate([np.zeros(0), *(p[0] for p in points)]), np.concatenate([np.zeros(0), *(p[1] for p in points)]))
        return FigureInputs(sizes, errors, points=joined)
    cells = ErrorCells.add([outcome.cells for outcome in outcomes if outcome.cells is not None], extent)
    return FigureInputs(sizes, errors, extent=extent, cells=cells)


def _fresh_staging(output_dir: str, release_id: str) -> Path:
    """The hidden staging folder, emptied (a rerun re-derives the same bytes), with the dataset's folder."""
    refuse_existing(release_directory(output_dir, release_id))
    staging = staging_directory(output_dir, release_id)
    if staging.exists():
        shutil.rmtree(staging)
    (staging / DATASET).mkdir(parents=True)
    return staging
