"""--model resolution and loading, the default model's cache, and the tiny test models."""

import json
import os

import pytest
import torch

from relax_authoring.testing import models as tiny
from relax_core import models
from relax_core.host.validation import model_is_moe
from relax_core.models import ModelLoadError


def test_missing_paths_and_non_model_dirs(tmp_path):
    with pytest.raises(ModelLoadError, match="no such directory"):
        models.resolve_model_path(str(tmp_path / "nope"))
    with pytest.raises(ModelLoadError, match="no config.json"):
        models.resolve_model_path(str(tmp_path))
    assert models.resolve_model_path("some-org/some-model") == "some-org/some-model"  # a hub name


def test_hub_name_offline_fails_clearly(monkeypatch):
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="(?s)could not load it as a hub name.*local Hugging Face model directory"):
        models.load_tokenizer("relax-nonexistent-org/relax-nonexistent-model")


def test_default_cache_is_atomic_and_tied_to_the_gguf(tmp_path, monkeypatch):
    monkeypatch.setenv("RELAX_CACHE_DIR", str(tmp_path))
    calls = []

    def fake_convert(gguf, out):
        calls.append(out)
        if len(calls) == 1:
            (out / "partial.bin").write_text("x")
            raise RuntimeError("crash mid-conversion")
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(models, "_convert_gguf", fake_convert)
    with pytest.raises(RuntimeError, match="crash"):
        models.ensure_default_model()
    target = tmp_path / "models" / models.DEFAULT_MODEL
    assert not target.exists() and not list((tmp_path / "models").iterdir())  # nothing half-written left
    assert models.ensure_default_model() == target and len(calls) == 2
    assert (target / "config.json").is_file()
    assert json.loads((target / models._MARKER).read_text()) == models._marker_for(models.default_gguf_path())
    assert models.ensure_default_model() == target and len(calls) == 2  # cached: no conversion
    (target / models._MARKER).write_text(json.dumps({"format": -1}))  # stale copy: converted again
    assert models.ensure_default_model() == target and len(calls) == 3
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [models.DEFAULT_MODEL]


def test_tiny_models(tmp_path):
    a = tiny.make_tiny_model(tmp_path / "a", seed=0)
    b = tiny.make_tiny_model(tmp_path / "b", seed=0)
    c = tiny.make_tiny_model(tmp_path / "c", seed=1)
    moe = tiny.make_tiny_model(tmp_path / "moe", moe=True)
    ma, mb, mc, mm = (models.load_model(str(p)) for p in (a, b, c, moe))
    assert all(torch.equal(x, mb.state_dict()[k]) for k, x in ma.state_dict().items())  # seeded
    assert not torch.equal(ma.model.embed_tokens.weight, mc.model.embed_tokens.weight)
    assert type(ma).__name__ == "Qwen3ForCausalLM" and type(mm).__name__ == "Qwen3MoeForCausalLM"
    assert mm.config.num_experts == 4 and mm.config.num_experts_per_tok == 2
    assert ma.config.vocab_size == 49152 and ma.config.hidden_size == 64
    assert model_is_moe(str(moe)) is True and model_is_moe(str(a)) is False
    tok = models.load_tokenizer(str(a))
    assert tok.chat_template and tok.eos_token_id == ma.config.eos_token_id == ma.generation_config.eos_token_id
    ids = tok.apply_chat_template([{"role": "user", "content": "2+2?"}], add_generation_prompt=True)["input_ids"]
    assert ma(input_ids=torch.tensor([ids])).logits.shape == (1, len(ids), 49152)


def test_byte_tokenizer_model_and_config_overrides(tmp_path):
    """The tokenizer that needs no model package (the GPU check's machine has none): bytes
    round-trip, ChatML, EOS/pad in the config; ``config`` replaces the tiny shape (a larger
    vocabulary than the tokenizer's is allowed, a smaller one refused)."""
    d = tiny.make_tiny_model(tmp_path / "bytes", vocab_from="bytes",
                               config=dict(vocab_size=300, intermediate_size=96, num_hidden_layers=3))
    m, tok = models.load_model(str(d)), models.load_tokenizer(str(d))
    assert (m.config.vocab_size, m.config.intermediate_size, m.config.num_hidden_layers) == (300, 96, 3)
    assert len(tok) == 259 and tok.eos_token_id == m.config.eos_token_id == 256 and tok.pad_token_id == 257
    text = "Héllo 12+3=?"
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text.encode()) and tok.decode(ids) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode([ids[0], 299, 258 + 1]) == "H"  # ids past the tokenizer are skipped
    assert tiny.QWEN3_0_6B["vocab_size"] == 151936 and tiny.QWEN3_0_6B["num_hidden_layers"] == 28
    with pytest.raises(ValueError, match="vocab_size 100"):
        tiny.make_tiny_model(tmp_path / "small", vocab_from="bytes", config=dict(vocab_size=100))


def test_load_state_dict_in_place(tmp_path):
    m = models.load_model(str(tiny.make_tiny_model(tmp_path / "a", seed=0)))
    other = models.load_model(str(tiny.make_tiny_model(tmp_path / "b", seed=3)))
    ptr = m.model.embed_tokens.weight.data_ptr()
    sd = {k: v for k, v in other.state_dict().items() if k != "lm_head.weight"}  # tied: given once
    models.load_state_dict_(m, sd)
    assert m.model.embed_tokens.weight.data_ptr() == ptr  # in place, tie kept
    assert torch.equal(m.lm_head.weight, other.lm_head.weight)
    sd["model.norm.weight"] = torch.zeros(3)
    with pytest.raises(ValueError, match="shape"):
        models.load_state_dict_(m, sd)



def test_load_state_dict_shared_keeps_the_given_tensors(tmp_path):
    """``share=True``: tensors of the module's dtype become its weights (the trainer's
    in-place updates are then the engine's, no copy); the tie is kept; another dtype gets a
    converted copy (a bf16 engine from a float32 trainer); and a later push of other tensors
    never writes into the storage an earlier push shared (a resume giving the engine older
    weights must not overwrite the trainer's)."""
    m = models.load_model(str(tiny.make_tiny_model(tmp_path / "a", seed=0)))
    trainer = models.load_model(str(tiny.make_tiny_model(tmp_path / "b", seed=3)))
    sd = {k: v.detach() for k, v in trainer.state_dict().items()}
    models.load_state_dict_(m, sd, share=True)
    for name, p in m.state_dict(keep_vars=True).items():
        assert p.data_ptr() == sd[name].data_ptr(), name
    assert m.lm_head.weight is m.model.embed_tokens.weight  # still one Parameter
    with torch.no_grad():
        trainer.model.norm.weight.add_(1.0)  # an optimizer step, in place
    assert torch.equal(m.model.norm.weight, trainer.model.norm.weight)
    models.load_state_dict_(m, sd, share=True)  # the next push: nothing to copy or move
    assert m.model.norm.weight.data_ptr() == sd["model.norm.weight"].data_ptr()

    half = models.load_model(str(tiny.make_tiny_model(tmp_path / "c", seed=0)), dtype="bfloat16")
    own_storage = {k: p.data_ptr() for k, p in half.state_dict(keep_vars=True).items()}
    for _ in range(2):  # converted into the engine's own storage, push after push: no second copy
        models.load_state_dict_(half, sd, share=True)
        assert {k: p.data_ptr() for k, p in half.state_dict(keep_vars=True).items()} == own_storage
    assert half.model.norm.weight.dtype == torch.bfloat16
    assert torch.equal(half.model.norm.weight, sd["model.norm.weight"].to(torch.bfloat16))
    assert half.lm_head.weight is half.model.embed_tokens.weight

    trainer_before = {k: v.clone() for k, v in sd.items()}
    older = {k: (v.double() - 1.0) for k, v in sd.items()}  # another dtype: cannot be shared
    models.load_state_dict_(m, older, share=True)
    for name, v in sd.items():
        assert torch.equal(v, trainer_before[name]), name  # the trainer's tensors untouched
    assert torch.equal(m.model.norm.weight, older["model.norm.weight"].float())


def test_released_weights_come_back_with_the_next_push(tmp_path):
    """``release_weights_`` frees the parameters a module owns (empty tensors of their dtype;
    running the module raises) and keeps its buffers and the storage a push shared;
    the next ``load_state_dict_`` gives them new storage on their device, in their dtype,
    holding exactly the pushed values, the tie kept (given once or twice)."""
    trainer = models.load_model(str(tiny.make_tiny_model(tmp_path / "b", seed=3)))
    sd = {k: v.detach() for k, v in trainer.state_dict().items()}
    half = models.load_model(str(tiny.make_tiny_model(tmp_path / "c", seed=0)), dtype="bfloat16")
    buffers = {k: b.clone() for k, b in half.named_buffers()}
    owned = sum(p.numel() * 2 for p in half.parameters())
    for tied in (sd, {k: v for k, v in sd.items() if k != "lm_head.weight"}):
        assert models.release_weights_(half) == owned
        assert all(p.numel() == 0 for p in half.parameters()) and half.lm_head.weight is half.model.embed_tokens.weight
        assert models.release_weights_(half) == 0  # nothing left to free
        assert all(torch.equal(b, buffers[k]) for k, b in half.named_buffers())
        assert models.weights_released(half)
        models.load_state_dict_(half, tied, share=True)
        for name, p in half.state_dict(keep_vars=True).items():
            if name in sd:
                assert p.device.type == "cpu" and p.dtype == torch.bfloat16, name
                assert torch.equal(p, sd[name].to(torch.bfloat16)), name
        assert half.lm_head.weight is half.model.embed_tokens.weight and not models.weights_released(half)
    with pytest.raises(KeyError, match="missing"):  # a released module still says what a push lacks
        models.release_weights_(half)
        models.load_state_dict_(half, {k: v for k, v in sd.items() if k != "model.norm.weight"}, share=True)

    same = models.load_model(str(tiny.make_tiny_model(tmp_path / "a", seed=0)))
    models.load_state_dict_(same, sd, share=True)  # float32 beside float32: the trainer's tensors
    assert models.release_weights_(same) == 0
    assert all(p.numel() > 0 for p in same.parameters())
    with torch.no_grad():
        trainer.model.norm.weight.add_(1.0)
    assert torch.equal(same.model.norm.weight, trainer.model.norm.weight)


@pytest.mark.slow
def test_default_model_cache_equals_the_gguf():
    """The cached safetensors copy computes the same logits as the GGUF loaded directly."""
    from transformers import AutoModelForCausalLM

    gguf = models.default_gguf_path()
    direct = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    cached = models.load_model(models.DEFAULT_MODEL)
    tok = models.load_tokenizer(models.DEFAULT_MODEL)
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 3+4?"}], add_generation_prompt=True)["input_ids"]
    x = torch.tensor([ids])
    with torch.no_grad():
        torch.testing.assert_close(cached(input_ids=x).logits, direct(input_ids=x).logits, atol=0, rtol=0)
    assert tok.eos_token == "<|im_end|>" and tok.chat_template
    assert os.path.isfile(models.ensure_default_model() / "model.safetensors")
