"""relax_routing_replay.routes: MoE route recording during generation and replay (R3) in training.

A tiny random Qwen3-MoE (2 layers, 4 experts, top-2, hidden 32) builds in milliseconds.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")

from relax_routing_replay.routes import (  # noqa: E402
    GATE_RULES,
    PAD_EXPERT,
    is_moe,
    moe_routers,
    record_routes,
    replay_routes,
)

P, T_NEW, B = 5, 6, 3


def tiny_moe(norm_topk_prob: bool = False, seed: int = 0):
    torch.manual_seed(seed)
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        num_experts=4, num_experts_per_tok=2, norm_topk_prob=norm_topk_prob,
        max_position_embeddings=64)
    model = transformers.Qwen3MoeForCausalLM(cfg).eval()
    for r in moe_routers(model):  # initialised with std 0.02: give the routers decisive logits
        torch.nn.init.normal_(r.weight, std=0.5)
    return model


def generate(model, seed: int = 1):
    torch.manual_seed(seed)
    prompts = torch.randint(1, 64, (B, P))
    with record_routes(model) as rec:
        out = model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=T_NEW,
                             min_new_tokens=T_NEW, do_sample=True, pad_token_id=0)
    return out, rec.routes()


def natural_routes(model, seq):
    with record_routes(model) as rec:
        model(seq)
    return rec.routes()


def token_log_probs(logits, seq):
    return torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, seq[:, 1:, None])[..., 0]


def test_recorder_shapes_and_matches_teacher_forced_forward():
    model = tiny_moe()
    seq, routes = generate(model)
    assert seq.shape == (B, P + T_NEW)
    assert routes.shape == (B, P + T_NEW - 1, 2, 2)  # every fed position: the last token is never fed
    assert routes.dtype == torch.long and routes.min() >= 0 and routes.max() < 4
    # the prefill + decode-step records equal the routes of one forward over the whole sequence
    assert torch.equal(natural_routes(model, seq)[:, : P + T_NEW - 1], routes)


@pytest.mark.parametrize("norm", [False, True])
def test_replay_of_natural_routes_is_the_identity(norm):
    model = tiny_moe(norm_topk_prob=norm)
    seq, _ = generate(model)
    nat = natural_routes(model, seq)
    ref = model(seq).logits
    pos = torch.arange(seq.shape[1]).expand(B, -1)
    with replay_routes(model, nat, pos):
        out = model(seq).logits
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)
    assert torch.equal(model(seq).logits, ref)  # hooks are gone after the context


def test_replay_identity_in_bfloat16():
    model = tiny_moe()
    seq, _ = generate(model)
    pos = torch.arange(seq.shape[1]).expand(B, -1)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the backend's --bf16
        nat = natural_routes(model, seq)
        ref = model(seq).logits
        with replay_routes(model, nat, pos):
            assert torch.equal(model(seq).logits, ref)
    model = model.to(torch.bfloat16)
    nat = natural_routes(model, seq)
    ref = model(seq).logits
    with replay_routes(model, nat, pos):
        assert torch.equal(model(seq).logits, ref)


def _perturb_near_boundary(model, seq):
    """Copy ``model`` and nudge its last router so that the token nearest a top-k boundary
    in that layer switches experts; returns (new model, (b, s) of that token)."""
    last = moe_routers(model)[-1]
    captured = {}
    h = last.register_forward_hook(lambda m, a, o: captured.update(x=a[0].detach()))
    model(seq)
    h.remove()
    x = captured["x"]  # [B*S, H] router input of the last layer
    logits = F.linear(x, last.weight)
    top = logits.sort(-1, descending=True)
    gap = top.values[:, 1] - top.values[:, 2]  # k = 2: 2nd vs 3rd logit
    gap[(seq.shape[1] - 1)::seq.shape[1]] = float("inf")  # the last position is not fed in generation
    n = int(gap.argmin())
    j = int(top.indices[n, 2])  # the 3rd expert gets pushed above the 2nd
    pert = copy.deepcopy(model)
    w = moe_routers(pert)[-1].weight
    with torch.no_grad():
        w[j] += (gap[n] + 0.05) * x[n] / x[n].dot(x[n])
    s = seq.shape[1]
    return pert, (n // s, n % s)


def _reference_forward(pert, rollout_model, seq):
    """A forward of ``pert`` whose last router selects with the rollout weights (identical
    inputs: the earlier layers are unchanged) and gates with its own: Qwen3-MoE's rule
    written out here, independently of relax_routing_replay.routes."""
    router, w_roll = moe_routers(pert)[-1], moe_routers(rollout_model)[-1].weight

    def forward(hidden_states):
        hs = hidden_states.reshape(-1, router.hidden_dim)
        logits = F.linear(hs, router.weight)
        idx = torch.topk(torch.softmax(F.linear(hs, w_roll), dim=-1, dtype=torch.float), router.top_k, dim=-1).indices
        scores = torch.softmax(logits, dim=-1, dtype=torch.float).gather(-1, idx)
        if router.norm_topk_prob:
            scores = scores / scores.sum(-1, keepdim=True)
        return logits, scores.to(logits.dtype), idx

    router.forward = forward
    try:
        with record_routes(pert) as rec:
            logits = pert(seq).logits
    finally:
        del router.forward
    return logits, rec.routes()


@pytest.mark.parametrize("norm", [False, True])
def test_replay_keeps_rollout_experts_across_a_router_perturbation(norm):
    model = tiny_moe(norm_topk_prob=norm)
    seq, routes = generate(model)
    pert, (b, s) = _perturb_near_boundary(model, seq)
    fed = seq.shape[1] - 1
    free = natural_routes(pert, seq)[:, :fed]
    assert not torch.equal(free[b, s, -1].sort().values, routes[b, s, -1].sort().values)  # it would switch

    pos = torch.arange(fed).expand(B, -1)
    pert.zero_grad()
    with replay_routes(pert, routes, pos), record_routes(pert) as rec:
        logits = pert(seq).logits
    assert torch.equal(rec.routes()[:, :fed], routes)  # the rollout's experts are kept
    lp = token_log_probs(logits, seq)
    lp.sum().backward()
    grad_replay = [p.grad.clone() for p in moe_routers(pert)[-1].parameters()]
    assert grad_replay[0].abs().sum() > 0  # the gate stays differentiable

    pert.zero_grad()
    ref_logits, ref_routes = _reference_forward(pert, model, seq)
    assert torch.equal(ref_routes[:, :fed], routes)
    ref_lp = token_log_probs(ref_logits, seq)
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-6)
    ref_lp.sum().backward()
    for g, p in zip(grad_replay, moe_routers(pert)[-1].parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-5, atol=1e-7)
    # and without replay the log-probs do change
    with torch.no_grad():
        assert (token_log_probs(pert(seq).logits, seq) - ref_lp).abs().max() > 1e-5


def test_response_only_replay_is_keyed_by_position_not_call_order():
    model = tiny_moe()
    seq, routes = generate(model)
    pert, _ = _perturb_near_boundary(model, seq)
    lengths = torch.tensor([T_NEW, 3, 0])
    rr = routes[:, P - 1:].clone()  # [B, T, L, E] aligned with response tokens
    rr[torch.arange(T_NEW)[None] >= lengths[:, None]] = PAD_EXPERT
    pos = (P - 1 + torch.arange(T_NEW)).expand(B, -1)
    free = natural_routes(pert, seq)
    with replay_routes(pert, rr, pos), record_routes(pert) as rec:
        with torch.no_grad():
            first = pert(seq).logits  # e.g. the old-log-prob forward
        second = pert(seq).logits  # the training forward, same routes
    torch.testing.assert_close(first, second.detach(), rtol=0, atol=0)
    got = rec.routes()[:B, P - 1: P - 1 + T_NEW]
    valid = rr[..., 0, 0] >= 0
    assert torch.equal(got[valid], rr[valid])
    assert torch.equal(got[~valid], free[:, P - 1: P - 1 + T_NEW][~valid])  # sentinel rows route freely
    # rows given in another order (with their positions) replay identically
    perm = torch.randperm(T_NEW)
    with replay_routes(pert, rr[:, perm], pos[:, perm]):
        torch.testing.assert_close(pert(seq).logits, second.detach(), rtol=0, atol=0)


def test_malformed_tables_and_dense_models_are_refused():
    model = tiny_moe()
    seq, routes = generate(model)
    pos = torch.arange(routes.shape[1]).expand(B, -1)
    for layer, cols in ((0, [1]), (1, [0, 1])):  # half a row padded; one layer of a token padded
        bad = routes.clone()
        bad[0, 0, layer, cols] = PAD_EXPERT
        with pytest.raises(ValueError, match="mixing"):
            with replay_routes(model, bad, pos):
                pass
    dup = pos.clone()
    dup[1, 3] = dup[1, 2]
    with pytest.raises(ValueError, match="same"):
        with replay_routes(model, routes, dup):
            pass
    bad = routes.clone()
    bad[0, 0, 0, 0] = 4
    with pytest.raises(ValueError, match="outside"):
        with replay_routes(model, bad, pos):
            pass
    bad = routes.clone()
    bad[0, 0, 0] = torch.tensor([1, 1])
    with pytest.raises(ValueError, match="repeated"):
        with replay_routes(model, bad, pos):
            pass
    with pytest.raises(ValueError, match=r"\[B, S, L=2, E\]"):
        with replay_routes(model, routes[:, :, :1], pos):
            pass
    with pytest.raises(RuntimeError, match="beyond"):
        with replay_routes(model, routes, pos + 5):
            model(seq)
    with pytest.raises(RuntimeError, match="samples"):
        with replay_routes(model, routes, pos):
            model(seq[:2])

    torch.manual_seed(0)
    dense = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8))
    assert not is_moe(dense) and is_moe(model)
    with pytest.raises(ValueError, match="no mixture-of-experts router"):
        with record_routes(dense):
            pass


_COMMON = dict(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=8)
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16)
_LINEAR = dict(linear_num_value_heads=2, linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
               layer_types=["full_attention", "full_attention"])
ROUTER_MODELS = {  # router class -> (config class, model class, config kwargs)
    "Qwen3MoeTopKRouter": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(_MOE, norm_topk_prob=True)),
    "Qwen2MoeTopKRouter": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", _MOE),
    "OlmoeTopKRouter": ("OlmoeConfig", "OlmoeForCausalLM", dict(num_experts=4, num_experts_per_tok=2)),
    "Qwen3NextTopKRouter": ("Qwen3NextConfig", "Qwen3NextForCausalLM", dict(_MOE, **_LINEAR)),
    "Qwen3_5MoeTopKRouter": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", dict(_MOE, **_LINEAR)),
    "MixtralTopKRouter": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2)),
}


def test_every_gate_rule_is_tested():
    assert set(ROUTER_MODELS) == set(GATE_RULES)


@pytest.mark.parametrize("router", sorted(ROUTER_MODELS))
def test_gate_rule_identity(router):
    """Replaying a model's own routes changes nothing: the gate rule matches the model's."""
    cfg_cls, model_cls, kw = ROUTER_MODELS[router]
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**_COMMON, **kw)).eval()
    assert {type(r).__name__ for r in moe_routers(model)} == {router}
    seq = torch.randint(0, 64, (2, 7))
    nat = natural_routes(model, seq)
    ref = model(seq).logits
    with replay_routes(model, nat, torch.arange(7).expand(2, -1)):
        torch.testing.assert_close(model(seq).logits, ref, rtol=0, atol=1e-6)


def test_replay_through_a_lora_adapter():
    """With a peft LoRA adapter on the attention (``--lora-rank``), the routers are still
    found and replay keeps the rollout's experts while the adapter trains."""
    peft = pytest.importorskip("peft")
    model = tiny_moe()
    seq, routes = generate(model)
    pert, _ = _perturb_near_boundary(model, seq)
    lora = peft.get_peft_model(pert, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(5)
    for name, p in lora.named_parameters():
        if "lora_B" in name:  # peft starts B at zero: make the adapter change the hidden states
            torch.nn.init.normal_(p, std=0.2)
    assert len(moe_routers(lora)) == len(moe_routers(model))
    fed = seq.shape[1] - 1
    assert not torch.equal(natural_routes(lora, seq)[:, :fed], routes)  # free routing would differ
    pos = torch.arange(fed).expand(B, -1)
    with replay_routes(lora, routes, pos), record_routes(lora) as rec:
        token_log_probs(lora(seq).logits, seq).sum().backward()
    assert torch.equal(rec.routes()[:, :fed], routes)
    grads = [p.grad for n, p in lora.named_parameters() if "lora_" in n]
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)
