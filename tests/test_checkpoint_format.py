"""Checkpoints hold data, never pickle: the format round-trips every kind of state bit for bit,
a state that holds anything else fails at its first commit in one line naming its key, reading
a checkpoint never runs code planted in it, and an older rayfl's pickle checkpoint resumes only
when the caller says it trusts the run directory."""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from test_resume import assert_same_tables, crash_after_round_4, job

import rayfl
from rayfl.algorithms.fedavg import fedavg_client
from rayfl.algorithms.server_opt import AdamMoments, ModelState
from rayfl.driver.asynchronous import AsyncServerState
from rayfl.engine.asyncpool import TaskSpec
from rayfl.engine.checkpoint import (
    Checkpoint,
    DamagedCheckpoint,
    checkpoint_bytes,
    checkpoint_from_bytes,
    load_checkpoint,
    read_checkpoint,
)
from rayfl.engine.state_codec import Encoder, Resolver, UnreadableState, UnsavableState, decode
from rayfl.engine.tasks import TaskPlan
from rayfl.results import load
from rayfl.results.storage import Location
from rayfl.runner import run_experiment

RAYFL = Resolver()


def same(a: Any, b: Any) -> bool:
    """Equal in type, dtype, shape and every bit, all the way down."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and a.requires_grad == b.requires_grad and \
            torch.equal(a.detach().reshape(-1).view(torch.uint8), b.detach().reshape(-1).view(torch.uint8))
    if isinstance(a, (np.ndarray, np.generic)):
        return a.dtype == b.dtype and np.shape(a) == np.shape(b) and np.asarray(a).tobytes() == np.asarray(b).tobytes()
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if hasattr(a, "__dataclass_fields__"):
        return same(vars(a), vars(b))
    return a == b or (a != a and b != b)  # NaN


def client_state() -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    return {
        "control": torch.randn(5, generator=g),
        "opt": {"m": torch.randn(2, 3, generator=g).to(torch.bfloat16), "steps": torch.tensor([7, -1], dtype=torch.int64),
                "grad": torch.randn(3, generator=g).requires_grad_()},
        "history": [np.arange(4, dtype=np.int64), np.float16(0.5), (1, "two", None, True)],
        "scores": {3: np.float32(np.nan), (0, 1): -0.0, "$": float("inf")},
        "empty": torch.zeros(0, 4, dtype=torch.float16),
        "mask": np.array([[True, False]]),
        "raw": b"\x00\xff",
        "seen": {2, 5},
    }


def test_every_kind_of_state_round_trips_bit_for_bit() -> None:
    """Tensors of float32 / bfloat16 / int64 (and an empty float16 one), numpy arrays and
    scalars, NaN / -0.0 / inf, tuples, int and tuple keys, bytes, sets, dataclass server states
    and an in-flight task whose function is stored by name all come back exactly."""
    plan = TaskPlan(client=3, seq=9, dispatch_time=1.5, version=2, drop_fraction=None, offline_time=4.25)
    spec = TaskSpec(plan=plan, fn=fedavg_client, payload={"params": np.ones(3, np.float32), "lr": 0.1}, key=17,
                    phase="train", min_forward=8, min_backward=8, task=41)
    ckpt = Checkpoint(
        round=4, clock=12.5, model_version=5, next_task=42,
        server_state=AsyncServerState(ModelState(np.linspace(0, 1, 6, dtype=np.float32), AdamMoments(np.ones(6), None, 3)),
                                      models={4: np.zeros(6, np.float32)}, picks=11),
        client_states={0: client_state(), 7: {"c": torch.ones(2)}},
        pools=[{"seq": 10, "tasks": [spec]}], parts={"rounds": 2}, pipeline={"clip": np.float64(1.25)},
        callbacks=[{"best": 0.9, "wait": 2}], model=np.arange(6, dtype=np.float32), driver={"steps": 5},
    )
    back = checkpoint_from_bytes(checkpoint_bytes(ckpt), RAYFL)
    for name in vars(ckpt):
        assert same(getattr(ckpt, name), getattr(back, name)), name
    assert back.pools[0]["tasks"][0].fn is fedavg_client
    assert isinstance(back.server_state.state, ModelState)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_gpu_tensor_comes_back_on_the_gpu_with_its_bits() -> None:
    state = {"m": torch.randn(3, 2, device="cuda").to(torch.bfloat16)}
    enc = Encoder()
    node = enc.encode(state, "ctx.state")
    back = decode(node, enc.arrays.__getitem__, RAYFL)
    assert back["m"].device.type == "cuda" and same(state["m"].cpu(), back["m"].cpu())


@pytest.mark.parametrize(("state", "key", "what"), [
    ({"opt": {"fn": lambda x: x}}, "ctx.state['opt']['fn']", "a function (<lambda>)"),
    ({"log": [1, open]}, "ctx.state['log'][1]", "a function (open)"),
    ({"obj": np.array([object()])}, "ctx.state['obj']", "numpy array of Python objects"),
    ({"model": torch.nn.Linear(2, 2)}, "ctx.state['model']", "torch.nn.modules.linear.Linear"),
    ({"s": ModelState(np.zeros(2))}, "ctx.state['s']", "rayfl.algorithms.server_opt.ModelState"),
])
def test_what_a_client_state_cannot_hold_is_named_by_its_key(state: dict[str, Any], key: str, what: str) -> None:
    with pytest.raises(UnsavableState) as e:
        Encoder().encode(state, "ctx.state")
    assert e.value.key == key and what in str(e.value) and len(str(e.value).splitlines()) == 1, str(e.value)


@pytest.mark.parametrize("node", [
    {"$": "dataclass", "class": "subprocess:Popen", "fields": {}},
    {"$": "function", "name": "os:system"},
    {"$": "function", "name": "rayfl.engine.checkpoint:os.system"},  # through a rayfl module's import
    {"$": "dataclass", "class": "rayfl.engine.checkpoint:Checkpoint.__init__", "fields": {}},
    {"$": "dataclass", "class": "rayfl.engine.checkpoint:Checkpoint",  # an allowed class, but __class__ set too
     "fields": {**{f.name: 0 for f in dataclasses.fields(Checkpoint)}, "__class__": 0}},
])
def test_a_name_outside_the_runs_own_code_is_refused(node: dict[str, Any]) -> None:
    with pytest.raises(UnreadableState):
        decode(node, lambda name: np.zeros(0), RAYFL)


# ---------------------------------------------------------------------------- runs

LEAKY = '''
from rayfl.algorithms.fedavg import FedAvg, fedavg_client


def leaky_client(ctx, **payload):
    ctx.state["opt"] = {"lr": 0.1, "fn": lambda g: g}
    return fedavg_client(ctx, **payload)


class Leaky(FedAvg):
    """FedAvg whose client keeps a function in its state."""

    client = staticmethod(leaky_client)
'''


def test_a_function_in_ctx_state_fails_at_the_first_commit_in_one_line(ray_local, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         capfd: pytest.CaptureFixture[str]) -> None:
    """A user's client function that stores a lambda: round 0 fails, long before the first
    checkpoint (round 10), with one line naming the key, the function and the client."""
    from rayfl.cli import main

    (tmp_path / "leakymod.py").write_text(LEAKY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    rc = main(["run", "--quiet", *[a for o in ("algorithm.name=leakymod:Leaky", "run.rounds=12", "engine.num_hosts=1",
                                               "partition.num_clients=6", "algorithm.clients_per_round=2",
                                               "engine.num_cpus_per_host=0.5", f"output.dir={tmp_path / 'out'}")
                                   for a in ("--set", o)]])
    lines = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1, lines
    assert lines[0].startswith("rayfl: error: ctx.state['opt']['fn']: holds a function (leaky_client.<locals>.<lambda>)")
    assert "leaky_client on client" in lines[0] and "round 0" in lines[0], lines[0]


@pytest.fixture(scope="module")
def crashed(ray_local, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a run that crashed after round 4, with checkpoints at rounds 1 and 3; the same run never
    stopped). Tests copy the first before changing it."""
    results = tmp_path_factory.mktemp("crashed")
    every_2 = ["algorithm.name=scaffold", "output.checkpoint_every=2"]
    whole = run_experiment(job(results, "whole", *every_2)).run_dir
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_experiment(job(results, "crashed", *every_2), on_start=crash_after_round_4)
    return results / "default" / "crashed", Path(whole)


def copy_run(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


class Payload:
    """What an attacker plants: unpickling it runs a shell command."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return os.system, (f"touch {self.marker}",)


def resume_cli(run_dir: Path, *flags: str) -> tuple[int, list[str]]:
    import contextlib

    from rayfl.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(["resume", "--quiet", *flags, str(run_dir)])
    return rc, [line for line in err.getvalue().splitlines() if line.strip()]


def test_a_planted_pickle_is_refused_and_never_runs(crashed: tuple[Path, Path], tmp_path: Path) -> None:
    """Three plantings, each refused with exit 2 in one line and the payload never run: a
    checkpoint.pkl without --trust-pickle, pickle bytes named checkpoint.npz, and a real
    checkpoint.npz whose array member is a pickled object array."""
    marker = tmp_path / "pwned"
    payload = pickle.dumps(Payload(marker))

    as_pkl = copy_run(crashed[0], tmp_path / "as-pkl")
    for name in ("checkpoint.npz", "checkpoint.prev.npz"):
        (as_pkl / name).unlink()
    (as_pkl / "checkpoint.pkl").write_bytes(payload)
    rc, lines = resume_cli(as_pkl)
    assert rc == 2 and len(lines) == 1 and str(as_pkl / "checkpoint.pkl") in lines[0] and "--trust-pickle" in lines[0], lines

    as_npz = copy_run(crashed[0], tmp_path / "as-npz")
    (as_npz / "checkpoint.npz").write_bytes(payload)
    (as_npz / "checkpoint.prev.npz").write_bytes(payload)
    rc, lines = resume_cli(as_npz)
    assert rc == 2 and len(lines) == 1 and "no checkpoint of this run can be read" in lines[0], lines

    member = copy_run(crashed[0], tmp_path / "member")
    for name in ("checkpoint.npz", "checkpoint.prev.npz"):
        target = member / name
        with zipfile.ZipFile(io.BytesIO(target.read_bytes())) as src:
            kept = {n: src.read(n) for n in src.namelist()}
        evil = io.BytesIO()
        np.save(evil, np.array([Payload(marker)], dtype=object), allow_pickle=True)
        kept["a0.npy"] = evil.getvalue()
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as dst:
            for n, data in kept.items():
                dst.writestr(n, data)
        target.write_bytes(out.getvalue())
    with pytest.raises(DamagedCheckpoint, match="allow_pickle"):
        read_checkpoint(Location.parse(member / "checkpoint.npz"))
    rc, lines = resume_cli(member)
    assert rc == 2 and len(lines) == 1 and "no checkpoint of this run can be read" in lines[0], lines
    assert not marker.exists()


def test_an_older_pickle_checkpoint_resumes_only_with_the_flag(crashed: tuple[Path, Path], tmp_path: Path) -> None:
    """The crashed run's checkpoints as an older rayfl wrote them (pickle): refused without
    the flag; with it the run resumes into the uninterrupted run's tables and its next
    checkpoint replaces the pickle files."""
    from ray import cloudpickle

    old = copy_run(crashed[0], tmp_path / "old")
    for new, legacy in (("checkpoint.npz", "checkpoint.pkl"), ("checkpoint.prev.npz", "checkpoint.prev.pkl")):
        ckpt = read_checkpoint(Location.parse(old / new))
        (old / legacy).write_bytes(cloudpickle.dumps(ckpt))
        (old / new).unlink()
    with pytest.raises(rayfl.ConfigError, match="trust-pickle"):
        rayfl.resume(old)
    resumed = rayfl.resume(old, trust_pickle=True)
    assert_same_tables(load(crashed[1]), load(resumed.dir))
    assert not (old / "checkpoint.pkl").exists() and not (old / "checkpoint.prev.pkl").exists()
    assert load_checkpoint(Location.parse(old)).round == 5  # its last periodic one (rounds 0-6, every 2)
