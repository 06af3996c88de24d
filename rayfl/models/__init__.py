"""Networks (`build_model`) and their flat-parameter view (`rayfl.models.params`)."""

from rayfl.models.networks import Conv4, build_model, init_params, mlp
from rayfl.models.params import (
    flat_grad,
    functional_logits,
    get_flat,
    num_params,
    set_flat,
    unflatten,
)

__all__ = [
    "Conv4",
    "build_model",
    "flat_grad",
    "functional_logits",
    "get_flat",
    "init_params",
    "mlp",
    "num_params",
    "set_flat",
    "unflatten",
]
