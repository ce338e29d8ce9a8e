"""`make bench-scale` keeps the cluster's log when a worker was replaced or the series stopped, and only then."""

import stat

import pytest

from benchmarks import scale


def _results(replaced: bool) -> dict:
    peaks = {"dask-worker-0": 900.0, **({"service-child-4242": 700.0} if replaced else {})}
    return {"recorded_at": "2026-11-29T11:00:00Z", "fixed_cost_case": {"peak_rss_mb": {"dask-worker-0": 400.0}},
            "cases": [{"name": "fine-1m", "peak_rss_mb": peaks}]}


@pytest.mark.parametrize("replaced, completed, kept", [(False, True, False), (True, True, True), (False, False, True)])
def test_the_log_is_kept_when_a_worker_was_replaced_or_the_series_stopped(tmp_path, monkeypatch, replaced, completed, kept):
    services = tmp_path / "services"
    services.mkdir()
    (services / "dask.log").write_text("Worker exceeded 95% memory budget. Restarting\n")
    monkeypatch.setattr(scale, "__file__", str(tmp_path / "benchmarks" / "scale.py"))
    (tmp_path / "benchmarks").mkdir()
    path = scale._keep_cluster_log(services, _results(replaced), completed)
    if not kept:
        assert path is None and not (tmp_path / "benchmarks" / ".logs").exists()
        return
    assert path == tmp_path / "benchmarks" / ".logs" / "scale-2026-11-29T110000Z-dask.log"
    assert path.read_text() == "Worker exceeded 95% memory budget. Restarting\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_a_replaced_worker_is_a_new_process_under_the_nanny():
    assert scale._replaced_workers({"peak_rss_mb": {"service-child-13038": 1168.1}})
    assert not scale._replaced_workers({"peak_rss_mb": {"dask-worker-0": 851.0, "dask-workers-child-12704": 12.8}})
