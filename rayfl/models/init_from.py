"""Starting a run from another run's parameters (`model.init_from`): FFGG's pipeline chains
non-personalized training, personalized training and fine-tuning this way (FFGG, App. E.3).

The source is a `.npy` flat vector of exactly the target model's length, or a run directory:
its manifest names the model it trained and its `checkpoint.npz` holds the server's state after
its last checkpointed round (a run whose `output.checkpoint_every` divides `run.rounds` has its
final model there). A run-directory source is copied into the target *by parameter name*, so a
base network's parameters land in the same network with adapters added after pretraining; the
parameters the source lacks (the adapters) keep their fresh, identity-edit initialisation."""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from pathlib import Path

import numpy as np
from torch import nn

from rayfl.config import ConfigError, ModelConfig, recorded_section


def initial_vector(target: nn.Module, fresh: np.ndarray, init_from: str, input_shape: tuple[int, ...], num_classes: int) -> np.ndarray:
    """The target model's flat start vector: `fresh` (its own init) overwritten by the source."""
    path = Path(init_from).expanduser()
    if path.suffix == ".npy":
        vec = np.load(path).astype(np.float32).reshape(-1)
        if len(vec) != len(fresh):
            raise ConfigError("model.init_from", f"{path} holds {len(vec)} parameters, the model has {len(fresh)}")
        return vec
    source_cfg, vec = run_final_params(path, input_shape, num_classes)
    from rayfl.models.networks import build_model

    source = build_model(source_cfg, input_shape, num_classes)
    return copy_by_name(source, vec, target, fresh)


def run_final_params(run_dir: Path, input_shape: tuple[int, ...], num_classes: int) -> tuple[ModelConfig, np.ndarray]:
    """(the model config, the flat global model) of a finished run's last checkpoint.

    FedAvg-like states hold the whole vector. FFGG's (`theta`, rayfl.algorithms.ffgg) hold only
    the global entries: the personal ones then take the model's own seeded initialisation (the
    run's fresh init: FFGG's clients are stateless and start w from the module's init)."""
    import torch

    from rayfl.engine.checkpoint import load_checkpoint, resolver_named
    from rayfl.models.networks import build_model
    from rayfl.models.params import get_flat
    from rayfl.results.storage import run_manifest
    from rayfl.rng import derive_seed

    location, manifest = run_manifest(run_dir)
    config = manifest["config"]
    cfg = recorded_section("model", config["model"])
    ckpt = load_checkpoint(location, resolver_named(str(config["algorithm"]["name"])))
    if ckpt is None:
        raise ConfigError("model.init_from", f"{run_dir} has no checkpoint (set output.checkpoint_every to divide run.rounds)")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(int(config["run"]["seed"]), "model.init"))
        model = build_model(cfg, input_shape, num_classes)
    fresh = get_flat(model).numpy()
    saved = ckpt.model
    vec = saved.astype(np.float32) if isinstance(saved, np.ndarray) and saved.shape == fresh.shape else None
    if vec is None:  # a checkpoint from before the drivers recorded the model: read the state
        vec = state_vector(ckpt.server_state, len(fresh))
    if vec is None:
        vec = theta_vector(ckpt.server_state, model, fresh, config.get("algorithm", {}))
    if vec is None:
        raise ConfigError("model.init_from", f"{run_dir}'s server state holds no flat model of {len(fresh)} parameters")
    return cfg, vec


def theta_vector(state: object, model: nn.Module, fresh: np.ndarray, algorithm: dict) -> np.ndarray | None:
    """FFGG's global theta put back at its entries of the flat vector, `fresh` elsewhere."""
    from rayfl.models.personal import personal_mask

    theta = getattr(state, "theta", None)
    scheme = algorithm.get("personal_scheme")
    if not isinstance(theta, np.ndarray) or scheme is None:
        return None
    mask = personal_mask(model, scheme, tuple(algorithm.get("personal_patterns") or ()))
    if theta.ndim != 1 or len(theta) != int((~mask).sum()):
        return None
    out = fresh.astype(np.float32).copy()
    out[~mask] = theta
    return out


def state_vector(state: object, n: int) -> np.ndarray | None:
    """The first array field of a server-state dataclass with `n` entries (FedAvg's `x`)."""
    if not is_dataclass(state):
        return None
    for f in fields(state):
        value = getattr(state, f.name)
        if isinstance(value, np.ndarray) and value.ndim == 1 and len(value) == n:
            return value.astype(np.float32)
    return None


def copy_by_name(source: nn.Module, vec: np.ndarray, target: nn.Module, fresh: np.ndarray) -> np.ndarray:
    """`fresh` with every target parameter that the source has (same name, same shape) replaced
    by the source's value in `vec`; a source parameter the target lacks is an error."""
    src = _slices(source)
    dst = _slices(target)
    out = fresh.astype(np.float32).copy()
    for name, (start, stop, shape) in src.items():
        if name not in dst or dst[name][2] != shape:
            raise ConfigError("model.init_from", f"the source parameter {name} {shape} has no match in this model")
        d0, d1, _ = dst[name]
        out[d0:d1] = vec[start:stop]
    return out


def _slices(model: nn.Module) -> dict[str, tuple[int, int, tuple[int, ...]]]:
    out, offset = {}, 0
    for name, p in model.named_parameters():
        out[name] = (offset, offset + p.numel(), tuple(p.shape))
        offset += p.numel()
    return out
