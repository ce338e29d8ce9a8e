"""make bench-scale's per-record figures: what each counts (benchmarks/scale.py)."""

from benchmarks import scale


def test_the_partitions_own_stages_count_their_worker_cpu_and_nothing_else():
    """The record partitions' stages (intake to publication) are summed; the shard steps (the histogram's merge,
    Mondrian's, the certificate's) and the flow-side steps are not, and a stage the workers spent nothing on adds 0."""
    stages = {
        "intake": {"worker_cpu_seconds": 25.08},
        "merge-histogram": {"worker_cpu_seconds": 4.26},
        "mondrian-subtree": {"worker_cpu_seconds": 8.26},
        "distribute": {"worker_cpu_seconds": 3.13},
        "predict": {"worker_cpu_seconds": 4.24},
        "reserve-epsilon": {"task_seconds": 0.02},
        "perturb-suppress": {"worker_cpu_seconds": 27.94},
        "publish-part": {"worker_cpu_seconds": 17.91},
        "certificate-shard": {"worker_cpu_seconds": 2.61},
    }
    assert scale.partition_stages_cpu_us(stages, 10_000_000) == 7.83  # (25.08 + 3.13 + 4.24 + 27.94 + 17.91) / 10M
    assert scale.partition_stages_cpu_us({"merge-histogram": {"worker_cpu_seconds": 4.0}}, 1_000_000) == 0.0
