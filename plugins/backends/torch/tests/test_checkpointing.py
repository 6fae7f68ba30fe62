"""Activation checkpointing (relax_torch.checkpointing): selective (the default) and full
against none, float64 tiny Qwen3 in each layout with masks holding holes and garbage: the
same kernels on the same inputs, so every gradient is equal bit for bit (checkpointing
changes only the backward); what each mode recomputes (counted operator calls); the critic;
the fall-back.  Every estimator's loss and gradients with selective checkpointing:
test_shared_prefix.py; Qwen3-MoE with routing replay: test_backend.py; LoRA (off there):
test_lora.py; SmolLM2: the slow test below."""

import collections
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from relax_core.contracts import CriticSettings
from relax_torch.checkpointing import checkpoint_layers
from relax_torch_test_helpers import PGLoss, assert_equal_grads, grads, grouped_batch, make_backend, random_value_head

MODES = ("none", "selective", "full")


def _backends(model_dir, dtype="float64", **kw):
    return {m: make_backend(model_dir, dtype=dtype, selective=m == "selective", gradient_checkpointing=m == "full", **kw)
            for m in MODES}


@pytest.mark.parametrize("layout", [dict(layout=False), dict(layout=True),
                                    dict(layout=True, max_tokens_per_micro_batch=60)], ids=["plain", "shared", "packed"])
def test_selective_and_full_equal_none(tiny_model_dir, layout):
    bes = _backends(tiny_model_dir, **layout)
    assert {m: be.checkpointing for m, be in bes.items()} == {"none": None, "selective": "selective", "full": "full"}
    batch = grouped_batch(seed=11)
    fn = PGLoss(float(batch.loss_mask.sum()))  # with the entropy and top-k log-prob terms
    for be in bes.values():
        be.accumulate_gradients(batch, fn)
    for m in ("selective", "full"):
        assert_equal_grads(bes["none"].models["actor"], bes[m].models["actor"])


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def test_what_each_mode_recomputes(tiny_model_dir):
    """Selective recomputes the element-wise operations (one more SiLU per layer and
    micro-batch) and neither a matrix product nor the attention kernel; full recomputes all;
    none nothing."""
    bes = _backends(tiny_model_dir, layout=False)
    batch = grouped_batch(seed=12, sizes=(2, 2))
    fn = PGLoss(float(batch.loss_mask.sum()))
    calls = {}
    for m, be in bes.items():
        with _Count() as count:
            be.accumulate_gradients(batch, fn)
        calls[m] = count.calls
    layers = bes["none"].models["actor"].config.num_hidden_layers
    mbs = len(bes["none"].micro_batches(batch))
    products = ("mm", "addmm", "bmm")
    attention = "_scaled_dot_product_flash_attention_for_cpu"  # sdpa on CPU (the tiny model's attention)
    assert calls["none"][attention] == layers * mbs
    assert calls["selective"][attention] == layers * mbs and calls["full"][attention] == 2 * layers * mbs
    assert calls["none"]["silu"] == layers * mbs
    assert calls["selective"]["silu"] == calls["full"]["silu"] == 2 * layers * mbs
    assert sum(calls["selective"][p] for p in products) == sum(calls["none"][p] for p in products)
    assert sum(calls["full"][p] for p in products) > sum(calls["none"][p] for p in products)


def test_critic_is_checkpointed_too(tiny_model_dir):
    """The critic's backbone gradients (a random value head: the default zero head sends none
    into the backbone)."""
    bes = {m: make_backend(tiny_model_dir, selective=m == "selective", layout=False) for m in ("none", "selective")}
    batch = grouped_batch(seed=13, sizes=(3, 1))
    n_tok = float(batch.loss_mask.sum())

    def value_loss(mb, out):
        m = mb.loss_mask.bool()
        loss = torch.where(m, (out.values - torch.nan_to_num(mb.returns)) ** 2, 0.0).sum() / n_tok
        return loss, {"loss": float(loss.detach())}
    for be in bes.values():
        be.setup(needs_critic=True, critic_settings=CriticSettings(lr=0.01))
        random_value_head(be)
        be.accumulate_gradients(batch, value_loss, role="critic")
    critic = bes["selective"].models["critic"]
    assert any(getattr(m, "gradient_checkpointing", False) for m in critic.modules())
    backbone = grads(critic.backbone)
    assert backbone and all(bool(g.ne(0).any()) for n, g in backbone.items() if "layers.0." in n)
    assert_equal_grads(bes["none"].models["critic"], critic)


def test_a_model_transformers_cannot_checkpoint_falls_back_with_a_warning(tiny_model_dir):
    model = make_backend(tiny_model_dir, selective=False).models["actor"]
    model.supports_gradient_checkpointing = False
    with pytest.warns(UserWarning, match="--selective-checkpointing off .*--no-selective-checkpointing silences"):
        assert checkpoint_layers(model, full=False, selective=True) is None
    assert not model.is_gradient_checkpointing
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert checkpoint_layers(model, full=False, selective=False) is None


@pytest.mark.slow
def test_smollm2_selective_equals_none():
    """SmolLM2-135M (Llama, the default model), float32, the default shared-prefix layout."""
    from relax_core.models import ensure_default_model

    path = ensure_default_model()
    batch = grouped_batch(seed=14, sizes=(3, 2), t=12)
    fn = PGLoss(float(batch.loss_mask.sum()))
    bes = [make_backend(path, dtype="float32", selective=s) for s in (False, True)]
    res = [be.accumulate_gradients(batch, fn) for be in bes]
    assert res[1].sums["loss"] == res[0].sums["loss"]
    assert_equal_grads(bes[0].models["actor"], bes[1].models["actor"])
