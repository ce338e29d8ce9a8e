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


def test_each_case_reports_the_machines_speed_probe_beside_its_figures():
    """The probe (CPU seconds of a fixed piece of work, taken before a case) is printed on the case's line, and a
    case recorded before it existed prints it as unknown instead of failing."""
    case = {
        "name": "fine-10m", "rows": 10_000_000, "seconds": 54.2, "distinct_tuples": 1_811_089, "classes": 346_590,
        "load_average_before": [1.8], "load_average_after": [2.2], "peak_rss_mb": {"dask-worker-0": 637.4},
        "partition_work": {"us_per_record_per_core_cpu": 7.88, "us_per_record_per_core_stage_time": 6.3,
                           "partition_stages_cpu_us_per_record": 5.38},
    }
    assert "speed probe 0.128 s" in scale.fine_report([{**case, "speed_probe_cpu_s": 0.128}])
    assert "speed probe nan s" in scale.fine_report([case])
    probe = scale.speed_probe(repeats=1)
    assert isinstance(probe, float) and probe > 0
