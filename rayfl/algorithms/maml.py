"""One-step MAML on the flat parameter vector: the objective every MAML-type method in rayfl
differentiates (Per-FedAvg / FedMAML, federated TR-MAML, ComFedL-DAMAML), and the one-step
adaptation that personalized evaluation applies to every method alike.

The objective is f(w) = l_Q(w - alpha grad l_S(w)) (Finn et al. 2017, eq. 1; ComFedL eq. 7),
with S the support batch and Q the query batch. Its exact gradient is
(I - alpha H_S(w)) grad l_Q(w'), a Hessian-vector product, which autograd produces when the
inner gradient is taken with `create_graph=True` (the graph of the inner step is kept and
differentiated through). The first-order variant treats the inner gradient as a constant
(its Jacobian term -alpha H_S is dropped), which gives grad l_Q(w') alone: cheaper, but not
what ComFedL's Alg. 1 or Per-FedAvg prescribe, so every caller labels it as a deviation.

Parameters are one flat vector (`rayfl.models.params`), so "w - alpha g" is vector
arithmetic and the gradient of f is again a flat vector."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rayfl.models.params import functional_logits

Batch = tuple[torch.Tensor, torch.Tensor]


def inner_step(model: nn.Module, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor, inner_lr: float,
               create_graph: bool) -> torch.Tensor:
    """w - alpha grad CE(w; x, y). With `create_graph` the result stays a differentiable
    function of `params` through the gradient (second order); without it the gradient is a
    constant and only the identity path w -> w' remains (first order)."""
    loss = F.cross_entropy(functional_logits(model, params, x), y)
    (grad,) = torch.autograd.grad(loss, params, create_graph=create_graph)
    return params - inner_lr * grad


def maml_objective(
    model: nn.Module,
    params: torch.Tensor,
    support: Batch,
    query: Batch,
    inner_lr: float,
    second_order: bool = True,
) -> torch.Tensor:
    """The scalar l_Q(w - alpha grad l_S(w)), differentiable with respect to `params` (which
    must require grad): `torch.autograd.grad(maml_objective(...), params)` is the MAML
    meta-gradient, exact with `second_order`, first-order (Hessian term dropped) without."""
    if not params.requires_grad:
        raise ValueError("maml_objective needs params that require grad (e.g. w.detach().requires_grad_(True))")
    adapted = inner_step(model, params, support[0], support[1], inner_lr, create_graph=second_order)
    return F.cross_entropy(functional_logits(model, adapted, query[0]), query[1])


def maml_gradient(
    model: nn.Module,
    params: torch.Tensor,
    support: Batch,
    query: Batch,
    inner_lr: float,
    second_order: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(query loss after adaptation, its gradient with respect to `params`), both detached."""
    w = params.detach().requires_grad_(True)
    loss = maml_objective(model, w, support, query, inner_lr, second_order)
    (grad,) = torch.autograd.grad(loss, w)
    return loss.detach(), grad.detach()


def adapt(model: nn.Module, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor, inner_lr: float,
          steps: int = 1) -> torch.Tensor:
    """`steps` full-batch SGD steps on (x, y) from `params`: the test-time adaptation of
    personalized evaluation ("FedAvg is trained with one step at test time", ComFedL Sec. 5.2).
    Returns a detached vector; `params` is not changed."""
    w = params.detach()
    for _ in range(steps):
        w = inner_step(model, w.requires_grad_(True), x, y, inner_lr, create_graph=False).detach()
    return w
