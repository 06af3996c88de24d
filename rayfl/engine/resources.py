"""Fail fast when the Ray cluster cannot hold the client hosts a run asks for.

Ray queues an actor whose resources no node offers and waits for ever, so a job asking for 64
one-CPU hosts on a 2-CPU machine would hang without a word. Before any host starts, the request
(hosts x CPUs, hosts x GPUs, and one host's bundle on one node) is compared with the nodes the
cluster has, or with the node types its autoscaler may launch; what is left to chance (a busy or
slowly scaling cluster) is bounded by `engine.start_timeout`.

The arithmetic is pure (`check_request` on a `Capacity`) so it is tested without Ray; only
`cluster_capacity` and `await_hosts` talk to the cluster.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rayfl.config import EngineConfig
from rayfl.engine.placement import Placement, plan_placement
from rayfl.errors import ResourceError


@dataclass(frozen=True)
class NodeGroup:
    """Nodes of one shape: an alive node (count 1) or an autoscaler node type (up to `count`
    nodes; None when unbounded)."""

    resources: Mapping[str, float]
    count: int | None = 1


@dataclass(frozen=True)
class Capacity:
    """What the cluster has, or may grow to. `scales` means an autoscaler may add nodes whose
    limits are not known here: then nothing is refused and the start-up timeout decides."""

    groups: tuple[NodeGroup, ...]
    scales: bool = False
    source: str = "alive nodes"

    def total(self, resource: str) -> float:
        """The most of `resource` the cluster can ever hold (inf when unbounded)."""
        total = 0.0
        for g in self.groups:
            amount = float(g.resources.get(resource, 0.0))
            if amount > 0 and g.count != 0:
                total += math.inf if g.count is None else amount * g.count
        return total

    def describe(self) -> str:
        """e.g. 'the cluster has 2 CPUs, 0 GPUs on 1 node'."""
        cpus, gpus = _fmt(self.total("CPU")), _fmt(self.total("GPU"))
        if any(g.count is None for g in self.groups):
            return f"the cluster's {self.source} have no limit"
        nodes = sum(g.count or 0 for g in self.groups)
        where = f"{nodes} node" + ("" if nodes == 1 else "s")
        if self.source == "alive nodes":
            return f"the cluster has {cpus} CPUs, {gpus} GPUs on {where}"
        return f"the cluster's {self.source} give at most {cpus} CPUs, {gpus} GPUs on {where}"


@dataclass(frozen=True)
class HostRequest:
    """`num_hosts` actors of (`num_cpus`, `num_gpus`) each; `count_key` is the engine field that
    set the host count (what to lower when there are too many)."""

    num_hosts: int
    num_cpus: float
    num_gpus: float
    device: str
    count_key: str
    num_clients: int

    def bundle(self) -> str:
        """One host's reservation, e.g. '1 CPU' or '0.5 CPU + 0.25 GPU'."""
        gpu = f" + {_fmt(self.num_gpus)} GPU" if self.num_gpus > 0 else ""
        return f"{_fmt(self.num_cpus)} CPU{gpu}"

    def total(self) -> str:
        """All hosts' reservation, e.g. '64 CPUs'."""
        gpu = f" + {_fmt(self.num_hosts * self.num_gpus)} GPUs" if self.num_gpus > 0 else ""
        return f"{_fmt(self.num_hosts * self.num_cpus)} CPUs{gpu}"


def host_request(cfg: EngineConfig, placement: Placement, num_clients: int) -> HostRequest:
    """The request a placement makes, and which config field decided its host count."""
    if cfg.num_hosts is not None:
        count_key = "engine.num_hosts"
    elif cfg.clients_per_host != "auto":
        count_key = "engine.clients_per_host"
    else:  # auto: one host per CPU / GPU share, so the share is what to change
        count_key = (
            "engine.num_gpus_per_host" if cfg.num_gpus_per_host > 0 else "engine.num_cpus_per_host"
        )
    return HostRequest(
        placement.num_hosts,
        placement.num_cpus,
        placement.num_gpus,
        cfg.device,
        count_key,
        num_clients,
    )


# ---------------------------------------------------------------------------- the arithmetic


def hosts_per_node(node: Mapping[str, float], num_cpus: float, num_gpus: float) -> float:
    """How many (num_cpus, num_gpus) bundles fit on one node (inf when nothing is reserved).
    Ray accounts fractional resources in units of 1e-4, hence the tolerance."""
    fits = math.inf
    for name, need in (("CPU", num_cpus), ("GPU", num_gpus)):
        if need > 0:
            fits = min(fits, math.floor(float(node.get(name, 0.0)) / need + 1e-6))
    return fits


def hosts_that_fit(capacity: Capacity, num_cpus: float, num_gpus: float) -> float:
    """Hosts of one bundle the whole cluster can hold at once."""
    total = 0.0
    for g in capacity.groups:
        per = hosts_per_node(g.resources, num_cpus, num_gpus)
        if per > 0 and g.count != 0:
            total += math.inf if g.count is None else per * g.count
    return total


def check_request(req: HostRequest, capacity: Capacity) -> None:
    """Raise ResourceError when `capacity` can never hold `req`, with the fix in the message."""
    if req.device == "cuda" and req.num_gpus <= 0 and (capacity.scales or capacity.total("GPU") > 0):
        # Ray reserves no GPU for such hosts and leaves every GPU visible to them: all of them
        # would run on GPU 0, beside whatever Ray hands that GPU to
        raise ResourceError(
            "engine.num_gpus_per_host",
            "engine.device=cuda needs a GPU share per host, or Ray reserves none and every host "
            "lands on GPU 0; set engine.num_gpus_per_host (e.g. 0.25: four hosts share a GPU)",
        )
    if capacity.scales:
        return
    have = capacity.describe()
    if (req.num_gpus > 0 or req.device == "cuda") and capacity.total("GPU") <= 0:
        if req.num_gpus > 0:
            raise ResourceError(
                "engine.num_gpus_per_host",
                f"{_fmt(req.num_gpus)} GPU per host asked, but no GPU is there ({have}); "
                "set engine.num_gpus_per_host=0, or connect to a cluster with GPUs (--address)",
            )
        raise ResourceError(
            "engine.device",
            f"'cuda' asked, but no GPU is there ({have}); set engine.device=auto or cpu, or "
            "connect to a cluster with GPUs (--address) and set engine.num_gpus_per_host",
        )
    if hosts_that_fit(capacity, req.num_cpus, req.num_gpus) >= req.num_hosts:
        return
    if hosts_that_fit(capacity, req.num_cpus, req.num_gpus) < 1:
        key = (
            "engine.num_gpus_per_host" if _gpu_bound(capacity, req) else "engine.num_cpus_per_host"
        )
        raise ResourceError(
            key,
            f"one host needs {req.bundle()} on a single node, but no node has that much ({have}); "
            f"lower {key}{_share_hint(capacity, req, key)}",
        )
    fit = int(hosts_that_fit(capacity, req.num_cpus, req.num_gpus))
    asked = f"{req.num_hosts} hosts of {req.bundle()} ({req.total()} in all)"
    share_key = (
        "engine.num_gpus_per_host" if _gpu_bound(capacity, req) else "engine.num_cpus_per_host"
    )
    fixes = {
        "engine.num_hosts": f"set engine.num_hosts to at most {fit}",
        "engine.clients_per_host": (
            f"raise engine.clients_per_host to at least {math.ceil(req.num_clients / fit)} "
            "(or set it to auto)"
        ),
    }
    fix = fixes.get(req.count_key, "")
    share = f"lower {share_key}{_share_hint(capacity, req, share_key)}"
    fix = f"{fix}, or {share}" if fix else share
    if req.count_key == "engine.clients_per_host":
        asked = f"{req.num_clients} clients at this many per host make {asked}"
    else:
        asked = f"{asked} asked"
    raise ResourceError(req.count_key, f"{asked}, but only {fit} fit ({have}); {fix}")


def _gpu_bound(capacity: Capacity, req: HostRequest) -> bool:
    """Whether GPUs, not CPUs, limit how many hosts fit."""
    if req.num_gpus <= 0:
        return False
    return hosts_that_fit(capacity, 0.0, req.num_gpus) <= hosts_that_fit(
        capacity, req.num_cpus, 0.0
    )


def _share_hint(capacity: Capacity, req: HostRequest, key: str) -> str:
    """' to 0.5' : the largest round share at which every host fits (0 reserves no CPU)."""
    gpu = key == "engine.num_gpus_per_host"
    current = req.num_gpus if gpu else req.num_cpus
    for share in (4, 2, 1, 0.5, 0.25, 0.2, 0.1, 0.05, 0.02, 0.01):
        if share >= current:
            continue
        cpus, gpus = (req.num_cpus, share) if gpu else (share, req.num_gpus)
        if hosts_that_fit(capacity, cpus, gpus) >= req.num_hosts:
            return f" to {_fmt(share)}"
    return "" if gpu else " (0 reserves no CPU)"


def _fmt(x: float) -> str:
    return "unbounded" if math.isinf(x) else f"{x:g}"


# ---------------------------------------------------------------------------- the cluster


def cluster_capacity() -> Capacity:
    """The cluster as Ray reports it: the node types and counts an autoscaler published to the
    GCS (KubeRay reports a ClusterConfig), else the alive nodes, marked `scales` when a v1 or v2
    autoscaler with real node types runs (its limits live in a file on the head node)."""
    import ray

    alive = tuple(
        NodeGroup(dict(n.get("Resources", {})), 1)
        for n in ray.nodes()
        if n.get("Alive", n.get("alive"))
    )
    config = _autoscaler_node_types()
    if config is not None:
        groups, max_resources = config
        if any(g.count is None or g.count > 0 for g in groups):
            capped = tuple(_cap(g, max_resources) for g in groups)
            return Capacity(
                capped, scales=any(g.count is None for g in capped), source="autoscaler node types"
            )
    if _autoscaler_running():
        return Capacity(alive, scales=True, source="alive nodes; an autoscaler may add more")
    return Capacity(alive)


def _cap(group: NodeGroup, max_resources: Mapping[str, float]) -> NodeGroup:
    """A node type with an unbounded count, bounded by the cluster-wide max_resources if any."""
    if group.count is not None or not max_resources:
        return group
    counts = [
        math.floor(max_resources[r] / amount)
        for r, amount in group.resources.items()
        if r in max_resources and amount > 0
    ]
    return NodeGroup(group.resources, min(counts)) if counts else group


def _autoscaler_node_types() -> tuple[tuple[NodeGroup, ...], dict[str, float]] | None:
    """The node types (resources, max_count) an autoscaler reported to the GCS, or None. Ray
    2.x keeps them as an autoscaler_pb2.ClusterConfig (`ray._private.state.state
    .get_cluster_config()`, also what Ray Train and Ray Data read); max_count -1 is unbounded."""
    try:
        from ray._private import state

        config = state.state.get_cluster_config()
    except Exception:  # private API: absent or changed in another Ray version
        return None
    if config is None or not config.node_group_configs:
        return None
    groups = tuple(
        NodeGroup(dict(ng.resources), None if ng.max_count < 0 else int(ng.max_count))
        for ng in config.node_group_configs
    )
    return groups, dict(config.max_resources)


_READONLY_TYPE = re.compile(r"^node_[0-9a-f]{56}$")  # the autoscaler's name for an unmanaged node


def autoscaler_may_add_nodes(type_names: set[str]) -> bool:
    """Whether the node types an autoscaler reports are real ones it can launch. A plain
    `ray start` / ray.init head runs the autoscaler read-only, naming each node's type after
    the node itself ('node_<id>'): that one never adds a node."""
    return any(not _READONLY_TYPE.match(name) for name in type_names)


def _autoscaler_running() -> bool:
    return autoscaler_may_add_nodes(_v1_node_types() | _v2_node_types())


def _v1_node_types() -> set[str]:
    """Node type names in the v1 autoscaler's status report (`ray up`, KubeRay v1)."""
    try:
        from ray._private import ray_constants
        from ray.experimental import internal_kv

        raw = internal_kv._internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS)
        report = (json.loads(raw).get("autoscaler_report") if raw else None) or {}
    except Exception:  # private API, or no report: no autoscaler we can see
        return set()
    names = set((report.get("node_type_mapping") or {}).values())
    names |= set(report.get("active_nodes") or {}) | set(report.get("pending_launches") or {})
    return {str(n) for n in names}


def _v2_node_types() -> set[str]:
    """Node type names the v2 autoscaler reports (RAY_enable_autoscaler_v2), if it runs."""
    try:
        import ray
        from ray.autoscaler.v2.sdk import get_cluster_status
        from ray.autoscaler.v2.utils import is_autoscaler_v2

        if not is_autoscaler_v2(fetch_from_server=True):
            return set()
        status = get_cluster_status(ray.get_runtime_context().gcs_address)
    except Exception:
        return set()
    nodes = [*status.active_nodes, *status.idle_nodes, *status.pending_nodes]
    launches = [*status.pending_launches, *status.failed_launches]
    return {n.ray_node_type_name for n in nodes} | {lr.ray_node_type_name for lr in launches}


def await_hosts(info_refs: Sequence[Any], req: HostRequest, timeout: float) -> list[Any]:
    """ray.get the hosts' first answers, but give up after `timeout` seconds with what was
    asked and what the cluster has (rather than wait for ever on an unplaceable actor)."""
    import ray

    refs = list(info_refs)
    ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout)
    if pending:
        free = ray.available_resources()
        raise ResourceError(
            "engine.start_timeout",
            f"only {len(ready)} of {req.num_hosts} hosts ({req.bundle()} each) started within "
            f"{timeout:g}s ({cluster_capacity().describe()}, {_fmt(free.get('CPU', 0.0))} CPUs "
            f"and {_fmt(free.get('GPU', 0.0))} GPUs free now); "
            f"ask for fewer hosts or smaller shares ({req.count_key}, engine.num_cpus_per_host), "
            "or raise engine.start_timeout while an autoscaler adds nodes",
        )
    return ray.get(refs)


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity, where the platform tells it)."""
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def check_local_cluster(cfg: EngineConfig, num_clients: int | None) -> None:
    """`check_cluster` for the local Ray a run is about to start, before it starts: a mistake
    is then said in a second, not after Ray's start (5 s and more here), and before the
    dataset is built. That Ray's one node will have Ray's own count of this machine's CPUs
    (cgroup limits included) and of its GPUs. A GPU that Ray counts and torch cannot use is
    left to the check after the start. `num_clients` None (not known before the data): the
    host count of `clients_per_host: auto` does not depend on it, an explicit one is not checked."""
    import torch

    if num_clients is None:
        if cfg.clients_per_host != "auto" and cfg.num_hosts is None:
            return
        num_clients = 1 << 16  # auto: one host per CPU / GPU share, as many as fit
    try:
        from ray._private.utils import get_num_cpus  # what `ray.init` itself counts
    except ImportError:  # a Ray that moved it
        get_num_cpus = available_cpus
    torch_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    ray_gpus = ray_gpu_count()
    if (cfg.num_gpus_per_host > 0 or cfg.device == "cuda") and torch_gpus == 0 and ray_gpus > 0:
        return
    node = {"CPU": float(get_num_cpus()), "GPU": float(max(torch_gpus, ray_gpus))}
    placement = plan_placement(cfg, num_clients, node)
    check_request(host_request(cfg, placement, num_clients), Capacity((NodeGroup(node),), source="alive nodes"))


def ray_gpu_count() -> int:
    """The GPUs `ray.init` will count on this machine (its NVIDIA accelerator manager), 0 when
    that cannot be asked."""
    try:
        from ray._private import accelerators

        return int(accelerators.get_accelerator_manager_for_resource("GPU").get_current_node_num_accelerators())
    except Exception:
        return 0


def check_cluster(cfg: EngineConfig, num_clients: int) -> Placement:
    """The run's placement on the joined cluster, checked to fit it: the runner plans it once,
    before it creates anything (such as a run directory) for a run that could never start,
    and hands it to the Federation, which plans and checks it itself when given none."""
    import ray

    placement = plan_placement(cfg, num_clients, ray.cluster_resources())
    check_request(host_request(cfg, placement, num_clients), cluster_capacity())
    return placement
