"""cluster.yaml is a valid Ray cluster-launcher config (checked against Ray's own schema)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def schema() -> dict:
    import ray

    return json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())


def test_cluster_yaml_matches_ray_schema(schema):
    cfg = yaml.safe_load((REPO / "cluster.yaml").read_text())
    jsonschema.validate(cfg, schema)
    assert cfg["head_node_type"] in cfg["available_node_types"]
    workers = [n for n in cfg["available_node_types"] if n != cfg["head_node_type"]]
    assert any("g" in cfg["available_node_types"][w]["node_config"]["InstanceType"].split(".")[0] for w in workers)
    assert any("pip install -e ~/rayfl" in c for c in cfg["setup_commands"])


def test_schema_check_catches_mistakes(schema):
    cfg = yaml.safe_load((REPO / "cluster.yaml").read_text())
    cfg["max_wrkers"] = 3
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(cfg, schema)
