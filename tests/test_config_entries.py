"""Each algorithm, model, dataset and partitioner validates its own keys: a section is built
with the named entry's config class; keys that moved say where to; a run recorded before the
per-kind classes still resumes; an entry registered without a class takes `kwargs`, checked
against its callable."""

from __future__ import annotations

import dataclasses

import pytest
from torch import nn

import rayfl
from rayfl.config import ConfigError, config_from_dict, config_from_manifest, load_config
from rayfl.registry import MODELS, PARTITIONERS


def test_a_section_takes_the_named_entrys_own_keys() -> None:
    cfg = load_config(None, ["model.name=resnet18", "model.width=8", "data.alpha=0.5"])
    assert type(cfg.model).__name__ == "ResNet18Config" and cfg.model.width == 8
    assert type(cfg.data).__name__ == "SyntheticConfig" and cfg.data.alpha == 0.5
    with pytest.raises(ConfigError, match=r"^model\.width: unknown key of model 'linear'; its keys are \["):
        load_config(None, ["model.width=8"])
    with pytest.raises(ConfigError, match=r"^partition\.alpha: unknown key of partitioner 'iid'"):
        load_config(None, ["data.dataset=digits", "partition.method=iid", "partition.alpha=0.3"])


def test_a_moved_key_says_where_it_went() -> None:
    with pytest.raises(ConfigError, match=r"^data\.synthetic_alpha: this key moved: it is now data\.alpha"):
        load_config(None, ["data.synthetic_alpha=0.5"])
    with pytest.raises(ConfigError, match=r"^data\.quadratic_n: this key moved: it is now data\.n"):
        load_config(None, ["data.dataset=ffgg_quadratic", "data.quadratic_n=7"])
    with pytest.raises(ConfigError, match=r"^data\.synthetic_alpha: unknown key of dataset 'digits'"):
        load_config(None, ["data.dataset=digits", "partition.method=iid", "data.synthetic_alpha=0.5"])


# A manifest's config as runs recorded it before each entry had its own class: every flat key.
LEGACY = {
    "run": {"experiment": "x", "seed": 3, "rounds": 2, "eval_every": 1, "run_id": None},
    "data": {"dataset": "synthetic", "data_dir": "~/.rayfl/data", "source": "full", "split": "official",
             "test_fraction": 0.2, "server_fraction": 0.0, "download": True, "max_samples": None,
             "synthetic_alpha": 0.5, "synthetic_beta": 1.0, "synthetic_iid": False, "synthetic_features": 12,
             "synthetic_classes": 10, "synthetic_size_mu": 4.0, "synthetic_size_sigma": 2.0,
             "synthetic_min_samples": 50, "synthetic_max_samples": 300, "synthetic_lazy": False,
             "synthetic_eval_clients": 1000, "quadratic_n": 10000, "quadratic_d_theta": 100, "quadratic_d_w": 50,
             "quadratic_planted": True, "min_client_train": 0, "min_client_test": 0, "max_clients": None,
             "max_client_train": None, "vocab_size": 10000, "seq_len": 20, "image_size": 224, "seed": None},
    "partition": {"method": "natural", "num_clients": 20, "alpha": 0.5, "min_size": 10, "big_client_size": 5000,
                  "small_client_size": 20, "rho": 0.8, "samples_per_client": None, "shards_per_client": 2,
                  "client_test": "none", "client_test_size": None},
    "model": {"name": "mlp", "bias": True, "hidden": [16], "conv_channels": 32, "activation": "relu",
              "softplus_beta": 10.0, "eval_activation": "same", "width": 64, "norm_groups": 2, "layers": 4,
              "heads": 4, "dim": 256, "ffn_dim": 1024, "adapter": "none", "adapter_rank": 16, "init_from": None},
}


def test_a_run_recorded_with_the_flat_sections_still_loads_for_resume() -> None:
    cfg = config_from_manifest(LEGACY)
    assert (cfg.data.alpha, cfg.data.features, cfg.data.max_client_samples) == (0.5, 12, 300)
    assert type(cfg.model).__name__ == "MLPConfig" and cfg.model.hidden == [16]
    assert cfg.partition.num_clients == 20 and not hasattr(cfg.partition, "alpha")
    with pytest.raises(ConfigError):  # a job, unlike a manifest, is told
        config_from_dict(LEGACY)
    assert config_from_manifest(cfg.to_dict()) == cfg  # and today's records round-trip


def test_a_run_recorded_with_ffggs_own_robust_keys_resumes_with_them_in_robust() -> None:
    """BR-FFGG's aggregator and attack were keys of the algorithm before the round pipeline."""
    cfg = load_config(None, ["algorithm.name=br_ffgg", "robust.aggregator={name: median, bucket_size: 2}",
                             "robust.attack={name: sign_flip, fraction: 0.1}"])
    old = cfg.to_dict()
    old["algorithm"] = {**old["algorithm"], **old.pop("robust")}
    assert config_from_manifest(old) == cfg
    with pytest.raises(ConfigError, match=r"^algorithm\.aggregator: this key moved: it is now robust\.aggregator "):
        config_from_dict(old)  # a job, unlike a manifest, is told


def test_an_entry_without_a_config_class_takes_kwargs_checked_against_its_signature() -> None:
    def net(input_shape, num_classes, width=4):
        return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0], width), nn.Linear(width, num_classes))

    def split(labels, num_clients, cfg, rng, reverse=False):
        return [list(range(k, len(labels), num_clients)) for k in range(num_clients)]

    rayfl.register_model("kw_net", net)
    rayfl.register_partitioner("kw_split", split)
    try:
        cfg = load_config(None, ["model.name=kw_net", "model.kwargs={width: 6}", "data.dataset=digits",
                                 "partition.method=kw_split", "partition.kwargs.reverse=true"])
        assert [f.name for f in dataclasses.fields(cfg.model)][-1] == "kwargs" and cfg.model.factory_kwargs() == {"width": 6}
        assert cfg.partition.kwargs == {"reverse": True}
        with pytest.raises(ConfigError, match=r"^model\.kwargs\.widht: net takes no keyword 'widht'; it takes \['width'\]"):
            load_config(None, ["model.name=kw_net", "model.kwargs={widht: 6}"])
        with pytest.raises(ConfigError, match=r"^partition\.kwargs\.order: split takes no keyword"):
            load_config(None, ["data.dataset=digits", "partition.method=kw_split", "partition.kwargs.order=1"])
        model = rayfl.build_model(cfg.model, (5,), 3)
        assert model[1].out_features == 6
    finally:
        MODELS.unregister("kw_net")
        PARTITIONERS.unregister("kw_split")


def test_listing_shows_every_kind(capsys: pytest.CaptureFixture[str]) -> None:
    from rayfl.cli import main

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for heading, name in (("algorithms:", "scaffold"), ("models:", "resnet18"), ("datasets:", "parquet"),
                          ("partitions:", "dirichlet"), ("examples:", "digits_fedavg")):
        assert heading in out and f"  {name} " in out, (heading, name)
