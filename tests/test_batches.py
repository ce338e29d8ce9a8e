"""A stage's partitions in a few batches each (``flows/release_dask._on_cluster``, ``tasks/partitioned.run_batch``):
results in partition order, the first failing partition's own error raised with its worker's traceback, retries
only where they may help, and one Prefect task run per stage. On a real cluster: ``tests/test_dask_release.py``."""

import pickle
from uuid import UUID

import pytest
from prefect import flow
from prefect.runtime import flow_run

from kepsilon.flows import release_dask
from kepsilon.flows.release_dask import (
    BATCH_RETRIES,
    SHARD_TASKS_PER_THREAD,
    TASKS_PER_THREAD,
    _on_cluster,
    _once_on_cluster,
)
from kepsilon.tasks import progress
from kepsilon.tasks.errors import InputError, SpecError
from kepsilon.tasks.partitioned import PartitionFailed, WorkerTraceback, run_batch, worth_retrying

ran: list[int] = []


def square_unless(number: int, failing: dict) -> int:
    ran.append(number)
    if number in failing:
        failure = failing[number]
        if isinstance(failure, list):  # fails as many times as the list has errors, then passes
            if failure:
                raise failure.pop(0)
        else:
            raise failure
    return number * number


def test_a_batch_runs_its_partitions_in_turn_and_hands_back_the_first_failure():
    ran.clear()
    assert run_batch(square_unless, [(2, {}), (5, {}), (7, {})], [2, 5, 7]) == [4, 25, 49]
    ran.clear()
    failure = SpecError("k", "too large for the table")
    failed = run_batch(square_unless, [(2, {}), (5, {5: failure}), (7, {})], [2, 5, 7])
    assert isinstance(failed, PartitionFailed)  # handed back, not raised: Dask would log the task's arguments
    assert failed.number == 5 and failed.failure is failure
    assert ran == [2, 5]  # the partition after the failure never ran
    assert str(failed) == "partition 5: SpecError: " + str(failure)
    assert "in square_unless" in failed.where and failed.where.rstrip().endswith(str(failure))


def test_a_partition_failure_crosses_a_process_boundary_with_its_number_error_and_traceback():
    copied = pickle.loads(pickle.dumps(PartitionFailed(3, InputError("HEIGHT", "is not a number in 2 records"), "trace")))
    assert copied.number == 3 and copied.where == "trace"
    assert type(copied.failure) is InputError and str(copied.failure) == str(InputError("HEIGHT", "is not a number in 2 records"))


def test_a_batch_is_retried_unless_its_partition_failed_on_the_input_or_the_spec():
    assert not worth_retrying(PartitionFailed(0, SpecError("k", "too large")))
    assert not worth_retrying(PartitionFailed(4, InputError("AGE", "is missing in 3 records")))
    assert worth_retrying(PartitionFailed(4, OSError("no space left on device")))
    assert worth_retrying(MemoryError())
    assert not worth_retrying(SpecError("k", "too large"))


@flow(persist_result=False)
def stage_of(count: int, failing: dict, per_thread: int = SHARD_TASKS_PER_THREAD) -> tuple[list, str]:
    results = _on_cluster("test-stage", square_unless, [(number, failing) for number in range(count)], counted=True,
                          per_thread=per_thread)
    return results, flow_run.id


@pytest.fixture
def batches(monkeypatch) -> list[list[int]]:
    """The batches run (their partition numbers), each try counted."""
    started: list[list[int]] = []
    original = release_dask.run_batch

    def counting(function, arguments, numbers):
        started.append(list(numbers))
        return original(function, arguments, numbers)

    monkeypatch.setattr(release_dask, "run_batch", counting)
    monkeypatch.setattr(release_dask, "BATCH_RETRY_DELAY_SECONDS", 0.0)
    return started


def _task_run_names(flow_run_id: str) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(flow_run_id)])))
    return sorted(run.name.rsplit("-", 1)[0] for run in runs)


@pytest.mark.usefixtures("prefect_harness")
def test_a_stage_returns_every_partitions_result_in_order_from_fewer_batches_in_one_task_run(batches):
    for per_thread in (SHARD_TASKS_PER_THREAD, TASKS_PER_THREAD):
        ran.clear()
        batches.clear()
        results, run_id = stage_of(10, {}, per_thread)
        assert results == [number * number for number in range(10)]
        assert sorted(ran) == list(range(10))
        # One worker thread outside a Dask cluster: per_thread batches, the partitions dealt in turn.
        assert sorted(batches) == sorted(list(range(first, 10, per_thread)) for first in range(per_thread))
        # The stage is one Prefect task run, named after it, whatever its batches.
        assert _task_run_names(run_id) == ["test-stage"]
    assert (TASKS_PER_THREAD, SHARD_TASKS_PER_THREAD) == (1, 3) and batches == [list(range(10))]


@pytest.mark.usefixtures("prefect_harness")
def test_a_stage_raises_the_first_failing_partitions_error_whichever_batch_fails_first(batches):
    # Dealt in turn to 3 batches: 4 is the second batch's second partition, 5 the third batch's second, 8 the
    # third's third (never run: its batch stopped at 5). The error raised is partition 4's, the in-memory path's
    # first, with the traceback it had where it was raised as its cause.
    failing = {4: InputError("AGE", "is missing in 1 record"), 5: SpecError("k", "too large"), 8: OSError("disk")}
    ran.clear()
    with pytest.raises(InputError) as caught:
        stage_of(9, failing)
    assert str(caught.value) == str(failing[4])
    assert isinstance(caught.value.__cause__, WorkerTraceback) and "in square_unless" in str(caught.value.__cause__)
    assert 8 not in ran and {0, 3, 6, 1, 4, 2, 5} <= set(ran)
    assert len(batches) == 3  # neither failure is retried: the same input gives the same error


@pytest.mark.usefixtures("prefect_harness")
def test_a_batch_that_failed_for_a_moment_runs_again_and_the_stage_passes(batches):
    ran.clear()
    failing = {4: [OSError("no space left on device")] * BATCH_RETRIES}  # fails on the first try and the retry
    results, _ = stage_of(6, failing)
    assert results == [number * number for number in range(6)]
    assert batches == [[0, 3], [1, 4], [2, 5], [1, 4], [1, 4]]  # the failed batch, again, twice


@pytest.mark.usefixtures("prefect_harness")
def test_a_batch_that_keeps_failing_stops_after_its_retries_with_its_error(batches):
    ran.clear()
    failing = {1: [MemoryError()] * (BATCH_RETRIES + 1)}
    with pytest.raises(MemoryError):
        stage_of(3, failing)
    assert batches == [[0], [1], [2], [1], [1]]


class Bars:
    """A progress listener, as the CLI's bars are one: the stages it was told of."""

    def __init__(self):
        self.started: list[tuple[str, int]] = []

    def stage_started(self, name: str, total: int) -> None:
        self.started.append((name, total))

    def stage_advanced(self, name: str, done: int, total: int) -> None:
        pass

    def stage_finished(self, name: str, done: int, total: int, seconds: float) -> None:
        pass


@flow(persist_result=False)
def a_stage_and_a_step() -> tuple[list, int, str]:
    results = _on_cluster("test-stage", square_unless, [(number, {}) for number in range(4)])
    return results, _once_on_cluster("test-step", square_unless, 9, {}), flow_run.id


@pytest.mark.usefixtures("prefect_harness")
def test_a_step_done_once_is_a_task_run_of_its_own_with_no_bar_of_partitions():
    bars = Bars()
    progress.add_listener(bars)
    try:
        results, step, run_id = a_stage_and_a_step()
    finally:
        progress.remove_listener(bars)
    assert (results, step) == ([0, 1, 4, 9], 81)
    assert bars.started == [("test-stage", 4)]  # plan-source, count-distinct, write-csv: not "1/1 partitions"
    assert _task_run_names(run_id) == ["test-stage", "test-step"]
