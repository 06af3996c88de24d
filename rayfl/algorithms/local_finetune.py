"""Local fine-tuning, then personalized evaluation on every client: step 3 of FFGG's Table 1
pipeline (arXiv 2305.18285, §3.3 / App. E.3), and the "FedAvg + fine-tuning" baseline (not in
the paper).

Every client with a test set starts from the run's initial model (`model.init_from`: the
previous stage's final model), runs `local_epochs` epochs of minibatch SGD on its personal
parameters only (`personal_scheme`, rayfl.models.personal: input / output / adapter layers, `all` for
full fine-tuning, `none` for no fine-tuning), the rest frozen, and is tested on its own test
split before and after. The reported accuracy is the paper's: the mean over clients weighted by
their number of test examples, i.e. the accuracy on the pooled client test sets (for
StackOverflow: next-token top-1, ignoring padding, OOV, BOS and EOS targets).

One server round; nothing is uploaded but counts (the fine-tuned w stays on the client).
`rounds` gets test_accuracy (after) and test_accuracy_before; `evals` one row per client."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from rayfl.algorithms.local import LocalSchedule
from rayfl.config import AlgorithmConfig, ConfigError
from rayfl.driver import Algorithm, Round, Uploads
from rayfl.engine import ClientContext
from rayfl.models.params import functional_logits
from rayfl.models.personal import SCHEMES, personal_mask

EVAL_BATCH = 512


@dataclass
class LocalFinetuneConfig(AlgorithmConfig):
    """`personal_scheme` / `personal_patterns`: which parameters each client fine-tunes (the rest stay frozen);
    local_epochs (5 in the paper), lr, batch_size: its SGD; max_grad_norm: clip each step's
    gradient (StackOverflow's 0.1), null for none."""

    name: str = "local_finetune"
    # Which parameters each client fine-tunes, the rest frozen: none, input, output, adapter,
    # adapter_norm, all (full fine-tuning) or patterns.
    personal_scheme: str = "all"
    # With personal_scheme patterns: parameter-name globs whose matches are fine-tuned.
    personal_patterns: list[str] = field(default_factory=list)
    # Epochs of fine-tuning on each client's data (5 in the FFGG paper).
    local_epochs: int | None = 5
    # Clip each step's gradient to this L2 norm (StackOverflow: 0.1); null: no clipping.
    max_grad_norm: float | None = None

    def validate(self) -> None:
        super().validate()
        if self.personal_scheme not in SCHEMES:
            raise ConfigError("algorithm.personal_scheme", f"must be one of {', '.join(SCHEMES)}, got {self.personal_scheme!r}")
        if self.personal_scheme == "patterns" and not self.personal_patterns:
            raise ConfigError("algorithm.personal_patterns", "the patterns scheme needs at least one parameter-name glob")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ConfigError("algorithm.max_grad_norm", f"must be > 0 (or null), got {self.max_grad_norm}")


@dataclass
class FinetuneState:
    """The model every client starts fine-tuning from."""

    x: np.ndarray


def finetune_client(
    ctx: ClientContext,
    params: np.ndarray,
    mask: np.ndarray,
    lr: float,
    schedule: LocalSchedule,
    max_grad_norm: float | None = None,
    excluded: tuple[int, ...] = (),
) -> dict[str, Any]:
    """Masked SGD on the personal entries, then (correct, counted, loss sum) on the client's
    test split before and after."""
    x = torch.tensor(params, device=ctx.device)
    m = torch.tensor(mask, device=ctx.device, dtype=x.dtype)
    before = client_test_counts(ctx, x, excluded)
    w = x.clone()
    losses = []
    if m.any():
        for xb, yb in ctx.batches(schedule.batch_size, epochs=schedule.epochs, steps=schedule.steps):
            v = w.detach().requires_grad_(True)
            loss = F.cross_entropy(functional_logits(ctx.model, v, xb), yb)
            (grad,) = torch.autograd.grad(loss, v)
            ctx.work.gradient_step(len(yb))
            with torch.no_grad():
                grad = grad * m
                if max_grad_norm is not None:
                    norm = float(grad.norm())
                    if norm > max_grad_norm:
                        grad = grad * (max_grad_norm / norm)
                w -= lr * grad
            losses.append(loss.item())
    after = client_test_counts(ctx, w, excluded)
    return {
        "loss": float(np.mean(losses)) if losses else float("nan"),
        "correct_before": before[0], "count": before[1], "loss_sum_before": before[2],
        "correct_after": after[0], "loss_sum_after": after[2],
    }


def client_test_counts(ctx: ClientContext, w: torch.Tensor, excluded: tuple[int, ...]) -> tuple[int, int, float]:
    """(correct, counted targets, summed CE) of flat model `w` on the client's test split.
    Targets of -100 (padding) and those in `excluded` are not counted."""
    if ctx.test_x is None or ctx.test_y is None or len(ctx.test_y) == 0:
        return 0, 0, 0.0
    correct, count, loss_sum = 0, 0, 0.0
    with torch.no_grad():
        for start in range(0, len(ctx.test_y), EVAL_BATCH):
            xb, yb = ctx.test_x[start : start + EVAL_BATCH], ctx.test_y[start : start + EVAL_BATCH]
            logits = functional_logits(ctx.model, w, xb)
            valid = yb != -100
            if excluded:
                valid &= ~torch.isin(yb, torch.tensor(excluded, device=yb.device))
            loss_sum += float(F.cross_entropy(logits, yb, reduction="sum").item())
            correct += int(((logits.argmax(1) == yb) & valid).sum())
            count += int(valid.sum())
            ctx.work.forward(len(yb))
    return correct, count, loss_sum


class LocalFinetune(Algorithm[FinetuneState]):
    """One round: every client with train and test data fine-tunes from the initial model
    and is measured before and after; nothing is uploaded but counts."""

    config = LocalFinetuneConfig
    client = staticmethod(finetune_client)
    asynchrony_refusal = "local fine-tuning is one round of per-client work with no server step"

    def setup(self) -> None:
        fed, cfg = self.fed, self.cfg
        if fed.dataset.client_test is None:
            raise ConfigError("partition.client_test", "local fine-tuning is judged on per-client test sets; set partition.client_test=proportional")
        self.mask = personal_mask(fed.model, cfg.personal_scheme, tuple(cfg.personal_patterns))
        self.schedule = LocalSchedule(cfg.batch_size, cfg.local_epochs, cfg.local_steps)

    def rounds(self) -> int:
        return 1

    def init(self) -> FinetuneState:
        return FinetuneState(x=self.fed.initial_params())

    def cohort(self, state: FinetuneState, rnd: Round) -> list[int]:
        ds = self.fed.dataset
        return [c for c in range(self.fed.num_clients) if len(ds.client_test[c]) and len(ds.client_train[c])]

    def payload(self, state: FinetuneState, rnd: Round) -> dict[str, Any]:
        cfg = self.cfg
        return {"params": state.x, "mask": self.mask, "lr": cfg.lr, "schedule": self.schedule,
                "max_grad_norm": cfg.max_grad_norm, "excluded": tuple(self.fed.dataset.excluded_targets)}

    def metrics(self, state: FinetuneState, uploads: Uploads, rnd: Round) -> dict[str, Any]:
        """The pooled accuracy before and after; each client's own in `evals`."""
        for res in uploads.results:
            n = max(res["count"], 1)
            self.fed.log_eval(rnd.index, {
                "test_accuracy": res["correct_after"] / n, "test_accuracy_before": res["correct_before"] / n,
                "test_loss": res["loss_sum_after"] / n, "test_count": res["count"],
            }, client=res.client)
        return {**pooled_metrics(uploads.results), "personal_params": int(self.mask.sum())}

    def evaluate(self, state: FinetuneState, rnd: Round) -> dict[str, Any]:
        return {}


def pooled_metrics(results: list[Any]) -> dict[str, float]:
    """Accuracy over the pooled client test sets = the test-size-weighted client mean."""
    count = sum(int(r["count"]) for r in results)
    n = max(count, 1)
    losses = np.array([r["loss"] for r in results], dtype=np.float64)
    return {
        "test_accuracy": sum(int(r["correct_after"]) for r in results) / n,
        "test_accuracy_before": sum(int(r["correct_before"]) for r in results) / n,
        "test_loss": sum(float(r["loss_sum_after"]) for r in results) / n,
        "test_loss_before": sum(float(r["loss_sum_before"]) for r in results) / n,
        "train_loss": float(np.nanmean(losses)) if np.isfinite(losses).any() else float("nan"),
        "num_updates": len(results),
        "test_count": count,
    }
