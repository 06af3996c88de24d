"""The Byzantine clients of a run and what they send (BR-FFGG, Alg. 5 line 7), for the round
pipeline's robust path (rayfl.pipeline.server), which then aggregates with `aggregate`.

`ByzantineServer` fixes the Byzantine clients once per run (B of the M clients, drawn from the
run seed, so a resumed run and any host layout agree), tags them in the `clients` table (column
`byzantine`) and lets them send what the attack crafts: they are omniscient, seeing the round's
honest vectors (FFGG, App. D: Byzantines "know the updates of other clients and
aggregation rule applied by the server"). A data attack (label_flip) is applied on the hosts instead
(rayfl.pipeline.uploads): its clients' uploads are their own."""

from __future__ import annotations

from typing import Any

import numpy as np

from rayfl.rng import numpy_rng
from rayfl.robust.aggregators import RobustConfig
from rayfl.robust.attacks import FROM_OWN, AttackConfig, choose_byzantine, craft


class ByzantineServer:
    """Who is Byzantine, and the stack of vectors the server receives from a round."""

    def __init__(self, fed: Any, aggregator: RobustConfig, attack: AttackConfig):
        self.aggregator, self.attack, self.seed = aggregator, attack, int(fed.seed)
        picked = choose_byzantine(int(fed.num_clients), attack, numpy_rng(self.seed, "byzantine"))
        self.byzantine = frozenset(int(c) for c in picked)
        if hasattr(fed, "client_tags") and attack.name != "none":
            fed.client_tags.update({c: {"byzantine": c in self.byzantine} for c in range(int(fed.num_clients))})

    def vectors(self, results: list[Any], key: str, round: int, stream: str = "") -> np.ndarray:
        """The [n, d] stack the server receives, in client-id order: honest uploads as sent,
        Byzantine rows replaced by the attack's crafted vectors. `stream` names a second
        upload of the same round (its own random stream).

        The attack reads the honest rows in place (by index), and gets the Byzantines' own rows
        only if it starts from them: the stack is the one [n, d] array the server holds."""
        stack = np.stack([np.asarray(r[key], dtype=np.float64) for r in results])
        bad = np.array([r.client in self.byzantine for r in results], dtype=bool)
        if bad.any() and self.attack.name not in ("none", "label_flip"):
            # With no honest client left, the attackers see the whole stack (their own rows).
            rows = np.flatnonzero(~bad) if (~bad).any() else None
            own = stack[bad] if self.attack.name in FROM_OWN else None
            rng = numpy_rng(self.seed, "byzantine.attack" + stream, round)
            stack[bad] = craft(self.attack, stack, rng, own=own, count=int(bad.sum()), rows=rows)
        return stack
