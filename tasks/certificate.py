"""The officer's certificate, at release time: the risk and utility figures, and the pre-ε risk gates.

Two entry points for the release flow (docs/certificate.md):

* :func:`refuse_risk_over_limits` — before ε is reserved, the journalist and marketer risk of the
  groups the anonymiser decided (each class labelled as it would be published if no record were
  suppressed afterwards) against ``max_journalist_risk`` and ``max_marketer_risk``.
* :func:`certificate_figures` — after the noise and the suppression, before the record is committed:
  the risk models on the published groups (and on the source's groups), SUDA's special uniques on the
  source, and the utility report. The result goes into the private record (``record["certificate"]``),
  never into the public manifest (its allow-list does not name it).

The measures themselves are plain functions of ``kepsilon.engine.risk`` and ``kepsilon.engine.utility``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kepsilon.engine import risk, utility
from kepsilon.engine.assemble import merge_release_columns
from kepsilon.engine.partition import published_labels
from kepsilon.engine.perturb import public_grid
from kepsilon.record import ReleaseRecord
from kepsilon.tasks.counting import value_pair_counts
from kepsilon.tasks.errors import InputError, SpecError


def _settings(spec):
    from kepsilon.spec import CertificateSettings

    return spec.certificate if spec.certificate is not None else CertificateSettings()


def load_population_table(path: str, k_quasi: list[str]) -> pd.DataFrame:
    """The population table: the k-quasi columns as text (values as in the source) and ``count``."""
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (OSError, pd.errors.ParserError, UnicodeDecodeError) as error:
        raise SpecError("population.table", f"cannot be read ({type(error).__name__})") from None
    for column in [*k_quasi, "count"]:
        if column not in frame.columns:
            raise InputError(column, "is missing from the population table")
    return frame


def risk_models(labels: pd.DataFrame, spec, hierarchies: dict, weights: np.ndarray | None = None,
                population_table: pd.DataFrame | None = None) -> dict:
    """Prosecutor, journalist and marketer risk of the groups ``labels`` forms (one row per record).

    ``weights``: each record's sampling weight (the spec's weight column), or None. See
    :func:`group_risk_models`, which this reduces the records to.
    """
    n = len(labels)
    columns = list(labels.columns)
    codes = labels.groupby(columns, sort=False, dropna=False, observed=True).ngroup().to_numpy() if n else np.zeros(0, int)
    sizes = np.bincount(codes).astype(np.float64) if n else np.zeros(0)
    group_labels = None
    if population_table is not None or (spec.population is not None and spec.population.table is not None):
        firsts = pd.Series(np.arange(n)).groupby(codes).first().to_numpy() if n else np.zeros(0, int)
        group_labels = labels.iloc[firsts].reset_index(drop=True)
    weight_sums = None if weights is None else (np.bincount(codes, weights=weights, minlength=len(sizes)) if n else np.zeros(0))
    return group_risk_models(sizes, spec, hierarchies, weight_sums, group_labels, population_table)


def group_risk_models(sizes: np.ndarray, spec, hierarchies: dict, weight_sums: np.ndarray | None = None,
                      group_labels: pd.DataFrame | None = None, population_table: pd.DataFrame | None = None) -> dict:
    """Prosecutor, journalist and marketer risk of groups of ``sizes`` records (what partitions add up to).

    The population (``spec.population``): a table gives each group's population size exactly (it
    needs ``group_labels``, one row of k-quasi labels per group); a sampling fraction π gives every
    record a weight 1/π; ``weight_sums`` (per group, the spec's weight column summed) gives each group
    its own; nothing declared makes the table its own population. With weights, a record's journalist
    risk is the Benedetti–Franconi individual risk ``E[1/F | f, Σw]``.
    """
    threshold = _settings(spec).risk_threshold
    sizes = np.asarray(sizes, dtype=np.float64)
    n = int(sizes.sum())
    population = spec.population
    if population is not None and population.table is not None:
        if population_table is not None:
            table = population_table
        else:
            assert group_labels is not None, "a population table needs one row of labels per group"
            table = load_population_table(population.table, list(group_labels.columns))
        sizes_in_population = np.maximum(risk.population_group_sizes(group_labels, table, hierarchies), sizes)
        record_risk = 1.0 / sizes_in_population
        basis = "population table"
        population_size = float(pd.to_numeric(table["count"]).sum())
    else:
        if weight_sums is None:
            fraction = population.sampling_fraction if population is not None and population.sampling_fraction else 1.0
            weight_sums = sizes / fraction
            basis = "sampling fraction" if fraction < 1 else "the table is its own population"
        else:
            basis = "sampling weights"
        weight_sums = np.asarray(weight_sums, dtype=np.float64)
        record_risk = risk.individual_risk(sizes, np.maximum(weight_sums, sizes)) if n else np.zeros(0)
        population_size = float(max(weight_sums.sum(), n))
    summary = {
        "groups": int(len(sizes)),
        "records": n,
        "population_basis": basis,
        "population_size": population_size,
        "prosecutor": risk.prosecutor_risk(sizes, threshold),
        "journalist": risk.record_risk_summary(sizes, record_risk, threshold),
        "marketer": risk.marketer_risk(sizes, record_risk) if n else 0.0,
        "group_sizes": risk.size_histogram(sizes) if n else {},
    }
    summary["population_uniqueness"] = risk.population_uniqueness(sizes, int(round(population_size))) if n else None
    return summary


def _weights(spec, frame: pd.DataFrame) -> np.ndarray | None:
    population = spec.population
    if population is None or population.weight_column is None:
        return None
    values = pd.to_numeric(frame[population.weight_column], errors="coerce").to_numpy(dtype=np.float64)
    if not np.isfinite(values).all() or (values <= 0).any():
        raise InputError(population.weight_column, "sampling weights must be positive numbers")
    return values


def predicted_labels(table, partition) -> pd.DataFrame:
    """The k-quasi labels each kept record would be published under if no record were suppressed later."""
    kept = table.frame[partition.kept]
    k_quasi = table.roles["k_quasi"]
    return published_labels(kept[k_quasi], partition.class_ids[partition.kept], np.ones(len(kept), dtype=bool),
                            partition.hierarchies, partition.levels)


def predicted_risk(table, partition, spec) -> dict:
    """Prosecutor, journalist and marketer risk of the anonymiser's groups, before any noise (``kepsilon check``).

    The groups each kept record would be published in if nothing were suppressed after the noise: an upper
    bound for the published groups' risk in the method's own mode (suppression only removes records). Uses
    the spec's population (a table, a sampling fraction, sampling weights) as the certificate does.
    """
    weights = _weights(spec, table.frame)
    population_table = declared_population_table(spec, table.roles["k_quasi"])
    return risk_models(predicted_labels(table, partition), spec, partition.hierarchies,
                       None if weights is None else weights[partition.kept], population_table)


def risk_line(figures: dict) -> str:
    """The predicted risk models as one line for the terminal."""
    prosecutor, journalist = figures["prosecutor"], figures["journalist"]
    basis = figures.get("population_basis") or "the sample as the population"
    return (f"risk of the anonymiser's groups before the noise: prosecutor highest {prosecutor['highest']:.3g} "
            f"(average {prosecutor['average']:.3g}); journalist highest {journalist['highest']:.3g} "
            f"(average {journalist['average']:.3g}; population: {basis}); marketer {figures['marketer']:.3g}")


def refuse_risk_over_limits(table, partition, spec) -> dict | None:
    """Refuse before ε when the anonymiser's groups already exceed ``max_journalist_risk`` or ``max_marketer_risk``.

    The groups are decided before the noise; suppression after the noise can only remove records, so
    the published groups can be smaller than predicted (their risk is measured again, and recorded,
    after the noise: docs/certificate.md). Returns the predicted figures, or None when no gate is set.
    """
    if spec.max_journalist_risk is None and spec.max_marketer_risk is None:
        return None
    weights = _weights(spec, table.frame)
    predicted = risk_models(predicted_labels(table, partition), spec, partition.hierarchies,
                            None if weights is None else weights[partition.kept])
    return check_risk_limits(predicted, spec)


def check_risk_limits(predicted: dict, spec) -> dict:
    """Refuse when the predicted groups' journalist or marketer risk exceeds its limit; else return them."""
    if spec.max_journalist_risk is not None and predicted["journalist"]["highest"] > spec.max_journalist_risk:
        raise SpecError("max_journalist_risk", f"the anonymiser's groups reach a journalist risk of "
                        f"{predicted['journalist']['highest']:.3g}, above the limit (raise k or declare the population)")
    if spec.max_marketer_risk is not None and predicted["marketer"] > spec.max_marketer_risk:
        raise SpecError("max_marketer_risk", f"the anonymiser's groups reach a marketer risk of "
                        f"{predicted['marketer']:.3g}, above the limit (raise k or declare the population)")
    return predicted


def certificate_figures(spec, table, partition, kept: pd.DataFrame, class_ids: np.ndarray, noisy: pd.DataFrame,
                        removed: np.ndarray) -> dict:
    """The certificate's private figures for one release of the method's own mode (in memory).

    ``kept``, ``class_ids``, ``noisy`` (the noised ε-quasis) and ``removed`` (suppressed after the noise)
    are aligned with the records the anonymiser kept. Never raises for a figure that cannot be
    computed: the figure says "not computed" and why (a certificate must not fail a release).
    """
    started = time.perf_counter()
    settings = _settings(spec)
    roles = table.roles
    k_quasi = roles["k_quasi"]
    published = ~np.asarray(removed, dtype=bool)
    labels = published_labels(kept[k_quasi], class_ids, published, partition.hierarchies, partition.levels)
    aligned = merge_release_columns(labels, kept, noisy, roles)[published]
    source = kept[published]
    figures: dict = {"computed": True}
    timings: dict[str, float] = {}
    timed = timed_attempts(timings)

    def weights(rows: np.ndarray | None = None) -> np.ndarray | None:
        # Inside each figure's attempt: a weight that is not a positive number makes the weighted figures
        # "not computed" (the pre-ε gates refuse it), it does not fail a release whose ε is spent.
        values = _weights(spec, table.frame)
        if values is None or rows is None:
            return values
        return values[partition.kept][rows]

    population_table = declared_population_table(spec, k_quasi)
    figures["risk"] = {
        "published": timed("risk_published", lambda: risk_models(aligned[k_quasi], spec, partition.hierarchies,
                                                                 weights(published), population_table)),
        "predicted": timed("risk_predicted", lambda: risk_models(predicted_labels(table, partition), spec, partition.hierarchies,
                                                                 weights(np.ones(int(partition.kept.sum()), dtype=bool)),
                                                                 population_table)),
        "source": timed("source_uniqueness", lambda: _source_uniqueness(table.frame, k_quasi, spec, weights(), population_table)),
        "special_uniques": timed("special_uniques", lambda: risk.special_uniques(table.frame, k_quasi, settings.suda_max_size)),
    }
    figures["utility"] = timed("utility", lambda: utility_report(spec, roles, partition, table.frame, source, aligned, labels[published],
                                                                 class_ids[published], int((~published).sum()) + int((~partition.kept).sum())))
    figures["seconds"] = round(time.perf_counter() - started, 3)
    figures["seconds_by_part"] = timings
    return figures


def dp_certificate_figures(spec, frame: pd.DataFrame, dp_plan, release: pd.DataFrame, rows: np.ndarray) -> dict:
    """The certificate's private figures for a DP-mode release (docs/dp-mode.md, docs/certificate.md).

    ``frame``: the classified source; ``release``: the published table; ``rows``: each published row's
    source position. The DP mode generalises every quasi-identifier (k-quasis and ε-quasis) to one
    node of the lattice, so the groups an attacker matches are those of the generalised columns; no
    groups are decided before the noise (they are drawn from the sample), so nothing is "predicted".
    Never raises for a figure that cannot be computed (see :func:`certificate_figures`).
    """
    started = time.perf_counter()
    settings = _settings(spec)
    quasi = list(dp_plan.columns)
    source = frame.iloc[np.asarray(rows, dtype=np.int64)].reset_index(drop=True)
    timings: dict[str, float] = {}
    timed = timed_attempts(timings)

    def weights(positions: np.ndarray | None = None) -> np.ndarray | None:
        values = _weights(spec, frame)  # inside the attempts, as in :func:`certificate_figures`
        return values if values is None or positions is None else values[positions]

    population_table = declared_population_table(spec, quasi)
    figures: dict = {"computed": True, "mode": "dp", "quasi_identifiers": quasi}
    figures["risk"] = {
        "published": timed("risk_published", lambda: risk_models(release[quasi], spec, dp_plan.hierarchies,
                                                                 weights(rows), population_table)),
        "predicted": {"computed": False, "reason": "the DP mode's groups are drawn from the sample, not decided before ε"},
        "source": timed("source_uniqueness", lambda: _source_uniqueness(frame, quasi, spec, weights(), population_table)),
        "special_uniques": timed("special_uniques", lambda: risk.special_uniques(frame, quasi, settings.suda_max_size)),
    }
    figures["utility"] = timed("utility", lambda: _dp_utility(spec, dp_plan, frame, source, release))
    figures["seconds"] = round(time.perf_counter() - started, 3)
    figures["seconds_by_part"] = timings
    return figures


def _dp_utility(spec, dp_plan, frame: pd.DataFrame, source: pd.DataFrame, release: pd.DataFrame) -> dict:
    """The utility report of a DP release: every generalised column by ARX's generalisation measures (the
    published records' source values against their labels), the rest by total variation."""
    columns = {}
    generalised = set(dp_plan.columns) | {c for c, level in dp_plan.sensitive_levels.items() if level > 0}
    for column in release.columns:
        if column in generalised:
            columns[column] = _generalised(source[column], release[column], dp_plan.hierarchies[column])
        else:
            columns[column] = {"kind": "as read (records removed only)",
                               "total_variation": utility.total_variation(frame[column], release[column])}
    group_sizes = risk.group_sizes(release, list(dp_plan.columns))
    suppressed = len(frame) - len(release)
    report: dict[str, Any] = {
        "columns": columns,
        "correlations": None,  # no column is noised: every number is generalised
        "discernibility": utility.discernibility(group_sizes, suppressed, len(frame)),
        "classes": int(len(group_sizes)),
    }
    target = _settings(spec).utility_target
    if target is None:
        report["classifier"] = {"computed": False, "reason": "no utility_target named in the spec's certificate settings"}
    else:
        begun = time.perf_counter()
        report["classifier"] = utility.classifier_utility(source[release.columns], release, target,
                                                          [q.column for q in spec.roles.e_quasi])
        report["classifier"]["seconds"] = round(time.perf_counter() - begun, 3)
    return report


def _source_uniqueness(frame: pd.DataFrame, k_quasi: list[str], spec, weights, population_table) -> dict:
    """The source's own groups (k-quasi values as read): how many people its raw values single out."""
    return source_uniqueness(risk.group_sizes(frame, k_quasi), spec, None if weights is None else float(weights.sum()),
                             population_table)


def source_uniqueness(sizes: np.ndarray, spec, weight_total: float | None, population_table) -> dict:
    """Population uniqueness of the source's groups of ``sizes`` records (see :func:`_source_uniqueness`)."""
    return source_uniqueness_of_size_counts(risk.size_histogram(sizes), spec, weight_total, population_table)


def source_uniqueness_of_size_counts(size_counts: dict[int, int], spec, weight_total: float | None,
                                     population_table) -> dict:
    """:func:`source_uniqueness` from the frequency of frequencies of the source's groups (``{size: groups}``),
    which is all its measures need: the Dask engine adds it up over the shards."""
    records = int(sum(size * groups for size, groups in size_counts.items()))
    if population_table is not None:
        population_size = int(pd.to_numeric(population_table["count"]).sum())
    elif weight_total is not None:
        population_size = int(round(weight_total))
    elif spec.population is not None and spec.population.sampling_fraction:
        population_size = int(round(records / spec.population.sampling_fraction))
    else:
        population_size = records
    population_size = max(population_size, records)
    return {
        "groups": int(sum(size_counts.values())),
        "prosecutor": risk.prosecutor_risk_of_size_counts(size_counts, _settings(spec).risk_threshold),
        "population_uniqueness": risk.population_uniqueness_of_size_counts(size_counts, population_size),
    }


def _generalised(values: pd.Series, labels: pd.Series, hierarchy) -> dict:
    """A generalised column's figures (granularity, non-uniform entropy, share released as read) from the
    published records' (value, label) pairs' counts, as a Dask release adds them up: the record-level
    formulas (``utility.granularity``, ``non_uniform_entropy``) matched text per record and level."""
    pairs = value_pair_counts(values, labels.astype(str))
    return {"kind": "generalised", **utility.generalisation_from_pairs(pairs, hierarchy)}


def utility_report(spec, roles, partition, source_in: pd.DataFrame, source: pd.DataFrame, released: pd.DataFrame,
                   labels: pd.DataFrame, class_ids: np.ndarray, suppressed: int) -> dict:
    """Per released column a distance, the ε-quasis' correlations, generalisation measures, classifier utility.

    Distributions compare every source record (``source_in``) with every released one, so removed
    records count; the record-level measures (generalisation, correlations, classifier) compare each
    published record's source values (``source``) with its released values (``released``, aligned).
    """
    columns = {}
    grids = {q.column: public_grid(q.lower, q.upper, eps) for q, eps in zip(spec.roles.e_quasi, spec.epsilon_split().values())}
    bounds = {q.column: q.upper - q.lower for q in spec.roles.e_quasi}
    for column in released.columns:
        if column in roles["k_quasi"]:
            columns[column] = _generalised(source[column], labels[column], partition.hierarchies[column])
        elif column in roles["e_quasi"]:
            columns[column] = {"kind": "noised", **utility.numeric_distances(source_in[column], released[column],
                                                                              grids.get(column), bounds.get(column))}
        else:
            columns[column] = {"kind": "as read (records removed only)",
                               "total_variation": utility.total_variation(source_in[column], released[column])}
    sizes = np.bincount(pd.factorize(pd.Series(class_ids))[0]) if len(class_ids) else np.zeros(0)
    group_sizes = risk.group_sizes(labels, list(labels.columns))
    report: dict[str, Any] = {
        "columns": columns,
        "correlations": utility.correlation_change(source, released, roles["e_quasi"]),
        "discernibility": utility.discernibility(group_sizes, suppressed, len(source) + suppressed),
        "classes": int(len(sizes)),
    }
    target = _settings(spec).utility_target
    if target is None:
        report["classifier"] = {"computed": False, "reason": "no utility_target named in the spec's certificate settings"}
    else:
        begun = time.perf_counter()
        report["classifier"] = utility.classifier_utility(source[released.columns], released, target, roles["e_quasi"])
        report["classifier"]["seconds"] = round(time.perf_counter() - begun, 3)
    return report


def timed_attempts(timings: dict[str, float]):
    """``timed(name, compute)``: :func:`_attempt` of ``compute``, its seconds kept in ``timings[name]``."""

    def timed(name: str, compute):
        begun = time.perf_counter()
        try:
            return _attempt(compute)
        finally:
            timings[name] = round(time.perf_counter() - begun, 3)

    return timed


def declared_population_table(spec, columns: list[str]) -> pd.DataFrame | None:
    """The spec's population table (``population.table``) on ``columns``, or None when it declares none."""
    if spec.population is None or spec.population.table is None:
        return None
    return load_population_table(spec.population.table, columns)


def _attempt(compute):
    """A figure, or ``{"computed": False, "reason": <error class: message>}`` when it cannot be computed.

    Engine errors name columns and parameters, never values; other errors are reduced to their class.
    """
    try:
        return compute()
    except (SpecError, InputError) as error:
        return {"computed": False, "reason": str(error)}
    except Exception as error:  # noqa: BLE001 - a figure that fails must not fail the release
        return {"computed": False, "reason": type(error).__name__}


def write_release_certificate(record: ReleaseRecord, store: str, folder: Path) -> Path | None:
    """After the record is committed: write the certificate into the release's private report folder
    and show it on the run's page. Never fails the (already published) release: logged instead."""
    from prefect import get_run_logger

    from kepsilon.audit.certificate import write_certificate

    logger = get_run_logger()
    try:
        path = write_certificate(store, record["release_id"], folder)
    except Exception as error:  # noqa: BLE001 - see the docstring
        logger.warning("release %s: certificate not written (%s)", record.get("release_id"), type(error).__name__)
        return None
    try:
        from prefect.artifacts import create_markdown_artifact

        from kepsilon.flows.report import artifact_key

        create_markdown_artifact(
            key=f"certificate-{artifact_key(record['release_id'])}",
            markdown=f"# Officer's certificate\n\nPrivate, for the steward only. Written to `{path}`; "
            f"check it against the store with `kepsilon audit certificate {record['release_id']} --verify {path}`.\n",
            description="the officer's certificate (private)",
        )
    except Exception as error:  # noqa: BLE001
        logger.warning("release %s: certificate artifact not made (%s)", record.get("release_id"), type(error).__name__)
    logger.info("release %s: certificate written to %s", record["release_id"], path)
    return path
