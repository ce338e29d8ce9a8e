"""Every check that needs no noise runs before ε, and ``kepsilon check`` reports it (issue 24, items 3 and 5).

Each case runs the real ``kepsilon release`` and ``kepsilon check`` against the run's Prefect server, under
a cap that admits the ε, and asserts: exit 2, one line naming the parameter or variable (never a value), no
traceback, no reservation, spend or sealed seed added, nothing under the final name, and the check's
verdict of the same name marked ``NO`` with a final ``would be refused`` line.

- ``ε too small for the noise grid`` / ``ε too large for float precision`` (``--epsilon 0.0005`` and
  ``1e7``): these used to fail after the reservation, with ε recorded as spent.
- ``corrupt seed key file``: used to let every new release reserve ε and then fail.
- ``deleted seed key, a reservation awaiting its seed``: a release killed after its noise, its key file
  deleted: the rerun is refused naming the variable, the file is not recreated (a new key could not unseal
  the sealed seed); put back, the rerun publishes on the same reservation — one spend, one seed.
- ``scratch folder inside the output folder`` (Dask engine).
- ``empty release``: confidence suppression predicted to remove every record (confidence 0.0001, budget 1.0).
"""

from __future__ import annotations

import re
from pathlib import Path

from .harness import Results, kepsilon, ledger_kinds, rows, set_cap, spec_dict, store_env, write_spec
from .scenarios import NO_BUDGET_FAILURES, _figures, _flat, _message_lines

CATEGORY = "before ε"
REFUSED = "release refused:"


class Case:
    """One case's folder, store (its own, cap ``cap``) and spec."""

    def __init__(self, results: Results, env: dict, base: Path, name: str, source: Path, cap: float = 10.0):
        self.results, self.name, self.source = results, name, source
        self.work = base / re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
        self.work.mkdir(parents=True, exist_ok=True)
        self.env = store_env(env, self.work)
        self.env.pop("KEPSILON_DEFAULT_CAP", None)
        self.db = self.work / "audit.db"
        set_cap(self.env, self.work, cap)

    def spec(self, release_id: str, **changes) -> Path:
        spec = spec_dict(self.work, release_id, source={"path": str(self.source), "delimiter": ";"}, **NO_BUDGET_FAILURES)
        spec.update(changes)
        return write_spec(self.work, spec, name=release_id)

    def add(self, what: str, ok: bool, detail: str = "") -> bool:
        return self.results.add(CATEGORY, f"{self.name}: {what}", ok, detail)

    def refused(self, spec: Path, release_id: str, names: tuple[str, ...], verdict: str, extra: tuple[str, ...] = (),
                value: str | None = None) -> dict:
        """Release then check ``spec``: both refuse, the release in one line naming one of ``names``, nothing spent."""
        before = _figures(self.db)
        run = kepsilon(["release", str(spec), *extra], self.env, self.work)
        said = [line for line in _message_lines(run.stderr) if not line.startswith("note:")]
        line = said[-1] if said else ""
        self.add("release: exit 2", run.returncode == 2, f"exit {run.returncode}: {_flat(run.stderr)[-200:]}")
        self.add("release: one line, naming " + " or ".join(names),
                 len(said) == 1 and line.startswith(REFUSED) and any(n in line for n in names), line[:240])
        if value is not None:
            self.add("release: the value is not repeated", value not in line, line[:240])
        self.add("release: no traceback", "Traceback" not in run.stdout + run.stderr)
        after = _figures(self.db)
        self.add("release: refused before any ε (no new reservation, spend or seed)",
                 (after["reserves"], after["spent"], after["seeds"]) == (before["reserves"], before["spent"], before["seeds"]),
                 f"before {before['reserves']}/{before['spent']}/{before['seeds']}, "
                 f"after {after['reserves']}/{after['spent']}/{after['seeds']}")
        self.add("release: nothing under the final name", not (self.work / "out" / release_id).exists())
        checked = kepsilon(["check", str(spec), *extra], self.env, self.work)
        output = checked.stdout + checked.stderr
        self.add(f"check: exit 2, verdict '{verdict}' marked NO, 'would be refused'",
                 checked.returncode == 2 and re.search(rf"^\s*NO\s+{re.escape(verdict)}", output, re.MULTILINE) is not None
                 and "would be refused:" in output, f"exit {checked.returncode}: {_flat(output)[-240:]}")
        self.add("check: no traceback", "Traceback" not in output)
        return {"case": self.name, "exit": run.returncode, "line": line[:200]}


GRID_CASES = (("ε too small for the noise grid", "0.0005", 10.0), ("ε too large for float precision", "1e7", 2e7))


def noise_grid_cases(results: Results, env: dict, base: Path, source: Path, cases=GRID_CASES) -> list[dict]:
    """ε too small (grid wider than the bounds) and too large (grid under the float precision), caps admitting them."""
    table = []
    for name, epsilon, cap in cases:
        case = Case(results, env, base, name, source, cap=cap)
        release_id = "grid"
        table.append(case.refused(case.spec(release_id), release_id, ("'epsilon'",), "noise grid",
                                  extra=("--epsilon", epsilon), value=epsilon))
    return table


def corrupt_seed_key(results: Results, env: dict, base: Path, source: Path) -> dict:
    case = Case(results, env, base, "corrupt seed key file", source)
    (case.work / "seed.key").write_bytes(b"this is not a Fernet key\n")
    (case.work / "seed.key").chmod(0o600)
    return case.refused(case.spec("seeded"), "seeded", ("KEPSILON_SEED_KEY_FILE",), "seed key")


def deleted_seed_key(results: Results, env: dict, base: Path, source: Path) -> dict:
    """Killed after its noise (seed sealed), the key file deleted: refused, not recreated; put back, resumed."""
    case = Case(results, env, base, "deleted seed key, a reservation awaiting its seed", source)
    spec = case.spec("awaiting")
    killed = kepsilon(["release", str(spec)], case.env, case.work, fault="after-noise")
    case.add("the first run was killed after its noise", killed.returncode == -9, f"exit {killed.returncode}")
    key_file = case.work / "seed.key"
    saved = key_file.read_bytes() if key_file.exists() else b""
    case.add("its seed key file existed", bool(saved))
    key_file.unlink(missing_ok=True)
    row = case.refused(spec, "awaiting", ("KEPSILON_SEED_KEY_FILE",), "seed key")
    case.add("the key file was not recreated", not key_file.exists())
    key_file.write_bytes(saved)
    key_file.chmod(0o600)
    rerun = kepsilon(["release", str(spec)], case.env, case.work)
    kinds = ledger_kinds(case.db, "awaiting")
    seeds = rows(case.db, "SELECT COUNT(*) FROM sealed_seeds")[0][0]
    outcomes = [o for (o,) in rows(case.db, "SELECT outcome FROM releases WHERE release_id = 'awaiting' ORDER BY id")]
    case.add("with the key put back, the rerun publishes on the same reservation and seed (nothing lost)",
             rerun.returncode == 0 and kinds == {"reserve": 1, "spend": 1} and seeds == 1 and outcomes[-1:] == ["published"],
             f"exit {rerun.returncode}, ledger {kinds}, seeds {seeds}, records {outcomes}")
    return row


def scratch_in_output(results: Results, env: dict, base: Path, source: Path) -> dict:
    case = Case(results, env, base, "dask scratch folder inside the output folder", source)
    execution = {"engine": "dask", "partitions": 2, "workers": 1, "scratch": str(case.work / "out" / "scratch")}
    return case.refused(case.spec("scratchy", execution=execution), "scratchy", ("execution.scratch",), "scratch folder")


def empty_release(results: Results, env: dict, base: Path, source: Path) -> dict:
    """Confidence 0.0001 with budget 1.0: confidence suppression would remove every record (issue 24's case)."""
    case = Case(results, env, base, "empty release (confidence 0.0001, budget 1.0)", source)
    spec = case.spec("empty", confidence=0.0001, suppression_budget=1.0)
    return case.refused(spec, "empty", ("'confidence'", "'k'"), "records published")


def pre_epsilon_scenario(results: Results, env: dict, base: Path, source: Path) -> list[dict]:
    """All the cases above; the rows of the report's table."""
    base.mkdir(parents=True, exist_ok=True)
    table = noise_grid_cases(results, env, base, source)
    table += [corrupt_seed_key(results, env, base, source), deleted_seed_key(results, env, base, source),
              scratch_in_output(results, env, base, source), empty_release(results, env, base, source)]
    results.counts["checks before ε (release and check)"] = str(len(table))
    return table
