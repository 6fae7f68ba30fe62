"""--shared-prefix (Prefix Grouper, arXiv 2506.05433) and --packing against the plain layout,
float64 tiny Qwen3 with sdpa: log-probs, entropy, top-k log-probs, critic values, losses,
metrics and full parameter gradients equal to 1e-10 for groups of size 1 and n, interleaved
groups, responses of very different lengths, masks with holes, several estimators, packed rows
of several micro-batches; the mask keeps responses and packed segments apart; the fall-backs.

transformers' Qwen3RMSNorm computes in float32 whatever the weights' dtype.  The forward is
the same per position in both layouts (equal bit for bit), but the backward sums a shared
prompt position's gradients before that float32 cast (plain: after), so the gradients then
agree only to float32 rounding (measured max |Δg| / max |g| ≈ 6e-8).  The exactness tests
therefore run with a float64 RMSNorm (:func:`float64_norm`), where they agree to ~1e-13, and
one test keeps transformers' own norm at a float32-rounding tolerance."""

import dataclasses

import pytest
import torch

from relax_core.batch import Batch
from relax_core.config import RunConfig
from relax_core.contracts import AdvantageInput
from relax_core.host.plugins import default_registry
from relax_core.stages.loss import ActorLoss, LossSettings, global_denominators
from relax_torch.backend import TorchBackend
from relax_torch.layout import build_layout
from relax_torch.plugin import TorchBackendParams
from relax_torch_test_helpers import PGLoss, assert_equal_grads, grads, grouped_batch, random_value_head

TOL = dict(atol=1e-10, rtol=1e-10)  # float64: the two layouts differ only in summation order


def _backend(model_dir, shared, dtype="float64", packing=False, selective=True, **cfg):
    """shared=False, packing=False: the plain layout (the reference); selective: the default
    ``--selective-checkpointing`` (:mod:`relax_torch.checkpointing`)."""
    cfg.setdefault("lr", 1e-3)
    cfg.setdefault("rollout_temperature", 0.7)
    return TorchBackend(TorchBackendParams(dtype=dtype, logits_chunk_size=7, shared_prefix=shared, packing=packing,
                                           selective_checkpointing=selective),
                        RunConfig(model=str(model_dir), **cfg))


LAYOUTS = {"shared": dict(shared=True), "packed": dict(shared=False, packing=True, max_tokens_per_micro_batch=60),
           "shared_packed": dict(shared=True, packing=True, max_tokens_per_micro_batch=60),
           "selective": dict(shared=False)}  # the plain layout, with selective checkpointing (the reference has none)


@pytest.fixture(scope="module", autouse=True)
def float64_norm():
    """Qwen3RMSNorm in the input's dtype (transformers casts to float32), for the whole module
    except where a test restores it."""
    from transformers.models.qwen3 import modeling_qwen3 as mq

    def forward(self, h):
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mq.Qwen3RMSNorm, "forward", forward)
        yield mp


@pytest.fixture(scope="module")
def pair(tiny_model_dir):
    return _backend(tiny_model_dir, False), _backend(tiny_model_dir, True)


def _assert_same_grads(a, b, tol=TOL):
    ga, gb = grads(a), grads(b)
    assert ga.keys() == gb.keys() and ga
    for n in ga:
        torch.testing.assert_close(gb[n], ga[n], **tol, msg=n)
    return max(float((ga[n] - gb[n]).abs().max()) for n in ga)


def _assert_same_gradients_to(bes, batch, *, rel_atol, rtol):
    """One PGLoss accumulation on the (plain, shared) backends; gradients equal to
    ``rel_atol × max |g|`` absolute and ``rtol`` relative."""
    fn = PGLoss(float(batch.loss_mask.sum()))
    for be in bes:
        be.accumulate_gradients(batch, fn)
    scale = max(float(g.abs().max()) for g in grads(bes[0].models["actor"]).values())
    _assert_same_grads(bes[0].models["actor"], bes[1].models["actor"], dict(atol=rel_atol * scale, rtol=rtol))


def test_transformers_float32_norm_gradients_agree_to_float32_rounding(tiny_model_dir, float64_norm):
    from transformers.models.qwen3 import modeling_qwen3 as mq

    float64_norm.undo()
    try:
        bes = [_backend(tiny_model_dir, s) for s in (False, True)]
        batch = grouped_batch()
        outs = [be.forward(batch, entropy=True) for be in bes]
        torch.testing.assert_close(outs[1].log_probs, outs[0].log_probs, **TOL)
        _assert_same_gradients_to(bes, batch, rel_atol=1e-6, rtol=1e-5)
    finally:
        def forward(self, h):
            return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))
        float64_norm.setattr(mq.Qwen3RMSNorm, "forward", forward)


@pytest.mark.parametrize("sizes", [(1, 4, 3, 1), (8,), (1, 1, 1)])
def test_forward_and_gradient_equal_plain(pair, sizes):
    plain, shared = pair
    batch = grouped_batch(sizes=sizes)
    outs = [be.forward(batch, entropy=True, top_k=True) for be in pair]
    for name in ("log_probs", "entropy", "top_k_log_probs"):
        torch.testing.assert_close(getattr(outs[1], name), getattr(outs[0], name), **TOL)
    assert (outs[1].log_probs[batch.loss_mask] != 0).all()
    fn = PGLoss(float(batch.loss_mask.sum()))
    res = [be.accumulate_gradients(batch, fn) for be in pair]
    assert res[1].sums["loss"] == pytest.approx(res[0].sums["loss"], rel=1e-10, abs=1e-12)
    _assert_same_grads(plain.models["actor"], shared.models["actor"])


def test_responses_do_not_see_each_other(pair):
    """Changing one response's tokens changes no other sample's log-probs (a mask that lets
    responses attend to each other fails this), but the prompt does reach every response."""
    _, shared = pair
    batch = grouped_batch(sizes=(4,))
    base = shared.forward(batch).log_probs
    other = batch.response_ids.clone()
    other[0] = torch.randint(3, 1000, other[0].shape)
    changed = shared.forward(Batch(**{**batch.to_dict(), "response_ids": other})
                             if hasattr(batch, "to_dict") else _replace(batch, response_ids=other)).log_probs
    torch.testing.assert_close(changed[1:], base[1:], atol=0, rtol=0)
    assert not torch.equal(changed[0], base[0])
    prompts = [[p[0] + 1] + p[1:] for p in batch.prompt_ids]
    moved = shared.forward(_replace(batch, prompt_ids=prompts)).log_probs
    m = batch.loss_mask
    assert (moved[m] != base[m]).all()


def _replace(batch, **kw):
    fields = {n: getattr(batch, n) for n in ("prompt_ids", "response_ids", "loss_mask", "advantages", "top_k_ids",
                                             "returns", "group_index", "rewards", "response_lengths")}
    return Batch(**{**fields, **kw})


def test_packed_layout_is_block_diagonal():
    """Two samples of two groups packed into one row (no sharing): hand-derived ids, positions
    restarting per segment, a block-diagonal causal mask, no padding; with sharing the group's
    prompt is stored once."""
    lay = build_layout([[5, 6], [7]], torch.tensor([0, 1]), torch.tensor([[10, 11], [12, 13]]),
                       torch.tensor([[True, True], [True, False]]), 0, 100, share=False, pack=True, sdpa=True,
                       mask_dtype=torch.float64)
    assert lay.input_ids.tolist() == [[5, 6, 10, 11, 7, 12]] and lay.tokens == 6
    assert lay.position_ids.tolist() == [[0, 1, 2, 3, 0, 1]]
    m = lay.attention_mask[0, 0].int().tolist()
    assert m == [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0],
                 [0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 1, 1]]
    assert lay.src_col.tolist() == [[1, 2], [4, 5]]  # token 0 of sample 1 from its prompt's last state (col 4)
    shared = build_layout([[5, 6], [5, 6], [7]], torch.tensor([0, 0, 1]), torch.tensor([[10, 11], [12, 13], [14, 15]]),
                          torch.tensor([[True, True], [True, False], [True, True]]), 0, 100, pack=True, sdpa=False,
                          mask_dtype=torch.float32)
    assert shared.input_ids.tolist() == [[5, 6, 10, 11, 12, 7, 14, 15]]
    assert shared.position_ids.tolist() == [[0, 1, 2, 3, 2, 0, 1, 2]]
    allowed = (shared.attention_mask[0, 0] == 0).int().tolist()
    assert allowed[4] == [1, 1, 0, 0, 1, 0, 0, 0] and allowed[6] == [0, 0, 0, 0, 0, 1, 1, 0]
    assert shared.attention_mask.dtype == torch.float32 and shared.attention_mask.min() == torch.finfo(torch.float32).min


@pytest.mark.parametrize("layout", ["packed", "shared_packed"])
def test_packed_forward_and_gradient_equal_plain(tiny_model_dir, layout):
    """Packed rows over several micro-batches (a 60-token budget) against the plain layout with
    the same budget: log-probs, entropy, top-k, loss and full gradient to 1e-10; no padding."""
    batch = grouped_batch(sizes=(1, 4, 3, 1))
    bes = [_backend(tiny_model_dir, False, max_tokens_per_micro_batch=60), _backend(tiny_model_dir, **LAYOUTS[layout])]
    assert len(bes[1].micro_batches(batch)) > 2
    positions, tokens = bes[1].packed_positions(batch)
    assert positions == tokens < bes[0].packed_positions(batch)[0]
    outs = [be.forward(batch, entropy=True, top_k=True) for be in bes]
    for name in ("log_probs", "entropy", "top_k_log_probs"):
        torch.testing.assert_close(getattr(outs[1], name), getattr(outs[0], name), **TOL)
    fn = PGLoss(float(batch.loss_mask.sum()))
    res = [be.accumulate_gradients(batch, fn) for be in bes]
    assert res[1].sums["loss"] == pytest.approx(res[0].sums["loss"], rel=1e-10, abs=1e-12)
    _assert_same_grads(bes[0].models["actor"], bes[1].models["actor"])


def test_packed_segments_do_not_see_each_other(tiny_model_dir):
    """In a packed row, changing one sample's prompt changes no other sample's log-probs."""
    be = _backend(tiny_model_dir, False, packing=True, max_tokens_per_micro_batch=10_000)
    batch = grouped_batch(sizes=(1, 1, 1, 1))
    assert be.micro_batches(batch) == [(0, 4)]
    base = be.forward(batch).log_probs
    prompts = [list(p) for p in batch.prompt_ids]
    prompts[1][0] += 1
    moved = be.forward(_replace(batch, prompt_ids=prompts)).log_probs
    keep = torch.arange(4) != 1
    torch.testing.assert_close(moved[keep], base[keep], atol=0, rtol=0)
    m = batch.loss_mask[1]
    assert (moved[1][m] != base[1][m]).all()


def test_layout_mask_is_the_prefix_grouper_mask():
    lay = build_layout([[5, 6, 7], [5, 6, 7]], torch.tensor([3, 3]), torch.tensor([[10, 11], [12, 13]]),
                       torch.tensor([[True, True], [True, False]]), 0, 100, sdpa=True, mask_dtype=torch.float64)
    assert lay.input_ids.tolist() == [[5, 6, 7, 10, 11, 12]]
    assert lay.position_ids.tolist() == [[0, 1, 2, 3, 4, 3]]
    m = lay.attention_mask[0, 0].int().tolist()
    assert m[5] == [1, 1, 1, 0, 0, 1]  # r2 sees the prompt and itself, not r1
    assert m[4] == [1, 1, 1, 1, 1, 0] and m[2] == [1, 1, 1, 0, 0, 0]
    assert lay.src_col.tolist() == [[2, 3], [2, 5]]  # first tokens from the prompt's last state


ESTIMATORS = ["grpo", "gspo", "ppo"]
ALL_ESTIMATORS = default_registry().names("estimator")


@pytest.mark.parametrize("est,layout", [(e, "shared") for e in ESTIMATORS] + [("grpo", "packed"), ("ppo", "shared_packed")]
                         + [(e, "selective") for e in ALL_ESTIMATORS])
def test_estimator_loss_metrics_and_gradients_equal_plain(tiny_model_dir, est, layout):
    """One actor step's loss, metrics and gradient (and for ppo the critic's values and value
    gradient) through ActorLoss with the estimator's own advantages, against the plain layout
    without activation checkpointing."""
    reg = default_registry()
    cfg_kw = dict(advantage_estimator=est, n_samples_per_prompt=4, entropy_coef=0.01)
    if est == "gdpo":  # two reward columns (two --reward scorers)
        cfg_kw["reward_weights"] = (1.0, 0.5)
    lay = dict(LAYOUTS[layout])
    bes = [_backend(tiny_model_dir, False, **cfg_kw, max_tokens_per_micro_batch=lay.get("max_tokens_per_micro_batch"),
                    selective=False),
           _backend(tiny_model_dir, **lay, **cfg_kw)]
    batch = grouped_batch(seed=3, sizes=(4, 1, 4))
    critic = est == "ppo"
    for be in bes:
        be.setup(needs_critic=critic)
        if critic:
            random_value_head(be)
    values = [be.forward(batch, role="critic").values if critic else None for be in bes]
    if critic:
        torch.testing.assert_close(values[1], values[0], **TOL)
    spec = reg.get("estimator", est).spec
    params = spec.default_params()
    if hasattr(params, "eps_clip_high"):
        params = dataclasses.replace(params, eps_clip_high=0.28)  # an asymmetric clip (PPOClipParams)
    parts = {"reward_parts": torch.stack([batch.rewards, batch.rewards.sign()], 1)} if est == "gdpo" else {}
    results, metrics = [], []
    for be, v in zip(bes, values):
        cfg = be.cfg
        estimator = spec.build(params, cfg)
        old = be.forward(batch).log_probs.double() - 0.05 * batch.loss_mask
        adv = estimator.compute_advantages(AdvantageInput(
            rewards=batch.rewards, group_index=batch.group_index, loss_mask=batch.loss_mask, old_log_probs=old,
            ref_log_probs=old, values=v if v is not None else torch.zeros_like(old),
            response_lengths=batch.response_lengths, **parts)).advantages
        mb = _replace(batch, advantages=adv)
        mb = Batch(**{**{n: getattr(mb, n) for n in ("prompt_ids", "response_ids", "loss_mask", "advantages",
                                                     "group_index")}, "old_log_probs": old})
        tokens, samples = global_denominators(mb.loss_mask)
        fn = ActorLoss(estimator, [], LossSettings.from_config(cfg, spec.capabilities_for(params).behaviour_numerator),
                       num_tokens=tokens, num_samples=samples, old_from_current=False)
        results.append(be.accumulate_gradients(mb, fn))
        metrics.append(fn.metrics())
    # ActorLoss reports its loss and metrics in float32 per micro-batch, and packing cuts other
    # micro-batches than the plain budget: their sums then agree to float32 rounding only
    rel = 1e-10 if bes[0].micro_batches(batch) == bes[1].micro_batches(batch) else 1e-6
    assert results[1].sums["loss"] == pytest.approx(results[0].sums["loss"], rel=rel, abs=1e-12)
    assert metrics[0].keys() == metrics[1].keys()
    for k in metrics[0]:
        assert metrics[1][k] == pytest.approx(metrics[0][k], rel=rel, abs=1e-12), k
    _assert_same_grads(bes[0].models["actor"], bes[1].models["actor"])
    assert bes[0].checkpointing is None and bes[1].checkpointing == "selective"
    if layout == "selective":  # the same kernels recomputed on the same inputs: equal bit for bit
        assert_equal_grads(bes[0].models["actor"], bes[1].models["actor"])
    if critic:
        n_tok = float(batch.loss_mask.sum())  # the global denominator (micro-batches differ when packed)

        def value_loss(mb, out):
            m = mb.loss_mask.bool()
            loss = torch.where(m, (out.values.double() - torch.nan_to_num(mb.returns)) ** 2, 0.0).sum() / n_tok
            return loss, {"loss": float(loss.detach())}
        for be in bes:
            be.accumulate_gradients(batch, value_loss, role="critic")
        _assert_same_grads(bes[0].models["critic"], bes[1].models["critic"])


@pytest.mark.parametrize("packing", [False, True])
def test_token_budget_counts_packed_positions(tiny_model_dir, packing):
    batch = grouped_batch(sizes=(4, 4, 2))
    plain = _backend(tiny_model_dir, False, max_tokens_per_micro_batch=80)
    shared = _backend(tiny_model_dir, True, packing=packing, max_tokens_per_micro_batch=80)
    bounds = shared.micro_batches(batch)
    assert bounds[0][0] == 0 and bounds[-1][1] == batch.size and len(bounds) > 1
    for lo, hi in bounds:
        if hi - lo > 1:
            assert shared.packed_positions(batch.slice(lo, hi))[0] <= 80
    for lo, hi in bounds:  # the budget counts exactly the positions the layout computes
        mb = batch.slice(lo, hi)
        lay = build_layout(mb.prompt_ids, mb.group_index, mb.response_ids, mb.loss_mask, 0, 49152, pack=packing,
                           sdpa=True, mask_dtype=torch.float64)
        assert shared.packed_positions(mb) == (lay.input_ids.numel(), lay.tokens)
        if packing:  # one row, no padding
            assert lay.input_ids.shape[0] == 1 and lay.tokens == lay.input_ids.numel()
    fn = PGLoss(float(batch.loss_mask.sum()))
    plain.accumulate_gradients(batch, fn)
    shared.accumulate_gradients(batch, fn)
    _assert_same_grads(plain.models["actor"], shared.models["actor"])


def test_fall_backs_and_refusals(tiny_model_dir, tiny_moe_model_dir):
    """Where the layouts cannot be exact the backend warns and uses the plain layout."""
    be = _backend(tiny_moe_model_dir, True, dtype="float32", packing=True)
    with pytest.warns(UserWarning, match="--shared-prefix and --packing off .*routing replay"):
        be.setup(routing_replay=True)
    assert not (be.shared_prefix or be.packing)
    be = _backend(tiny_model_dir, True)
    be.models["actor"].config._attn_implementation = "flash_attention_2"
    assert "4-D mask" in be._inexact_layout(be.models["actor"])
    with pytest.warns(UserWarning, match="--shared-prefix off .*4-D mask"):
        be._fall_back(be._inexact_layout(be.models["actor"]))
    assert not be.shared_prefix
    be.models["actor"].config._attn_implementation = "sdpa"
    be.models["actor"].config.use_sliding_window = True
    try:
        assert "sliding-window" in be._inexact_layout(be.models["actor"])
    finally:
        be.models["actor"].config.use_sliding_window = False
    bad = grouped_batch(sizes=(2,))
    bad = _replace(bad, prompt_ids=[bad.prompt_ids[0], bad.prompt_ids[0] + [9]])
    with pytest.raises(ValueError, match="different prompts"):
        _backend(tiny_model_dir, True).forward(bad)


def test_every_loaded_model_is_checked(tiny_model_dir, tmp_path):
    """The frozen models (--teacher-model, --ref-load) run on the backend's one layout too, so a
    teacher or reference with sliding-window attention turns the shared-prefix layout off (with
    a warning naming it) as such an actor does."""
    import warnings

    from relax_authoring.testing.models import make_tiny_model

    sliding = make_tiny_model(tmp_path / "sliding", seed=3,
                              config={"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 0})
    for cfg, roles in ((dict(teacher_model=str(sliding)), {}), (dict(ref_load=str(sliding)), dict(needs_ref=True))):
        be = _backend(tiny_model_dir, True, **cfg)
        assert be.shared_prefix
        with pytest.warns(UserWarning, match=f"--shared-prefix off .*{sliding} uses sliding-window"):
            be.setup(**roles)
        assert not be.shared_prefix
    be = _backend(tiny_model_dir, False, teacher_model=str(sliding))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the plain layout takes it without a word
        be.setup()


def test_eager_attention(tiny_model_dir):
    """eager attention takes the additive float mask.  Against the plain path under sdpa (the
    plain path under eager gives NaN for left-padded samples: see the report of issue 24); eager's
    softmax runs in float32, so log-probs and gradients agree to float32 rounding."""
    bes = [_backend(tiny_model_dir, s) for s in (False, True)]
    bes[1].models["actor"].config._attn_implementation = "eager"
    batch = grouped_batch(seed=9, sizes=(3, 1, 2))
    assert bes[1]._inputs(batch)[1].dtype == torch.float64
    outs = [be.forward(batch, entropy=True) for be in bes]
    torch.testing.assert_close(outs[1].log_probs, outs[0].log_probs, atol=1e-6, rtol=1e-6)
    _assert_same_gradients_to(bes, batch, rel_atol=1e-5, rtol=1e-4)


def test_qwen3_moe_float32(tiny_moe_model_dir):
    """Qwen3-MoE (routing is per token, so a shared prompt routes as in the plain layout), float32:
    log-probs to 1e-5 and gradients to float32 rounding."""
    bes = [_backend(tiny_moe_model_dir, s, dtype="float32") for s in (False, True)]
    batch = grouped_batch(seed=5, sizes=(3, 1, 2))
    outs = [be.forward(batch) for be in bes]
    torch.testing.assert_close(outs[1].log_probs, outs[0].log_probs, atol=1e-5, rtol=1e-5)
    _assert_same_gradients_to(bes, batch, rel_atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_smollm2_llama_float32():
    """SmolLM2-135M (Llama), float32, sdpa, shared prefix with and without packing: log-probs and
    entropy to 1e-4, gradients to float32 rounding of the summed prompt gradients (2e-4 of the
    largest entry)."""
    from relax_core.models import ensure_default_model

    path = ensure_default_model()
    plain = _backend(path, False, dtype="float32", max_tokens_per_micro_batch=40)
    batch = grouped_batch(seed=7, sizes=(3, 1), t=12)
    for lay in (dict(shared=True), dict(shared=True, packing=True)):  # one row per group; packed rows of <= 40 tokens
        other = _backend(path, dtype="float32", max_tokens_per_micro_batch=40, **lay)
        outs = [be.forward(batch, entropy=True) for be in (plain, other)]
        torch.testing.assert_close(outs[1].log_probs, outs[0].log_probs, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(outs[1].entropy, outs[0].entropy, atol=1e-4, rtol=1e-4)
        _assert_same_gradients_to((plain, other), batch, rel_atol=2e-4, rtol=1e-3)
        del other
