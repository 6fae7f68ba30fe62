"""vLLM's native LoRA (``lora_rank``): a pushed PEFT adapter gives transformers' log-probs of
the PEFT model, and replaces the previous one.  Its own module: the engine here is built with
LoRA support, and two live vLLM engines in one process cannot both be shut down cleanly
(``test_vllm.py``'s module engine is shut down before this module starts)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).parent))

from test_vllm import PROMPTS, _check_against_hf, _hf_log_probs  # noqa: E402

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed (see .ci/vllm.sh)")]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from vllm_tiny import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def _random_adapter(model, seed):
    """``model`` wrapped in a rank-4 PEFT LoRA on q_proj/v_proj/down_proj with random A and B
    (B = 0 at initialisation would leave the model unchanged), and its adapter as pushed."""
    from peft import LoraConfig, get_peft_model

    from relax_core.contracts import AdapterWeights
    from relax_torch.lora import engine_adapter

    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(0.05 * torch.randn_like(p))
    adapter = engine_adapter(peft_model)
    assert isinstance(adapter, AdapterWeights)
    return peft_model, adapter


def test_a_pushed_lora_adapter_samples_as_the_merged_weights_and_replaces_the_last(tiny_dir):
    """An engine built for LoRA (``lora_rank``) keeps its base weights and applies the pushed
    adapter: its log-probs equal transformers' on the PEFT model (adapter on) before and after
    a second adapter replaces the first, and the base model's when no adapter was pushed."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from relax_vllm.engine import VLLMEngine

    base = lambda: AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()  # noqa: E731
    eng = VLLMEngine(str(tiny_dir), AutoTokenizer.from_pretrained(tiny_dir), seed=0, max_model_len=256, lora_rank=4)
    try:
        _check_against_hf(eng, base(), seed=5)  # no adapter yet: the base model
        for version, seed in ((1, 1), (2, 2)):
            peft_model, adapter = _random_adapter(base(), seed)
            eng.update_weights(adapter, version=version)
            assert eng.version == version and eng._lora.lora_int_id == version
            out = _check_against_hf(eng, peft_model, seed=5)
            # the adapter moved these log-probs far beyond the 1e-4 the engine matches them to
            with peft_model.disable_adapter():
                off, _ = _hf_log_probs(peft_model, PROMPTS, out, 0.7)
            assert max((o - eng_lp[:len(o)].double()).abs().max().item()
                       for o, eng_lp in zip(off, out.rollout_log_probs)) > 1e-2
            assert len(list(eng._weights_dir.glob("adapter-*"))) == 1  # the previous adapter's files are gone
    finally:
        eng.shutdown()
