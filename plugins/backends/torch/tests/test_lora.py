"""LoRA in the torch backend (float64 tiny Qwen3): the layer's equation and gradient, only
adapter parameters trained, merged weights under the base model's names, the reference as
the base model with the adapter disabled, small exact checkpoints, the PEFT export, and the
default target modules per architecture."""

import pytest
import torch
from safetensors.torch import load_file

from relax_core.config import RunConfig
from relax_core.models import load_model, load_state_dict_
from relax_torch.lora import add_adapter, merged_state_dict
from relax_torch_test_helpers import PGLoss, make_backend, make_batch, train_step

RANK, ALPHA = 4, 8.0
DENSE = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def lora_backend(model_dir, **cfg):
    return make_backend(model_dir, lora_rank=RANK, lora_alpha=ALPHA, **cfg)


def move_adapter(be, seed=1):
    """Give every lora_B random values (B = 0 at the start: the adapter would be the identity)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in be.models["actor"].named_parameters():
            if "lora_B" in n:
                p.copy_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))


@pytest.fixture(scope="module")
def moved(tiny_model_dir):
    be = lora_backend(tiny_model_dir)
    be.setup(needs_ref=True)
    move_adapter(be)
    return be


def test_a_lora_layer_computes_w_x_plus_scaled_b_a_x_and_its_gradient(moved):
    """h = W x + (α/r) B A x (Hu et al. eq. 3); ∂(g·h)/∂B = (α/r) g (A x)ᵀ, ∂/∂A = (α/r) Bᵀ g xᵀ."""
    layer = moved.models["actor"].model.layers[0].self_attn.q_proj
    w = layer.base_layer.weight
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    x = torch.randn(3, w.shape[1], dtype=w.dtype)
    g = torch.randn(3, w.shape[0], dtype=w.dtype)
    s = ALPHA / RANK
    h = layer(x)
    torch.testing.assert_close(h, x @ w.T + s * (x @ a.T) @ b.T, atol=1e-12, rtol=0)
    da, db = torch.autograd.grad((g * h).sum(), (a, b))
    torch.testing.assert_close(db, s * g.T @ (x @ a.T), atol=1e-12, rtol=0)
    torch.testing.assert_close(da, s * (g @ b).T @ x, atol=1e-12, rtol=0)


def test_only_the_adapter_is_trained(tiny_model_dir):
    be = lora_backend(tiny_model_dir)
    actor = be.models["actor"]
    trainable = {n for n, p in actor.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    # every dense projection of both layers, A and B: 2 layers × 7 modules × 2
    assert len(trainable) == 2 * 7 * 2
    in_optimizer = {id(p) for g in be.optimizers["actor"].param_groups for p in g["params"]}
    assert in_optimizer == {id(p) for n, p in actor.named_parameters() if n in trainable}
    # hidden 64, q/o 64 -> 64, k/v 64 -> 32 (2 KV heads × 16), MLP 64 <-> 128: r·(d_in + d_out) each
    assert sum(p.numel() for p in actor.parameters() if p.requires_grad) == 2 * RANK * (
        128 + 96 + 96 + 128 + 192 + 192 + 192)
    frozen = {n: p.detach().clone() for n, p in actor.named_parameters() if not p.requires_grad}
    batch = make_batch()
    r = train_step(be, batch, PGLoss(int(batch.loss_mask.sum())))
    assert not r.skipped and r.grad_norm > 0
    after = dict(actor.named_parameters())
    assert all(torch.equal(after[n], v) for n, v in frozen.items())  # bitwise: the base never moves
    assert all(after[n].grad is None for n in frozen)
    # the first step moves B (its gradient is (α/r) g (A x)ᵀ ≠ 0); A's gradient is Bᵀ(...) = 0 at B = 0
    assert all(bool(after[n].ne(0).any()) for n in trainable if "lora_B" in n)


def test_a_critic_beside_the_adapted_actor_trains_all_its_weights_and_checkpoints(tiny_model_dir, tmp_path):
    be = lora_backend(tiny_model_dir, dtype="float32")
    be.setup(needs_critic=True)
    critic = list(be.models["critic"].parameters())
    assert all(p.requires_grad for p in critic)  # PPO's value model: full fine-tuning
    assert sum(len(g["params"]) for g in be.optimizers["critic"].param_groups) == len(critic)
    with torch.no_grad():
        be.models["critic"].value_head.weight.fill_(0.5)  # (a fresh critic's head is 0)
    be.save_checkpoint(str(tmp_path / "ck"))
    other = lora_backend(tiny_model_dir, dtype="float32")
    other.setup(needs_critic=True)
    other.load_checkpoint(str(tmp_path / "ck"))  # adapter + full critic
    assert all(torch.equal(a, b) for a, b in zip(other.models["critic"].state_dict().values(),
                                                 be.models["critic"].state_dict().values()))


def test_the_engine_gets_merged_weights_under_the_base_models_names(moved, tiny_model_dir):
    base = load_model(str(tiny_model_dir), dtype=torch.float64)
    sd = moved.engine_state_dict()
    assert set(sd) == set(base.state_dict())  # no base_model.model., base_layer or lora_ keys
    layer = moved.models["actor"].model.layers[1].mlp.down_proj
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    want = base.state_dict()["model.layers.1.mlp.down_proj.weight"] + (ALPHA / RANK) * b @ a
    torch.testing.assert_close(sd["model.layers.1.mlp.down_proj.weight"], want, atol=1e-12, rtol=0)
    torch.testing.assert_close(sd["model.norm.weight"], base.state_dict()["model.norm.weight"], atol=0, rtol=0)
    load_state_dict_(base, sd)  # what the hf engine does: strict names and shapes
    ids = torch.tensor([[5, 17, 300, 2, 9]])
    with torch.no_grad():
        torch.testing.assert_close(base(input_ids=ids).logits, moved.models["actor"](input_ids=ids).logits,
                                   atol=1e-10, rtol=0)


def test_reference_is_the_base_model_with_the_adapter_disabled(moved, tiny_model_dir):
    assert moved.models["ref"] is moved.models["actor"]  # no second model in memory
    batch = make_batch(seed=4)
    ref = moved.forward(batch, role="ref").log_probs
    base = make_backend(tiny_model_dir)  # the base model, loaded separately
    torch.testing.assert_close(ref, base.forward(batch).log_probs, atol=1e-12, rtol=0)
    actor = moved.forward(batch).log_probs
    assert (actor - ref).abs()[batch.loss_mask].mean() > 1e-3  # the adapter is on outside the context


def test_checkpoint_holds_the_adapter_and_its_optimizer_state_and_resumes_exactly(tiny_model_dir, tmp_path):
    be = lora_backend(tiny_model_dir, dtype="float32")
    batch = make_batch(seed=2)
    loss = PGLoss(int(batch.loss_mask.sum()))
    train_step(be, batch, loss)
    be.save_checkpoint(str(tmp_path / "lora"))
    saved = load_file(str(tmp_path / "lora" / "actor.safetensors"))
    assert set(saved) == {n for n, p in be.models["actor"].named_parameters() if p.requires_grad}
    full = make_backend(tiny_model_dir, dtype="float32")
    train_step(full, batch, loss)  # (its AdamW moments exist after a step)
    full.save_checkpoint(str(tmp_path / "full"))
    size = lambda d: sum(f.stat().st_size for f in (tmp_path / d).iterdir())  # noqa: E731
    assert size("lora") < 0.01 * size("full")  # adapter + its AdamW moments vs all weights + moments
    train_step(be, batch, loss)  # the uninterrupted second step
    want = merged_state_dict(be.models["actor"])
    other = lora_backend(tiny_model_dir, dtype="float32")
    other.load_checkpoint(str(tmp_path / "lora"))
    assert other.optimizer_steps() == 1
    train_step(other, batch, loss)
    got = merged_state_dict(other.models["actor"])
    assert all(torch.equal(got[k], want[k]) for k in want)  # AdamW moments restored: bitwise
    with pytest.raises(KeyError, match="LoRA adapter"):
        other.load_checkpoint(str(tmp_path / "full"))


def test_save_hf_writes_the_peft_adapter_and_on_request_the_merged_model(tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    be = lora_backend(tiny_model_dir, save_hf_merged=True)
    move_adapter(be)
    be.save_hf(str(tmp_path / "final"))
    assert (tmp_path / "final" / "adapter_config.json").is_file()
    adapter = PeftModel.from_pretrained(load_model(str(tiny_model_dir), dtype=torch.float64), str(tmp_path / "final"))
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "final" / "merged"), dtype=torch.float64)
    ids = torch.tensor([[5, 17, 300, 2, 9]])
    with torch.no_grad():
        want = be.models["actor"](input_ids=ids).logits
        torch.testing.assert_close(adapter(input_ids=ids).logits, want, atol=1e-10, rtol=0)
        torch.testing.assert_close(merged(input_ids=ids).logits, want, atol=1e-10, rtol=0)


def test_the_engine_adapter_is_peft_s_saved_format_and_gives_the_trainer_s_logits(tiny_model_dir, tmp_path):
    """What an engine that takes adapters (vllm) gets: the tensors ``save_pretrained`` writes
    (names and values) and its config's LoRA fields, which PEFT loads onto the base model as
    the trainer's model."""
    import json

    from peft import PeftModel

    be = lora_backend(tiny_model_dir)
    move_adapter(be, seed=3)
    adapter = be.engine_adapter()
    assert all(v.device.type == "cpu" for v in adapter.tensors.values())
    be.save_hf(str(tmp_path / "saved"))
    saved = load_file(str(tmp_path / "saved" / "adapter_model.safetensors"))
    assert set(adapter.tensors) == set(saved) and all(torch.equal(adapter.tensors[k], saved[k]) for k in saved)
    assert all(k.startswith("base_model.model.") and ".lora_" in k and ".default." not in k for k in saved)
    config = json.loads((tmp_path / "saved" / "adapter_config.json").read_text())
    same = ("peft_type", "r", "lora_alpha", "lora_dropout", "bias", "use_rslora", "use_dora", "inference_mode")
    assert {k: adapter.config[k] for k in same} == {k: config[k] for k in same}
    assert set(adapter.config["target_modules"]) == set(config["target_modules"]) == DENSE
    assert (config["r"], config["lora_alpha"]) == (RANK, ALPHA)
    adapter.save(tmp_path / "pushed")
    loaded = PeftModel.from_pretrained(load_model(str(tiny_model_dir), dtype=torch.float64), str(tmp_path / "pushed"))
    ids = torch.tensor([[5, 17, 300, 2, 9]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, be.models["actor"](input_ids=ids).logits,
                                   atol=1e-10, rtol=0)
    adapter.tensors[next(iter(adapter.tensors))].add_(1.0)  # a copy: the live adapter does not move
    assert torch.equal(be.engine_adapter().tensors[next(iter(adapter.tensors))], saved[next(iter(adapter.tensors))])
    with pytest.raises(RuntimeError, match="--lora-rank"):
        make_backend(tiny_model_dir).engine_adapter()


def _adapted(model_dir, **cfg) -> set[str]:
    model = load_model(str(model_dir))
    add_adapter(model, RunConfig(model=str(model_dir), lora_rank=2, **cfg))
    return {n.split(".")[-1] for n, m in model.named_modules() if hasattr(m, "lora_A")}


def test_default_target_modules_per_architecture(tiny_model_dir, tiny_moe_model_dir, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
                     ).save_pretrained(tmp_path / "llama")
    assert _adapted(tmp_path / "llama") == DENSE  # SmolLM2's architecture
    assert _adapted(tiny_model_dir) == DENSE  # Qwen3
    assert _adapted(tiny_moe_model_dir) == {"q_proj", "k_proj", "v_proj", "o_proj"}  # Qwen3-MoE: not the router
    assert _adapted(tiny_model_dir, lora_target_modules=("v_proj",)) == {"v_proj"}
    with pytest.raises(ValueError, match="embeddings"):
        _adapted(tiny_model_dir, lora_target_modules=("q_proj", "embed_tokens"))


def test_lora_dropout_acts_in_the_training_forward_only(tiny_model_dir):
    be = make_backend(tiny_model_dir, lora_rank=RANK, lora_dropout=0.5)
    move_adapter(be)
    batch = make_batch(seed=5)
    a, b = be.forward(batch).log_probs, be.forward(batch).log_probs
    assert torch.equal(a, b)  # no-grad forwards (old log-probs, the adapter check): deterministic
    layer = be.models["actor"].model.layers[0].self_attn.q_proj
    assert layer.lora_dropout["default"].p == 0.5  # not zeroed with the base model's dropouts


def test_gradient_checkpointing_gives_the_same_adapter_gradients(tiny_model_dir):
    """Full checkpointing against none; selective checkpointing (the default elsewhere) is off
    under LoRA, where it would save nothing."""
    from relax_torch.lora import adapter_state_dict, load_adapter_state_dict_

    plain = lora_backend(tiny_model_dir)
    assert plain.checkpointing is None
    move_adapter(plain)
    ckpt = lora_backend(tiny_model_dir, gradient_checkpointing=True)
    assert ckpt.checkpointing == "full"
    load_adapter_state_dict_(ckpt.models["actor"], adapter_state_dict(plain.models["actor"]))  # the same random A
    batch = make_batch(seed=6)
    grads = []
    for be in (plain, ckpt):
        be.accumulate_gradients(batch, PGLoss(int(batch.loss_mask.sum())))
        grads.append({n: p.grad for n, p in be.models["actor"].named_parameters() if p.requires_grad})
    assert all(bool(g.ne(0).any()) for g in grads[0].values())
    for n, g in grads[0].items():
        torch.testing.assert_close(grads[1][n], g, atol=1e-12, rtol=0)


def test_teacher_is_a_separate_model_under_lora(tiny_model_dir, tmp_path):
    """With LoRA the reference is the actor with its adapter disabled, but the teacher
    (--teacher-model) is its own frozen model: its log-probs are that model's, whatever the
    adapter holds."""
    from relax_authoring.testing.models import make_tiny_model

    teacher = make_tiny_model(tmp_path / "teacher", seed=4)
    be = lora_backend(tiny_model_dir, teacher_model=str(teacher))
    be.setup(needs_ref=True)
    move_adapter(be)
    batch = make_batch(seed=2)
    expected = make_backend(teacher).forward(batch).log_probs
    torch.testing.assert_close(be.forward(batch, role="teacher").log_probs, expected, atol=0, rtol=0)
    assert be.models["teacher"] is not be.models["actor"]
    assert not any("lora_" in n for n, _ in be.models["teacher"].named_parameters())
    base = make_backend(tiny_model_dir).forward(batch).log_probs
    torch.testing.assert_close(be.forward(batch, role="ref").log_probs, base, atol=0, rtol=0)
