"""What happens to a client's answer between its client function and the network, on its host.

In order, on each model-shaped key the algorithm declares (`AlgorithmConfig.uploads`):

1. compression, with error feedback: the residual of what was not sent is the client's state
   (`pipeline.residual.<key>`), so it is staged with the task and committed only when the
   server accepts it, checkpointed, and replayed after a host failure like any client state;
2. clipping to `clip` in L2 norm, over every uploaded key together (one client, one vector: the
   sensitivity bound of client-level DP);
3. local DP noise, N(0, std^2) per coordinate.

Every draw comes from (run seed, purpose, round, client), so a task gives the same bits on any
host, in any order, and when re-run. The answer's `bytes_up` becomes the encoded size."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rayfl.engine.payload import payload_nbytes
from rayfl.pipeline.compression import CompressionConfig, encoded_nbytes, with_error_feedback
from rayfl.rng import numpy_rng

RESIDUAL = "pipeline.residual."


@dataclass(frozen=True)
class UploadSpec:
    """The client-side half of one call's pipeline: which keys, and what to do to them.

    `clip` is this round's bound (adaptive clipping moves it between rounds), `local_noise_std`
    the std of local DP noise (0: none), `flip_labels` the Byzantine clients whose labels a
    data attack flips in this call, out of `num_classes`."""

    keys: tuple[str, ...]
    compression: CompressionConfig | None = None
    clip: float | None = None
    local_noise_std: float = 0.0
    flip_labels: frozenset[int] = frozenset()
    num_classes: int = 0

    def estimate(self, num_params: int, dense: int) -> int:
        """The bytes an answer will take, before it exists (a deadline's work budget): `dense`
        uncompressed, else each key's encoded size as if model-sized, plus a scalar loss."""
        if self.compression is None or self.compression.name == "none":
            return dense
        return len(self.keys) * encoded_nbytes(num_params, 4, self.compression) + 8


@dataclass
class UploadInfo:
    """What the transform did to one answer: its norm before clipping, whether it was clipped,
    its norm after clipping (measured on the arrays sent, before any local noise), and the
    bytes it takes on the wire."""

    norm: float | None
    clipped: bool | None
    bytes_up: int
    clipped_norm: float | None = None

    def row(self) -> dict[str, Any]:
        """The `clients` columns it adds."""
        out: dict[str, Any] = {}
        if self.norm is not None:
            out["update_norm"] = self.norm
            out["clipped"] = bool(self.clipped)
            out["clipped_norm"] = self.clipped_norm
        return out


def transform_upload(
    values: dict[str, Any], state: dict[str, Any], spec: UploadSpec, client: int, round: int, seed: int
) -> tuple[dict[str, Any], UploadInfo]:
    """`values` as the client sends them (a new dict; arrays not transformed are shared), with
    the error-feedback residuals updated in `state` (the task's private copy).

    Compression, then clipping: the clip bounds what is sent. Under local DP the order is
    clip, noise, then compression: the codec only post-processes the private vector, and the
    residual error feedback keeps is a function of private vectors alone."""
    out = dict(values)
    keys = [k for k in spec.keys if isinstance(out.get(k), np.ndarray)]
    compressing = spec.compression is not None and spec.compression.name != "none"
    encoded: dict[str, int] = {}
    if compressing and spec.local_noise_std == 0:
        encoded = _compress(out, keys, state, spec, client, round, seed)
    norm = clipped = after = None
    if spec.clip is not None and keys:
        norm = joint_norm([out[k] for k in keys])
        clipped = norm > spec.clip
        after = norm
        if clipped:
            after = scale_to(out, keys, spec.clip / norm)
            if after > spec.clip:  # the cast back to float32 rounded it a hair over: the bound must hold
                eps = max(float(np.finfo(out[k].dtype).eps) for k in keys)
                after = scale_to(out, keys, spec.clip / after * (1.0 - 4.0 * eps))
    if spec.local_noise_std > 0:
        for key in keys:
            rng = numpy_rng(seed, f"privacy.local.{key}", round, client)
            noise = rng.normal(0.0, spec.local_noise_std, size=out[key].shape)
            out[key] = (out[key].astype(np.float64) + noise).astype(out[key].dtype)
        if compressing:
            encoded = _compress(out, keys, state, spec, client, round, seed)
    others = {k: v for k, v in out.items() if k not in encoded}
    bytes_up = payload_nbytes(others) + sum(encoded.values())
    return out, UploadInfo(None if norm is None else float(norm), clipped, bytes_up, None if after is None else float(after))


def _compress(out: dict[str, Any], keys: list[str], state: dict[str, Any], spec: UploadSpec, client: int, round: int,
              seed: int) -> dict[str, int]:
    """Encode each key in place (with error feedback's residual in `state`); its wire bytes."""
    assert spec.compression is not None
    encoded: dict[str, int] = {}
    for key in keys:
        rng = numpy_rng(seed, f"compression.{key}", round, client)
        shape = out[key].shape
        sent, residual = with_error_feedback(out[key].ravel(), _residual(state, key), spec.compression, rng)
        out[key] = sent.values.reshape(shape)
        encoded[key] = sent.nbytes
        if residual is not None:
            state[RESIDUAL + key] = residual
    return encoded


def scale_to(out: dict[str, Any], keys: list[str], factor: float) -> float:
    """Multiply the arrays of `keys` by `factor` (in float64, back to their dtype); their joint
    norm after."""
    for key in keys:
        out[key] = (out[key].astype(np.float64) * factor).astype(out[key].dtype)
    return joint_norm([out[k] for k in keys])


def joint_norm(arrays: list[np.ndarray]) -> float:
    """The L2 norm of the arrays taken as one vector, in float64."""
    return float(np.sqrt(sum(float(np.dot(a.ravel().astype(np.float64), a.ravel().astype(np.float64))) for a in arrays)))


def flip_labels_of(y: Any, spec: UploadSpec | None, client: int) -> Any:
    """A data attack's labels: c -> num_classes - 1 - c for a Byzantine client, else `y`."""
    if spec is None or client not in spec.flip_labels:
        return y
    return spec.num_classes - 1 - y


def _residual(state: Mapping[str, Any], key: str) -> np.ndarray | None:
    value = state.get(RESIDUAL + key)
    return None if value is None else np.asarray(value)
