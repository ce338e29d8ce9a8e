"""The officer's certificate on the Dask engine: the same figures, by reduction over partitions.

The in-memory path (``tasks/certificate.py``) computes the certificate's figures from the whole table.
A Dask release never holds the table in one process, so every figure is rebuilt here from what the
partitions add up to (docs/certificate.md):

* **risk models**: the published groups' sizes are the gate's recount of the rows written
  (``GroupCounts``); the predicted groups and the source's groups come from the table's histogram of
  distinct k-quasi tuples (which the anonymiser works on anyway); SUDA's special uniques run on that
  histogram with its record counts as weights (``kepsilon.engine.risk.special_uniques``). Sampling
  weights are summed per published group by the publishing partitions.
* **utility**: each source piece (stage A) counts its values of every column released as read and
  its ε-quasis snapped to the published grid; each published part (stage D) counts the released
  values, the (source value, label) pairs of every k-quasi, and the sums Pearson correlations need.
  Distances, generalisation measures and correlations computed from those counts are exactly the
  in-memory ones (``kepsilon.engine.utility``'s ``*_from_*`` functions).
* **classifier utility**: a part's records are in the published order, which is a uniformly random
  order (the release-order keys), and part 0 holds the smallest keys: the first records of the parts,
  in part order, are a uniform random sample of the published records. Each part keeps at most
  ``SAMPLE_ROWS`` of its first records (source and released values, aligned) in the scratch; the
  reduction trains on that sample, as the in-memory path trains on a capped random subset.

Sketches hold private values, so they go through the run's sealed scratch folder like every other
intermediate (``tasks/scratch.py``), never through task results; the reduction (a task on the cluster)
returns figures only.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from kepsilon.engine import risk, utility
from kepsilon.engine.histogram import concat_disjoint
from kepsilon.engine.partition import TupleClasses, published_labels
from kepsilon.engine.perturb import public_grid

from .certificate import (
    _settings,
    declared_population_table,
    group_risk_models,
    source_uniqueness,
    timed_attempts,
)

SOURCE_SKETCH = "certificate-source"  # scratch folder: one sketch per source piece (stage A)
PART_SKETCH = "certificate-part"  # scratch folder: one sketch per published part (stage D)
MISSING = "\x00missing"  # a missing value, counted as a value (``utility.total_variation``'s convention)
SAMPLE_ROWS = int(utility.MAX_TEST_ROWS / 0.2)  # enough for the in-memory caps at a 20 % held-out share


def _grids(spec) -> dict[str, float]:
    return {q.column: public_grid(q.lower, q.upper, eps) for q, eps in zip(spec.roles.e_quasi, spec.epsilon_split().values())}


def _as_read_columns(spec) -> list[str]:
    return spec.roles.names()["sensitive"]


def _value_counts(values: pd.Series) -> pd.Series:
    return values.astype("string").fillna(MISSING).value_counts(sort=False)


def _number_counts(values: pd.Series, grid: float | None) -> pd.Series:
    numbers = pd.to_numeric(values, errors="coerce").to_numpy(dtype=np.float64)
    numbers = numbers[np.isfinite(numbers)]
    if grid:
        numbers = np.round(numbers / grid) * grid
    return pd.Series(numbers).value_counts(sort=False)


def _add_counts(parts: list[pd.Series]) -> pd.Series:
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.Series(dtype=np.float64)
    return pd.concat(parts).groupby(level=0).sum()


def source_sketch(classified: pd.DataFrame, spec) -> dict:
    """Stage A: one source piece's counts — values of the columns released as read, ε-quasis on the
    published grid, and its sampling weights' total."""
    begun = time.perf_counter()
    grids = _grids(spec)
    sketch: dict[str, Any] = {
        "as_read": {column: _value_counts(classified[column]) for column in _as_read_columns(spec)},
        "numbers": {column: _number_counts(classified[column], grids[column]) for column in grids},
        "weight_total": None,
    }
    weight = spec.population.weight_column if spec.population is not None else None
    if weight is not None:
        sketch["weight_total"] = float(pd.to_numeric(classified[weight], errors="coerce").sum())
    sketch["seconds"] = time.perf_counter() - begun
    return sketch


def source_columns(spec) -> list[str]:
    """The source columns stage C keeps beside each candidate record for stage D's sketch."""
    names = spec.roles.names()
    return [*names["k_quasi"], *names["e_quasi"]]


def part_sketch(frame: pd.DataFrame, source: pd.DataFrame, keys: np.ndarray, spec) -> dict:
    """Stage D: one published part's counts. ``frame``: its released records in the published order;
    ``source``: the same records' source k-quasi and ε-quasi values; ``keys``: their group keys."""
    begun = time.perf_counter()
    names = spec.roles.names()
    e_quasi = names["e_quasi"]
    sample_source = frame.iloc[:SAMPLE_ROWS].copy()  # the released columns, with the source's values where they differ
    for column in source.columns:
        sample_source[column] = source[column].to_numpy()[:SAMPLE_ROWS]
    sketch = {
        "records": int(len(frame)),
        "as_read": {column: _value_counts(frame[column]) for column in _as_read_columns(spec)},
        "numbers": {column: _number_counts(frame[column], None) for column in e_quasi},
        "pairs": {
            column: pd.DataFrame({"value": source[column].to_numpy(), "label": frame[column].astype(str).to_numpy()})
            .value_counts(sort=False, dropna=False).rename("records").reset_index()
            for column in names["k_quasi"]
        },
        "moments_source": utility.moments(source, e_quasi) if len(e_quasi) > 1 else None,
        "moments_released": utility.moments(frame, e_quasi) if len(e_quasi) > 1 else None,
        "weight_sums": None,
        "sample_source": sample_source.reset_index(drop=True),
        "sample_released": frame.iloc[:SAMPLE_ROWS].reset_index(drop=True),
    }
    weight = spec.population.weight_column if spec.population is not None else None
    if weight is not None:
        weights = pd.to_numeric((source if weight in source.columns else frame)[weight], errors="coerce").to_numpy(dtype=np.float64)
        sketch["weight_sums"] = pd.Series(weights).groupby(np.asarray(keys, dtype=np.int64)).sum()
    sketch["seconds"] = time.perf_counter() - begun
    return sketch


def histogram_with_classes(scratch, buckets: int, levels: dict | None):
    """The table's histogram and the anonymiser's class of each tuple, from the shards in the scratch folder.

    Read on a worker (by the tasks below), never in the flow's process: the shards (``tasks/shards.py``)
    are disjoint, so their tuples one after the other are the whole histogram, and ``shard-classes`` holds
    each shard's classes in the shard's order. Every figure computed from it here is order-independent.
    This one task holds the whole histogram (``docs/dask.md``: a limit at very many distinct tuples).
    """
    shards = [scratch.read("shard", bucket) for bucket in range(buckets)]
    class_of_tuple = np.concatenate(
        [scratch.read("shard-classes", bucket)[1] for bucket in range(buckets)] or [np.zeros(0, dtype=np.int64)])
    return concat_disjoint(shards), TupleClasses(class_of_tuple, pd.DataFrame(), {}, levels)


def dask_certificate_figures(spec, scratch, source_pieces: int, parts: int, buckets: int, levels: dict | None,
                             hierarchies: dict, written, coder, suppressed: int) -> dict:
    """The certificate's figures of a Dask release, from the shards' histogram, the written groups and the sketches.

    ``written``: the published groups as recounted from the rows written (``GroupCounts``);
    ``suppressed``: every record not published. Same structure as ``certificate_figures``; a figure
    that cannot be computed says so and why, it never fails the release.
    """
    started = time.perf_counter()
    histogram, classes = histogram_with_classes(scratch, buckets, levels)
    settings = _settings(spec)
    k_quasi = [q.column for q in spec.roles.k_quasi]
    timings: dict[str, float] = {}
    timed = timed_attempts(timings)

    sources = [scratch.read(SOURCE_SKETCH, piece) for piece in range(source_pieces)]
    sketches = [scratch.read(PART_SKETCH, part) for part in range(parts) if scratch.exists(PART_SKETCH, part)]
    weight_total = None
    if spec.population is not None and spec.population.weight_column is not None:
        weight_total = sum(s["weight_total"] for s in sources)
    population_table = declared_population_table(spec, k_quasi)

    def published():
        weight_sums = None
        if weight_total is not None:
            sums = _add_counts([s["weight_sums"] for s in sketches if s["weight_sums"] is not None])
            weight_sums = sums.reindex(written.keys, fill_value=0.0).to_numpy(dtype=np.float64)
        labels = coder.labels(written.keys) if population_table is not None else None
        return group_risk_models(written.sizes, spec, hierarchies, weight_sums, labels, population_table)

    def predicted():
        if weight_total is not None:
            return {"computed": False, "reason": "sampling weights are not summed per predicted group on the Dask engine"}
        sizes, labels = predicted_groups(histogram, classes, hierarchies, k_quasi)
        return group_risk_models(sizes, spec, hierarchies, None, labels if population_table is not None else None, population_table)

    figures: dict = {"computed": True, "engine": "dask"}
    figures["risk"] = {
        "published": timed("risk_published", published),
        "predicted": timed("risk_predicted", predicted),
        "source": timed("source_uniqueness", lambda: source_uniqueness(histogram.weights, spec, weight_total, population_table)),
        "special_uniques": timed("special_uniques", lambda: risk.special_uniques(
            histogram.tuples[k_quasi], k_quasi, settings.suda_max_size, weights=histogram.weights)),
    }
    figures["utility"] = timed("utility", lambda: _utility(spec, hierarchies, sources, sketches, written, suppressed))
    figures["seconds"] = round(time.perf_counter() - started, 3)
    figures["seconds_by_part"] = timings
    # What the partitions spent on the sketches, added up over them (they run in parallel on the workers).
    figures["seconds_in_partitions"] = round(sum(s.get("seconds", 0.0) for s in [*sources, *sketches]), 3)
    return figures


def predicted_groups(histogram, classes, hierarchies: dict, k_quasi: list[str]) -> tuple[np.ndarray, pd.DataFrame]:
    """The anonymiser's groups from the histogram: per group (label combination) its records and labels,
    each class labelled as it would be published if no record were suppressed later."""
    kept = classes.class_of_tuple >= 0
    tuples = histogram.tuples[k_quasi][kept].reset_index(drop=True)
    labels = published_labels(tuples, classes.class_of_tuple[kept], np.ones(len(tuples), dtype=bool), hierarchies, classes.levels)
    if not len(labels):
        return np.zeros(0), labels
    codes = labels.groupby(k_quasi, sort=False, dropna=False, observed=True).ngroup().to_numpy()
    sizes = np.bincount(codes, weights=histogram.weights[kept])
    firsts = pd.Series(np.arange(len(codes))).groupby(codes).first().to_numpy()
    return sizes, labels.iloc[firsts].reset_index(drop=True)


def refuse_risk_over_limits_on_histogram(histogram, classes, hierarchies: dict, spec) -> dict | None:
    """``refuse_risk_over_limits`` on the Dask engine: the anonymiser's groups from the histogram, before ε."""
    from .certificate import check_risk_limits

    if spec.max_journalist_risk is None and spec.max_marketer_risk is None:
        return None
    k_quasi = [q.column for q in spec.roles.k_quasi]
    sizes, labels = predicted_groups(histogram, classes, hierarchies, k_quasi)
    with_table = spec.population is not None and spec.population.table is not None
    return check_risk_limits(group_risk_models(sizes, spec, hierarchies, None, labels if with_table else None), spec)


def _utility(spec, hierarchies: dict, sources: list[dict], sketches: list[dict], written, suppressed: int) -> dict:
    """``utility_report``'s figures from the pieces' and parts' counts."""
    names = spec.roles.names()
    bounds = {q.column: q.upper - q.lower for q in spec.roles.e_quasi}
    columns: dict = {}
    for column in names["k_quasi"]:
        pairs = pd.concat([s["pairs"][column] for s in sketches], ignore_index=True) if sketches else pd.DataFrame(
            {"value": [], "label": [], "records": []})
        pairs = pairs.groupby(["value", "label"], sort=False, dropna=False)["records"].sum().reset_index()
        columns[column] = {"kind": "generalised", **utility.generalisation_from_pairs(pairs, hierarchies[column])}
    for column in names["e_quasi"]:
        columns[column] = {"kind": "noised", **utility.numeric_distances_from_counts(
            _add_counts([s["numbers"][column] for s in sources]), _add_counts([s["numbers"][column] for s in sketches]),
            bounds.get(column))}
    for column in _as_read_columns(spec):
        columns[column] = {"kind": "as read (records removed only)", "total_variation": utility.total_variation_from_counts(
            _add_counts([s["as_read"][column] for s in sources]), _add_counts([s["as_read"][column] for s in sketches]))}
    # In the published column order (the source's), as the in-memory report lists them.
    released = list(sketches[0]["sample_released"].columns) if sketches else list(columns)
    ordered = {column: columns[column] for column in released if column in columns}
    correlations = None
    if len(names["e_quasi"]) > 1 and sketches:
        correlations = utility.correlations_from_moments(
            names["e_quasi"], utility.add_moments([s["moments_source"] for s in sketches]),
            utility.add_moments([s["moments_released"] for s in sketches]))
    published = int(written.sizes.sum())
    report: dict[str, Any] = {
        "columns": ordered,
        "correlations": correlations,
        "discernibility": utility.discernibility(written.sizes, suppressed, published + suppressed),
        "classes": int(len(written.sizes)),
    }
    target = _settings(spec).utility_target
    if target is None:
        report["classifier"] = {"computed": False, "reason": "no utility_target named in the spec's certificate settings"}
    else:
        begun = time.perf_counter()
        source, release = _sample(sketches)
        report["classifier"] = utility.classifier_utility(source[release.columns], release, target, names["e_quasi"])
        report["classifier"]["sampled_from"] = published
        report["classifier"]["seconds"] = round(time.perf_counter() - begun, 3)
    return report


def _sample(sketches: list[dict]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The first ``SAMPLE_ROWS`` published records in the published order (a uniform random sample)."""
    source, released, have = [], [], 0
    for sketch in sketches:  # in part order: part 0 holds the smallest order keys
        take = min(SAMPLE_ROWS - have, len(sketch["sample_released"]))
        source.append(sketch["sample_source"].iloc[:take])
        released.append(sketch["sample_released"].iloc[:take])
        have += take
        if have >= SAMPLE_ROWS:
            break
    return pd.concat(source, ignore_index=True), pd.concat(released, ignore_index=True)


WRITTEN_GROUPS = "written-groups"
"""The scratch name of the published groups' counts (``GroupCounts``) the certificate task reads: passed by
reference, since they grow with the groups and would otherwise travel inside the task graph."""


@task(name="certificate-figures", cache_policy=NO_CACHE, persist_result=False)
def dask_certificate_task(spec, scratch, source_pieces: int, parts: int, buckets: int, levels: dict | None,
                          hierarchies: dict, coder, suppressed: int) -> dict:
    """Prefect task: the certificate's figures of a Dask release (reads the shards, the sketches and the
    published groups, ``WRITTEN_GROUPS``, from the scratch)."""
    written = scratch.read(WRITTEN_GROUPS)
    return dask_certificate_figures(spec, scratch, source_pieces, parts, buckets, levels, hierarchies, written, coder,
                                    suppressed)


def refuse_risk_over_limits_on_shards(scratch, buckets: int, levels: dict | None, hierarchies: dict, spec) -> dict | None:
    """``refuse_risk_over_limits_on_histogram`` on the histogram read from the shards (run on a worker)."""
    histogram, classes = histogram_with_classes(scratch, buckets, levels)
    return refuse_risk_over_limits_on_histogram(histogram, classes, hierarchies, spec)


@task(name="risk-limits", cache_policy=NO_CACHE, persist_result=False)
def risk_limits_task(scratch, buckets: int, levels: dict | None, hierarchies: dict, spec) -> dict | None:
    """Prefect task: the journalist and marketer gates before ε, on a worker (the flow never holds the histogram)."""
    return refuse_risk_over_limits_on_shards(scratch, buckets, levels, hierarchies, spec)
