"""The local Dask cluster's size (issue 25): one thread per worker by default, ``execution.threads`` to
override it, and each worker's memory limit computed from the partition's size (``flows/cluster.py``).

The clusters here are real ``LocalCluster``s made from the options the flow's runner gets
(``dask_task_runner``); what is checked is what their scheduler reports of its workers.
"""

from pathlib import Path

import dask
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from kepsilon.cli import app
from kepsilon.flows.cluster import MINIMUM_LIMIT, PARTITION_FACTOR, WORKER_BASE_BYTES, worker_memory_limit
from kepsilon.flows.release_dask import CLOSED_HTTP, dask_task_runner
from kepsilon.flows.spec import Execution, SourceSpec
from kepsilon.tasks.sources import parquet_pieces, partition_memory_estimate, plan_source

ROOT = Path(__file__).resolve().parents[1]


def _workers_of(execution: Execution, source: SourceSpec | None = None) -> list[dict]:
    """Start the LocalCluster the flow would start for ``execution``; what its scheduler says of its workers."""
    from distributed import Client, LocalCluster

    runner = dask_task_runner(execution, source=source)
    with dask.config.set(CLOSED_HTTP), LocalCluster(**runner.cluster_kwargs) as cluster:
        with Client(cluster, security=runner.cluster_kwargs["security"]) as client:
            client.wait_for_workers(execution.workers, timeout=60)
            return list(client.scheduler_info()["workers"].values())


def _dataset(folder: Path, rows: int, text: str = "x" * 40) -> Path:
    folder.mkdir()
    pq.write_table(pa.table({"A": pa.array([text] * rows), "B": pa.array([str(n) for n in range(rows)])}),
                   folder / "part-00000.parquet")
    return folder


def test_a_default_local_cluster_has_one_thread_per_worker_whatever_the_cores():
    workers = _workers_of(Execution(engine="dask", workers=1))
    assert [worker["nthreads"] for worker in workers] == [1]
    assert psutil.cpu_count() >= 2  # Dask's own default here would be cpu_count / workers threads, not 1


def test_execution_threads_overrides_the_threads_and_the_memory_limit_grows_with_them(tmp_path):
    source = SourceSpec(path=str(_dataset(tmp_path / "data", 200_000, text="x" * 400)))  # ~80 MB: above the floor
    one = Execution(engine="dask", workers=1, partitions=1)
    three = Execution(engine="dask", workers=1, partitions=1, threads=3)
    workers = _workers_of(three, source)
    assert [worker["nthreads"] for worker in workers] == [3]
    assert workers[0]["memory_limit"] == worker_memory_limit(three, source)
    assert worker_memory_limit(three, source) > worker_memory_limit(one, source)


def test_the_memory_limit_is_the_fixed_part_plus_a_multiple_of_the_partitions_arrow_size(tmp_path):
    rows = 2_000_000
    source = SourceSpec(path=str(_dataset(tmp_path / "data", rows)))
    table = pq.read_table(source.path)
    for partitions in (1, 4):
        estimate = partition_memory_estimate(source, partitions)
        actual = table.slice(0, rows // partitions).nbytes
        assert 0.8 * actual <= estimate <= 1.2 * actual, (partitions, estimate, actual)
        limit = worker_memory_limit(Execution(engine="dask", workers=1, partitions=partitions), source)
        assert limit == min(psutil.virtual_memory().total, max(MINIMUM_LIMIT, WORKER_BASE_BYTES + PARTITION_FACTOR * estimate))
    # a source that cannot be read sizes nothing: the floor, and the plan refuses it by name later
    assert partition_memory_estimate(SourceSpec(path=str(tmp_path / "missing.parquet")), None) == 0
    assert worker_memory_limit(Execution(engine="dask"), SourceSpec(path=str(tmp_path / "missing.parquet"))) == MINIMUM_LIMIT


@pytest.mark.parametrize(("records", "threads", "pieces"), [
    (30_000_000, 2, 30),  # a million records a piece
    (10_000_000, 14, 14),  # as many as the cluster's threads, 714,286 records each
    (1_000_000, 2, 2),  # one piece would leave a thread idle: two of 500,000
    (1_000_000, 8, 4),  # but none under 250,000 records
    (400_000, 2, 1),
    (1_000_001, 1, 2),
    (0, 4, 1),
])
def test_a_parquet_sources_default_pieces_hold_a_million_records_and_give_every_thread_one(records, threads, pieces):
    assert parquet_pieces(records, threads=threads) == pieces
    assert parquet_pieces(records, 3, threads) == min(3, max(records, 1))  # execution.partitions decides


def test_the_plan_cuts_a_parquet_source_for_the_clusters_threads_unless_partitions_are_given(tmp_path):
    source = SourceSpec(path=str(_dataset(tmp_path / "data", 600_000)))
    assert len(plan_source(source, None).pieces) == 1
    assert [piece.start_row for piece in plan_source(source, None, threads=2).pieces] == [0, 300_000]
    assert len(plan_source(source, None, threads=4).pieces) == 2  # 250,000 records a piece at the least
    assert len(plan_source(source, 5, threads=2).pieces) == 5  # execution.partitions decides
    # The workers' memory is sized for the largest default piece (threads unknown before the cluster starts).
    assert partition_memory_estimate(source, None) == partition_memory_estimate(source, 1)


def test_a_csv_partition_is_estimated_from_its_bytes(tmp_path):
    path = tmp_path / "people.csv"
    path.write_text("A;B\n" + "".join(f"{n};text\n" for n in range(100_000)), encoding="utf-8")
    estimate = partition_memory_estimate(SourceSpec(path=str(path), delimiter=";"), 2)
    assert estimate == int(path.stat().st_size / 2 * 1.5)


@pytest.mark.parametrize("threads", [0, -1, 1.5, "two", 10**6])
def test_a_bad_execution_threads_is_refused_in_one_line_by_name_with_exit_2(tmp_path, threads):
    spec = yaml.safe_load((ROOT / "releases" / "paper-synthetic.yaml").read_text(encoding="utf-8"))
    spec["source"]["path"] = str(ROOT / "data" / "paper-synthetic" / "people.csv")
    for quasi in spec["roles"]["k_quasi"]:
        quasi["hierarchy"] = str((ROOT / "releases" / quasi["hierarchy"]).resolve())
    spec["output_dir"] = str(tmp_path / "out")
    spec["execution"] = {"engine": "dask", "threads": threads}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    result = CliRunner().invoke(app, ["release", str(path), "--db", str(tmp_path / "audit.db")])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and "execution.threads" in lines[0], result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_the_flows_cluster_keeps_few_of_dasks_developer_messages(tmp_path, monkeypatch):
    """``release_on_dask`` runs the flow with Dask's developer logs short (``DEVELOPER_LOGS``): the flow's client
    keeps at most 50 of the messages it sent (each task's pickled graph among them) instead of 1,000, and so do
    the local cluster's scheduler and workers. The flow itself is replaced by one that starts the runner's cluster."""
    import tempfile

    from distributed import Client, LocalCluster

    from kepsilon.flows import release_dask
    from kepsilon.flows.spec import ReleaseSpec

    from .conftest import release_spec_dict

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    spec = ReleaseSpec.model_validate(release_spec_dict(
        "paper-synthetic", release_id="logs-test", population_id="test-population", output_dir=str(tmp_path / "out"),
        execution={"engine": "dask", "workers": 1}))
    seen: dict = {}

    def flow(spec):
        runner = release_dask.dask_task_runner(spec.execution, source=spec.source)
        with LocalCluster(**runner.cluster_kwargs) as cluster, \
                Client(cluster, security=runner.cluster_kwargs["security"]) as client:
            for number in range(120):  # each task's graph carries 100 kB
                assert client.submit(len, bytes(100_000) + bytes([number]), pure=False).result() == 100_001
            log = client.scheduler_comm.recent_message_log
            seen["client"] = (len(log), log.maxlen)
            seen["workers"] = list(client.run(lambda dask_worker: dask_worker.batched_stream.recent_message_log.maxlen).values())
            seen["scheduler"] = client.run_on_scheduler(
                lambda dask_scheduler: sorted({stream.recent_message_log.maxlen for stream in dask_scheduler.stream_comms.values()}))
            seen["worker monitors"] = list(client.run(_monitors).values())
            seen["scheduler monitors"] = client.run_on_scheduler(_monitors)
        return "record"

    monkeypatch.setattr(release_dask.governed_release_dask, "with_options", lambda **options: flow)
    assert release_dask.release_on_dask(spec) == "record"
    # Nor do its workers profile their tasks (no "profile" callbacks), and the servers tick every second and
    # measure their process every 5 s (QUIET_MONITORS), not every 20 and 500 ms.
    quiet = {"profile": False, "tick ms": 1000.0, "monitor ms": 5000.0}
    assert seen == {"client": (50, 50), "workers": [50], "scheduler": [50],
                    "worker monitors": [quiet], "scheduler monitors": quiet}
    assert dask.config.get("distributed.admin.low-level-log-length") == 1000  # the setting is the release's only
    assert dask.config.get("distributed.worker.profile.enabled") is True
    assert dask.config.get("distributed.admin.tick.interval") == "20ms"


def _monitors(dask_worker=None, dask_scheduler=None) -> dict:
    """A Dask server's background callbacks, as ``client.run`` or ``run_on_scheduler`` finds it."""
    server = dask_worker if dask_worker is not None else dask_scheduler
    callbacks = server.periodic_callbacks
    return {"profile": "profile" in callbacks or "profile-cycle" in callbacks,
            "tick ms": callbacks["tick"].callback_time, "monitor ms": callbacks["monitor"].callback_time}
