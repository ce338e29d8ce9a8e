"""``make reliability``: every scenario with repetitions, against one real local Prefect server;
writes ``reliability/report.md`` ending with ``N passed, N failed``.

    .venv/bin/python -m reliability.run [--fault-runs 3] [--race-trials 3] [--processes 4] [--noise-samples 20000]

Exit status 1 if any check failed. ``--issue-24-first`` runs issue 24's blocks before the others; SIGTERM or
Ctrl-C stops the run and still writes the report of what finished, headed PARTIAL RUN (exit status 1).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

from kepsilon.faults import WORKER_FAULT_POINTS

from .dask_scenarios import DASK_KILL_POINTS, cluster_intruder_scenario, dask_kill_scenario, worker_kill_scenario
from .harness import Results, prefect_server, scratch
from .identity import identity_scenario
from .logins import logins_scenario
from .pre_epsilon import pre_epsilon_scenario
from .private_store import private_store_scenario
from .rollback import rollback_scenario
from .scenarios import (
    FAULT_POINTS,
    ORCHESTRATOR_KILL_POINTS,
    bad_day_scenario,
    bad_input_scenario,
    bad_settings_scenario,
    fault_scenario,
    leak_scenario,
    noise_scenario,
    orchestrator_death,
    race_scenario,
    sample_source,
    subprocess_cli,
    tamper_scenario,
)

REPORT = Path(__file__).resolve().parent / "report.md"


# What an interrupted run has so far (SIGTERM or Ctrl-C): main() writes it as a partial report.
PROGRESS: dict = {}

# The blocks of issue 24 (rollback witness, orchestrator death, checks before ε, bad settings and same-id
# races, the Dask engine's kills): run first with --issue-24-first, so that a run stopped early reports them.
ISSUE_24_BLOCKS = ("orchestrator lost", "before ε", "rollback", "dask", "bad settings")


def _settings_rows(rows: list[dict]) -> list[dict]:
    return [{"case": row["case"], "exit": row["exit"], "outcome": "accepted" if row["exit"] == 0 else f"exit {row['exit']}",
             "message": row["line"]} for row in rows]


def run_all(args) -> tuple[Results, list[dict], dict, dict[str, float], list[dict]]:
    results = Results()
    base = scratch("reliability")
    # The stores' default head logs live outside their folders, in the state folder: this run's, not the account's.
    os.environ["XDG_STATE_HOME"] = str(base / "state")
    timings: dict[str, float] = {}
    bad_day: list[dict] = []
    bad_table: list[dict] = []
    leak_matrix: dict = {}
    PROGRESS.update(results=results, bad_table=bad_table, leak_matrix=leak_matrix, timings=timings, bad_day=bad_day,
                    done=[], base=base)
    fault_source = sample_source(base / "fault-source.csv", args.fault_rows)
    small = sample_source(base / "small.csv", 400)
    leak_sample = sample_source(base / "leak-sample.csv", 2000)
    with prefect_server(base / "prefect") as env:
        def timed(name: str, block) -> None:
            start = time.monotonic()
            PROGRESS["running"] = name
            block()
            timings.setdefault(name, time.monotonic() - start)
            PROGRESS["done"].append(name)

        def settings() -> None:
            start = time.monotonic()
            bad_table.extend(_settings_rows(bad_settings_scenario(results, env, base / "settings", small,
                                                                  race_trials=args.same_id_trials)))
            timings["bad settings"] = timings["same-id races"] = time.monotonic() - start

        if args.bad_settings_only:
            timed("bad settings", settings)
            return _finish(results, base), bad_table, {}, timings, []

        def day() -> None:
            bad_day.extend(bad_day_scenario(results, env, base / "bad-day", small, lock_seconds=tuple(args.lock_seconds),
                                            busy_timeout=args.busy_timeout, late_lock_seconds=args.late_lock_seconds))

        def races() -> None:
            for trial in range(args.race_trials):
                race_scenario(results, env, base / f"race-{trial}", small, args.processes)
            results.counts["races × processes"] = (
                f"{args.race_trials} trials × {args.processes} concurrent processes (cap 1.0, ε 0.4 each: 2 admissible)"
            )

        if args.races_only:
            timed("races", races)
            return _finish(results, base), [], {}, timings, []

        if args.bad_day_only:
            timed("bad day", day)
            return _finish(results, base), [], {}, timings, bad_day

        def identity() -> None:
            # Signed approvals and releases (issue 26.5): reliability/identity.py.
            identity_scenario(results, env, base / "identity", small)

        def logins() -> None:
            # The servers' logins (issue 26.4/26.5): unauthenticated requests to Prefect and the officers' Datasette.
            logins_scenario(results, env, base / "logins", small)

        if args.identity_only:
            timed("identity", identity)
            return _finish(results, base), [], {}, timings, []
        if args.logins_only:
            timed("logins", logins)
            return _finish(results, base), [], {}, timings, []

        def faults() -> None:
            jobs = [(point, run) for run in range(args.fault_runs) for point in FAULT_POINTS]
            pool = ThreadPoolExecutor(max_workers=2)  # independent stores and folders; one per core
            try:
                list(pool.map(lambda job: fault_scenario(
                    results, env, base / f"fault-{job[0]}-{job[1]}", fault_source, job[0], extra_reruns=2), jobs))
            finally:  # interrupted: the jobs not yet started are dropped, not run
                pool.shutdown(wait=False, cancel_futures=True)
            results.counts["kill points × runs"] = (
                f"{len(FAULT_POINTS)} × {args.fault_runs} (each: SIGKILL, rerun, 2 further reruns; {args.fault_rows} records)"
            )

        def bad_input() -> None:
            bad_table.extend(bad_input_scenario(results, env, base / "bad", small, subprocess_cli))

        def leaks() -> None:
            leak_matrix.update(leak_scenario(results, env, base / "leak", leak_sample, rows_with_canaries=10))

        def private_store() -> None:
            # A store only its owner reads (issue 21.3): modes, a copy of the store as a guessing oracle, a shared
            # store folder. Its own block: reliability/private_store.py.
            private_store_scenario(results, env, base / "private-store", small)

        def dask() -> None:
            # The Dask engine: its cluster closed to other clients, its scratch under kills (issues 21, 24).
            if args.skip_dask:
                return
            start = time.monotonic()
            dask_sample = sample_source(base / "dask-sample.csv", args.dask_rows)
            for point in DASK_KILL_POINTS:
                dask_kill_scenario(results, env, base / f"dask-kill-{point}", dask_sample, point)
            timings["dask scratch"] = time.monotonic() - start
            results.counts["Dask kill points"] = f"{len(DASK_KILL_POINTS)} ({', '.join(DASK_KILL_POINTS)}; {args.dask_rows} records)"
            start = time.monotonic()
            cluster_intruder_scenario(results, env, base / "dask-intruder", dask_sample)
            timings["dask cluster"] = time.monotonic() - start
            start = time.monotonic()
            for point in WORKER_FAULT_POINTS:
                worker_kill_scenario(results, env, base / f"dask-worker-{point}", dask_sample, point)
            timings["dask worker kill"] = time.monotonic() - start

        def rollback() -> None:
            # A store put back from a backup (issue 24.1), with or without its head log: reliability/rollback.py.
            bad_day.extend(rollback_scenario(results, env, base / "rollback", small))  # its rows join the bad day's table

        def before_epsilon() -> None:
            # Every check that needs no noise before ε, and `kepsilon check` (issue 24.3, 24.5): reliability/pre_epsilon.py.
            bad_table.extend(_settings_rows(pre_epsilon_scenario(results, env, base / "before-epsilon", small)))

        def tampering() -> None:
            if not (base / "race-0" / "audit.db").exists():
                races()  # the tampered copies are of the first race's store
            tamper_scenario(results, env, base / "tamper", base / "race-0" / "audit.db")

        def noise() -> None:
            noise_scenario(results, args.noise_samples)

        def orchestrator() -> None:
            # Each kill needs a server of its own (it is killed): one at a time.
            rows = [orchestrator_death(results, base / "orchestrator", small, point) for point in ORCHESTRATOR_KILL_POINTS]
            results.counts["Prefect server killed under a release"] = (
                "; ".join(f"at {row['point']}: store {row['store']}, exit {row['exit']}, {row['seconds']} s after the kill"
                          for row in rows))

        blocks = {"bad day": day, "faults": faults, "races": races, "bad input": bad_input, "bad settings": settings,
                  "leaks": leaks, "private store": private_store, "dask": dask, "rollback": rollback,
                  "before ε": before_epsilon, "tampering": tampering, "noise": noise, "orchestrator lost": orchestrator,
                  "identity": identity, "logins": logins}
        order = list(blocks)
        if args.issue_24_first:
            order = [*ISSUE_24_BLOCKS, *(name for name in order if name not in ISSUE_24_BLOCKS)]
        PROGRESS["planned"] = order
        for name in order:
            if name in ("bad settings", "dask"):  # these time their parts themselves
                PROGRESS["running"] = name
                blocks[name]()
                PROGRESS["done"].append(name)
            else:
                timed(name, blocks[name])
    return _finish(results, base), bad_table, leak_matrix, timings, bad_day


def _finish(results: Results, base: Path) -> Results:
    if not results.failed():
        shutil.rmtree(base, ignore_errors=True)
    else:
        results.counts["scratch folder (kept for inspection)"] = str(base)
    return results


# What a failed check of each kind would mean, told by the words its name uses (every scenario names its
# checks this way: "no traceback", "one reservation, one spend", "the rerun publishes on the same reservation").
OUTCOME_KINDS = {
    "tracebacks": ("traceback",),
    "ε overspent": ("spend", "spent", "reserv", "cap", "admit", "admissible", "twice"),
    "ε or a release lost": ("lost", "resum", "rerun", "publishes", "same reservation", "recreated", "complete"),
}


def _outcome_table(results: Results, categories: list[str]) -> list[str]:
    """Per category: of the checks about tracebacks, overspending and losses, how many failed."""
    lines = ["", "## Lost, overspent, tracebacks: failed checks of each kind, per category", "",
             "A check counts under a kind when its name says so (e.g. 'no traceback'; 'one reservation, one spend';",
             "'the rerun publishes on the same reservation'); the figure is failed / checks of that kind.", "",
             "| category | " + " | ".join(OUTCOME_KINDS) + " |", "|---|" + "---:|" * len(OUTCOME_KINDS)]
    for category in categories:
        own = [c for c in results.checks if c.category == category]
        cells = []
        for words in OUTCOME_KINDS.values():
            kind = [c for c in own if any(word in c.name.lower() for word in words)]
            cells.append(f"{sum(not c.ok for c in kind)} / {len(kind)}" if kind else "—")
        lines.append(f"| {category} | " + " | ".join(cells) + " |")
    return lines


def write_report(results: Results, bad_table: list[dict], leak_matrix: dict, timings: dict[str, float], path: Path,
                 bad_day: Sequence[dict] = ()) -> str:
    passed = sum(c.ok for c in results.checks)
    failed = len(results.checks) - passed
    lines = [
        "# Reliability and security report",
        "",
        f"Generated by `make reliability` on {datetime.now(UTC):%Y-%m-%d %H:%M UTC}. Every release ran through the",
        "real `kepsilon` command against a real local Prefect server (the leak test runs the flow in a",
        "subprocess with a planted seed). Scenarios: `reliability/scenarios.py` and the modules beside it",
        "(`dask_scenarios.py`, `private_store.py`, `rollback.py`, `pre_epsilon.py`, `identity.py`, `logins.py`).",
        "",
        "## Counts",
        "",
    ]
    lines += [f"- **{name}**: {value}" for name, value in results.counts.items()]
    lines += ["", "## Checks per category", "", "| category | passed | failed | seconds |", "|---|---:|---:|---:|"]
    categories = list(dict.fromkeys(c.category for c in results.checks))
    for category in categories:
        own = [c for c in results.checks if c.category == category]
        lines.append(f"| {category} | {sum(c.ok for c in own)} | {sum(not c.ok for c in own)} | {timings.get(category, 0):.0f} |")
    lines += _outcome_table(results, categories)
    lines += ["", "## An operator's bad day (issue 16) and a store put back from a backup (issue 24): each scenario's end state", "",
              "ε spent is the population's spend entries; 'refused before ε' means no reservation, spend or seed was",
              "added by the refused run and nothing appeared under the release's final name.", "",
              "| scenario | outcome | releases published | ε spent | records | refused before any ε |", "|---|---|---:|---:|---|---|"]
    for row in bad_day:
        before = {True: "yes", False: "no (failed after ε, resumed by the rerun)", None: "— (published)"}[row["refused_before_epsilon"]]
        lines.append(f"| {row['scenario']} | {row['outcome']} | {row['releases']} | {row['epsilon']:g} | {row['records']} | {before} |")
    lines += ["", "## Bad input catalogue (exit code and the CLI's message)", "", "| case | exit | outcome | message |", "|---|---:|---|---|"]
    for row in bad_table:
        message = row["message"].replace("|", "\\|") or "—"
        lines.append(f"| {row['case']} | {row['exit']} | {row['outcome']} | {message} |")
    lines += ["", "## Places searched for canaries (files searched)", ""]
    lines += [f"- {place}: {n}" for place, n in leak_matrix.items()]
    failures = results.failed()
    if failures:
        lines += ["", "## Failed checks", ""]
        lines += [f"- [{c.category}] {c.name}: {c.detail}" for c in failures]
    lines += ["", "## All checks", ""]
    lines += [f"- {'PASS' if c.ok else 'FAIL'} [{c.category}] {c.name}" + (f" — {c.detail}" if c.detail else "") for c in results.checks]
    summary = f"{passed} passed, {failed} failed" + (" (PARTIAL RUN: see Counts)" if "PARTIAL RUN" in results.counts else "")
    lines += ["", summary, ""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fault-runs", type=int, default=3)
    parser.add_argument("--fault-rows", type=int, default=32440)
    parser.add_argument("--race-trials", type=int, default=3)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--noise-samples", type=int, default=20000)
    parser.add_argument("--report", type=Path, default=REPORT)
    parser.add_argument("--lock-seconds", type=float, nargs="+", default=[30, 90], help="how long another writer holds the lock")
    parser.add_argument("--late-lock-seconds", type=float, default=90)
    parser.add_argument("--busy-timeout", type=float, default=60, help="KEPSILON_AUDIT_BUSY_TIMEOUT for the lock scenarios")
    parser.add_argument("--bad-day-only", action="store_true", help="run only the bad-day scenarios")
    parser.add_argument("--races-only", action="store_true",
                        help="run only the budget races (--race-trials trials of --processes processes)")
    parser.add_argument("--dask-rows", type=int, default=4000, help="records of the Dask scenarios' source")
    parser.add_argument("--skip-dask", action="store_true", help="leave out the Dask engine's scenarios")
    parser.add_argument("--bad-settings-only", action="store_true",
                        help="run only the bad-settings and same-id race scenarios (issue 24, items 4 and 5)")
    parser.add_argument("--identity-only", action="store_true",
                        help="run only the identity attacks (issue 26.5: signed approvals and releases)")
    parser.add_argument("--logins-only", action="store_true",
                        help="run only the logins scenario (issue 26: unauthenticated requests to Prefect and Datasette)")
    parser.add_argument("--same-id-trials", type=int, default=5, help="same-id races: trials of 3 processes")
    parser.add_argument("--issue-24-first", action="store_true",
                        help="run issue 24's blocks first (" + ", ".join(ISSUE_24_BLOCKS) + "), then the others")
    args = parser.parse_args()
    # SIGTERM as Ctrl-C: either ends the run with a report of what finished, marked partial.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        results, bad_table, leak_matrix, timings, bad_day = run_all(args)
    except KeyboardInterrupt:
        if "results" not in PROGRESS:
            raise
        results, bad_table, leak_matrix, timings, bad_day = (PROGRESS[k] for k in ("results", "bad_table", "leak_matrix",
                                                                                    "timings", "bad_day"))
        done = PROGRESS["done"]
        results.counts["PARTIAL RUN"] = (
            f"stopped during '{PROGRESS.get('running', '?')}' (its checks so far are listed); finished: {', '.join(done) or 'none'}; "
            f"not run: {', '.join(n for n in PROGRESS.get('planned', []) if n not in done and n != PROGRESS.get('running')) or 'none'}"
        )
        results.counts["scratch folder (kept for inspection)"] = str(PROGRESS["base"])
    summary = write_report(results, bad_table, leak_matrix, timings, args.report, bad_day)
    for check in results.failed():
        print(f"FAIL [{check.category}] {check.name}: {check.detail}")
    partial = "PARTIAL RUN" in results.counts
    print(f"{'PARTIAL RUN (interrupted): ' if partial else ''}{summary} — report in {args.report}")
    return 1 if results.failed() or partial else 0


if __name__ == "__main__":
    sys.exit(main())
