"""K clients' ZO-HFL lower-level solves as one [2K, d] projected-SGD run (the batched twin's parts).

Row 2k solves client k's problem at x + eta v_k, row 2k + 1 at x - eta v_k. What differs from
the per-client run in `rayfl.zo.lower_level.projected_sgd` is only bookkeeping: each client's
minibatches are padded to a common width (padded rows masked out, the mean still over the
client's own b), a client stops moving after its own step count (rows restored, so a finished
client is bit-for-bit where its own run ended), and the constraint's radius is per row. The
arithmetic of a step is the loop's, so results agree with it to float32 reduction order."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rayfl.zo.projection import ConstraintConfig, project, project_simplex
from rayfl.zo.schedules import step_size


@dataclass
class PairedBatches:
    """The clients' minibatch streams, padded to one width.

    Group g reads rows `index[t, g]` of its client's prepared inputs `xs[owner[g]]` (gathered
    client by client into one [G, B, F] buffer: concatenating every client's data would copy
    it all once more per call) and of `onehot`, the clients' one-hot targets concatenated
    (`global_index`); `mask` [T, G, B] is 1 for real rows, `b` [G] each group's own batch size
    (the mean's divisor, >= 1). A group is a client (common random numbers: both solves see
    one minibatch) or one solve (independent: rows 2k and 2k + 1 each their own stream)."""

    xs: list[torch.Tensor]
    owner: list[int]
    onehot: torch.Tensor
    index: torch.Tensor
    global_index: torch.Tensor
    mask: torch.Tensor
    b: torch.Tensor
    inputs: torch.Tensor | None = None  # [G, B, F] step t's gathered rows, one buffer for all steps

    def inputs_buffer(self, n_in: int, like: torch.Tensor) -> torch.Tensor:
        """The [G, B, F] buffer each step gathers its rows into: allocated (zeroed) once per call,
        since every step overwrites all of a client's B rows (padding reads its row 0) and an
        empty client's rows stay zero; a fresh tensor per step cost the ZO-HFL host 14% of its
        time in zero-filling alone."""
        if self.inputs is None:
            self.inputs = torch.zeros((len(self.owner), self.index.shape[2], n_in), dtype=like.dtype, device=like.device)
        return self.inputs


def pair_batches(
    xs: Sequence[torch.Tensor], onehots: Sequence[torch.Tensor], streams: Sequence[Sequence[torch.Tensor]], steps: int
) -> PairedBatches:
    """Pad per-client index streams to [steps, G, B]. `streams[k]` holds client k's [T_k, b_k]
    index tensors into its own data `xs[k]`, one per group the client owns (1 or 2)."""
    offsets, total = [], 0
    for x in xs:
        offsets.append(total)
        total += x.shape[0]
    groups = [(k, s) for k, owned in enumerate(streams) for s in owned]
    width = max([1, *(s.shape[1] for _, s in groups)])
    index = torch.zeros((steps, len(groups), width), dtype=torch.int64)
    shift = torch.tensor([offsets[k] for k, _ in groups], dtype=torch.int64)
    mask = torch.zeros((steps, len(groups), width), dtype=xs[0].dtype)
    b = torch.ones(len(groups), dtype=xs[0].dtype)
    for g, (_, s) in enumerate(groups):
        t, w = min(s.shape[0], steps), s.shape[1]
        if t and w:
            index[:t, g, :w] = s[:t]
            mask[:t, g, :w] = 1
            b[g] = w
    device = xs[0].device
    owner = [k for k, _ in groups]
    return PairedBatches(list(xs), owner, torch.cat(list(onehots)), index.to(device), (index + shift[None, :, None]).to(device),
                         mask.to(device), b.to(device))


def paired_ce_grad(
    w: torch.Tensor, batches: PairedBatches, t: int, shape: tuple[int, int, bool]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss [2K], grad [2K, d]) of the mean CE of a linear softmax model on step t's minibatches:
    `CrossEntropyGrad._linear` with one minibatch per group and a row mask. Each group's G
    weight vectors (2 when the two solves share a minibatch, else 1) share its matmul."""
    n_in, c, bias = shape
    idx, mask = batches.index[t], batches.mask[t]  # [G, B]
    g, width = idx.shape
    r = w.shape[0] // g
    cf = c * n_in
    x = batches.inputs_buffer(n_in, w)
    for j, k in enumerate(batches.owner):
        if batches.xs[k].shape[0]:  # an empty client's rows stay zero (and masked)
            torch.index_select(batches.xs[k], 0, idx[j], out=x[j])
    rows = batches.global_index[t].reshape(-1)
    onehot = (batches.onehot.index_select(0, rows).view(g, width, c) * mask.unsqueeze(-1)).unsqueeze(2)
    weight = w[:, :cf].reshape(g, r * c, n_in)
    z = torch.bmm(x, weight.transpose(1, 2)).view(g, width, r, c)
    if bias:
        z = z + w[:, cf:].reshape(g, 1, r, c)
    logp = torch.log_softmax(z, dim=-1)
    b = batches.b
    loss = (-(logp * onehot).sum(dim=(1, 3)) / b[:, None]).reshape(-1)
    p = logp.exp_().sub_(onehot).mul_(mask[:, :, None, None])  # B * dCE/dz, zero on padding
    g_w = torch.bmm(p.reshape(g, width, r * c).transpose(1, 2), x).div_(b[:, None, None]).reshape(g * r, cf)
    if not bias:
        return loss, g_w
    return loss, torch.cat([g_w, (p.sum(dim=1) / b[:, None, None]).reshape(g * r, c)], dim=1)


def row_radii(cfg: ConstraintConfig, clients: Sequence[int], like: torch.Tensor) -> torch.Tensor | None:
    """[2K, 1] radii for ball / simplex constraints with per-client radii (None: one radius)."""
    if cfg.kind not in ("ball", "simplex") or not cfg.client_radius:
        return None
    radii = [cfg.radius_of(c) for c in clients for _ in range(2)]
    return torch.tensor(radii, dtype=like.dtype, device=like.device).unsqueeze(1)


def project_rows(y: torch.Tensor, centers: torch.Tensor, cfg: ConstraintConfig, radii: torch.Tensor | None) -> torch.Tensor:
    """`project` row by row with per-row radii (`rayfl.zo.projection.project`'s formulas)."""
    if radii is None:
        return project(y, centers, cfg, 0)
    if cfg.kind == "simplex":
        return project_simplex(y, radii)
    diff = y - centers
    norm = torch.linalg.vector_norm(diff, dim=-1, keepdim=True)
    scale = torch.clamp(radii / torch.clamp(norm, min=torch.finfo(y.dtype).tiny), max=1.0)
    return centers + diff * scale


def batched_projected_sgd(
    starts: torch.Tensor,
    centers: torch.Tensor,
    done: Sequence[int],
    *,
    lr: float,
    lr_offset: float | None,
    mu: float,
    constraint: ConstraintConfig,
    radii: torch.Tensor | None,
    batches: PairedBatches | None,
    shape: tuple[int, int, bool] | None,
    has_data: Sequence[bool],
) -> tuple[torch.Tensor, list[float]]:
    """Alg. 2 for K clients at once: rows 2k, 2k + 1 take `done[k]` steps (client k's count
    after its work budget), the data term only where `has_data[k]`. Returns (y [2K, d], each
    client's mean data loss over its steps and two rows, NaN without data or steps)."""
    y = starts.clone()
    k = len(done)
    steps = max(done, default=0)
    done_t = torch.tensor(list(done), device=y.device)
    loss_sum = torch.zeros(2 * k, dtype=y.dtype, device=y.device)
    for t in range(steps):
        a = step_size(lr, t, lr_offset)
        active = (done_t > t).repeat_interleave(2)  # [2K]
        partial = not bool(active.all())
        before = y.clone() if partial else None
        grad = None
        if batches is not None:
            loss, grad = paired_ce_grad(y, batches, t, shape)
            loss_sum += torch.where(active, loss, torch.zeros_like(loss))
        if mu:
            y.mul_(1.0 - a * mu).add_(centers, alpha=a * mu)
        if grad is not None:
            y.add_(grad, alpha=-a)
        if constraint.kind != "none":
            y.copy_(project_rows(y, centers, constraint, radii))
        if before is not None:
            y = torch.where(active.unsqueeze(1), y, before)
    pair_loss = loss_sum.view(k, 2).mean(dim=1)
    losses = [float(pair_loss[j]) / done[j] if has_data[j] and done[j] else float("nan") for j in range(k)]
    return y, losses
