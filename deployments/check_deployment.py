"""Scripted check: a deployment run with changed parameters completes on a local Prefect server.

What an operator does from the UI's "Custom run" form, done through the same API: start a real Prefect
server, deploy ``deployments/prefect.yaml`` to a process work pool, start a worker, run the nightly
deployment with k and ε changed, and check that the run completes and that its published file is
k-anonymous (an independent group count) with the changed parameters. Everything lives in a temporary
folder (Prefect home, audit store, output), so it can run anywhere, including CI.

    .venv/bin/python deployments/check_deployment.py [--k 5] [--epsilon 0.5] [--prefect-database PATH]

``--prefect-database``: start the server from a copy of a Prefect database Prefect has already migrated (the
test suite passes its own, which spares the server Prefect's migrations); without it, a fresh one.

Exit status 0 when every check holds; prints one line per check.
"""

import argparse
import asyncio
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from uuid import UUID

import yaml

from kepsilon.local_server import prefect_server, stop

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
DEPLOYMENT = "governed-release/paper-synthetic-nightly"
ADVICE_DEPLOYMENT = "advise/paper-synthetic-advice"


def prefect(*args: str, env: dict) -> str:
    result = subprocess.run([str(BIN / "prefect"), *args], cwd=ROOT, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"prefect {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout


def changed_parameters(k: int, epsilon: float, output_dir: Path) -> dict:
    """The deployment's own spec parameter with k, ε, the release id and the output folder changed."""
    deployments = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())["deployments"]
    spec = dict(deployments[0]["parameters"]["spec"])
    spec.update(k=k, epsilon=epsilon, release_id=f"deployment-check-k{k}", output_dir=str(output_dir))
    return {"spec": spec}


async def run_and_wait(parameters: dict, timeout: float, deployment: str = DEPLOYMENT) -> tuple[str, str]:
    from prefect.client.orchestration import get_client
    from prefect.deployments import arun_deployment

    flow_run = await arun_deployment(deployment, parameters=parameters, timeout=0)
    deadline = time.monotonic() + timeout
    async with get_client() as client:
        while time.monotonic() < deadline:
            state = (await client.read_flow_run(flow_run.id)).state
            if state is not None and state.is_final():
                return str(flow_run.id), state.type.value
            await asyncio.sleep(1)
    return str(flow_run.id), "TIMED_OUT"


def check(name: str, ok: bool, failures: list[str]) -> None:
    print(f"{'PASS' if ok else 'FAIL'}  {name}")
    if not ok:
        failures.append(name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--epsilon", type=float, default=0.5)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--prefect-database", type=Path, default=None)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="kepsilon-deploy-"))
    failures: list[str] = []
    with prefect_server(work / "prefect", database=args.prefect_database) as server_env:
        env = {
            **server_env,
            "KEPSILON_PROJECT_DIR": str(ROOT),
            "KEPSILON_AUDIT_DB": str(work / "audit.db"),
            "KEPSILON_SEED_KEY_FILE": str(work / "seed.key"),
            "KEPSILON_REPORTS_DIR": str(work / "reports"),
        }
        os.environ.update(env)
        subprocess.run(
            [str(BIN / "kepsilon"), "audit", "set-cap", "paper-synthetic-people", "10", "--by", "check", "--reason", "check"],
            cwd=ROOT, env=env, check=True, capture_output=True,
        )
        prefect("work-pool", "create", "kepsilon-process", "--type", "process", "--overwrite", env=env)
        prefect("--no-prompt", "deploy", "--all", "--prefect-file", "deployments/prefect.yaml", env=env)
        worker = subprocess.Popen(
            [str(BIN / "prefect"), "worker", "start", "--pool", "kepsilon-process"],
            cwd=ROOT, env=env, stdout=open(work / "worker.log", "w"), stderr=subprocess.STDOUT,
        )
        try:
            check_run(args, work / "out", failures)
            check_advice(args, work / "out", failures)
        finally:
            stop(worker)
    if failures:
        # Kept for the logs (worker.log, prefect/server.log); it also holds the check's store, seed key and
        # reports, so it stays 0700 (mkdtemp) and is the reader's to remove.
        print(f"FAILED: deployment check ({len(failures)} failure(s)); logs and the check's private files in {work}")
        return 1
    # The check's store, seed key, reports and published files are private: nothing of them stays behind.
    shutil.rmtree(work, ignore_errors=True)
    print("OK: deployment check (0 failure(s))")
    return 0


def check_run(args, output_dir: Path, failures: list[str]) -> None:
    """Run the deployment with changed k and ε and check what it published."""
    import pandas as pd

    parameters = changed_parameters(args.k, args.epsilon, output_dir)
    flow_run_id, state = asyncio.run(run_and_wait(parameters, args.timeout))
    check(f"deployment run {flow_run_id} completed (state {state})", state == "COMPLETED", failures)

    release = output_dir / parameters["spec"]["release_id"]
    manifest_path = release / "manifest.json"
    check("manifest.json published", manifest_path.exists(), failures)
    if not manifest_path.exists():
        return
    manifest = json.loads(manifest_path.read_text())
    check(f"manifest records the changed k={args.k}", manifest["method"]["k"] == args.k, failures)
    check(f"manifest records the changed ε={args.epsilon}", manifest["method"]["epsilon"] == args.epsilon, failures)
    # Who ran it and in which flow run is private: the audit record has it, the public manifest does not.
    recorded = sqlite3.connect(os.environ["KEPSILON_AUDIT_DB"]).execute(
        "SELECT flow_run_id FROM releases WHERE release_id = ? AND outcome = 'published'", (release.name,)
    ).fetchall()
    check("audit record names the deployment's flow run", recorded == [(flow_run_id,)], failures)
    check("public manifest does not name the flow run", flow_run_id not in manifest_path.read_text(), failures)
    published = pd.read_csv(release / "data.csv")
    smallest = published.groupby(manifest["roles"]["k_quasi"]).size().min()
    check(f"published file is {args.k}-anonymous (smallest group {smallest})", smallest >= args.k, failures)


def check_advice(args, output_dir: Path, failures: list[str]) -> None:
    """Run the advice deployment on a small grid: it completes, shows its plots on the run, spends nothing."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, FlowRunFilter, FlowRunFilterId

    deployments = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())["deployments"]
    request = dict(next(d for d in deployments if d["name"] == "paper-synthetic-advice")["parameters"]["request"])
    request.update(k_values=[args.k], epsilon_values=[args.epsilon], draws=3)
    request["spec"] = {**request["spec"], "output_dir": str(output_dir / "advice-must-not-write-here")}
    store = sqlite3.connect(os.environ["KEPSILON_AUDIT_DB"])
    ledger_before = store.execute("SELECT COUNT(*) FROM ledger").fetchone()[0]
    flow_run_id, state = asyncio.run(run_and_wait({"request": request}, args.timeout, ADVICE_DEPLOYMENT))
    check(f"advice run {flow_run_id} completed (state {state})", state == "COMPLETED", failures)
    events = store.execute("SELECT via, flow_run_id FROM advice_events").fetchall()
    check("advice recorded as an advice event naming its flow run", events == [("flow", flow_run_id)], failures)
    check("advice left the ledger unchanged", store.execute("SELECT COUNT(*) FROM ledger").fetchone()[0] == ledger_before, failures)
    check("advice wrote nothing where releases are published", not (output_dir / "advice-must-not-write-here").exists(), failures)
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(flow_run_id)])), artifact_filter=ArtifactFilter()
        )
    images = sum(str(a.data).count("](data:image/png;base64,") for a in artifacts)
    check(f"advice run shows its 3 plots on its page ({images} embedded)", images == 3, failures)


if __name__ == "__main__":
    sys.exit(main())
