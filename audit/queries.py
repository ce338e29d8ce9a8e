"""The privacy officers' questions (governance.md, questions 1–9, and 11: advice runs) as named, parameterised SQL.

One definition serves both the ``kepsilon audit`` commands and Datasette's canned queries
(``audit/datasette.yaml`` is generated from ``QUERIES``: ``python -m kepsilon.audit.queries``), so the
browser and the command line cannot drift apart. ε is stored as integer nano-ε and shown divided by 1e9
only at the end, after exact integer sums. Question 10 (chain integrity) needs hash recomputation and
is ``kepsilon audit verify``; the ``chain_head`` query shows the head to compare with a checkpoint. δ is
stored as integer atto-δ (1e-18) and shown divided by 1e18 the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlite_utils

# The officers' policy when a question is asked without one (the CLI's defaults for
# ``kepsilon audit policy``, and what an empty field means in Datasette): k below 5 or ε above 1.0.
POLICY_MIN_K = 5
POLICY_MAX_EPSILON = 1.0

# Lexicographically comparable with the store's "YYYY-MM-DDTHH:MM:SS.ffffffZ" timestamps.
_TWELVE_MONTHS_AGO = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-12 months')"


@dataclass(frozen=True)
class Query:
    """One officers' question. ``browser_sql``: the variant Datasette serves, where it must leave out the
    keyed source fingerprints (the browser is for reading records, not matching files: that is
    ``kepsilon audit impact --source FILE``, which needs the installation's key anyway)."""

    title: str
    description: str
    sql: str
    params: tuple[str, ...] = ()
    browser_sql: str | None = None


_BUDGET = f"""
WITH
  cap AS (SELECT nano_epsilon AS nano, atto_delta AS atto FROM ledger
          WHERE population_id = :population AND kind = 'cap' ORDER BY id DESC LIMIT 1),
  live AS (SELECT r.id, r.nano_epsilon AS nano, r.atto_delta AS atto FROM ledger r
           WHERE r.population_id = :population AND r.kind = 'reserve'
             AND NOT EXISTS (SELECT 1 FROM ledger v WHERE v.reservation_id = r.id AND v.kind = 'void')),
  spends AS (SELECT s.id, s.reservation_id, s.nano_epsilon AS nano, s.atto_delta AS atto, s.created_at FROM ledger s
             WHERE s.population_id = :population AND s.kind = 'spend'),
  redraws AS (SELECT s.nano, s.atto FROM spends s
              WHERE s.id > (SELECT MIN(f.id) FROM spends f WHERE f.reservation_id = s.reservation_id)),
  -- A reservation carries δ exactly when its release is in the DP mode: only those compose into the DP total.
  totals AS (
    SELECT (SELECT nano FROM cap) AS cap, (SELECT atto FROM cap) AS cap_atto,
           COALESCE((SELECT SUM(nano) FROM live), 0) + COALESCE((SELECT SUM(nano) FROM redraws), 0) AS in_use,
           COALESCE((SELECT SUM(nano) FROM live WHERE atto IS NOT NULL), 0)
             + COALESCE((SELECT SUM(nano) FROM redraws WHERE atto IS NOT NULL), 0) AS dp_nano,
           COALESCE((SELECT SUM(atto) FROM live), 0) + COALESCE((SELECT SUM(atto) FROM redraws), 0) AS dp_atto,
           COALESCE((SELECT SUM(nano) FROM spends), 0) AS spent,
           COALESCE((SELECT SUM(nano) FROM spends WHERE created_at >= {_TWELVE_MONTHS_AGO}), 0) AS spent_12m)
SELECT :population AS population_id,
       cap / 1e9 AS cap,
       spent / 1e9 AS spent_lifetime,
       spent_12m / 1e9 AS spent_last_12_months,
       (in_use - spent) / 1e9 AS reserved_not_spent,
       CASE WHEN cap IS NULL THEN NULL ELSE (cap - in_use) / 1e9 END AS remaining,
       dp_nano / 1e9 AS dp_epsilon,
       dp_atto / 1e18 AS dp_delta,
       (in_use - dp_nano) / 1e9 AS kepsilon_mode_epsilon,
       cap_atto / 1e18 AS delta_cap,
       CASE WHEN cap_atto IS NULL THEN NULL ELSE (cap_atto - dp_atto) / 1e18 END AS delta_remaining,
       (SELECT COUNT(*) FROM ledger WHERE population_id = :population AND kind = 'cap') AS cap_entries
FROM totals
WHERE :population != ''
"""

_POLICY = f"""
WITH policy AS (SELECT CAST(COALESCE(NULLIF(trim(:min_k), ''), {POLICY_MIN_K}) AS REAL) AS min_k,
                       CAST(COALESCE(NULLIF(trim(:max_epsilon), ''), {POLICY_MAX_EPSILON}) AS REAL) AS max_epsilon)
SELECT r.id AS record, r.release_id, r.outcome, r.k, r.epsilon, r.population_id, r.operator, r.finished_at,
       trim(CASE WHEN r.k < p.min_k THEN 'k below policy ' ELSE '' END
            || CASE WHEN r.epsilon > p.max_epsilon THEN 'epsilon above policy' ELSE '' END) AS breach
FROM releases r, policy p
WHERE r.k < p.min_k OR r.epsilon > p.max_epsilon
ORDER BY r.id
"""

_WHO = """
SELECT r.id AS record, r.release_id, r.outcome, r.operator, r.flow_run_id, r.started_at, r.finished_at,
       a.approver, a.reason AS approval_reason, a.created_at AS approved_at,
       CASE WHEN a.approver IS NULL THEN NULL
            WHEN lower(trim(a.approver)) = lower(trim(r.operator)) THEN 'yes' ELSE 'no' END AS same_person
FROM releases r
LEFT JOIN approvals a ON a.release_id = r.release_id AND a.spec_hash = r.spec_hash
WHERE :release != '' AND r.release_id = :release
ORDER BY r.id, a.id
"""

_PROVENANCE = """
SELECT r.id AS record, r.release_id, r.outcome, r.source_path, r.source_sha256, r.source_rows, r.spec_hash,
       r.kepsilon_version, r.git_commit,
       (SELECT group_concat(package || '=' || COALESCE(version, ''), ', ')
          FROM (SELECT package, version FROM software s WHERE s.release = r.id ORDER BY package)) AS software,
       r.seed_commitment,
       (SELECT group_concat(path || ' ' || COALESCE(sha256, ''), ', ')
          FROM (SELECT path, sha256 FROM outputs o WHERE o.release = r.id ORDER BY path)) AS outputs
FROM releases r
WHERE :release != '' AND r.release_id = :release
ORDER BY r.id
"""

_PROVENANCE_BROWSER = _PROVENANCE.replace("r.source_path, r.source_sha256, r.source_rows", "r.source_path, r.source_rows")

_IMPACT = """
SELECT r.id AS record, r.release_id, r.outcome, r.population_id, r.source_sha256, r.kepsilon_version, r.git_commit,
       r.finished_at,
       (SELECT group_concat(package || '=' || COALESCE(version, ''), ', ')
          FROM (SELECT package, version FROM software s WHERE s.release = r.id ORDER BY package)) AS software
FROM releases r
WHERE (:source_sha != '' AND r.source_sha256 = :source_sha)
   OR (:version != '' AND EXISTS (
         SELECT 1 FROM software s WHERE s.release = r.id
            AND (s.version = :version OR s.package || '=' || s.version = :version)))
ORDER BY r.id
"""

_IMPACT_BROWSER = """
SELECT r.id AS record, r.release_id, r.outcome, r.population_id, r.kepsilon_version, r.git_commit, r.finished_at,
       (SELECT group_concat(package || '=' || COALESCE(version, ''), ', ')
          FROM (SELECT package, version FROM software s WHERE s.release = r.id ORDER BY package)) AS software
FROM releases r
WHERE :version != '' AND EXISTS (
        SELECT 1 FROM software s WHERE s.release = r.id
           AND (s.version = :version OR s.package || '=' || s.version = :version))
ORDER BY r.id
"""

_RERUNS = """
SELECT * FROM (
  SELECT r.idempotency_key, r.id AS reservation, r.release_id, r.population_id, r.nano_epsilon / 1e9 AS epsilon,
         r.actor AS operator, r.created_at AS reserved_at,
         CASE WHEN v.id IS NOT NULL THEN 'voided'
              WHEN EXISTS (SELECT 1 FROM ledger s WHERE s.reservation_id = r.id AND s.kind = 'spend') THEN 'spent'
              ELSE 'reserved' END AS status,
         v.reason AS void_reason,
         (SELECT COUNT(*) FROM releases x WHERE x.idempotency_key = r.idempotency_key) AS runs,
         (SELECT COUNT(*) FROM releases x WHERE x.idempotency_key = r.idempotency_key AND x.outcome = 'published') AS published,
         (SELECT group_concat(outcome, ',') FROM (SELECT outcome FROM releases x
                                                 WHERE x.idempotency_key = r.idempotency_key ORDER BY x.id)) AS outcomes
  FROM ledger r
  LEFT JOIN ledger v ON v.reservation_id = r.id AND v.kind = 'void'
  WHERE r.kind = 'reserve')
WHERE :only = 'all' OR :only = ''
   OR (:only = 'shared' AND runs > 1)
   OR (:only = 'unpublished' AND published = 0)
   OR (:only = 'voided' AND status = 'voided')
ORDER BY idempotency_key, reservation
"""

_NOISE_DRAWS = """
WITH
  draws AS (SELECT r.idempotency_key AS idempotency_key, MIN(r.release_id) AS release_id,
                   MIN(r.population_id) AS population_id, COUNT(s.id) AS noise_draws,
                   SUM(s.nano_epsilon) AS nano, group_concat(s.created_at, ', ') AS drawn_at
            FROM ledger s JOIN ledger r ON r.id = s.reservation_id
            WHERE s.kind = 'spend' GROUP BY r.idempotency_key),
  seeds AS (SELECT idempotency_key, COUNT(DISTINCT seed_commitment) AS seeds FROM releases
            WHERE seed_commitment IS NOT NULL AND idempotency_key IS NOT NULL GROUP BY idempotency_key)
SELECT d.idempotency_key, d.release_id, d.population_id, d.noise_draws, d.nano / 1e9 AS epsilon_charged,
       COALESCE(s.seeds, 0) AS distinct_seed_commitments, d.drawn_at
FROM draws d LEFT JOIN seeds s ON s.idempotency_key = d.idempotency_key
WHERE d.noise_draws > 1 OR s.seeds > 1
ORDER BY d.idempotency_key
"""

# A failed check as the private record stores it: {"name", "success", "figure"?, "limit"?}; records from
# before figures were kept show "—" for them.
_FAILED_CHECK_FIGURES = """(SELECT group_concat(
             json_extract(c.value, '$.name') || ' ' ||
             COALESCE(CAST(json_extract(c.value, '$.figure') AS TEXT), '—') || ' (limit ' ||
             COALESCE(CAST(json_extract(c.value, '$.limit') AS TEXT), '—') || ')', '; ')
           FROM json_each(CASE WHEN json_valid(r.manifest) AND json_type(r.manifest, '$.checks') = 'array'
                               THEN r.manifest ELSE '{"checks": []}' END, '$.checks') c
           WHERE json_type(c.value) = 'object' AND NOT json_extract(c.value, '$.success'))"""

_FAILURES = f"""
SELECT * FROM (
  SELECT r.id AS record, r.release_id, r.outcome,
         -- records from before failure_reason existed keep their reason in the manifest
         COALESCE(r.failure_reason, json_extract(r.manifest, '$.failure'), json_extract(r.manifest, '$.refusal'),
                  r.outcome_detail) AS failure_reason,
         (SELECT group_concat(name, ', ') FROM (SELECT name FROM checks c WHERE c.release = r.id AND c.success = 0
                                               ORDER BY c.id)) AS failed_checks,
         {_FAILED_CHECK_FIGURES} AS check_figures,
         -- the ε this release's reservation holds: spent once noise was drawn, voided, or still reserved
         CASE WHEN r.reservation_id IS NULL THEN 0
              ELSE (SELECT nano_epsilon FROM ledger l WHERE l.id = r.reservation_id) / 1e9 END AS epsilon,
         CASE WHEN r.reservation_id IS NULL THEN 'none (refused before a reservation)'
              WHEN EXISTS (SELECT 1 FROM ledger v WHERE v.reservation_id = r.reservation_id AND v.kind = 'void')
                THEN 'voided'
              WHEN EXISTS (SELECT 1 FROM ledger s WHERE s.reservation_id = r.reservation_id AND s.kind = 'spend')
                THEN 'spent'
              ELSE 'reserved (a rerun reuses it)' END AS epsilon_status,
         CASE WHEN r.outcome = 'published' THEN r.rows_published ELSE 0 END AS rows_published,
         COALESCE((SELECT SUM(rows_removed) FROM stage_counts sc WHERE sc.release = r.id AND sc.stage LIKE '%suppress%'),
                  CASE WHEN r.outcome = 'published' THEN r.rows_in - r.rows_published END) AS rows_suppressed,
         r.rows_in, r.suppression_budget
  FROM releases r)
WHERE outcome != 'published'
   OR failed_checks IS NOT NULL
   OR (rows_in > 0 AND rows_suppressed > suppression_budget * rows_in)
ORDER BY record
"""

# A failed diversity check is one of the gate's ℓ-diversity or t-closeness checks (named
# "l_diversity:<column>" and "t_closeness:<column>"); homogeneous groups are counted on every release's
# published groups whether or not criteria were declared. Underscores are literal in LIKE via ESCAPE.
_DIVERSITY = r"""
SELECT * FROM (
  SELECT r.id AS record, r.release_id, r.outcome, r.homogeneous_groups, r.l_diversity_min, r.t_closeness_max,
         (SELECT group_concat(name, ', ') FROM (SELECT name FROM checks c WHERE c.release = r.id AND c.success = 0
                 AND (c.name LIKE 'l\_diversity:%' ESCAPE '\' OR c.name LIKE 't\_closeness:%' ESCAPE '\')
                 ORDER BY c.id)) AS failed_diversity_checks,
         r.linking_risk, r.prosecutor_risk, r.finished_at
  FROM releases r)
WHERE homogeneous_groups > 0 OR failed_diversity_checks IS NOT NULL
ORDER BY record
"""

_SCALE_BASIS = """
SELECT id AS record, release_id, outcome, scale_basis,
       CASE WHEN privacy_model = 'dp' THEN 'none: DP mode (nothing noised; sampling and safe k-anonymisation)'
            WHEN scale_basis = 'diameter' THEN 'data-derived (class diameter, the paper''s method)'
            WHEN scale_basis = 'bounds' THEN 'public bounds'
            ELSE 'not recorded' END AS noise_scale,
       mechanism, epsilon, delta, population_id, finished_at
FROM releases
WHERE :basis IN ('', 'any') OR scale_basis = :basis
ORDER BY id
"""

_UNSEALS = """
SELECT u.id AS event, u.release_id, u.idempotency_key, u.actor, u.reason, u.created_at,
       CASE u.verified WHEN 1 THEN 'yes' ELSE 'no' END AS commitment_verified
FROM unseal_events u
WHERE :release = '' OR u.release_id = :release
ORDER BY u.id
"""

_ADVICE = """
SELECT a.id AS event, a.population_id, a.actor, a.via, a.flow_run_id, a.created_at, a.source_sha256, a.source_rows,
       a.spec_hash, a.k_values, a.epsilon_values, a.draws, a.report_dir
FROM advice_events a
WHERE :population = '' OR a.population_id = :population
ORDER BY a.id
"""

# Newest first. A reservation without any record yet is a release in progress, or interrupted (a rerun
# resumes it): listed with status 'reserved' so a release that spent nothing visible still shows.
_RELEASES = """
SELECT release_id, population_id, status, model, k, epsilon, delta, records_published, operator, at FROM (
  SELECT r.id AS record_id, r.release_id, r.population_id, r.outcome AS status, r.privacy_model AS model, r.k,
         r.epsilon, r.delta, CASE WHEN r.outcome = 'published' THEN r.rows_published END AS records_published,
         r.operator, COALESCE(r.finished_at, r.recorded_at) AS at
  FROM releases r
  UNION ALL
  SELECT NULL, l.release_id, l.population_id,
         CASE WHEN EXISTS (SELECT 1 FROM ledger v WHERE v.reservation_id = l.id AND v.kind = 'void') THEN 'voided'
              ELSE 'reserved' END,
         CASE WHEN l.atto_delta IS NULL THEN NULL ELSE 'dp' END, NULL, l.nano_epsilon / 1e9, l.atto_delta / 1e18,
         NULL, l.actor, l.created_at
  FROM ledger l
  WHERE l.kind = 'reserve' AND NOT EXISTS (SELECT 1 FROM releases x WHERE x.idempotency_key = l.idempotency_key))
WHERE :population = '' OR population_id = :population
ORDER BY at DESC, record_id DESC
"""

_POPULATIONS = """
WITH caps AS (SELECT population_id, nano_epsilon, atto_delta,
                     ROW_NUMBER() OVER (PARTITION BY population_id ORDER BY id DESC) AS newest
              FROM ledger WHERE kind = 'cap'),
     live AS (SELECT r.population_id, r.nano_epsilon AS nano FROM ledger r
              WHERE r.kind = 'reserve'
                AND NOT EXISTS (SELECT 1 FROM ledger v WHERE v.reservation_id = r.id AND v.kind = 'void')),
     redraws AS (SELECT s.population_id, s.nano_epsilon AS nano FROM ledger s
                 WHERE s.kind = 'spend'
                   AND s.id > (SELECT MIN(f.id) FROM ledger f WHERE f.kind = 'spend' AND f.reservation_id = s.reservation_id))
SELECT p.population_id, c.nano_epsilon / 1e9 AS epsilon_cap,
       COALESCE((SELECT SUM(nano_epsilon) FROM ledger s WHERE s.population_id = p.population_id AND s.kind = 'spend'), 0)
         / 1e9 AS epsilon_spent,
       CASE WHEN c.nano_epsilon IS NULL THEN NULL
            ELSE (c.nano_epsilon - COALESCE((SELECT SUM(nano) FROM live WHERE live.population_id = p.population_id), 0)
                                 - COALESCE((SELECT SUM(nano) FROM redraws WHERE redraws.population_id = p.population_id), 0))
                 / 1e9 END AS epsilon_left,
       c.atto_delta / 1e18 AS delta_cap,
       (SELECT COUNT(*) FROM releases r WHERE r.population_id = p.population_id AND r.outcome = 'published') AS published,
       (SELECT COALESCE(SUM(rows_published), 0) FROM releases r
         WHERE r.population_id = p.population_id AND r.outcome = 'published') AS records_published,
       (SELECT MAX(COALESCE(finished_at, recorded_at)) FROM releases r WHERE r.population_id = p.population_id) AS last_release_at,
       p.created_at
FROM populations p LEFT JOIN caps c ON c.population_id = p.population_id AND c.newest = 1
ORDER BY p.created_at DESC, p.population_id
"""

_ADVICE_BROWSER = _ADVICE.replace("a.created_at, a.source_sha256, a.source_rows", "a.created_at, a.source_rows")

_CHAIN_HEAD = """
SELECT (SELECT COUNT(*) FROM chain) AS entries,
       (SELECT entry_hash FROM chain ORDER BY seq DESC LIMIT 1) AS head_hash,
       (SELECT entry_count FROM checkpoints ORDER BY id DESC LIMIT 1) AS last_checkpoint_entries,
       (SELECT head_hash FROM checkpoints ORDER BY id DESC LIMIT 1) AS last_checkpoint_hash,
       (SELECT created_at FROM checkpoints ORDER BY id DESC LIMIT 1) AS last_checkpoint_at
"""

QUERIES: dict[str, Query] = {
    "budget": Query(
        "1. ε (and δ) spent by a population, and what is left",
        "population (required): lifetime and last-12-months ε spent, ε reserved but not yet spent, and ε left "
        "under the latest cap (releases of both privacy models); then the DP total — the composed (ε, δ) of the "
        "DP mode's releases, sums of their ε and δ — beside the ε of the method's own mode, which is bookkeeping "
        "and never enters the DP total; and δ left under the δ cap. No population, no answer.",
        _BUDGET,
        ("population",),
    ),
    "policy": Query(
        "2. Releases outside policy",
        f"Releases with k below min_k or ε above max_epsilon; an empty field means the policy default "
        f"(k below {POLICY_MIN_K}, ε above {POLICY_MAX_EPSILON}).",
        _POLICY,
        ("min_k", "max_epsilon"),
    ),
    "who": Query(
        "3. Who ran and who approved a release",
        "release (required): operator, approvers of the same spec hash, and whether they were the same person.",
        _WHO,
        ("release",),
    ),
    "provenance": Query(
        "4a. Source and code of a release",
        "release (required): source file fingerprint (keyed) and rows, spec hash, package versions and git commit, "
        "seed commitment, outputs.",
        _PROVENANCE,
        ("release",),
        browser_sql=_PROVENANCE_BROWSER,
    ),
    "impact": Query(
        "4b. Releases that used a source hash or a library version",
        "Impact analysis after a bug: give a version ('2.4.6' or 'numpy=2.4.6'); with none, no answer. Releases "
        "made from a given file: `kepsilon audit impact --source FILE` (it needs the installation's fingerprint key).",
        _IMPACT,
        ("source_sha", "version"),
        browser_sql=_IMPACT_BROWSER,
    ),
    "reruns": Query(
        "5. Rerun provenance",
        "Reservations per idempotency key with their runs and outcomes; only: all (or empty), shared, unpublished, "
        "voided.",
        _RERUNS,
        ("only",),
    ),
    "noise_draws": Query(
        "6. Noise drawn more than once for one logical release",
        "Idempotency keys with more than one spend entry or more than one seed commitment.",
        _NOISE_DRAWS,
    ),
    "failures": Query(
        "7. Failed checks, refusals and suppression beyond budget",
        "Releases not published (with why: check names, error class and message), with a failed check, or with "
        "more rows suppressed than their budget allows; each failed check with its figure and limit (— where an "
        "older record kept none), and the ε its reservation holds (spent, reserved for a rerun, voided).",
        _FAILURES,
    ),
    "scale_basis": Query(
        "8. Noise-scale basis of each release",
        "Data-derived (class diameter) or public bounds; basis: empty or any for all, diameter or bounds.",
        _SCALE_BASIS,
        ("basis",),
    ),
    "unseals": Query(
        "9. Who unsealed a seed, when and why",
        "Every unseal event; release: empty for all.",
        _UNSEALS,
        ("release",),
    ),
    "advice": Query(
        "11. Who read private data for parameter advice",
        "Every run of `kepsilon advise` or the advise flow (no ε spent, nothing published): who, when, which "
        "source and spec; population: empty for all.",
        _ADVICE,
        ("population",),
        browser_sql=_ADVICE_BROWSER,
    ),
    "release_list": Query(
        "13. Releases, newest first",
        "Every release record and every reservation not yet recorded (in progress or interrupted): status, "
        "privacy model, k, ε, δ, records published; population: empty for all.",
        _RELEASES,
        ("population",),
    ),
    "population_list": Query(
        "14. Populations, newest first",
        "Every population: its ε cap (latest), ε spent and left, δ cap, releases and records published, last release.",
        _POPULATIONS,
    ),
    "diversity": Query(
        "12. Releases with homogeneous groups or failed diversity checks",
        "Releases whose published groups include one where every member shares a sensitive value (homogeneity "
        "attack), or that failed an ℓ-diversity or t-closeness check; with the achieved ℓ (fewest distinct "
        "values in a group), t (largest EMD) and the linking and prosecutor risks. Private figures.",
        _DIVERSITY,
    ),
    "chain_head": Query(
        "10. Chain head and last checkpoint",
        "Compare with the exported checkpoint file; `kepsilon audit verify` recomputes every hash.",
        _CHAIN_HEAD,
    ),
}


def run(db: sqlite_utils.Database, name: str, **params) -> list[dict]:
    """Run one named question with its parameters (missing ones default to ''); rows as dicts."""
    query = QUERIES[name]
    values = {param: params.get(param, "") for param in query.params}
    values = {key: ("" if value is None else value) for key, value in values.items()}
    return list(db.query(query.sql, values))


def store_tables() -> list[str]:
    """Every table of a store at the current schema (a fresh in-memory store), for Datasette's deny list."""
    import sqlite3

    from .store import migrations

    db = sqlite_utils.Database(sqlite3.connect(":memory:"))
    migrations.apply(db)
    tables = sorted(db.table_names())
    db.close()
    return tables


def datasette_metadata(database: str = "audit") -> dict:
    """Datasette metadata: every question as a read-only canned query of ``database``, and nothing else.

    No arbitrary SQL (``allow_sql: false``: ``/audit.json?sql=…`` answers 403) and no table pages (every
    table of the store ``allow: false`` and hidden): the officers read the canned queries, whose browser
    variants leave the keyed source fingerprints out, and never the sealed seeds. Each query opens with its
    answer: ``hide_sql`` keeps the SQL behind a "show" link. Writes are refused by the read-only plugin
    (``audit/datasette_plugins``) with 405, never a server error.
    """
    return {
        "title": "kepsilon audit store",
        "description": "Read-only view of the ε ledger and release records for privacy officers: canned questions only.",
        "allow_sql": False,
        "databases": {
            database: {
                "allow_sql": False,
                "queries": {
                    name: {
                        "title": q.title,
                        "description": q.description,
                        "hide_sql": True,
                        "sql": (q.browser_sql or q.sql).strip() + "\n",
                    }
                    for name, q in QUERIES.items()
                },
                "tables": {table: {"hidden": True, "allow": False} for table in store_tables()},
            }
        },
    }


def datasette_yaml(database: str = "audit") -> str:
    """The metadata as YAML text, as committed in audit/datasette.yaml (for a store named audit.db)."""
    import yaml

    class _Literal(str):
        pass

    def _literal(dumper, value):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")

    yaml.add_representer(_Literal, _literal, Dumper=yaml.SafeDumper)
    metadata = datasette_metadata(database)
    for query in metadata["databases"][database]["queries"].values():
        query["sql"] = _Literal(query["sql"])
    header = "# Generated by `python -m kepsilon.audit.queries > audit/datasette.yaml`; do not edit by hand.\n"
    return header + yaml.safe_dump(metadata, sort_keys=False, allow_unicode=True, width=120)


if __name__ == "__main__":
    import sys

    # Datasette names a database after its file's stem: pass it for a store not called audit.db.
    print(datasette_yaml(sys.argv[1] if len(sys.argv) > 1 else "audit"), end="")
