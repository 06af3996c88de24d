"""Robust aggregation as a server step any algorithm can call (BR-FFGG, Alg. 5 line 9).

`ByzantineServer` fixes the Byzantine clients once per run (B of the M clients, drawn from the
run seed, so a resumed run and any host layout agree), tags them in the `clients` table
(column `byzantine`), lets them send what the attack crafts (they are omniscient: they see the
round's honest vectors, spec App. D) and replaces the mean by `aggregate`:

    byz = ByzantineServer(fed, cfg.aggregator, cfg.attack)
    ...
    results = fed.call(ids, client_fn, round=r, per_client=byz.per_client(ids), ...)
    g = byz.combine(results, "delta", r)          # ARAgg over honest + crafted vectors
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rayfl.rng import numpy_rng
from rayfl.robust.aggregators import RobustConfig, aggregate
from rayfl.robust.attacks import AttackConfig, choose_byzantine, craft


class ByzantineServer:
    """Who is Byzantine, what they send, and the robust aggregate of a round's vectors."""

    def __init__(self, fed: Any, aggregator: RobustConfig, attack: AttackConfig):
        self.aggregator, self.attack, self.seed = aggregator, attack, int(fed.seed)
        picked = choose_byzantine(int(fed.num_clients), attack, numpy_rng(self.seed, "byzantine"))
        self.byzantine = frozenset(int(c) for c in picked)
        if hasattr(fed, "client_tags") and attack.name != "none":
            fed.client_tags.update({c: {"byzantine": c in self.byzantine} for c in range(int(fed.num_clients))})

    def per_client(self, ids: list[int]) -> dict[int, dict[str, Any]] | None:
        """The data attack needs its clients to know (they flip their labels); model attacks
        are applied to the upload, so nobody is told anything."""
        if not self.attack.data_attack:
            return None
        return {c: {"byzantine": True} for c in ids if c in self.byzantine}

    def vectors(self, results: list[Any], key: str, round: int, stream: str = "") -> np.ndarray:
        """The [n, d] stack the server receives, in client-id order: honest uploads as sent,
        Byzantine rows replaced by the attack's crafted vectors. `stream` names a second
        upload of the same round (its own random stream)."""
        stack = np.stack([np.asarray(r[key], dtype=np.float64) for r in results])
        bad = np.array([r.client in self.byzantine for r in results], dtype=bool)
        if bad.any() and self.attack.name not in ("none", "label_flip"):
            honest = stack[~bad] if (~bad).any() else stack
            rng = numpy_rng(self.seed, "byzantine.attack" + stream, round)
            stack[bad] = craft(self.attack, honest, rng, own=stack[bad])
        return stack

    def combine(self, results: list[Any], key: str, round: int, reference: np.ndarray | None = None) -> np.ndarray:
        """ARAgg of the round's vectors (float64 [d]). `reference` is centered clipping's
        previous aggregate: the caller keeps it in its tracked server state (checkpointed)."""
        stack = self.vectors(results, key, round)
        rng = numpy_rng(self.seed, "byzantine.aggregate", round)
        return aggregate(stack, self.aggregator, rng, reference=reference)
