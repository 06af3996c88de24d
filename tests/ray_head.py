"""A real `ray start --head` of a test's own (token auth, its own ports and temp dir) and
`ray job submit` to it, for the tests that submit jobs as users do."""

from __future__ import annotations

import contextlib
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_tree(pid: int) -> None:
    """SIGKILL a process and everything it started (Ray workers start their own sessions, so a
    process-group kill alone would orphan them)."""
    import psutil

    try:
        parent = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    procs = [parent, *parent.children(recursive=True)]
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(procs, timeout=30)


@contextlib.contextmanager
def ray_head(tmp_path: Path, env: dict[str, str]) -> Iterator[str]:
    """A head with token auth on free ports; yields its dashboard address (for `ray job
    submit`), and sets `env["RAYFL_TEST_GCS"]` to its GCS address (for `--address`). `env`
    gets the token. A temp dir of the head's own: Ray's job supervisor gives the
    job's driver the address it reads from <temp dir>/ray_current_cluster, which in the shared
    /tmp/ray names whichever Ray on this machine started last (another test's)."""
    env["RAY_AUTH_MODE"] = "token"
    env["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    gcs, dash, client, agent = (free_port() for _ in range(4))
    ray_temp = tempfile.mkdtemp(prefix="rayfl-head-")
    head_log = (tmp_path / "head.log").open("w")
    head = subprocess.Popen(
        [str(BIN / "ray"), "start", "--head", "--block", f"--port={gcs}", f"--dashboard-port={dash}",
         f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent}", f"--temp-dir={ray_temp}",
         "--dashboard-host=127.0.0.1", "--num-cpus=2", "--include-dashboard=true", "--disable-usage-stats"],
        env=env, cwd=tmp_path, start_new_session=True, stdout=head_log, stderr=subprocess.STDOUT,
    )
    env["RAYFL_TEST_GCS"] = f"127.0.0.1:{gcs}"
    try:
        yield f"http://127.0.0.1:{dash}"
    finally:
        kill_tree(head.pid)
        head.wait(timeout=30)
        head_log.close()
        shutil.rmtree(ray_temp, ignore_errors=True)


def submit(address: str, working_dir: Path, entrypoint: list[str], env: dict[str, str], cwd: Path,
           timeout: float = 300) -> subprocess.CompletedProcess:
    """`ray job submit --working-dir`, retried while the head is not up yet (a job that was
    submitted and failed is a real failure: no retry)."""
    done = None
    deadline = time.time() + 120
    while time.time() < deadline:
        done = subprocess.run(
            [str(BIN / "ray"), "job", "submit", "--address", address, "--working-dir", str(working_dir), "--", *entrypoint],
            env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout,
        )
        if done.returncode == 0 or "raysubmit_" in done.stdout + done.stderr:
            break
        time.sleep(2)
    assert done is not None
    return done
