"""What ``kepsilon release`` prints, run as a user runs it: a subprocess on the bundled sample.

A success prints no ERROR and no traceback; a refusal prints its reason as one line with exit code 2 and
no traceback (it used to print Prefect's two tracebacks first), ``--debug`` adds the traceback; a crash
still shows what failed and where. Where the run reports: to the configured Prefect server (its flow
runs list it), else to the server ``make serve`` runs at 127.0.0.1:PREFECT_PORT, else to a local server
the command starts and stops itself, saying so — the test checks that one is gone afterwards and left no
log of a clean run. Every run but those of the last kind shares the session's Prefect server.
"""

import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from kepsilon.local_server import seeded_prefect_home
from kepsilon.prefect_login import authorization_header

from .conftest import ROOT, release_spec_dict

pytestmark = pytest.mark.server

KEPSILON = str(ROOT / ".venv" / "bin" / "kepsilon") if (ROOT / ".venv" / "bin" / "kepsilon").exists() else "kepsilon"
POPULATION = "cli-output-people"
# One successful release in make test; KEPSILON_CLI_OUTPUT_RUNS=3 repeats it (an intermittent ERROR line or
# traceback shows in some runs only).
SUCCESS_RUNS = int(os.environ.get("KEPSILON_CLI_OUTPUT_RUNS", "1"))
OWN_SERVER_RUNS = int(os.environ.get("KEPSILON_CLI_OWN_SERVER_RUNS", "1"))


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, prefect_server_env):
    """A spec publishing under a temporary folder, its own audit store and seed key, cap 10; the CLI's
    environment points at the session's Prefect server."""
    work = tmp_path_factory.mktemp("cli-output")
    # Several releases of the same source here: each is a new release, not "unchanged since the last one".
    spec = release_spec_dict("paper-synthetic", release_id="cli-output", population_id=POPULATION,
                             output_dir=str(work / "out"), rerelease_unchanged=True)
    (work / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    env = {**prefect_server_env, "KEPSILON_AUDIT_DB": str(work / "audit.db"),
           "KEPSILON_SEED_KEY_FILE": str(work / "seed.key"), "KEPSILON_REPORTS_DIR": str(work / "reports")}
    for name in ("KEPSILON_SEED_KEY", "KEPSILON_DEFAULT_CAP", "KEPSILON_FAULT_AT", "DO_NOT_TRACK"):
        env.pop(name, None)  # DO_NOT_TRACK unset: the CLI sets it itself (no telemetry banner)
    capped = subprocess.run([KEPSILON, "audit", "set-cap", POPULATION, "10", "--by", "tester", "--reason", "test"],
                            env=env, cwd=work, capture_output=True, text=True)
    assert capped.returncode == 0, capped.stderr
    return work, env


def run(workspace, *args, command=None, env=None):
    work, base_env = workspace
    done = subprocess.run(command or [KEPSILON, "release", str(work / "spec.yaml"), *args], env=env or base_env,
                          cwd=work, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout, done.stderr


def server_is_gone(output: str) -> bool:
    """The run's server (its port is in the flow run's 'View at' line) no longer answers."""
    ports = set(re.findall(r"View at http://127\.0\.0\.1:(\d+)/", output))
    assert ports, output
    for port in ports:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=2)
            return False
        except OSError:
            pass
    return True


def flow_run_on(api_url: str, output: str, seconds: float = 30, auth_string: str | None = None) -> dict:
    """The flow run the CLI's 'View at' line names, as the server at ``api_url`` lists it, once finished
    (asked with the server's login ``auth_string``)."""
    ids = re.findall(r"View at http://[^/]+/runs/flow-run/([0-9a-f-]{36})", output)
    assert len(ids) == 1, output
    request = urllib.request.Request(f"{api_url}/flow_runs/filter", method="POST",
                                     data=json.dumps({"flow_runs": {"id": {"any_": ids}}}).encode(),
                                     headers={"Content-Type": "application/json", **authorization_header(auth_string)})
    deadline = time.monotonic() + seconds
    while True:
        with urllib.request.urlopen(request, timeout=10) as response:
            runs = json.loads(response.read())
        if runs and (runs[0]["state_type"] == "COMPLETED" or time.monotonic() > deadline):
            return runs[0] if runs else {}
        if not runs and time.monotonic() > deadline:
            return {}
        time.sleep(0.5)


def flow_run_events(api_url: str, flow_run_id: str, names: list[str], auth_string: str | None) -> int:
    """How many events named ``names`` the server at ``api_url`` holds about the flow run ``flow_run_id``."""
    since = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(time.time() - 3600))
    body = {"filter": {"event": {"name": names}, "any_resource": {"id": [f"prefect.flow-run.{flow_run_id}"]},
                       "occurred": {"since": since}}, "limit": 50}
    request = urllib.request.Request(f"{api_url}/events/filter", method="POST", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **authorization_header(auth_string)})
    with urllib.request.urlopen(request, timeout=10) as response:
        return int(json.loads(response.read())["total"])


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("attempt", range(SUCCESS_RUNS))
def test_a_successful_release_is_listed_by_the_configured_server_and_prints_no_error(workspace, attempt):
    work, env = workspace
    code, out, err = run(workspace, "--release-id", f"cli-ok-{attempt}")
    assert code == 0, err
    assert "records published" in out
    for text in (out, err):
        assert "Traceback" not in text, text
        assert "ERROR" not in text, text
        assert "Prefect collects anonymous usage data" not in text  # the CLI sets DO_NOT_TRACK itself
    assert "local Prefect server of its own" not in err  # a configured server that answers is used
    listed = flow_run_on(env["PREFECT_API_URL"], err, auth_string=env["PREFECT_API_AUTH_STRING"])
    assert listed.get("state_type") == "COMPLETED", listed
    assert listed["parameters"]["spec"]["release_id"] == f"cli-ok-{attempt}"
    assert not list((work / "prefect").glob("kepsilon-release-server-*.log")), "no server of its own, no log"
    if attempt:
        return
    # The CLI's run sends no heartbeat (kepsilon.cli.HEARTBEAT_VARIABLES): once the server has the run's
    # completion event, it has no heartbeat event of it (Prefect's default sends one as the run starts).
    # Asked of the first attempt only: the server's events arrive some seconds after the run.
    api, login = env["PREFECT_API_URL"], env["PREFECT_API_AUTH_STRING"]
    deadline = time.monotonic() + 30
    while not flow_run_events(api, listed["id"], ["prefect.flow-run.Completed"], login) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert flow_run_events(api, listed["id"], ["prefect.flow-run.Completed"], login) == 1
    assert flow_run_events(api, listed["id"], ["prefect.flow-run.heartbeat"], login) == 0


def test_the_clis_flow_run_sends_heartbeats_only_when_the_environment_asks():
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, PREFECT_FLOWS_HEARTBEAT_FREQUENCY

    from kepsilon.cli import CLIENT_MAX_RETRIES, release_client_settings

    assert release_client_settings({}) == {PREFECT_CLIENT_MAX_RETRIES: CLIENT_MAX_RETRIES,
                                           PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}
    for name in ("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", "PREFECT_RUNNER_HEARTBEAT_FREQUENCY"):
        assert PREFECT_FLOWS_HEARTBEAT_FREQUENCY not in release_client_settings({name: "60"})
    assert release_client_settings({"PREFECT_CLIENT_MAX_RETRIES": "8"}) == {PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}


def test_without_prefect_api_url_the_release_goes_to_the_make_serve_server(workspace):
    """`make serve` sets no PREFECT_API_URL for the user's shell: the CLI finds it at 127.0.0.1:PREFECT_PORT."""
    work, env = workspace
    port = env["PREFECT_API_URL"].split(":")[2].split("/")[0]
    found = {**env, "PREFECT_PORT": port}
    found.pop("PREFECT_API_URL")
    code, out, err = run(workspace, "--release-id", "cli-serve", env=found)
    assert code == 0, err
    assert f"Prefect server: http://127.0.0.1:{port} (make serve)" in err
    assert flow_run_on(env["PREFECT_API_URL"], err, auth_string=env["PREFECT_API_AUTH_STRING"]).get("state_type") == "COMPLETED"


def test_the_make_serve_server_with_a_login_the_cli_lacks_is_not_used(workspace, migrated_prefect_database):
    """A server at PREFECT_PORT whose login the CLI does not have (no PREFECT_API_AUTH_STRING, another secret
    in KEPSILON_PREFECT_AUTH_FILE) would refuse every report: the run goes to a server of its own, saying why."""
    work, env = workspace
    port = env["PREFECT_API_URL"].split(":")[2].split("/")[0]
    wrong = work / "private" / "prefect-server.auth"
    wrong.parent.mkdir(mode=0o700, exist_ok=True)
    wrong.write_text("kepsilon:not-the-secret\n")
    seeded_prefect_home(work / "own-prefect-login", migrated_prefect_database)  # its own server: no migrations
    lacking = {**env, "PREFECT_PORT": port, "KEPSILON_PREFECT_AUTH_FILE": str(wrong),
               "PREFECT_HOME": str(work / "own-prefect-login"), "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120"}
    for name in ("PREFECT_API_URL", "PREFECT_API_AUTH_STRING"):
        lacking.pop(name)
    code, out, err = run(workspace, "--release-id", "cli-serve-wrong-login", env=lacking)
    assert code == 0, err
    notes = [line for line in err.splitlines() if "local Prefect server of its own" in line]
    assert len(notes) == 1 and "refuses this run's login" in notes[0], err
    assert "Traceback" not in out + err
    assert server_is_gone(err)


@pytest.mark.parametrize("attempt", range(OWN_SERVER_RUNS))
@pytest.mark.parametrize("configured", [False, True], ids=["none configured", "configured one down"])
def test_with_no_server_answering_the_cli_runs_its_own_says_so_and_stops_it(workspace, configured, attempt):
    work, env = workspace
    alone = {**env, "PREFECT_PORT": str(closed_port()), "PREFECT_HOME": str(work / "own-prefect"),
             "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120"}
    alone.pop("PREFECT_API_URL")
    if configured:
        alone["PREFECT_API_URL"] = f"http://127.0.0.1:{closed_port()}/api"
    code, out, err = run(workspace, "--release-id", f"cli-own-{configured:d}-{attempt}", env=alone)
    assert code == 0, err
    notes = [line for line in err.splitlines() if "local Prefect server of its own" in line]
    assert len(notes) == 1, err
    assert ("does not answer" in notes[0]) == configured and ("no Prefect server configured" in notes[0]) != configured
    for text in (out, err):
        assert "Traceback" not in text and "ERROR" not in text, text
    assert server_is_gone(err)
    assert not list((work / "own-prefect").glob("kepsilon-release-server-*.log")), "a clean run keeps no server log"


def _only_line(err: str, prefix: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, err
    assert err.rstrip().endswith(lines[0]), "the reason is the last thing printed"
    return lines[0]


def greedy_spec(workspace) -> str:
    """The workspace's spec with the gate's limits open, so that ε = 500 passes the checks before ε (its
    predicted linking risk and suppression are far above the defaults) and meets the cap."""
    work, _ = workspace
    spec = yaml.safe_load((work / "spec.yaml").read_text(encoding="utf-8"))
    spec.update(max_linking_risk=1.0, suppression_budget=1.0)
    (work / "greedy.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return str(work / "greedy.yaml")


def test_a_refusal_over_the_cap_prints_one_line_and_no_traceback(workspace):
    code, out, err = run(workspace, command=[KEPSILON, "release", greedy_spec(workspace), "--release-id", "cli-greedy",
                                             "--epsilon", "500"])
    assert code == 2
    line = _only_line(err, "release refused:")
    assert POPULATION in line and "exceeds the remaining budget" in line
    assert "Traceback" not in err + out


def test_a_refusal_for_an_unknown_column_prints_one_line_and_no_traceback(workspace):
    work, _ = workspace
    spec = yaml.safe_load((work / "spec.yaml").read_text(encoding="utf-8"))
    spec["roles"]["sensitive"] = [*spec["roles"]["sensitive"], "NO_SUCH_COLUMN"]
    (work / "unknown-column.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    code, out, err = run(workspace, command=[KEPSILON, "release", str(work / "unknown-column.yaml"),
                                              "--release-id", "cli-unknown-column"])
    assert code == 2
    assert "NO_SUCH_COLUMN" in _only_line(err, "release refused:")
    assert "Traceback" not in err + out


def test_debug_shows_the_refusals_traceback(workspace):
    code, _, err = run(workspace, command=[KEPSILON, "release", greedy_spec(workspace), "--release-id",
                                           "cli-greedy-debug", "--epsilon", "500", "--debug"])
    assert code == 2
    assert "Traceback" in err and "BudgetExceeded" in err
    _only_line(err, "release refused:")


def _crashing_cli(work: Path, command: str, release_id: str) -> list[str]:
    """``kepsilon COMMAND spec.yaml`` in a Python whose source reader raises an unexpected RuntimeError."""
    crash = (
        "import sys\n"
        "import kepsilon.tasks.ingest as ingest\n"
        "def crash(source):\n"
        "    raise RuntimeError('simulated crash while reading')\n"
        "ingest.read_source = crash\n"
        "from kepsilon.cli import app\n"
        f"sys.argv = ['kepsilon', {command!r}, {str(work / 'spec.yaml')!r}, '--release-id', {release_id!r}]\n"
        "app()\n"
    )
    return [sys.executable, "-c", crash]


def test_a_crash_still_says_what_failed_and_where(workspace):
    """Not a refusal: an unexpected exception inside a task keeps its traceback on the console."""
    work, _ = workspace
    code, out, err = run(workspace, command=_crashing_cli(work, "release", "cli-crash"))
    assert code == 1
    assert "Traceback" in err and "in crash" in err
    assert _only_line(err, "release failed:") == "release failed: RuntimeError: simulated crash while reading"


def test_a_check_that_crashes_says_check_failed(workspace):
    """``kepsilon check`` publishes and spends nothing: its crash line must not say a release failed."""
    work, _ = workspace
    code, out, err = run(workspace, command=_crashing_cli(work, "check", "cli-check-crash"))
    assert code == 1
    assert _only_line(err, "check failed:") == "check failed: RuntimeError: simulated crash while reading"
    assert "release failed" not in err + out


# The Prefect server answers 503 to the first two flow-run creations (its SQLite database busy with other
# runs), as it did to one of four releases racing for one budget: the client's bounded retries give up
# before the release has begun. Injected at the HTTP client, below Prefect's own retry loop.
BUSY_AT_FLOW_RUN_CREATION = """
import sys
import httpx
from kepsilon.cli import app

busy = {{"left": 2}}
real_send = httpx.Client.send

def send(self, request, *args, **kwargs):
    if request.method == "POST" and request.url.path.rstrip("/").endswith("/flow_runs") and busy["left"]:
        busy["left"] -= 1
        return httpx.Response(503, request=request, text="database is locked")
    return real_send(self, request, *args, **kwargs)

httpx.Client.send = send
sys.argv = ["kepsilon", "release", {spec!r}, "--release-id", {release_id!r}, "--epsilon", "500"]
app()
"""


def test_a_release_the_busy_server_did_not_start_is_started_again_and_refused_over_the_budget(workspace):
    """A budget race's loser whose run the Prefect server was too busy to create: before, it exited 2 with
    "nothing reserved, recorded or published" and left no refusal record; now the CLI starts it again once
    the server answers and it is refused with the budget message and recorded as refused."""
    work, env = workspace
    script = BUSY_AT_FLOW_RUN_CREATION.format(spec=greedy_spec(workspace), release_id="cli-busy-server")
    plain = {name: value for name, value in env.items() if name != "PREFECT_CLIENT_MAX_RETRIES"}  # the CLI's own bound
    code, out, err = run(workspace, command=[sys.executable, "-c", script], env=plain)
    assert code == 2, err
    line = _only_line(err, "release refused:")
    assert "exceeds the remaining budget" in line, err
    assert "starting it again" in err and "Traceback" not in err + out
    conn = sqlite3.connect(work / "audit.db")
    try:
        outcomes = [o for (o,) in conn.execute("SELECT outcome FROM releases WHERE release_id = 'cli-busy-server'")]
        ledger = conn.execute("SELECT COUNT(*) FROM ledger WHERE release_id = 'cli-busy-server'").fetchone()[0]
    finally:
        conn.close()
    assert outcomes == ["refused"] and ledger == 0


def test_a_failed_gate_says_failed_and_that_its_epsilon_is_spent(workspace):
    # The gate runs on the noisy release, after the spend: "refused" would tell the steward nothing was spent.
    work, _ = workspace
    spec = yaml.safe_load((work / "spec.yaml").read_text(encoding="utf-8"))
    spec["max_prosecutor_risk"] = 0.01  # every group has fewer than 100 members
    (work / "strict-gate.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    code, out, err = run(workspace, command=[KEPSILON, "release", str(work / "strict-gate.yaml"),
                                              "--release-id", "cli-strict-gate"])
    assert code == 2
    line = _only_line(err, "release failed:")
    assert "prosecutor_risk" in line and "its ε is spent" in line
    assert "release refused:" not in err and "Traceback" not in err + out
    assert not (work / "out" / "cli-strict-gate").exists()


# --- At a real terminal: tmux, 120 × 40 ---------------------------------------------------------------

BAR = "━"
LOG_MARK = re.compile(r"\| (INFO|WARNING|ERROR|CRITICAL|DEBUG) +\||Flow run '|Task run '")
TELEMETRY_BANNER = "Prefect collects anonymous usage data"


def run_in_tmux(workspace, tmp_path, spec_path, release_id: str, timeout: float = 300) -> str:
    """Run ``kepsilon release`` in a detached tmux pane of 120 × 40 (a real terminal); return its whole history.

    A tmux server of its own (``-L``), started by this process, so the pane gets this environment: the
    session's Prefect server, a fresh PREFECT_HOME (Prefect's telemetry banner shows once per home), and no
    DO_NOT_TRACK (the CLI must set it).
    """
    import shutil

    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (Debian: apt-get install tmux)")
    work, env = workspace
    socket_name = f"kepsilon-test-{os.getpid()}-{release_id}"
    pane_env = {**env, "PREFECT_HOME": str(tmp_path / "prefect-home"), "TERM": "xterm-256color"}
    pane_env.pop("DO_NOT_TRACK", None)
    done = tmp_path / "exit-code"
    script = tmp_path / "run.sh"
    script.write_text(f"cd {work} && {KEPSILON} release {spec_path} --release-id {release_id}; echo $? > {done}.tmp; "
                      f"mv {done}.tmp {done}; sleep 600\n", encoding="utf-8")
    tmux = ["tmux", "-L", socket_name]
    subprocess.run([*tmux, "-f", "/dev/null", "new-session", "-d", "-x", "120", "-y", "40", f"bash {script}"],
                   env=pane_env, check=True)
    try:
        deadline = time.monotonic() + timeout
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert done.exists(), "the release did not end in time"
        captured = subprocess.run([*tmux, "capture-pane", "-p", "-J", "-S", "-", "-E", "-"], env=pane_env,
                                  capture_output=True, text=True, check=True).stdout
    finally:
        subprocess.run([*tmux, "kill-server"], env=pane_env, capture_output=True)
    (tmp_path / "pane.txt").write_text(captured, encoding="utf-8")  # kept with pytest's temporary folders
    assert done.read_text().strip() == "0", captured
    return captured


def assert_a_clean_terminal(captured: str) -> None:
    lines = captured.splitlines()
    glued = [line for line in lines if BAR in line and LOG_MARK.search(line)]
    assert glued == [], "bars and log lines glued together:\n" + "\n".join(glued)
    bars = [line.split()[0] for line in lines if BAR in line and not line.startswith(("┏", "┡", "└", "┃", "│"))]
    assert bars, captured
    assert len(bars) == len(set(bars)), f"the bar block was drawn {len(bars) / len(set(bars)):.1f} times: {bars}"
    last_log = max(i for i, line in enumerate(lines) if LOG_MARK.search(line))
    first_bar = min(i for i, line in enumerate(lines) if BAR in line)
    assert first_bar > last_log, "the bars stay below the log, as one block"
    assert TELEMETRY_BANNER not in captured
    assert "records published" in captured


def test_at_a_terminal_the_log_prints_above_one_block_of_bars(workspace, tmp_path):
    """The bundled sample at a real terminal: eight stages, each bar drawn once, below every log line.

    Before: Prefect's handler wrote straight to the terminal under rich's live display, which redrew the
    whole bar block after every log line (23 copies) with log text glued to the bars; and a first run in a
    fresh PREFECT_HOME printed Prefect's telemetry banner.
    """
    work, _ = workspace
    captured = run_in_tmux(workspace, tmp_path, work / "spec.yaml", "cli-tty")
    assert_a_clean_terminal(captured)
    assert len([line for line in captured.splitlines() if BAR in line and "partitions" in line]) == 8


@pytest.mark.heavy
def test_at_a_terminal_a_dask_release_prints_no_telemetry_banner_and_clean_bars(workspace, tmp_path):
    """The sample on the Dask engine (two worker processes, four partitions): the workers inherit the
    CLI's DO_NOT_TRACK, so none prints Prefect's banner, and their stages' bars stay one block."""
    work, _ = workspace
    spec = yaml.safe_load((work / "spec.yaml").read_text(encoding="utf-8"))
    spec["execution"] = {"engine": "dask", "workers": 2, "partitions": 4}
    (work / "dask.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    captured = run_in_tmux(workspace, tmp_path, work / "dask.yaml", "cli-tty-dask", timeout=600)
    assert_a_clean_terminal(captured)
    assert any(BAR in line and "4/4 partitions" in line for line in captured.splitlines())


# --- What the CLI says when its server is gone: the store's reading of every outcome --------------------


def test_the_store_outcome_line_for_failed_reserved_and_nothing(workspace, tmp_path, monkeypatch):
    """``store_outcome`` reads each state a release can be left in (the kill scenarios of make reliability
    end published): a failed gate recorded by a real run, an open reservation, and nothing at all."""
    from kepsilon.audit.ledger import mark_noise_drawn, reserve
    from kepsilon.audit.store import now
    from kepsilon.orchestrator import store_outcome

    from .conftest import capped_store

    work, _ = workspace
    spec = yaml.safe_load((work / "spec.yaml").read_text(encoding="utf-8"))
    spec["max_prosecutor_risk"] = 0.01
    (work / "strict-again.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    since = now()
    code, _, err = run(workspace, command=[KEPSILON, "release", str(work / "strict-again.yaml"),
                                           "--release-id", "cli-strict-again"])
    assert code == 2, err
    failed = store_outcome(work / "audit.db", "cli-strict-again", since)
    assert (failed.state, failed.exit_code) == ("failed", 2) and "prosecutor_risk" in failed.line, failed
    assert store_outcome(work / "audit.db", "cli-strict-again", now()).state != "failed"  # an earlier run's failure

    db = capped_store(tmp_path, monkeypatch, "outcome-people")
    held = reserve(db, population_id="outcome-people", epsilon=0.5, idempotency_key="k-1", release_id="held",
                   operator="tester")
    reserved = store_outcome(tmp_path / "audit.db", "held", now())
    assert (reserved.state, reserved.exit_code) == ("reserved", 2)
    assert "ε 0.5 stays reserved (not yet spent" in reserved.line and "rerun the same release" in reserved.line
    mark_noise_drawn(db, held.id)
    assert "spent: its noise was drawn" in store_outcome(tmp_path / "audit.db", "held", now()).line
    nothing = store_outcome(tmp_path / "audit.db", "never-ran", now())
    assert (nothing.state, nothing.exit_code) == ("nothing", 2) and "no ε spent" in nothing.line


@pytest.mark.heavy
def test_kepsilon_check_ends_with_its_verdict_line_and_exit_code(workspace):
    """`kepsilon check` as the README runs it: one line per verdict, then the verdict line; exit 0 only for
    `would publish`. Nothing is reserved (the ledger's reservations are counted before and after)."""
    import sqlite3

    work, _ = workspace

    def reservations() -> int:
        with sqlite3.connect(work / "audit.db") as db:
            return db.execute("SELECT COUNT(*) FROM ledger WHERE kind = 'reserve'").fetchone()[0]

    before = reservations()
    spec = str(work / "spec.yaml")
    code, out, err = run(workspace, command=[KEPSILON, "check", spec, "--release-id", "cli-check-16", "--epsilon", "9"])
    assert code == 2, err
    last = out.strip().splitlines()[-1]
    assert last.startswith("would be refused: suppression ") and "(limit 5.00 %); try " in last
    assert "Traceback" not in out + err
    code, out, err = run(workspace, command=[KEPSILON, "check", spec, "--release-id", "cli-check-ok"])
    assert code == 0, err
    assert out.strip().splitlines()[-1] == "would publish"
    assert reservations() == before


@pytest.mark.heavy
def test_a_busy_prefect_database_gives_the_stores_line_not_a_traceback(workspace, tmp_path, migrated_prefect_database):
    """A Prefect server whose SQLite database stays locked answers 503 (after its 60 s busy timeout); once
    the client's retries are used up the CLI says so and what the store holds, in one line, exit 2.

    The lock is a real exclusive transaction on the server's own database file, as a busy shared server
    under several releases holds it; retries are set to 0 so that one busy timeout is enough. (A client
    timeout shorter than the busy timeout gives a ReadTimeout instead, told the same way.)
    """
    from kepsilon.local_server import prefect_server

    work, env = workspace
    with prefect_server(tmp_path / "busy-prefect", database=migrated_prefect_database) as server_env:
        database = sqlite3.connect(tmp_path / "busy-prefect" / "prefect.db", timeout=30, isolation_level=None)
        try:
            database.execute("BEGIN EXCLUSIVE")
            busy = {**env, "PREFECT_API_URL": server_env["PREFECT_API_URL"],
                    "PREFECT_HOME": server_env["PREFECT_HOME"], "PREFECT_CLIENT_MAX_RETRIES": "0",
                    "PREFECT_API_REQUEST_TIMEOUT": "180"}  # the server's 60 s busy timeout ends first
            code, out, err = run(workspace, "--release-id", "cli-busy-prefect", env=busy)
        finally:
            database.execute("ROLLBACK")
            database.close()
    assert code == 2, err
    line = _only_line(err, "the Prefect server answered 503")
    assert 'the audit store says: release "cli-busy-prefect": nothing reserved, recorded or published' in line
    for text in (out, err):
        assert "Traceback" not in text, text
