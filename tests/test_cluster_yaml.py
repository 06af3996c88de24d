"""cluster.yaml is a valid Ray cluster-launcher config (checked against Ray's own schema) whose
client-hosting workers really have GPUs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]

# EC2 families whose every size has at least one NVIDIA GPU (so Ray's AWS provider autodetects
# GPU >= 1 for them). Matched exactly against the part of the instance type before the dot:
# m6g, c6g (Graviton CPUs) or g5g (Graviton + T4G, not an x86 CUDA image) are not in it.
GPU_FAMILIES = frozenset({
    "g4dn", "g5", "g6", "g6e", "p3", "p3dn", "p4d", "p4de", "p5", "p5e", "p5en",
})


def instance_family(instance_type: str) -> str:
    """'g5.2xlarge' -> 'g5'; raises on a string that is not <family>.<size>."""
    family, dot, size = instance_type.partition(".")
    if not dot or not family or not size or "." in size:
        raise ValueError(f"not an EC2 instance type: {instance_type!r}")
    return family


def node_gpus(node_type: dict[str, Any]) -> int:
    """GPUs Ray will schedule on this node type: the declared `resources.GPU` when there is one
    (it overrides autodetection), else what the AWS provider autodetects, >= 1 only for a known
    GPU family (0 otherwise)."""
    declared = node_type.get("resources") or {}
    if "GPU" in declared:
        return int(declared["GPU"])
    return 1 if instance_family(node_type["node_config"]["InstanceType"]) in GPU_FAMILIES else 0


def gpu_worker_types(cfg: dict[str, Any]) -> list[str]:
    """Worker node types (not the head) that are a known GPU family and have >= 1 GPU."""
    head = cfg["head_node_type"]
    return [
        name for name, node in cfg["available_node_types"].items()
        if name != head and instance_family(node["node_config"]["InstanceType"]) in GPU_FAMILIES
        and node_gpus(node) >= 1
    ]


@pytest.fixture(scope="module")
def schema() -> dict:
    import ray

    return json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())


@pytest.fixture
def cfg() -> dict[str, Any]:
    return yaml.safe_load((REPO / "cluster.yaml").read_text())


def test_cluster_yaml_matches_ray_schema(schema, cfg):
    jsonschema.validate(cfg, schema)
    assert cfg["head_node_type"] in cfg["available_node_types"]
    assert any("pip install -e ~/rayfl" in c for c in cfg["setup_commands"])


def test_workers_are_gpu_instances_and_the_head_is_not(cfg):
    workers = gpu_worker_types(cfg)
    assert workers, "no worker node type is a known GPU instance type with GPU >= 1"
    assert all(cfg["available_node_types"][w]["max_workers"] >= 1 for w in workers)
    head = cfg["available_node_types"][cfg["head_node_type"]]
    assert instance_family(head["node_config"]["InstanceType"]) not in GPU_FAMILIES  # a CPU head
    for node in cfg["available_node_types"].values():  # a declared GPU count is never 0
        assert (node.get("resources") or {}).get("GPU", 1) >= 1


@pytest.mark.parametrize("instance_type", ["m6g.xlarge", "c6g.large", "g5g.xlarge", "mg5.xlarge", "m6i.2xlarge"])
def test_cpu_instance_types_are_rejected(cfg, tmp_path, instance_type):
    """The same helper on a copy of cluster.yaml whose worker is a CPU (or unknown) type."""
    for name, node in cfg["available_node_types"].items():
        if name != cfg["head_node_type"]:
            node["node_config"]["InstanceType"] = instance_type
    copy = tmp_path / "cluster.yaml"
    copy.write_text(yaml.safe_dump(cfg))
    assert gpu_worker_types(yaml.safe_load(copy.read_text())) == []


def test_gpu_family_with_zero_declared_gpus_is_rejected(cfg):
    for name, node in cfg["available_node_types"].items():
        if name != cfg["head_node_type"]:
            node["resources"] = {"CPU": 8, "GPU": 0}
    assert gpu_worker_types(cfg) == []


@pytest.mark.parametrize("bad", ["g5", "g5.", ".xlarge", "g5.2x.large"])
def test_instance_family_parses_strictly(bad):
    assert instance_family("g4dn.12xlarge") == "g4dn" and instance_family("p4d.24xlarge") == "p4d"
    with pytest.raises(ValueError):
        instance_family(bad)


def test_schema_check_catches_mistakes(schema, cfg):
    cfg["max_wrkers"] = 3
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(cfg, schema)
