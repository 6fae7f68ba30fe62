"""Data parallel over Ray: 2 training ranks (gloo, float64) give the loss, metrics and
gradients of one process on the same global batch, for grpo, rloo, ppo (actor and critic)
and reinforce_plus_plus (whose advantage normalisation is reduced over the group).

The one-process reference is the torch backend built in this process, with the same
config, estimator and loss; the ranks are :class:`TrainWorker` actors built by name."""

from __future__ import annotations

import pytest
import torch

from relax_core.batch import Batch
from relax_core.config import build_config, config_to_dict, load_yaml
from relax_core.contracts import AdvantageInput
from relax_core.distributed.proxies import RayBackend, split_even
from relax_core.distributed.runtime import start_train_group
from relax_core.distributed.workers import build_component, loss_recipe
from relax_core.host.plugins import default_registry
from relax_core.stages.loss import ActorLoss, CriticLoss, LossSettings, global_denominators
from relax_core.stages.optimizer import OptimizerSettings, optimizer_step

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
ESTIMATORS = ("grpo", "rloo", "ppo", "reinforce_plus_plus")
WORLD = 2
TOL = dict(rtol=1e-6, atol=1e-9)


def make_config(name: str, model_dir):
    reg = default_registry()
    yaml_values = load_yaml(ROOT / "examples" / "recipes" / f"{name}.yaml")
    cli = {"model": str(model_dir), "rollout_batch_size": 4, "n_samples_per_prompt": 2, "global_batch_size": 8,
           "micro_batch_size": 2, "device": "cpu", "launcher": "ray", "actor_num_gpus_per_node": WORLD,
           "lr": 1e-2, "torch.dtype": "float64", "rollout_max_response_len": 6}
    return build_config(cli=cli, yaml_values=yaml_values, param_schemas=reg.param_schemas())


def make_batch(seed: int = 5, b: int = 8, t: int = 6) -> tuple[Batch, torch.Tensor, torch.Tensor]:
    """Variable lengths (one empty response), garbage token ids off the mask; 4 groups of 2."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 1000, (int(n),), generator=g).tolist() for n in torch.randint(2, 7, (b,), generator=g)]
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    lengths[0], lengths[5] = t, 0
    mask = torch.arange(t)[None, :] < lengths[:, None]
    resp = torch.where(mask, torch.randint(3, 1000, (b, t), generator=g), 10**9)
    rewards = torch.rand(b, generator=g, dtype=torch.float64).float()
    group_index = torch.arange(b) // 2
    return Batch(prompt_ids=prompts, response_ids=resp, loss_mask=mask), rewards, group_index


@pytest.fixture(scope="module")
def batch():
    return make_batch()


@pytest.fixture(scope="module")
def ranks(ray_local, tiny_model_dir):
    """Two ranks in one gloo group, reconfigured per estimator."""
    cfg = make_config("grpo", tiny_model_dir)
    workers = start_train_group(config_to_dict(cfg), WORLD, {}, [], [{"num_cpus": 1}] * WORLD)
    yield workers
    for w in workers:
        ray_local.kill(w, no_restart=True)


@pytest.mark.slow
@pytest.mark.parametrize("name", ESTIMATORS)
def test_two_ranks_equal_one_process(name, tiny_model_dir, ray_local, ranks, batch):
    ray = ray_local
    cfg = make_config(name, tiny_model_dir)
    reg = default_registry()
    caps = reg.get("estimator", name).spec.capabilities_for(cfg.params_for(name))
    setup = {"needs_ref": cfg.needs_reference_model, "needs_critic": caps.needs_critic, "needs_top_k": False,
             "routing_replay": False}
    tb, rewards, group_index = batch

    # ---- one process: the reference
    est = build_component("estimator", name, cfg)
    be = build_component("backend", "torch", cfg)
    be.setup(critic_settings=getattr(est, "critic_settings", None), **setup)
    g = torch.Generator().manual_seed(1)
    mask = tb.loss_mask
    old = be.forward(tb).log_probs + 0.3 * torch.randn(mask.shape, generator=g, dtype=torch.float64)  # ratios ≠ 1
    ref = be.forward(tb, role="ref").log_probs if setup["needs_ref"] else None
    values = (be.forward(tb, role="critic").values + 0.5 * torch.randn(mask.shape, generator=g, dtype=torch.float64)
              if setup["needs_critic"] else None)
    adv_in = dict(rewards=rewards, group_index=group_index, loss_mask=mask, old_log_probs=old, ref_log_probs=ref,
                  values=values, response_lengths=mask.sum(1))
    out = est.compute_advantages(AdvantageInput(**adv_in))
    tensors = {"advantages": out.advantages.double(), "returns": out.returns.double(), "old_log_probs": old}
    if ref is not None:
        tensors["ref_log_probs"] = ref
    if values is not None:
        tensors["values"] = values
    tb = tb.replace(**tensors)
    tokens, samples = global_denominators(mask)
    settings = LossSettings.from_config(cfg, caps.behaviour_numerator)
    roles = ["actor"] + (["critic"] if setup["needs_critic"] else [])

    def loss_for(role):
        if role == "critic":
            return CriticLoss(est, settings, num_tokens=tokens, num_samples=samples)
        return ActorLoss(est, [], settings, num_tokens=tokens, num_samples=samples, old_from_current=False)

    want = {}
    for role in roles:
        fn = loss_for(role)
        acc = be.accumulate_gradients(tb, fn, role=role)
        want[role] = (acc.sums["loss"], fn.metrics(),
                      {k: p.grad.clone() for k, p in be.models[role].named_parameters()})
        be.models[role].zero_grad(set_to_none=True)

    # ---- two ranks
    workers = ranks
    ray.get([w.configure.remote(config_to_dict(cfg), setup, []) for w in workers])
    shards = [tb.slice(lo, hi).to_dict() for lo, hi in split_even(tb.size, WORLD)]
    assert all(0 < len(s["prompt_ids"]) < tb.size for s in shards)
    for role in roles:
        recipe = loss_recipe(loss_for(role))
        got = ray.get([w.gradients.remote(s, recipe, role) for w, s in zip(workers, shards)])
        loss, metrics, grads = want[role]
        assert sum(r[0]["loss"] for r in got) == pytest.approx(loss, rel=1e-6, abs=1e-9), role
        summed = {k: sum(r[2].get(k, 0.0) for r in got) for k in metrics}
        for k, v in metrics.items():
            assert summed[k] == pytest.approx(v, rel=1e-6, abs=1e-9), (role, k)
        for r in got:  # every rank holds the all-reduced (global) gradient
            assert r[1].keys() == grads.keys()
            for k in grads:
                torch.testing.assert_close(r[1][k], grads[k], **TOL, msg=f"{role} {k}")
    if name == "reinforce_plus_plus":  # global advantage normalisation reduced over the ranks
        parts = ray.get([w.compute_advantages.remote({k: (v[lo:hi] if v is not None else None)
                                                      for k, v in adv_in.items()})
                         for w, (lo, hi) in zip(workers, split_even(tb.size, WORLD))])
        adv = torch.cat([p["advantages"] for p in parts])
        torch.testing.assert_close(torch.where(mask, adv, 0.0), torch.where(mask, out.advantages, 0.0),
                                   rtol=1e-5, atol=1e-6)
        assert parts[0]["normalized"]

    # the proxy: one optimizer step through RayBackend equals the local step
    proxy = RayBackend(workers)
    fn_ray, fn_local = loss_for("actor"), loss_for("actor")
    step_settings = OptimizerSettings.from_config(cfg, getattr(est, "critic_settings", None))
    got = optimizer_step(proxy, tb, fn_ray, role="actor", settings=step_settings)
    exp = optimizer_step(be, tb, fn_local, role="actor", settings=step_settings)
    assert got.sums["loss"] == pytest.approx(exp.sums["loss"], rel=1e-6, abs=1e-9)
    assert got.grad_norm == pytest.approx(exp.grad_norm, rel=1e-6)
    assert got.lr == exp.lr and not got.skipped and not exp.skipped
    for k, v in fn_local.metrics().items():
        assert fn_ray.metrics()[k] == pytest.approx(v, rel=1e-6, abs=1e-9), k
    weights = ray.get(proxy.engine_state_dict())
    for k, v in be.engine_state_dict().items():
        torch.testing.assert_close(weights[k], v, **TOL, msg=k)
