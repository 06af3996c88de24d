"""The server's own data as one more, always-participating client of a first-order baseline.

ZO-HFL's server trains on 30% of the training data every round (its f1 term, Alg. 1 line 7)
while the paper does not say that FedAvg, FedProx and SCAFFOLD see that data (Sec. IV): a
possible confounder of Table I. With `server_as_client: true` a baseline gets the same data as
an extra client that runs the baseline's own client function on the driver every round. It is the
server's computation, so it is not charged on the simulated clock; its RNG streams use the
client id m (one past the last real client)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from rayfl.config import ConfigError
from rayfl.engine import ClientContext, Federation
from rayfl.engine.payload import to_numpy_tree


@dataclass
class ServerUpdate:
    """What the server-as-client returned, shaped like a `ClientResult` for aggregation."""

    client: int
    values: dict[str, Any]
    num_samples: int
    local_steps: int

    def __getitem__(self, key: str) -> Any:
        return self.values[key]


@dataclass
class ServerClient:
    fed: Federation
    state: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        data = self.fed.server_data
        if data is None:
            raise ConfigError("algorithm.server_as_client", "the server owns no data; set data.server_fraction > 0")
        self.x, self.y = data.x, data.y
        self.id = self.fed.num_clients

    def run(self, fn: Any, round: int, **payload: Any) -> ServerUpdate:
        ctx = ClientContext(
            id=self.id, round=round, seed=self.fed.seed, model=self.fed.model, device=torch.device("cpu"),
            x=self.x, y=self.y, test_x=None, test_y=None, state=self.state,
        )
        values = to_numpy_tree(dict(fn(ctx, **payload)))
        return ServerUpdate(self.id, values, ctx.num_samples, ctx.work.steps)
