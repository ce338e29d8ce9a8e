"""The Dask engine keeps its private data to itself (issue 21, items 1 and 2; issue 24, item 5).

- The local cluster our code starts accepts only clients holding the run's credentials (mutual TLS on
  127.0.0.1), and its HTTP endpoints listen on loopback and serve nothing: tested on a real cluster
  made by ``dask_task_runner``, with a plain client, a client with credentials of its own, a TLS
  handshake without a certificate, and the run's own client.
- The scratch folder: 0700 at every level and 0600 files whatever the umask, pieces sealed (no canary
  readable, nothing unpickles without the run's key, a swapped or cut piece is refused), the key
  withheld from ``repr``, refused inside the output folder, and a dead run's folder (and only a dead
  run's) removed by the sweep, which says so.
- A Dask worker killed inside ``distribute`` or ``publish-part`` costs a retry, not the release.
"""

import logging
import os
import pickle
import signal
import socket
import ssl
import stat
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kepsilon.tasks.errors import SpecError
from kepsilon.tasks.scratch import MAGIC, MARKER, Scratch, ScratchKey, ScratchLease, private_root, sweep_leftover_scratch

from .conftest import release_spec_dict

CANARY_HEIGHT = 171.23456789
CANARY_TEXT = "CANARYxq7Zr2"


def canary_frame() -> pd.DataFrame:
    return pd.DataFrame({"HEIGHT": [CANARY_HEIGHT, 180.5] * 50, "RELIGION": [CANARY_TEXT, "none"] * 50})


def spec_with(tmp_path: Path, **execution):
    from kepsilon.flows.spec import ReleaseSpec

    data = release_spec_dict("paper-synthetic", release_id="sec-test", population_id="test-population",
                             output_dir=str(tmp_path / "out"), execution={"engine": "dask", **execution})
    return ReleaseSpec.model_validate(data)


# --------------------------------------------------------------------------- sealed, private pieces


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077])
def test_every_scratch_folder_is_0700_and_every_piece_0600_whatever_the_umask(tmp_path, umask):
    previous = os.umask(umask)
    try:
        area = Scratch.new(tmp_path / "run")
        area.write(canary_frame(), "hashes", 0, 3)
        area.write(canary_frame(), "shuffle", 2, 1)
    finally:
        os.umask(previous)
    folders = [area.root, *(p for p in area.root.rglob("*") if p.is_dir())]
    files = [p for p in area.root.rglob("*") if p.is_file()]
    assert len(folders) == 5 and len(files) == 2  # run, hashes, hashes/0, shuffle, shuffle/2
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in folders} == {"0o700"}
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {"0o600"}


def test_a_piece_is_sealed_no_canary_readable_and_only_the_runs_key_opens_it(tmp_path):
    area = Scratch.new(tmp_path / "run")
    area.write(canary_frame(), "shuffle", 0, 0)
    raw = area.path("shuffle", 0, 0).read_bytes()
    for needle in (struct.pack("<d", CANARY_HEIGHT), str(CANARY_HEIGHT).encode(), CANARY_TEXT.encode()):
        assert needle not in raw
    # Positive control: the same frame pickled plainly shows both canaries.
    plain = pickle.dumps(canary_frame(), protocol=5)
    assert struct.pack("<d", CANARY_HEIGHT) in plain and CANARY_TEXT.encode() in plain
    with pytest.raises(pickle.UnpicklingError):
        pickle.loads(raw)
    pd.testing.assert_frame_equal(area.read("shuffle", 0, 0), canary_frame())
    with pytest.raises(ValueError, match="does not open"):
        Scratch(area.root, ScratchKey.generate()).read("shuffle", 0, 0)


def test_a_piece_moved_to_another_name_or_cut_short_is_refused(tmp_path):
    area = Scratch.new(tmp_path / "run")
    big = pd.DataFrame({"x": np.arange(1_500_000, dtype=np.float64)})  # 12 MB: several sealed chunks
    area.write(big, "ordered", 0, 0)
    area.write(canary_frame(), "ordered", 0, 1)
    os.replace(area.path("ordered", 0, 1), area.path("ordered", 0, 2))
    with pytest.raises(ValueError, match="does not open"):
        area.read("ordered", 0, 2)
    sealed = area.path("ordered", 0, 0).read_bytes()
    pd.testing.assert_frame_equal(area.read("ordered", 0, 0), big)
    area.path("ordered", 0, 0).write_bytes(sealed[: len(sealed) // 2])
    with pytest.raises(ValueError):
        area.read("ordered", 0, 0)


def test_a_stage_reads_the_pieces_present_in_order_and_only_those(tmp_path):
    area = Scratch.new(tmp_path / "run")
    for number in (5, 0, 2):
        area.write({"piece": number}, "ordered", 3, number)
    area.write({"piece": "elsewhere"}, "ordered", 4, 1)
    assert area.present("ordered", 3, count=6) == [0, 2, 5]
    assert area.present("ordered", 3, count=5) == [0, 2]
    assert area.read_present("ordered", 3, count=6) == [{"piece": 0}, {"piece": 2}, {"piece": 5}]
    assert area.read_present("ordered", 7, count=6) == []


def test_a_piece_cut_at_a_chunk_boundary_or_lengthened_is_refused(tmp_path):
    """Each chunk is opened once, its "last" flag read from whether another chunk follows: a piece cut
    just after a whole chunk, or with bytes after its last, must not open."""
    area = Scratch.new(tmp_path / "run")
    big = pd.DataFrame({"x": np.arange(1_500_000, dtype=np.float64)})  # 12 MB: several sealed chunks
    area.write(big, "ordered", 0, 0)
    sealed = area.path("ordered", 0, 0).read_bytes()
    boundaries, offset = [], len(MAGIC)
    while offset < len(sealed):
        offset += 4 + 12 + int.from_bytes(sealed[offset:offset + 4], "big")
        boundaries.append(offset)
    assert len(boundaries) >= 3 and boundaries[-1] == len(sealed)
    for cut in boundaries[:-1]:
        area.path("ordered", 0, 0).write_bytes(sealed[:cut])
        with pytest.raises(ValueError, match="does not open"):
            area.read("ordered", 0, 0)
    area.path("ordered", 0, 0).write_bytes(sealed + sealed[len(MAGIC):boundaries[0]])  # its first chunk again
    with pytest.raises(ValueError, match="does not open"):
        area.read("ordered", 0, 0)
    area.path("ordered", 0, 0).write_bytes(sealed)
    pd.testing.assert_frame_equal(area.read("ordered", 0, 0), big)


def test_the_key_is_withheld_from_repr_and_travels_pickled_to_a_worker(tmp_path):
    area = Scratch.new(tmp_path / "run")
    secret = area.key._secret
    for shown in (repr(area), str(area), repr(area.key), str(area.key), f"{area!r}"):
        assert secret.hex() not in shown and repr(secret) not in shown and "withheld" in shown
    area.write([1, 2, 3], "csv", 0)
    assert pickle.loads(pickle.dumps(area)).read("csv", 0) == [1, 2, 3]


def test_a_worker_outliving_its_run_cannot_recreate_a_removed_scratch(tmp_path):
    area = Scratch.new(tmp_path / "run")
    area.remove_all()
    with pytest.raises(FileNotFoundError):
        area.write([1], "shuffle", 0, 0)
    assert not area.root.exists()


# --------------------------------------------------------------------------- where the scratch lies


def test_the_default_scratch_is_the_accounts_private_folder_in_the_temporary_folder(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    root = private_root(spec_with(tmp_path), tmp_path / "out")
    assert root == (tmp_path / "tmp" / f"kepsilon-scratch-{os.getuid()}").resolve()
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    root.chmod(0o755)  # loosened by someone: made private again
    assert stat.S_IMODE(private_root(spec_with(tmp_path), tmp_path / "out").stat().st_mode) == 0o700


@pytest.mark.parametrize("inside", ["out", "out/deeper"])
def test_a_scratch_folder_inside_the_output_folder_is_refused(tmp_path, inside):
    spec = spec_with(tmp_path, scratch=str(tmp_path / inside))
    with pytest.raises(SpecError) as refused:
        private_root(spec, tmp_path / "out")
    assert refused.value.parameter == "execution.scratch" and "inside the output folder" in str(refused.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another account needs root")
def test_an_account_folder_owned_by_another_account_is_refused(tmp_path):
    spec = spec_with(tmp_path, scratch=str(tmp_path / "shared"))
    root = tmp_path / "shared" / f"kepsilon-scratch-{os.getuid()}"
    root.mkdir(parents=True)
    os.chown(root, 4242, 4242)
    with pytest.raises(SpecError, match="belongs to another account"):
        private_root(spec, tmp_path / "out")


# --------------------------------------------------------------------------- the sweep


def _lease_in_a_process_then_kill_it(root: Path) -> Path:
    """A run folder leased by another process, which is then SIGKILLed: what a killed release leaves."""
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from kepsilon.tasks.scratch import ScratchLease
        lease = ScratchLease(Path({str(root)!r}), "killed-release")
        lease.scratch.write({{"height": {CANARY_HEIGHT}}}, "shuffle", 0, 0)
        print(lease.scratch.root, flush=True)
        time.sleep(60)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    folder = Path(child.stdout.readline().strip())
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=30)
    return folder


def test_the_sweep_removes_a_dead_runs_folder_and_says_so_but_leaves_a_live_one(tmp_path, monkeypatch, caplog):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    spec = spec_with(tmp_path)
    root = private_root(spec, spec.output_dir)
    dead = _lease_in_a_process_then_kill_it(root)
    live = ScratchLease(root, "running-release")
    live.scratch.write([1], "shuffle", 0, 0)
    stranger = root / "not-ours"  # no marker: not a run folder of ours
    stranger.mkdir()
    old = Path(spec.output_dir) / ".old-release.scratch"  # the layout of earlier versions
    (old / "shuffle" / "0").mkdir(parents=True)
    (old / "shuffle" / "0" / "1").write_bytes(b"raw")
    assert dead.is_dir() and (dead / MARKER).exists()

    with caplog.at_level(logging.INFO):
        removed = sweep_leftover_scratch(spec, logging.getLogger("test-sweep"))
    assert sorted(removed) == sorted([dead, old])
    assert not dead.exists() and not old.exists()
    assert live.scratch.read("shuffle", 0, 0) == [1] and stranger.is_dir()
    lines = [r.getMessage() for r in caplog.records if r.name == "test-sweep"]
    assert len(lines) == 1 and "removed 2 scratch folder(s)" in lines[0] and str(dead) in lines[0]
    live.close()
    assert not live.scratch.root.exists()
    assert sweep_leftover_scratch(spec, logging.getLogger("test-sweep")) == []


# --------------------------------------------------------------------------- the closed cluster


@pytest.fixture(scope="module")
def closed_cluster():
    """A LocalCluster made exactly as the flow's runner makes it (``dask_task_runner``, ``CLOSED_HTTP``)."""
    import dask
    from distributed import LocalCluster

    from kepsilon.flows.release_dask import CLOSED_HTTP, dask_task_runner
    from kepsilon.flows.spec import Execution

    runner = dask_task_runner(Execution(engine="dask", workers=1))
    with dask.config.set(CLOSED_HTTP):
        cluster = LocalCluster(**runner.cluster_kwargs)
    try:
        yield cluster
    finally:
        cluster.close()


def _listening(pids: list[int]) -> list[tuple[str, int]]:
    import psutil

    found = []
    for pid in pids:
        for connection in psutil.Process(pid).net_connections(kind="inet"):
            if connection.status == psutil.CONN_LISTEN:
                found.append((connection.laddr.ip, connection.laddr.port))
    return found


# Another account's client, in a process of its own: it connects with ``security`` ("none", "its own" CA, or the
# default) and submits work that leaves a mark on disk; prints one line, the refusal's type and text, or "ran".
INTRUDER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from distributed import Client, Security

    address, security, mark = sys.argv[1:4]

    def leave_a_mark(path):
        Path(path).write_text("ran")

    extra = {"security": Security.temporary()} if security == "its own" else {}
    try:
        with Client(address, timeout=5, **extra) as intruder:
            intruder.submit(leave_a_mark, mark, pure=False).result(timeout=5)
        print("ran")
    except Exception as refused:
        print(f"{type(refused).__name__}: {refused}".replace("\\n", " "))
""")
INTRUDER_DEADLINE = 20  # seconds: a client that has had no answer by then is refused as surely as one told no


def _intruder(address: str, security: str, mark: Path) -> str:
    """What another account's client gets at ``address``: its refusal's type and text, "hung" when it had no
    answer within ``INTRUDER_DEADLINE`` (distributed's client sometimes waits forever after a TLS alert), or
    "ran"; and nothing may have run: the mark its work would leave is absent."""
    try:
        done = subprocess.run([sys.executable, "-c", INTRUDER, address, security, str(mark)], capture_output=True,
                              text=True, timeout=INTRUDER_DEADLINE)
        outcome = (done.stdout.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    except subprocess.TimeoutExpired:
        outcome = "hung"
    assert not mark.exists(), (security, outcome)
    return outcome


def test_the_local_cluster_admits_only_the_runs_credentials(closed_cluster, tmp_path):
    from distributed import Client

    address = closed_cluster.scheduler_address
    assert address.startswith("tls://127.0.0.1:")
    host, port = "127.0.0.1", int(address.rsplit(":", 1)[1])

    # Another account knows the address. Without credentials, or with its own, it gets nothing run: its client
    # fails (or waits forever), and the work it submitted left no mark.
    refusals = {
        "no credentials": _intruder(address, "none", tmp_path / "no-credentials"),
        "credentials of its own": _intruder(address, "its own", tmp_path / "its-own"),
        "plain tcp": _intruder(address.replace("tls://", "tcp://"), "none", tmp_path / "plain-tcp"),
    }
    assert "ran" not in refusals.values(), refusals
    assert "ssl_context" in refusals["no credentials"]  # Dask will not even try TLS without a certificate
    # Its own CA's certificate fails the scheduler's verification: distributed says so — or, now and then, its
    # client fails an internal check (AssertionError, seen under load) or never returns after the scheduler's
    # "unknown ca" alert (seen in make test, where the test then hung for minutes).
    assert any(text in refusals["credentials of its own"] for text in ("TLS certificate does not match", "AssertionError", "hung")), refusals
    # A plain-TCP client reads TLS bytes it cannot parse: the connection closes (CommClosedError, OSError) or,
    # when the scheduler's first bytes arrive before the close, distributed's message check fails (AssertionError).
    assert any(name in refusals["plain tcp"] for name in ("CommClosedError", "OSError", "AssertionError", "hung")), refusals
    # A TLS handshake without a client certificate is refused by the scheduler.
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    # The scheduler aborts the handshake (its log: "peer did not return a certificate"); the client sees a TLS
    # error, not a session that merely stays silent (a timeout) or answers.
    with pytest.raises(ssl.SSLError):
        with socket.create_connection((host, port), timeout=5) as raw, context.wrap_socket(raw) as tls:
            tls.sendall(b"\0" * 8)
            tls.recv(1)
    # The run's own client (the cluster's credentials) runs work.
    with Client(closed_cluster) as own:
        assert own.submit(pow, 2, 10).result(timeout=30) == 1024


def test_the_cluster_listens_on_loopback_only_and_its_http_endpoints_serve_nothing(closed_cluster):
    import urllib.error
    import urllib.request

    import psutil

    pids = [os.getpid(), *(child.pid for child in psutil.Process().children(recursive=True))]
    ports = {port for _, port in _listening(pids)}
    scheduler_http = closed_cluster.scheduler.http_server
    http_ports = {s.getsockname()[1] for s in scheduler_http._sockets.values()}
    assert http_ports and http_ports <= ports
    assert all(ip == "127.0.0.1" for ip, _ in _listening(pids)), _listening(pids)
    for port in http_ports:
        for path in ("/status", "/info/main/workers.html", "/json/identity.json", "/metrics", "/health"):
            with pytest.raises(urllib.error.HTTPError) as answer:
                urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5)
            assert answer.value.code == 404


# --------------------------------------------------------------------------- a killed worker's partition


@pytest.mark.heavy  # a LocalCluster per run, and its worker restarted: minutes on a busy machine
@pytest.mark.flow
@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.parametrize("point", ["worker-distribute", "worker-publish-part"])
def test_a_worker_killed_inside_a_partition_task_costs_a_retry_not_the_release(tmp_path, monkeypatch, point):
    import tempfile

    import pyarrow.parquet as pq

    from kepsilon.flows.release import governed_release

    from .conftest import capped_store

    store = capped_store(tmp_path, monkeypatch, "test-population")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    once = tmp_path / "killed-once"
    monkeypatch.setenv("KEPSILON_FAULT_AT", point)  # the workers the flow starts inherit it
    monkeypatch.setenv("KEPSILON_FAULT_ONCE", str(once))
    spec = spec_with(tmp_path, workers=2, partitions=3)
    record = governed_release(spec)

    assert once.exists()  # a worker was killed inside the task
    folder = Path(record["output_dir"])
    assert sorted(p.name for p in folder.iterdir()) == ["data.parquet", "manifest.json"]
    assert sorted(p.name for p in (folder / "data.parquet").iterdir()) == [f"part-{q:05d}.parquet" for q in range(3)]
    assert len(pq.read_table(folder / "data.parquet")) == record["rows_published"] > 0
    assert [r["outcome"] for r in store["releases"].rows] == ["published"]
    assert list((tmp_path / "tmp" / f"kepsilon-scratch-{os.getuid()}").glob("sec-test-*")) == []


# --------------------------------------------------------------------------- through the CLI (make reliability's scenarios)


@pytest.fixture(scope="module")
def cli_server(tmp_path_factory, migrated_prefect_database):
    from reliability.harness import prefect_server

    with prefect_server(tmp_path_factory.mktemp("dask-cli") / "prefect", database=migrated_prefect_database) as env:
        yield env


def _assert_all_pass(results, category: str, minimum: int) -> None:
    own = [c for c in results.checks if c.category == category]
    assert not [c for c in own if not c.ok], "\n".join(f"{c.name}: {c.detail}" for c in own if not c.ok)
    assert len(own) >= minimum


@pytest.mark.heavy  # two real releases through the CLI, one on a LocalCluster
@pytest.mark.server
def test_a_dask_release_killed_mid_distribute_leaves_nothing_readable_and_the_next_release_sweeps_it(cli_server, tmp_path):
    from reliability.dask_scenarios import dask_kill_scenario
    from reliability.harness import Results
    from reliability.scenarios import sample_source

    results = Results()
    sample = sample_source(tmp_path / "sample.csv", 1500)
    dask_kill_scenario(results, cli_server, tmp_path / "kill", sample, "dask-distribute")
    _assert_all_pass(results, "dask scratch", 10)


@pytest.mark.heavy  # a release held mid-distribute while every port of its processes is tried
@pytest.mark.server
def test_another_client_gets_nothing_from_a_running_releases_cluster(cli_server, tmp_path):
    from reliability.dask_scenarios import cluster_intruder_scenario
    from reliability.harness import Results
    from reliability.scenarios import sample_source

    results = Results()
    cluster_intruder_scenario(results, cli_server, tmp_path / "intruder", sample_source(tmp_path / "sample.csv", 1500))
    _assert_all_pass(results, "dask cluster", 6)


# --------------------------------------------------------------------------- an existing scheduler


def test_a_tls_scheduler_without_the_clients_files_is_refused_by_name(tmp_path):
    # distributed's configuration loads first: dask.config.set, on leaving, removes the sections it created, and
    # would remove distributed's whole configuration if its first import came inside the block.
    import dask
    import distributed  # noqa: F401

    from kepsilon.flows.release_dask import scheduler_security

    with dask.config.set({"distributed.comm.tls.ca-file": None, "distributed.comm.tls.client.cert": None}):
        with pytest.raises(SpecError) as refused:
            scheduler_security("tls://10.0.0.5:8786")
    assert refused.value.parameter == "execution.scheduler"
    assert "DASK_DISTRIBUTED__COMM__TLS__CA_FILE" in str(refused.value)
    settings = {"distributed.comm.tls.ca-file": str(tmp_path / "missing-ca.pem"),
                "distributed.comm.tls.client.cert": str(tmp_path / "missing-cert.pem")}
    with dask.config.set(settings), pytest.raises(SpecError, match="CA cannot be read"):
        scheduler_security("tls://10.0.0.5:8786")


def test_a_tls_scheduler_is_reached_with_the_files_of_dasks_configuration(closed_cluster, tmp_path):
    """The files an operator gives a scheduler of their own, here the closed cluster's credentials written
    out: the client kepsilon builds from Dask's configuration runs work there."""
    import dask
    from distributed import Client

    from kepsilon.flows.release_dask import scheduler_security

    credentials = closed_cluster.security
    folder = tmp_path / "tls"
    folder.mkdir(mode=0o700)
    files = {}
    for name, content in (("ca.pem", credentials.tls_ca_file), ("client.pem", credentials.tls_client_cert),
                          ("client.key", credentials.tls_client_key)):
        descriptor = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(content)
        files[name] = str(folder / name)
    settings = {"distributed.comm.tls.ca-file": files["ca.pem"], "distributed.comm.tls.client.cert": files["client.pem"],
                "distributed.comm.tls.client.key": files["client.key"]}
    with dask.config.set(settings):
        security = scheduler_security(closed_cluster.scheduler_address)
    assert security.require_encryption and security.tls_client_key == files["client.key"]
    with Client(closed_cluster.scheduler_address, security=security, timeout=30) as client:
        assert client.submit(pow, 3, 3).result(timeout=30) == 27


def test_positive_control_the_intruders_probe_gets_in_where_a_cluster_is_open():
    """The probe ``make reliability`` aims at a release's ports does run a task on an open (tcp://, no
    credentials) scheduler, so its finding nothing on ours means something."""
    from distributed import LocalCluster

    from reliability.dask_scenarios import _intrusions

    with LocalCluster(n_workers=1, processes=False, scheduler_port=0, dashboard_address=None, protocol="tcp://") as open_cluster:
        port = int(open_cluster.scheduler_address.rsplit(":", 1)[1])
        got = _intrusions(port)
    assert got["tcp-no-credentials"] is True


@pytest.mark.heavy  # a flow run on a LocalCluster of its own
@pytest.mark.flow
@pytest.mark.usefixtures("prefect_harness")
def test_the_scratch_key_reaches_no_log_no_api_record_and_no_file(tmp_path, monkeypatch):
    """A known key planted in the flow's process (tests only: production has no hook): after the release,
    its bytes appear nowhere the Prefect API keeps for the run, nor in any file of the scratch base, the
    output folder or the private reports."""
    import base64
    import json
    import tempfile
    from unittest.mock import patch

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterFlowRunId

    from kepsilon.flows.release import governed_release

    from .conftest import capped_store

    capped_store(tmp_path, monkeypatch, "test-population")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    secret = os.urandom(32)
    with patch("kepsilon.tasks.scratch.ScratchKey.generate", classmethod(lambda cls: cls(secret))):
        record = governed_release(spec_with(tmp_path, workers=1, partitions=2))

    with get_client(sync_client=True) as client:
        run_id = record["execution"]["flow_run_id"]
        runs = client.read_flow_runs()
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[r.id for r in runs])))
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[r.id for r in runs])))
    assert any(str(r.id) == run_id for r in runs) and any(t.name.startswith("perturb-suppress") for t in tasks)
    seen = json.dumps({"runs": [r.model_dump(mode="json") for r in runs], "tasks": [t.model_dump(mode="json") for t in tasks],
                       "logs": [entry.message for entry in logs]})
    forms = [secret.hex(), secret.hex().upper(), base64.b64encode(secret).decode(), base64.urlsafe_b64encode(secret).decode(),
             repr(secret)]
    assert not [form for form in forms if form in seen]
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert files and not [p for p in files if secret in p.read_bytes() or secret.hex().encode() in p.read_bytes()]
