"""How many ClientHost actors to start, with what resources, and which clients each hosts.

Results never depend on this layout (every client draws from its own seeded streams and the
driver aggregates in client-id order), so placement is purely a performance choice."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from functools import cached_property

from rayfl.config import EngineConfig
from rayfl.errors import ResourceError


@dataclass(frozen=True)
class Placement:
    num_hosts: int
    num_cpus: float
    num_gpus: float
    assignment: list[range]  # the contiguous block of client ids each host holds

    def host_of(self, client: int) -> int:
        """The host holding `client` (a binary search over the blocks: no per-client array)."""
        h = bisect.bisect_right(self.starts, int(client)) - 1
        if h < 0 or int(client) not in self.assignment[h]:
            raise IndexError(f"client {client} is on no host (clients 0-{self.num_clients - 1})")
        return h

    @cached_property
    def starts(self) -> list[int]:
        return [r.start for r in self.assignment]

    @property
    def num_clients(self) -> int:
        return sum(len(r) for r in self.assignment)


def plan_placement(cfg: EngineConfig, num_clients: int, cluster_resources: dict[str, float]) -> Placement:
    """Pick the host count: explicit `num_hosts`; else `clients_per_host`; else (auto) one host
    per `num_cpus_per_host` CPUs, or per `num_gpus_per_host` GPU share when GPUs are requested."""
    if cfg.num_hosts is not None:
        hosts = cfg.num_hosts
    elif cfg.clients_per_host != "auto":
        hosts = math.ceil(num_clients / int(cfg.clients_per_host))
    elif cfg.num_gpus_per_host > 0:
        gpus = cluster_resources.get("GPU", 0.0)
        if gpus <= 0:
            raise ResourceError(
                "engine.num_gpus_per_host",
                f"{cfg.num_gpus_per_host:g} GPU per host asked, but the Ray cluster has no "
                "GPU now; set engine.num_gpus_per_host=0, or engine.num_hosts if an autoscaler "
                "adds GPUs",
            )
        hosts = max(1, int(gpus / cfg.num_gpus_per_host + 1e-9))
    else:
        cpus = cluster_resources.get("CPU", 1.0)
        per = cfg.num_cpus_per_host if cfg.num_cpus_per_host > 0 else 1.0
        hosts = max(1, int(cpus / per + 1e-9))
    hosts = max(1, min(hosts, num_clients))
    if cfg.clients_per_host != "auto" and cfg.num_hosts is None:
        size = int(cfg.clients_per_host)
        assignment = [range(i, min(i + size, num_clients)) for i in range(0, num_clients, size)]
    else:  # np.array_split's blocks: the first num_clients % hosts one longer
        base, longer = divmod(num_clients, hosts)
        bounds = [h * base + min(h, longer) for h in range(hosts + 1)]
        assignment = [range(bounds[h], bounds[h + 1]) for h in range(hosts)]
    return Placement(hosts, cfg.num_cpus_per_host, cfg.num_gpus_per_host, assignment)
