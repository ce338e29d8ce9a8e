"""The officer's certificate on the Dask engine: the same figures, by reduction over partitions.

The in-memory path (``tasks/certificate.py``) computes the certificate's figures from the whole table.
A Dask release never holds the table in one process, so every figure is rebuilt here from what the
partitions add up to (docs/certificate.md):

* **risk models**: the published groups' sizes are the gate's recount of the rows written
  (``GroupCounts``), their sampling weights summed per group by the publishing partitions (stage D).
  The predicted groups (the anonymiser's, before the noise) are counted by each class partition,
  which holds whole classes, with the in-memory path's own labelling, records and weights summed per
  label combination, then added up (``PREDICTED_SKETCH``). The source's groups (distinct k-quasi
  tuples) are counted by each shard of the histogram as a frequency of frequencies, all that the
  uniqueness estimators need. SUDA's special uniques by a shuffle over the shards: each shard sends
  its records per value combination of every searched column set to the shard that owns the
  combination's hash, which adds them up and answers which combinations one record holds; each shard
  then finds its own minimal sample uniques and adds its part of the figures (``SHARD_SKETCH``). No
  task reads every shard: the reduction reads per-shard and per-partition tables only.
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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from kepsilon.engine import risk, utility
from kepsilon.engine.partition import label_table, published_label_codes
from kepsilon.engine.perturb import public_grid

from .certificate import (
    _settings,
    check_risk_limits,
    declared_population_table,
    group_risk_models,
    source_uniqueness_of_size_counts,
    timed_attempts,
)
from .counting import (
    by_target,
    combination_codes,
    first_occurrences,
    slices_by_target,
    value_pair_counts,
)
from .errors import InputError, SpecError
from .text_codes import concat_shuffled

Each = Callable[[str, Callable, list[tuple]], list]  # as tasks/shards.py: a task per argument tuple

SOURCE_SKETCH = "certificate-source"  # scratch folder: one sketch per source piece (stage A)
PART_SKETCH = "certificate-part"  # scratch folder: one sketch per published part (stage D)
PREDICTED_SKETCH = "certificate-predicted"  # scratch folder: the predicted groups of one class partition
SHARD_SKETCH = "certificate-shard"  # scratch folder: one shard's source group sizes and SUDA part
PROJECTIONS = "certificate-projections"  # (owner shard, sending shard): records per value combination
ANSWERS = "certificate-answers"  # (owner shard, sending shard): which of the sent combinations one record holds
CERTIFICATE_SKETCHES = (SOURCE_SKETCH, PART_SKETCH, PREDICTED_SKETCH, SHARD_SKETCH)  # removed after the figures
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
    weight = _weight_column(spec)
    if weight is not None:
        weights = pd.to_numeric(classified[weight], errors="coerce").to_numpy(dtype=np.float64)
        sketch["weight_total"] = float(weights.sum())
        # What ``certificate._weights`` refuses in memory: a weight that is not a positive number.
        sketch["weight_invalid"] = int((~np.isfinite(weights) | (weights <= 0)).sum())
    sketch["seconds"] = time.perf_counter() - begun
    return sketch


def _weight_column(spec) -> str | None:
    return spec.population.weight_column if spec.population is not None else None


def check_weights(spec, sources: list[dict]) -> float | None:
    """The sampling weights' total over every source piece, or None without a weight column; refuses, as the
    in-memory path does, a weight that is not a positive number (by column, never by value)."""
    weight = _weight_column(spec)
    if weight is None:
        return None
    if any(s.get("weight_invalid", 0) for s in sources):
        raise InputError(weight, "sampling weights must be positive numbers")
    return float(sum(s["weight_total"] for s in sources))


def source_columns(spec) -> list[str]:
    """The source columns stage C keeps beside each candidate record for stage D's sketch."""
    names = spec.roles.names()
    return [*names["k_quasi"], *names["e_quasi"]]


def part_sketch(frame: pd.DataFrame, source: pd.DataFrame, keys: np.ndarray, spec,
                pair_codes: dict[str, tuple[np.ndarray, np.ndarray]] | None = None) -> dict:
    """Stage D: one published part's counts. ``frame``: its released records in the published order;
    ``source``: the same records' source k-quasi and ε-quasi values; ``keys``: their group keys;
    ``pair_codes``: per k-quasi, its source values' and labels' codes where stage D has them
    (``value_pair_counts``)."""
    begun = time.perf_counter()
    names = spec.roles.names()
    e_quasi = names["e_quasi"]
    sample_source = frame.iloc[:SAMPLE_ROWS].copy()  # the released columns, with the source's values where they differ
    for column in source.columns:
        sample_source[column] = source[column].iloc[:SAMPLE_ROWS].to_numpy()  # the sample's rows only, as NumPy
    sketch = {
        "records": int(len(frame)),
        "as_read": {column: _value_counts(frame[column]) for column in _as_read_columns(spec)},
        "numbers": {column: _number_counts(frame[column], None) for column in e_quasi},
        "pairs": {column: value_pair_counts(source[column], frame[column].astype(str), (pair_codes or {}).get(column))
                  for column in names["k_quasi"]},
        "moments_source": utility.moments(source, e_quasi) if len(e_quasi) > 1 else None,
        "moments_released": utility.moments(frame, e_quasi) if len(e_quasi) > 1 else None,
        "weight_sums": None,
        "sample_source": sample_source.reset_index(drop=True),
        "sample_released": frame.iloc[:SAMPLE_ROWS].reset_index(drop=True),
    }
    weight = _weight_column(spec)
    if weight is not None:
        weights = pd.to_numeric((source if weight in source.columns else frame)[weight], errors="coerce").to_numpy(dtype=np.float64)
        sketch["weight_sums"] = pd.Series(weights).groupby(np.asarray(keys, dtype=np.int64)).sum()
    sketch["seconds"] = time.perf_counter() - begun
    return sketch


# --------------------------------------------------------------------------- predicted groups (class partitions)


def predicted_sketch(kept: pd.DataFrame, class_ids: np.ndarray, spec, hierarchies: dict, levels: dict | None,
                     leaf_codes: dict[str, np.ndarray] | None = None,
                     label_codes: dict[str, np.ndarray] | None = None) -> dict:
    """One class partition's predicted groups: per label combination its records and sampling weights' sum.

    A class partition holds whole classes, so each record's label is the in-memory path's
    (``certificate.predicted_labels``: every kept record published); a label combination may still
    come from classes of several partitions, hence the reduction by labels (:func:`add_predicted`).
    The combinations are counted on the labels' numbers, in order of first occurrence, and only each
    combination's first record's labels become text. ``leaf_codes``: as ``published_label_codes`` takes them;
    ``label_codes``: its codes with every record published, when the caller has them (stage C does).
    """
    k_quasi = [q.column for q in spec.roles.k_quasi]
    numbers = label_codes if label_codes is not None else published_label_codes(
        kept[k_quasi], class_ids, np.ones(len(kept), dtype=bool), hierarchies, levels, leaf_codes)
    distinct = {column: label_table(hierarchies[column])[1] for column in k_quasi}
    combined = combination_codes({column: (numbers[column], len(distinct[column])) for column in k_quasi}, k_quasi, len(kept))
    codes, firsts = first_occurrences(combined)
    groups = len(firsts)
    weight = _weight_column(spec)
    weight_sums = None
    if weight is not None:
        weights = pd.to_numeric(kept[weight], errors="coerce").to_numpy(dtype=np.float64)
        weight_sums = np.bincount(codes, weights=weights, minlength=groups)
    labels = pd.DataFrame({column: distinct[column].take(numbers[column][firsts]) for column in k_quasi})
    return {"labels": labels, "records": np.bincount(codes, minlength=groups), "weight_sums": weight_sums}


def predicted_partition(index: int, pieces: int, scratch, spec, hierarchies: dict, levels: dict | None) -> int:
    """Before ε: :func:`predicted_sketch` of class partition ``index`` (``shuffle``) into the scratch.
    Returns its groups' number (no value). Stage C does the same when it finds none."""
    loaded = scratch.read_present("shuffle", index, count=pieces)
    if not loaded:
        sketch = {"labels": pd.DataFrame(), "records": np.zeros(0, dtype=np.int64), "weight_sums": None}
    else:
        kept, class_ids, _ = concat_shuffled(loaded, set())  # every column as the text it was
        sketch = predicted_sketch(kept, class_ids, spec, hierarchies, levels)
    scratch.write(sketch, PREDICTED_SKETCH, index)
    return len(sketch["records"])


def add_predicted(sketches: list[dict], k_quasi: list[str]) -> tuple[np.ndarray, pd.DataFrame, np.ndarray | None]:
    """The partitions' predicted groups added up by label combination: sizes, labels, weight sums."""
    sketches = [s for s in sketches if len(s["records"])]
    if not sketches:
        return np.zeros(0), pd.DataFrame({column: pd.Series([], dtype=str) for column in k_quasi}), None
    labels = pd.concat([s["labels"] for s in sketches], ignore_index=True)
    codes = labels.groupby(k_quasi, sort=False, dropna=False, observed=True).ngroup().to_numpy()
    groups = int(codes.max()) + 1
    sizes = np.bincount(codes, weights=np.concatenate([s["records"] for s in sketches]), minlength=groups)
    weight_sums = None
    if sketches[0]["weight_sums"] is not None:
        weight_sums = np.bincount(codes, weights=np.concatenate([s["weight_sums"] for s in sketches]), minlength=groups)
    firsts = np.full(groups, len(codes), dtype=np.int64)
    np.minimum.at(firsts, codes, np.arange(len(codes), dtype=np.int64))
    return sizes, labels.iloc[firsts].reset_index(drop=True), weight_sums


def predicted_risk_models(spec, scratch, parts: int, source_pieces: int, hierarchies: dict,
                          population_table: pd.DataFrame | None) -> dict:
    """The predicted groups' risk models from the class partitions' sketches (``certificate.risk_models`` of
    ``predicted_labels`` in memory), with the sampling weights checked as the in-memory path checks them."""
    check_weights(spec, [scratch.read(SOURCE_SKETCH, piece) for piece in range(source_pieces)])
    k_quasi = [q.column for q in spec.roles.k_quasi]
    sizes, labels, weight_sums = add_predicted(
        scratch.read_present(PREDICTED_SKETCH, count=parts), k_quasi)
    with_table = population_table is not None or (spec.population is not None and spec.population.table is not None)
    return group_risk_models(sizes, spec, hierarchies, weight_sums, labels if with_table else None, population_table)


def check_predicted_risk(scratch, parts: int, source_pieces: int, hierarchies: dict, spec) -> dict:
    """``refuse_risk_over_limits`` on the Dask engine (a task on the cluster): the partitions' predicted groups."""
    return check_risk_limits(predicted_risk_models(spec, scratch, parts, source_pieces, hierarchies, None), spec)


def refuse_risk_over_limits_on_partitions(spec, scratch, pieces: int, levels: dict | None, hierarchies: dict,
                                          each: Each) -> dict | None:
    """The journalist and marketer gates before ε: each class partition counts its predicted groups on a
    worker, one task adds them up and checks the limits. None when no gate is set."""
    if spec.max_journalist_risk is None and spec.max_marketer_risk is None:
        return None
    each("predicted-groups", predicted_partition, [(index, pieces, scratch, spec, hierarchies, levels)
                                                   for index in range(pieces)])
    (result,) = each("risk-limits", check_predicted_risk, [(scratch, pieces, pieces, hierarchies, spec)])
    return result


# --------------------------------------------------------------------------- the source's groups (shards)


def shard_sketches(spec, scratch, buckets: int, each: Each, hierarchies: dict) -> str | None:
    """The shards' part of the certificate (``SHARD_SKETCH``): each shard's groups' sizes and its part of SUDA's
    figures, through the shuffle of the module docstring. Returns None, or why the figures could not be
    made (the certificate then says so: it never fails a release)."""
    k_quasi = [q.column for q in spec.roles.k_quasi]
    try:
        combinations = risk.suda_combinations(k_quasi, _settings(spec).suda_max_size)
        widths = {column: len(hierarchies[column].leaves) for column in k_quasi}
        if np.prod([float(width) for width in widths.values()]) >= 2.0**62:
            raise SpecError("roles.k_quasi", "the hierarchies' leaves are too many to number value combinations")
        each("certificate-projections", send_projections, [(scratch, b, combinations, buckets, hierarchies) for b in range(buckets)])
        each("certificate-uniques", answer_projections, [(scratch, b, combinations, buckets) for b in range(buckets)])
        each("certificate-shard", shard_sketch, [(scratch, b, spec, combinations, buckets, hierarchies) for b in range(buckets)])
        return None
    except (SpecError, InputError) as error:
        return str(error)
    except Exception as error:  # noqa: BLE001 - a figure that fails must not fail the release
        return type(error).__name__
    finally:
        scratch.remove(PROJECTIONS)
        scratch.remove(ANSWERS)


def _leaf_codes(shard, columns: list[str], hierarchies: dict) -> dict[str, tuple[np.ndarray, int]]:
    """Per searched column, each of the shard's tuples' leaf code in the column's hierarchy and the number
    of leaves: codes that are the same in every shard (a tuple's k-quasi values are leaves of the public
    hierarchies), so that a value combination is one integer wherever it is met."""
    return {column: (hierarchies[column].leaf_codes(shard.tuples[column]), len(hierarchies[column].leaves))
            for column in columns}


def _projections(shard, combination: tuple[str, ...], buckets: int,
                 codes: dict[str, tuple[np.ndarray, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A shard's distinct values on ``combination``: each tuple's projection, the projections (as numbers:
    the combination's leaf codes in mixed radix, below 2⁶² as ``shard_sketches`` checks), their records,
    and the shard that owns each projection (by a hash of its number, the same in every shard).
    ``codes``: the shard's tuples' :func:`_leaf_codes`, made once for all the combinations."""
    number = np.zeros(len(shard.tuples), dtype=np.int64)
    for column in combination:
        code, width = codes[column]
        number = number * width + code
    of_tuple, firsts = first_occurrences(number)
    projections = number[firsts]
    records = np.bincount(of_tuple, weights=shard.weights, minlength=len(firsts))
    return of_tuple, projections, records, _owners(projections, buckets)


def _owners(projections: np.ndarray, buckets: int) -> np.ndarray:
    """The shard owning each projection: Fibonacci hashing of its number (spreads consecutive numbers)."""
    if buckets == 1:
        return np.zeros(len(projections), dtype=np.int64)
    mixed = projections.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)  # wraps modulo 2⁶⁴, as meant
    return ((mixed >> np.uint64(32)) % np.uint64(buckets)).astype(np.int64)


def _searched_columns(combinations: list[tuple[str, ...]]) -> list[str]:
    return list(dict.fromkeys(column for combination in combinations for column in combination))


def send_projections(scratch, bucket: int, combinations: list[tuple[str, ...]], buckets: int, hierarchies: dict) -> int:
    """Round 1, per shard: its records per value combination of every searched column set, each to the
    shard owning the combination (``PROJECTIONS``, owner, this shard). Returns the tuples read."""
    shard = scratch.read("shard", bucket)
    codes = _leaf_codes(shard, _searched_columns(combinations), hierarchies)
    outgoing: list[dict] = [{} for _ in range(buckets)]
    for number, combination in enumerate(combinations):
        _, projections, records, owner = _projections(shard, combination, buckets, codes)
        order, slices = slices_by_target(owner, buckets)
        projections, records = projections[order], records[order]  # owner by owner, in order
        for target, rows in enumerate(slices):
            outgoing[target][number] = (projections[rows], records[rows])
    for target in range(buckets):
        scratch.write(outgoing[target], PROJECTIONS, target, bucket)
    return len(shard)


def answer_projections(scratch, owner: int, combinations: list[tuple[str, ...]], buckets: int) -> int:
    """Round 2, per owning shard: the records of each combination it owns added up over every sender; each
    sender is told which of the combinations it sent one record holds (``ANSWERS``, owner, sender)."""
    received = [scratch.read(PROJECTIONS, owner, sender) for sender in range(buckets)]
    answers: list[dict] = [{} for _ in range(buckets)]
    uniques = 0
    for number in range(len(combinations)):
        projections = np.concatenate([np.zeros(0, dtype=np.int64), *(part[number][0] for part in received)])
        records = np.concatenate([np.zeros(0), *(part[number][1] for part in received)])
        codes, _ = pd.factorize(projections)
        total = np.bincount(codes, weights=records)
        one = total[codes] == 1 if len(codes) else np.zeros(0, dtype=bool)
        uniques += int(one.sum())
        start = 0
        for sender, part in enumerate(received):
            sent = len(part[number][1])
            answers[sender][number] = one[start:start + sent]
            start += sent
    for sender in range(buckets):
        scratch.write(answers[sender], ANSWERS, owner, sender)
    return uniques


def shard_sketch(scratch, bucket: int, spec, combinations: list[tuple[str, ...]], buckets: int, hierarchies: dict) -> int:
    """Round 3, per shard: which of its tuples each column set singles out (from the owners' answers), its
    minimal sample uniques and its part of SUDA's figures, and its groups' sizes (``SHARD_SKETCH``)."""
    shard = scratch.read("shard", bucket)
    answers = [scratch.read(ANSWERS, owner, bucket) for owner in range(buckets)]
    unique_on: dict[tuple[str, ...], np.ndarray] = {}
    codes = _leaf_codes(shard, _searched_columns(combinations), hierarchies)
    for number, combination in enumerate(combinations):
        of_tuple, _, _, owner = _projections(shard, combination, buckets, codes)
        one = np.zeros(len(owner), dtype=bool)
        order, runs = by_target(owner)
        for target, rows in runs:
            one[order[rows]] = answers[target][number]  # in the order the projections were sent
        unique_on[combination] = one[of_tuple]
    k_quasi = [q.column for q in spec.roles.k_quasi]
    max_size = _settings(spec).suda_max_size
    msus = risk.minimal_sample_uniques_given(k_quasi, max_size, unique_on.__getitem__)
    scratch.write({"sizes": risk.size_histogram(shard.weights) if len(shard) else {},
                   "suda": risk.special_uniques_part(msus, len(shard), k_quasi, max_size, shard.weights)},
                  SHARD_SKETCH, bucket)
    return len(shard)


# --------------------------------------------------------------------------- the reduction


def dask_certificate_figures(spec, scratch, source_pieces: int, parts: int, buckets: int, hierarchies: dict,
                             written, coder, suppressed: int, shards_failed: str | None = None) -> dict:
    """The certificate's figures of a Dask release, from the partitions' and shards' sketches and the written groups.

    ``written``: the published groups as recounted from the rows written (their ``keys`` and ``sizes``:
    ``GroupSizes``, or a ``GroupCounts``);
    ``suppressed``: every record not published; ``shards_failed``: why :func:`shard_sketches` could
    not run, if it could not. Same structure as ``certificate_figures``; a figure that cannot be
    computed says so and why, it never fails the release.
    """
    started = time.perf_counter()
    settings = _settings(spec)
    k_quasi = [q.column for q in spec.roles.k_quasi]
    timings: dict[str, float] = {}
    timed = timed_attempts(timings)

    sources = [scratch.read(SOURCE_SKETCH, piece) for piece in range(source_pieces)]
    sketches = read_part_sketches(scratch, parts)
    population_table = declared_population_table(spec, k_quasi)

    def published():
        weight_total = check_weights(spec, sources)
        weight_sums = None
        if weight_total is not None:
            sums = _add_counts([s["weight_sums"] for s in sketches if s["weight_sums"] is not None])
            weight_sums = sums.reindex(written.keys, fill_value=0.0).to_numpy(dtype=np.float64)
        labels = coder.labels(written.keys) if population_table is not None else None
        return group_risk_models(written.sizes, spec, hierarchies, weight_sums, labels, population_table)

    def from_shards(name: str, compute) -> dict:
        if shards_failed is not None:
            return {"computed": False, "reason": shards_failed}
        return timed(name, lambda: compute([scratch.read(SHARD_SKETCH, bucket) for bucket in range(buckets)]))

    def source(shards: list[dict]) -> dict:
        weight_total = check_weights(spec, sources)
        sizes = risk.add_size_counts([shard["sizes"] for shard in shards])
        return source_uniqueness_of_size_counts(sizes, spec, weight_total, population_table)

    figures: dict = {"computed": True, "engine": "dask"}
    figures["risk"] = {
        "published": timed("risk_published", published),
        "predicted": timed("risk_predicted", lambda: predicted_risk_models(
            spec, scratch, parts, source_pieces, hierarchies, population_table)),
        "source": from_shards("source_uniqueness", source),
        "special_uniques": from_shards("special_uniques", lambda shards: risk.special_uniques_of_parts(
            [shard["suda"] for shard in shards], k_quasi, settings.suda_max_size)),
    }
    figures["utility"] = timed("utility", lambda: _utility(spec, hierarchies, sources, sketches, written, suppressed))
    figures["seconds"] = round(time.perf_counter() - started, 3)
    figures["seconds_by_part"] = timings
    # What the partitions spent on the sketches, added up over them (they run in parallel on the workers).
    figures["seconds_in_partitions"] = round(sum(s.get("seconds", 0.0) for s in [*sources, *sketches]), 3)
    return figures


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


def read_part_sketches(scratch, parts: int) -> list[dict]:
    """The published parts' sketches, read one at a time, each part's sample kept only where :func:`_sample`
    takes from it: every part keeps up to ``SAMPLE_ROWS`` records (it cannot know how many the parts before it
    publish), but part 0 alone nearly always fills the sample, and 60 parts' samples held some 0.19 GB."""
    sketches, have = [], 0
    for part in range(parts):
        if not scratch.exists(PART_SKETCH, part):
            continue
        sketch = scratch.read(PART_SKETCH, part)
        if have >= SAMPLE_ROWS:  # none of it taken: the columns kept, no row (a slice would keep its buffers)
            for name in ("sample_source", "sample_released"):
                sketch[name] = pd.DataFrame(columns=sketch[name].columns).astype(sketch[name].dtypes.to_dict())
        have += len(sketch["sample_released"])
        sketches.append(sketch)
    return sketches


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


WRITTEN_SIZES = "written-sizes"
"""The scratch name of one bucket's written groups as the certificate reads them (``GroupSizes``: keys and
records), written by the gate's reduction (``tasks/group_reduction.gate_groups``), one piece per bucket."""


@dataclass
class GroupSizes:
    """Published groups' keys, sorted, and their records: all the certificate reads of the written groups (its
    risk models, the discernibility, the number of classes). 16 bytes a group: the sensitive values' counts
    (``GroupCounts.values``, one row per group and value, some 50 times larger) stay in their buckets."""

    keys: np.ndarray
    sizes: np.ndarray

    @classmethod
    def gather(cls, buckets: list[GroupSizes]) -> GroupSizes:
        """The buckets' groups in key order (a group lies in exactly one bucket): the keys and sizes
        ``GroupCounts.add`` gives over the same groups."""
        keys = np.concatenate([np.zeros(0, dtype=np.int64), *(bucket.keys for bucket in buckets)])
        sizes = np.concatenate([np.zeros(0, dtype=np.int64), *(bucket.sizes for bucket in buckets)])
        order = np.argsort(keys, kind="stable")
        return cls(keys[order], sizes[order])


def read_written_sizes(scratch, buckets: int) -> GroupSizes:
    """Every bucket's ``WRITTEN_SIZES`` gathered in key order."""
    return GroupSizes.gather([scratch.read(WRITTEN_SIZES, bucket) for bucket in range(buckets)])


def dask_certificate(spec, scratch, source_pieces: int, parts: int, buckets: int, hierarchies: dict, coder,
                     suppressed: int, shards_failed: str | None = None) -> dict:
    """On a worker: the certificate's figures of a Dask release (reads the sketches and the published groups'
    keys and sizes, ``WRITTEN_SIZES``, from the scratch; never a shard)."""
    written = read_written_sizes(scratch, buckets)
    return dask_certificate_figures(spec, scratch, source_pieces, parts, buckets, hierarchies, written, coder,
                                    suppressed, shards_failed)
