"""A stage's partitions in a few Prefect tasks each (``flows/release_dask._on_cluster``, ``tasks/partitioned.batch_task``):
results in partition order, the first failing partition's own error raised, retries only where they may help."""

import pickle

import pytest
from prefect import flow
from prefect.states import Failed

from kepsilon.flows import release_dask
from kepsilon.flows.release_dask import SHARD_TASKS_PER_THREAD, TASKS_PER_THREAD, _on_cluster
from kepsilon.tasks.errors import InputError, SpecError
from kepsilon.tasks.partitioned import PartitionFailed, _worth_retrying, batch_task

ran: list[int] = []


def square_unless(number: int, failing: dict) -> int:
    ran.append(number)
    if number in failing:
        raise failing[number]
    return number * number


def test_a_batch_runs_its_partitions_in_turn_and_stops_at_the_first_failure():
    ran.clear()
    assert batch_task.fn(square_unless, [(2, {}), (5, {}), (7, {})], [2, 5, 7]) == [4, 25, 49]
    ran.clear()
    failure = SpecError("k", "too large for the table")
    with pytest.raises(PartitionFailed) as caught:
        batch_task.fn(square_unless, [(2, {}), (5, {5: failure}), (7, {})], [2, 5, 7])
    assert caught.value.number == 5 and caught.value.failure is failure
    assert ran == [2, 5]  # the partition after the failure never ran
    assert str(caught.value) == "partition 5: SpecError: " + str(failure)


def test_a_partition_failure_crosses_a_process_boundary_with_its_number_and_error():
    copied = pickle.loads(pickle.dumps(PartitionFailed(3, InputError("HEIGHT", "is not a number in 2 records"))))
    assert copied.number == 3
    assert type(copied.failure) is InputError and str(copied.failure) == str(InputError("HEIGHT", "is not a number in 2 records"))


def test_a_batch_is_retried_unless_its_partition_failed_on_the_input_or_the_spec():
    def retried(failure: BaseException) -> bool:
        return _worth_retrying(batch_task, None, Failed(data=failure))  # type: ignore[arg-type]

    assert not retried(PartitionFailed(0, SpecError("k", "too large")))
    assert not retried(PartitionFailed(4, InputError("AGE", "is missing in 3 records")))
    assert retried(PartitionFailed(4, OSError("no space left on device")))
    assert retried(MemoryError())
    assert not retried(SpecError("k", "too large"))


@flow(persist_result=False)
def stage_of(count: int, failing: dict, per_thread: int = SHARD_TASKS_PER_THREAD) -> list:
    return _on_cluster("test-stage", square_unless, [(number, failing) for number in range(count)], counted=True,
                       per_thread=per_thread)


@pytest.mark.usefixtures("prefect_harness")
def test_a_stage_returns_every_partitions_result_in_order_from_fewer_tasks(monkeypatch):
    submitted: list[int] = []
    original = batch_task.with_options

    def counting(**options):
        step = original(**options)
        submit = step.submit
        step.submit = lambda *args, **kwargs: submitted.append(len(args[2])) or submit(*args, **kwargs)
        return step

    monkeypatch.setattr(release_dask.batch_task, "with_options", counting)
    for per_thread in (SHARD_TASKS_PER_THREAD, TASKS_PER_THREAD):
        ran.clear()
        submitted.clear()
        assert stage_of(10, {}, per_thread) == [number * number for number in range(10)]
        assert sorted(ran) == list(range(10))
        # One worker thread outside a Dask cluster: per_thread tasks, the partitions dealt in turn.
        assert sorted(submitted) == sorted(len(range(first, 10, per_thread)) for first in range(per_thread))
    assert (TASKS_PER_THREAD, SHARD_TASKS_PER_THREAD) == (1, 3) and submitted == [10]  # a stage: one task per thread


@pytest.mark.usefixtures("prefect_harness")
def test_a_stage_raises_the_first_failing_partitions_error_whichever_task_fails_first():
    # Dealt in turn to 3 tasks: 4 is the second task's second partition, 5 the third task's second, 8 the third's
    # third (never run: its task stopped at 5). The error raised is partition 4's, the in-memory path's first.
    failing = {4: InputError("AGE", "is missing in 1 record"), 5: SpecError("k", "too large"), 8: OSError("disk")}
    ran.clear()
    with pytest.raises(InputError) as caught:
        stage_of(9, failing)
    assert str(caught.value) == str(failing[4])
    assert 8 not in ran and {0, 3, 6, 1, 4, 2, 5} <= set(ran)
