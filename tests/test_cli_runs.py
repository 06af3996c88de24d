"""The command line as a user meets it: help, a run, a killed run, a submitted Ray job."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from guide_blocks import environment as env_with_venv
from ray_head import kill_tree

from rayfl.cli import main
from rayfl.results import load

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def test_help_teaches(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for word in ("run", "partition", "report", "bench", "--set", "ray job submit", "read_parquet"):
        assert word in out


def test_partition_prints_the_matrix(capsys, tmp_path):
    png = tmp_path / "p.png"
    assert main(["partition", "--set", "data.dataset=digits", "--set", "partition.method=dirichlet",
                 "--set", "partition.num_clients=6", "--set", "algorithm.clients_per_round=6",
                 "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "client" in out and png.stat().st_size > 1000


def test_a_replication_without_its_data_says_what_to_fetch_in_one_line(capsys, tmp_path, monkeypatch):
    """A clone without an offline copy: the replication's job looks in ~/.rayfl/data, and with
    nothing there (downloads off here; a failed download says the same plus why) it stops in
    one line naming the files, where they go and the RAYFL_DATA_DIR setting, with exit 2."""
    monkeypatch.delenv("RAYFL_DATA_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    job = str(Path(__file__).resolve().parents[1] / "jobs" / "zo_hfl" / "table1_zo_hfl.yaml")
    code = main(["run", job, "--quiet", "--set", "data.source=test_only", "--set", "data.download=false",
                 "--set", f"output.dir={tmp_path / 'out'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "t10k-images-idx3-ubyte" in err and str(tmp_path / ".rayfl" / "data" / "mnist") in err
    assert "RAYFL_DATA_DIR" in err


@pytest.mark.slow
def test_cli_run_default_job(tmp_path):
    """`rayfl run` with no job: the default experiment, in its own local Ray."""
    proc = subprocess.run(
        [str(BIN / "rayfl"), "run", "--set", "run.rounds=3", "--set", f"output.dir={tmp_path}"],
        env=env_with_venv(), cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "results:" in proc.stdout
    res = load(tmp_path)
    assert len(res.rounds) == 3 and res.manifests["status"].iloc[0] == "completed"


@pytest.mark.slow
def test_killed_run_leaves_readable_parquet(tmp_path):
    """SIGKILL the driver and its Ray mid-run: every Parquet file already on disk reads back, and
    holds every row logged up to the last flush. Flushes here come from the flush policy alone
    (no checkpoints): by age, every 0.2 s."""
    cmd = [
        str(BIN / "rayfl"), "run", str(REPO / "jobs" / "digits_fedavg.yaml"), "--quiet",
        "--set", "run.rounds=100000", "--set", "run.eval_every=1", "--set", f"output.dir={tmp_path}",
        "--set", "output.checkpoint_every=0", "--set", "output.flush_seconds=0.2",
    ]
    proc = subprocess.Popen(cmd, env=env_with_venv(), cwd=tmp_path, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240
        while time.time() < deadline:
            parts = list(tmp_path.glob("*/*/rounds/part-*.parquet"))
            if len(parts) >= 5:
                break
            assert proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.2)
        else:
            pytest.fail("no rounds were written in time")
    finally:
        kill_tree(proc.pid)
        proc.wait(timeout=30)
    files = sorted(tmp_path.rglob("*.parquet"))
    assert len(files) >= 5
    for f in files:
        pq.read_table(f)  # raises on a torn file
    assert not [f for f in files if f.name.startswith("part-c")]  # a killed run is never compacted
    res = load(tmp_path)
    manifest = res.manifests.iloc[0]
    assert manifest["status"] == "running"  # it never got to close
    rounds = res.rounds.sort_values("round")["round"].tolist()
    assert rounds == list(range(len(rounds)))  # no gaps, nothing doubled
    # the tables were flushed together: each round on disk has all its client and eval rows
    clients = res.clients.groupby("round").size()
    assert (clients.reindex(rounds) == 10).all()
    assert set(res.evals["round"]) >= set(rounds)
    assert manifest["last_round"] <= rounds[-1]  # progress never claims rows that are not on disk


def ray_answers(address: str, token: str | None) -> str:
    """A real gRPC call to the GCS at `address` (its node table), with the token or without:
    the status code's name, OK when it answered."""
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    metadata = [("authorization", f"Bearer {token}")] if token else []
    with grpc.insecure_channel(address) as channel:
        try:
            gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetAllNodeInfo(
                gcs_service_pb2.GetAllNodeInfoRequest(), metadata=metadata, timeout=10)
        except grpc.RpcError as e:
            return e.code().name
    return "OK"


def listening_addresses(run_pid: int) -> dict[str, list[str]]:
    """Every TCP address a process of the run listens on (its own Ray's GCS, raylet, agents and
    workers are all its descendants), by process name."""
    import psutil

    found: dict[str, list[str]] = {}
    run = psutil.Process(run_pid)
    for proc in [run, *run.children(recursive=True)]:
        try:
            conns, name = proc.net_connections(kind="tcp"), proc.name()
        except psutil.Error:  # gone meanwhile
            continue
        for conn in conns:
            if conn.status == psutil.CONN_LISTEN:
                found.setdefault(name, []).append(f"{conn.laddr.ip}:{conn.laddr.port}")
    return found


def is_loopback(address: str) -> bool:
    import ipaddress

    ip = ipaddress.ip_address(address.rsplit(":", 1)[0])
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


@pytest.mark.slow
def test_sigterm_closes_the_run_as_interrupted(tmp_path):
    """`ray job stop` and `kill` send SIGTERM: the run stops cleanly and says so. While it runs,
    no process of its own Ray listens on an address other than loopback, and its GCS answers a
    call from this machine only with the token (~/.ray/auth_token): neither the network nor
    another local user joins the run."""
    cmd = [
        str(BIN / "rayfl"), "run", str(REPO / "jobs" / "digits_fedavg.yaml"), "--quiet",
        "--set", "run.rounds=100000", "--set", f"output.dir={tmp_path}",
    ]
    env = env_with_venv()
    env.pop("RAY_AUTH_MODE", None)
    proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and len(list(tmp_path.glob("*/*/rounds/part-*.parquet"))) < 3:
            assert proc.poll() is None, "the run ended before it could be stopped"
            time.sleep(0.2)
        listening = listening_addresses(proc.pid)
        assert {"gcs_server", "raylet"} <= set(listening) and len(listening) >= 4, listening
        assert all(is_loopback(a) for addresses in listening.values() for a in addresses), listening
        token = (Path.home() / ".ray" / "auth_token").read_text().strip()
        for address in listening["gcs_server"]:
            address = "127.0.0.1:" + address.rsplit(":", 1)[1]
            assert ray_answers(address, None) == "UNAUTHENTICATED"
            assert ray_answers(address, "not-" + token) == "UNAUTHENTICATED"
            assert ray_answers(address, token) == "OK"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        kill_tree(proc.pid)
    res = load(tmp_path)
    assert res.manifests["status"].iloc[0] == "interrupted"
    assert len(res.rounds) >= 3


def test_report_draws_figures(ray_local, tmp_path, capsys):
    from rayfl.config import load_config
    from rayfl.runner import run_experiment

    results = tmp_path / "results"
    for name in ("fedavg", "scaffold"):
        cfg = load_config(None, ["data.dataset=digits", "partition.method=iid", "partition.num_clients=6",
                                 "algorithm.clients_per_round=3", "run.rounds=3", f"algorithm.name={name}",
                                 f"output.dir={results}"])
        run_experiment(cfg)
    assert main(["report", str(results)]) == 0
    out = capsys.readouterr().out
    assert "fedavg" in out and "scaffold" in out
    figures = sorted((results / "report").glob("*.png"))
    assert {f.name for f in figures} >= {"test_accuracy_vs_round.png", "test_accuracy_vs_sim_time.png"}
    assert sum(f.name.startswith("timeline_") for f in figures) == 2  # one per run
    assert all(f.stat().st_size > 5000 for f in figures)
