"""FFGG's Table 1 pipeline: the fine-tuning step against a hand computation, the accuracy that
ignores padding and special tokens, the chaining of stages through `model.init_from`, and the
whole pipeline (FedAvg -> Local FFGG -> fine-tuning) end to end on a tiny Ray run."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from rayfl.algorithms.local import LocalSchedule
from rayfl.algorithms.local_finetune import (
    LocalFinetuneConfig,
    client_test_counts,
    finetune_client,
    pooled_metrics,
)
from rayfl.config import ConfigError, section_config
from rayfl.engine import ClientContext
from rayfl.models.init_from import theta_vector
from rayfl.models.networks import build_model
from rayfl.models.params import get_flat
from rayfl.models.personal import personal_mask
from rayfl.papers.ffgg.pipeline import plan_table1, run_plan
from rayfl.papers.ffgg.table1 import row_label, write_ffgg_table1


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny networks: one thread avoids thread contention on a busy 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def context(model: nn.Module, x, y, test_x=None, test_y=None) -> ClientContext:
    return ClientContext(id=3, round=0, seed=0, model=model, device=torch.device("cpu"), x=x, y=y,
                         test_x=test_x, test_y=test_y, state={})


def softmax_ce_grad(W, b, X, Y):
    """d mean CE / d (W, b) of logits X W^T + b, in float64."""
    z = X @ W.T + b
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    g = (p - np.eye(W.shape[0])[Y]) / len(Y)
    return g.T @ X, g.sum(0)


@pytest.mark.parametrize("clip", [None, 0.05])
def test_one_finetune_step_moves_only_personal_entries_by_the_gradient(clip):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3, 2))
    x = torch.randn(4, 3)
    y = torch.tensor([0, 1, 1, 0])
    params = get_flat(model).numpy().copy()
    mask = np.array([True, False, False, True, True, False, True, False])  # W rows / bias mixed
    lr = 0.7
    out = finetune_client(context(model, x, y, x, y), params, mask, lr, LocalSchedule(4, None, 1), max_grad_norm=clip)
    W0, b0 = params[:6].reshape(2, 3).astype(np.float64), params[6:].astype(np.float64)
    gW, gb = softmax_ce_grad(W0, b0, x.double().numpy(), y.numpy())
    g = np.concatenate([gW.ravel(), gb]) * mask
    if clip is not None:
        assert np.linalg.norm(g) > clip  # the clip is active
        g *= clip / np.linalg.norm(g)
    expected = params.astype(np.float64) - lr * g
    # the answer carries counts, not parameters: recompute the after-accuracy from `expected`
    logits = x.double().numpy() @ expected[:6].reshape(2, 3).T + expected[6:]
    assert out["correct_after"] == int((logits.argmax(1) == y.numpy()).sum())
    assert out["count"] == 4
    z = logits - logits.max(1, keepdims=True)
    ce = -(z[np.arange(4), y.numpy()] - np.log(np.exp(z).sum(1)))
    assert out["loss_sum_after"] == pytest.approx(ce.sum(), rel=1e-5)
    z0 = x.double().numpy() @ W0.T + b0
    assert out["correct_before"] == int((z0.argmax(1) == y.numpy()).sum())


def test_nothing_personal_means_no_training_and_equal_before_after():
    model = nn.Sequential(nn.Flatten(), nn.Linear(3, 2))
    x, y = torch.randn(5, 3), torch.tensor([0, 1, 1, 0, 1])
    out = finetune_client(context(model, x, y, x, y), get_flat(model).numpy(), np.zeros(8, bool), 1.0, LocalSchedule(2, 3, None))
    assert np.isnan(out["loss"]) and out["correct_before"] == out["correct_after"]
    assert out["loss_sum_before"] == out["loss_sum_after"]


def test_token_accuracy_ignores_padding_and_special_tokens():
    torch.manual_seed(0)
    model = build_model(section_config("model", name="transformer", dim=8, heads=2, layers=1, ffn_dim=8), (3,), 7)  # V=3
    tx = torch.tensor([[5, 1, 2], [5, 3, 4], [5, 2, 0]])
    ty = torch.tensor([[1, 2, 6], [3, 4, 6], [2, -100, -100]])
    ctx = context(model, tx, ty, tx, ty)
    w = get_flat(model)
    correct, count, _ = client_test_counts(ctx, w, (4, 5, 6))
    pred = model(tx).argmax(1)
    valid = (ty != -100) & (ty != 4) & (ty != 5) & (ty != 6)
    assert count == int(valid.sum()) == 4
    assert correct == int(((pred == ty) & valid).sum())
    assert client_test_counts(ctx, w, ())[1] == 7  # without exclusions every non-padding target counts


def test_pooled_accuracy_weights_clients_by_test_size():
    res = [
        {"correct_after": 9, "correct_before": 5, "count": 10, "loss_sum_after": 1.0, "loss_sum_before": 2.0, "loss": 0.5},
        {"correct_after": 0, "correct_before": 1, "count": 2, "loss_sum_after": 3.0, "loss_sum_before": 4.0, "loss": 0.1},
    ]
    m = pooled_metrics(res)
    assert m["test_accuracy"] == pytest.approx(9 / 12) and m["test_accuracy_before"] == pytest.approx(6 / 12)
    assert m["test_loss"] == pytest.approx(4 / 12) and m["test_count"] == 12


def test_bad_finetune_values_name_their_field():
    for kw, key in [(dict(personal_scheme="head"), "algorithm.personal_scheme"),
                    (dict(personal_scheme="patterns"), "algorithm.personal_patterns"),
                    (dict(max_grad_norm=0.0), "algorithm.max_grad_norm")]:
        with pytest.raises(ConfigError) as e:
            LocalFinetuneConfig(**kw).validate()
        assert e.value.key == key


def test_ffgg_theta_goes_back_to_its_entries():
    @dataclass
    class State:
        theta: np.ndarray

    model = build_model(section_config("model", name="mlp", hidden=[4]), (1, 3, 3), 3)
    fresh = get_flat(model).numpy()
    mask = personal_mask(model, "output")
    theta = np.arange(int((~mask).sum()), dtype=np.float32)
    out = theta_vector(State(theta), model, fresh, {"personal_scheme": "output"})
    assert np.array_equal(out[~mask], theta) and np.array_equal(out[mask], fresh[mask])
    assert theta_vector(State(theta[:-1]), model, fresh, {"personal_scheme": "output"}) is None


def test_plan_orders_stages_and_sets_adapters_only_for_the_adapter_scheme():
    plan = plan_table1("emnist", ("input", "adapter"), (0, 1), "resnet18")
    ids = [r.run_id for r in plan.runs]
    assert ids[0] == "pretrain" and len(ids) == 1 + 2 * (4 + 2 * 2)
    for r in plan.runs:
        assert r.after is None or ids.index(r.after) < ids.index(r.run_id)
        assert ("model.adapter=residual" in r.overrides) == ("adapter" in r.run_id)
    ft = {r.run_id: r for r in plan.runs}["ffgg_adapter_ft_s1"]
    assert ft.after == "ffgg_adapter_s1" and "algorithm.personal_scheme=adapter" in ft.overrides
    assert "model.adapter=lora" in {r.run_id: r for r in plan_table1("mnist", ("adapter",), (0,), "mlp").runs}["ffgg_adapter_s0"].overrides


def test_data_seed_pins_the_split_whatever_the_run_seed():
    from rayfl.data.federated import build_federated_dataset

    part = section_config("partition", method="dirichlet", num_clients=4, alpha=0.5, client_test="proportional")
    pinned = [build_federated_dataset(section_config("data", dataset="digits", seed=0), part, seed=s) for s in (0, 1)]
    free = [build_federated_dataset(section_config("data", dataset="digits"), part, seed=s) for s in (0, 1)]
    assert np.array_equal(pinned[0].test_x, pinned[1].test_x) and np.array_equal(pinned[0].test_x, free[0].test_x)
    assert all(np.array_equal(a, b) for a, b in zip(pinned[0].client_train, pinned[1].client_train, strict=True))
    assert not np.array_equal(free[0].test_y, free[1].test_y)
    with pytest.raises(ConfigError) as e:
        section_config("data", dataset="digits", seed=-1).validate()
    assert e.value.key == "data.seed"


def test_row_labels():
    assert row_label("fedavg", "none") == "FedAvg" and row_label("fedavg", "all") == "FedAvg + FT (all)"
    assert row_label("fedavg", "output") == "FedAvg + FT (output)" and row_label("local_ffgg", "adapter") == "FFGG (adapter)"
    assert row_label("local_ffgg", "all") is None and row_label("zo_hfl", "none") is None


# ---------------------------------------------------------------- end to end (Ray)

COMMON = """
data: {dataset: digits, test_fraction: 0.3}
partition: {method: dirichlet, num_clients: 4, alpha: 1.0, min_size: 10, client_test: proportional}
model: {name: mlp, hidden: [16, 16], adapter_rank: 2}
engine: {num_hosts: 1}
"""
STAGES = {
    "fedavg": "run: {rounds: 2}\nalgorithm: {name: fedavg, clients_per_round: 2, local_steps: 3, local_epochs: null, lr: 0.1}\n",
    "ffgg": "run: {rounds: 2}\nalgorithm: {name: local_ffgg, clients_per_round: 2, local_steps: 2, local_epochs: null, tau: 2, lr: 0.1, batch_size: 16}\n",
    "finetune": "run: {rounds: 1}\nalgorithm: {name: local_finetune, clients_per_round: 4, local_epochs: 1, lr: 0.1, batch_size: 16}\n",
}


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    jobs = tmp_path_factory.mktemp("jobs")
    for stage, text in STAGES.items():
        (jobs / f"table1_digits_{stage}.yaml").write_text(COMMON + text)
    out = tmp_path_factory.mktemp("results")
    plan = plan_table1("digits", ("adapter",), (0,), "mlp")
    plan.runs = [r for r in plan.runs if r.run_id != "fedavg_ft_all_s0"]  # "all" is a mask test's job
    # the same fine-tuning on 2 hosts, for the host-count determinism check
    ft = next(r for r in plan.runs if r.run_id == "fedavg_ft_adapter_s0")
    plan.runs.append(dataclasses.replace(ft, run_id="fedavg_ft_adapter_2hosts", overrides=(*ft.overrides, "engine.num_hosts=2")))
    dirs = run_plan(plan, str(out), [], jobs, log=lambda *_: None)
    import rayfl.results

    return dirs, rayfl.results.load(out), out


def final(results, run_id: str) -> dict:
    r = results.rounds
    return r[r["run_id"] == run_id].sort_values("round").iloc[-1].to_dict()


@pytest.mark.slow
def test_pipeline_runs_every_stage(pipeline):
    dirs, results, _ = pipeline
    m = results.manifests.set_index("run_id")
    assert set(m["status"]) == {"completed"} and len(m) == 6
    assert m.loc["ffgg_adapter_s0", "algorithm.personal_scheme"] == "adapter"
    assert m.loc["ffgg_adapter_s0", "model.adapter"] == "lora" and m.loc["pretrain", "model.adapter"] == "none"
    assert m.loc["ffgg_adapter_ft_s0", "model.init_from"] == str(dirs["ffgg_adapter_s0"])


@pytest.mark.slow
def test_stages_start_from_the_previous_model(pipeline):
    _, results, _ = pipeline
    none, adapter = final(results, "fedavg_ft_none_s0"), final(results, "fedavg_ft_adapter_s0")
    # FedAvg's model, nothing fine-tuned: before == after
    assert none["test_accuracy"] == none["test_accuracy_before"] and none["personal_params"] == 0
    # the same model with zero-init LoRA added is the same function: identical before-accuracy
    assert adapter["test_accuracy_before"] == none["test_accuracy_before"]
    assert adapter["test_loss_before"] == pytest.approx(none["test_loss_before"], rel=1e-5)
    assert adapter["personal_params"] == 2 * 2 * 16  # one LoRA pair on the 16 x 16 hidden layer


@pytest.mark.slow
def test_finetuning_is_host_count_independent(pipeline):
    _, results, _ = pipeline
    ev = results.evals
    one = ev[ev["run_id"] == "fedavg_ft_adapter_s0"].sort_values("client")
    two = ev[ev["run_id"] == "fedavg_ft_adapter_2hosts"].sort_values("client")
    assert len(one) == 4
    np.testing.assert_array_equal(one["test_accuracy"].to_numpy(), two["test_accuracy"].to_numpy())
    np.testing.assert_array_equal(one["test_loss"].to_numpy(), two["test_loss"].to_numpy())


@pytest.mark.slow
def test_table1_report_lays_out_every_row(pipeline, tmp_path):
    _, results, _ = pipeline
    lines = write_ffgg_table1(results, tmp_path)
    text = "\n".join(lines)
    for row in ["FedAvg", "FedAvg + FT (adapter)", "FFGG (adapter)"]:
        assert f"| {row} | digits |" in text
    assert (tmp_path / "ffgg_table1.csv").is_file() and Path(tmp_path / "ffgg_table1.md").is_file()
