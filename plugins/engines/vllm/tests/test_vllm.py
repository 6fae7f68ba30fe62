"""vLLM engine: output packing (no vLLM needed), install hint, and, where vLLM is installed
(``.venv-vllm``, see ``.ci/vllm.sh``), log-probs equal to transformers' for the same
weights before and after a weight push, multi-turn episodes trained on exactly the sampled
ids, seeds and stop strings (LoRA adapters: ``test_vllm_lora.py``)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

torch = pytest.importorskip("torch")

from relax_core.batch import TOP_K_HEAD  # noqa: E402
from relax_core.contracts import SamplingParams  # noqa: E402
from relax_vllm.engine import to_generation_output, vllm_lora_rank  # noqa: E402

HAS_VLLM = importlib.util.find_spec("vllm") is not None
sys.path.insert(0, str(Path(__file__).parent))


def _lp(logprob, rank):
    return NS(logprob=logprob, rank=rank)


def test_to_generation_output_packs_and_sorts_top_k():
    a = NS(token_ids=[5, 7], text="ab", finish_reason="length",
           logprobs=[{5: _lp(-0.5, 1), 9: _lp(-1.5, 2)},                 # sampled = rank 1
                     {7: _lp(-3.0, 4), 2: _lp(-1.0, 2), 3: _lp(-0.2, 1)}])  # sampled outside top-2
    b = NS(token_ids=[4], text="c", finish_reason="stop", logprobs=[{4: _lp(-0.1, 1), 1: _lp(-2.5, 2)}])
    out = to_generation_output([a, b], pad_id=0, top_k=2)
    assert out.response_ids.tolist() == [[5, 7], [4, 0]]
    assert out.response_lengths.tolist() == [2, 1]
    assert out.rollout_log_probs[0].tolist() == [-0.5, -3.0] and out.rollout_log_probs[1, 0].item() == pytest.approx(-0.1)
    assert out.truncated.tolist() == [True, False]
    assert out.top_k_ids.tolist()[0] == [[5, 9], [3, 2]]
    assert out.top_k_log_probs[0, 1].tolist() == pytest.approx([-0.2, -1.0])
    assert out.top_k_log_probs[1, 1].isneginf().all()  # past the response
    assert out.responses == ["ab", "c"]


def test_to_generation_output_errors_and_empty():
    empty = NS(token_ids=[], text="", finish_reason="stop", logprobs=[])
    out = to_generation_output([empty], pad_id=3, top_k=0)
    assert out.response_ids.tolist() == [[3]] and out.response_lengths.tolist() == [0]
    assert out.top_k_ids is None
    with pytest.raises(ValueError, match="no per-token log-probs"):
        to_generation_output([NS(token_ids=[1], text="", finish_reason="stop", logprobs=None)], pad_id=0, top_k=0)
    short = NS(token_ids=[1], text="", finish_reason="stop", logprobs=[{1: _lp(-1.0, 1)}])
    with pytest.raises(ValueError, match="fewer than k = 2"):
        to_generation_output([short], pad_id=0, top_k=2)


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_choosing_vllm_without_it_gives_install_hint():
    from relax_core.host.plugins import load_registry

    spec = load_registry().get("engine", "vllm").spec
    with pytest.raises(ImportError, match=r"plugins/engines/vllm\[engine\]"):
        spec.build(None, None)


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM not installed (see .ci/vllm.sh)")
def test_the_engine_reserves_the_smallest_vllm_lora_rank_that_holds_the_adapter():
    assert [vllm_lora_rank(r) for r in (1, 4, 8, 9, 16, 64, 512)] == [1, 8, 8, 16, 16, 64, 512]
    with pytest.raises(ValueError, match="--lora-rank 513 is above vLLM's largest adapter rank 512.*--no-lora-engine-adapter"):
        vllm_lora_rank(513)


# ------------------------------------------------------------------ live vLLM (slow)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from vllm_tiny import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def engine(tiny_dir):
    from transformers import AutoTokenizer

    from relax_vllm.engine import VLLMEngine

    eng = VLLMEngine(str(tiny_dir), AutoTokenizer.from_pretrained(tiny_dir), seed=0, max_model_len=256)
    yield eng
    eng.shutdown()


def _hf_log_probs(model, prompts, out, temperature):
    """log softmax(logits / T) of each sampled token and the top-3 head, from transformers."""
    lps, heads = [], []
    for p, ids, n in zip(prompts, out.response_ids, out.response_lengths.tolist()):
        x = torch.tensor([p + ids[:n].tolist()])
        with torch.no_grad():
            logits = model(x).logits[0, len(p) - 1: len(p) - 1 + n].double() / temperature
        lsm = torch.log_softmax(logits, -1)
        lps.append(lsm.gather(-1, ids[:n, None]).squeeze(-1))
        heads.append(lsm.topk(3, -1))
    return lps, heads


PROMPTS = [[1, 2, 3, 4], [10, 20, 30], [7, 7, 7, 7, 7, 7]]


def _check_against_hf(engine, model, seed):
    prompts = PROMPTS
    s = SamplingParams(temperature=0.7, max_new_tokens=12, seed=seed, fields=TOP_K_HEAD, top_k_width=3)
    out = engine.generate(prompts, s)
    assert out.response_lengths.min() >= 1
    lps, heads = _hf_log_probs(model, prompts, out, 0.7)
    worst = 0.0
    for i, n in enumerate(out.response_lengths.tolist()):
        worst = max(worst, (out.rollout_log_probs[i, :n].double() - lps[i]).abs().max().item())
        assert torch.equal(out.top_k_ids[i, :n], heads[i].indices)
        assert (out.top_k_log_probs[i, :n].double() - heads[i].values).abs().max() < 1e-4
    assert worst < 1e-4, worst
    assert out.rollout_log_probs.max() < 0 and math.isfinite(float(out.rollout_log_probs.sum()))
    return out




@pytest.mark.slow
@pytest.mark.skipif(not HAS_VLLM, reason="vLLM not installed (see .ci/vllm.sh)")
def test_log_probs_match_transformers_before_and_after_weight_push(engine, tiny_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    before = _check_against_hf(engine, model, seed=11)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    engine.update_weights(model.state_dict(), version=1)
    assert engine.version == 1
    after = _check_against_hf(engine, model, seed=11)
    # same seed, new weights: the distribution changed, so the log-probs did
    assert not torch.allclose(before.rollout_log_probs, after.rollout_log_probs)


@pytest.mark.slow
@pytest.mark.skipif(not HAS_VLLM, reason="vLLM not installed (see .ci/vllm.sh)")
def test_multi_turn_trained_ids_are_the_sampled_ids(engine, tiny_dir):
    """Three-turn retry episodes on vLLM (every answer wrong): the engine continued each turn
    from exactly the trained sequence's prefix (token-id prompts, nothing re-tokenised), the
    trained ids at loss_mask-1 positions are the sampled ids with vLLM's own log q, and those
    equal transformers' teacher-forced log-probs of the whole trained sequence."""
    from transformers import AutoModelForCausalLM

    from relax_core.environments import EPISODE_ENDS
    from relax_core.stages.env_host import ThreadHost
    from relax_core.stages.episodes import EpisodeRunner, ReplyRenderer
    from relax_retry.retry import Retry

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    engine.update_weights(model.state_dict(), version=engine.version + 1)  # an earlier test pushed other weights
    calls = []

    class Recording:
        tokenizer = engine.tokenizer

        def generate(self, prompt_ids, sampling):
            out = engine.generate(prompt_ids, sampling)
            calls.append(([list(p) for p in prompt_ids], out))
            return out

    tok = engine.tokenizer
    env = Retry(3, 1.0, 1.0, "Wrong, try again.")
    runner = EpisodeRunner(Recording(), ReplyRenderer(tok, True),
                           max_turns=3, max_episode_tokens=None, score=lambda texts, *rest: ([0.0] * len(texts), {}),
                           pad_token_id=tok.pad_token_id, host=ThreadHost(env, 60.0, 4))
    prompts = [tok(tok.apply_chat_template([{"role": "user", "content": f"What is {i} + 1?"}], tokenize=False,
                                           add_generation_prompt=True), add_special_tokens=False)["input_ids"]
               for i in (1, 2)]
    out = runner.generate([{"prompt": "", "label": "2", "metadata": {}}] * 2, [""] * 2, prompts,
                          SamplingParams(temperature=1.0, max_new_tokens=16, seed=5, stop=("e",)))
    # a random model rarely samples EOS: the stop string ends its turns (else a turn that hits
    # max_new_tokens ends the episode as turn_length)
    assert out.num_turns.tolist() == [3, 3], [EPISODE_ENDS[int(e)] for e in out.episode_end]
    assert out.env_mask.any() and len(calls) == 3
    for b in range(2):
        mask, n = out.loss_mask[b], int(out.response_lengths[b])
        sampled, logq = [], []
        for contexts, call in calls:
            assert contexts[b] == prompts[b] + out.response_ids[b, :len(contexts[b]) - len(prompts[b])].tolist()
            m = int(call.response_lengths[b])
            sampled += call.response_ids[b, :m].tolist()
            logq += call.rollout_log_probs[b, :m].tolist()
        assert out.response_ids[b][mask].tolist() == sampled
        assert out.rollout_log_probs[b][mask].tolist() == logq
        assert not (mask & out.env_mask[b]).any() and bool((mask | out.env_mask[b])[:n].all())
        ids = torch.tensor([prompts[b] + out.response_ids[b, :n].tolist()])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompts[b]) - 1:-1].double()
        forced = logits.log_softmax(-1).gather(1, ids[0, len(prompts[b]):, None]).squeeze(1)
        assert (forced[mask[:n]] - out.rollout_log_probs[b, :n][mask[:n]].double()).abs().max() < 1e-4


@pytest.mark.slow
@pytest.mark.skipif(not HAS_VLLM, reason="vLLM not installed (see .ci/vllm.sh)")
def test_an_adapter_pushed_to_an_engine_built_without_lora_is_refused(engine):
    from relax_core.contracts import AdapterWeights

    with pytest.raises(ValueError, match="built without LoRA support"):
        engine.update_weights(AdapterWeights(tensors={}, config={}), version=1)


@pytest.mark.slow
@pytest.mark.skipif(not HAS_VLLM, reason="vLLM not installed (see .ci/vllm.sh)")
def test_seeds_and_stop_strings(engine):
    prompts = [[5, 6, 7]] * 3
    s = SamplingParams(temperature=1.0, max_new_tokens=16, seed=3)
    a, b = engine.generate(prompts, s), engine.generate(prompts, s)
    assert torch.equal(a.response_ids, b.response_ids)  # same seed, same samples
    assert len({tuple(r.tolist()) for r in a.response_ids}) == 3  # a group gets distinct samples
    assert a.truncated.all() and a.response_lengths.tolist() == [16] * 3
    text = a.responses[0]
    stop = text[len(text) // 2: len(text) // 2 + 3]
    assert stop.strip(), text
    c = engine.generate(prompts[:1], SamplingParams(temperature=1.0, max_new_tokens=16, seed=3, stop=(stop,)))
    assert not c.truncated[0] and c.responses[0].endswith(stop)  # the text keeps the stop string
    assert c.responses[0] == text[: text.index(stop) + len(stop)]
    assert 1 <= c.response_lengths[0] < 16
    n = int(c.response_lengths[0])
    assert torch.equal(c.response_ids[0, :n], a.response_ids[0, :n])  # same seed: a prefix of the free run
    # greedy: log q = 0 (a point mass), and no top-k head
    g = engine.generate(prompts[:2], SamplingParams(temperature=0.0, max_new_tokens=4))
    assert torch.equal(g.response_ids[0], g.response_ids[1]) and (g.rollout_log_probs == 0).all()
    with pytest.raises(ValueError, match="top-k head needs"):
        engine.generate(prompts[:1], SamplingParams(temperature=0.0, fields=TOP_K_HEAD, top_k_width=2))
    with pytest.raises(ValueError, match="top-k head needs"):
        engine.generate(prompts[:1], SamplingParams(top_p=0.9, fields=TOP_K_HEAD, top_k_width=2))


def test_contract():
    from relax_authoring.testing import check_contract
    from relax_vllm.plugin import relax_register_rollout_engines

    check_contract(relax_register_rollout_engines()[0])


def test_routing_replay_with_vllm_refused_at_startup():
    from relax_core.config import RunConfig
    from relax_core.host.plugins import default_registry
    from relax_core.host.validation import resolve

    reg = default_registry()
    if "routing_replay" not in reg.names("correction"):
        pytest.skip("routing_replay correction not installed")
    _, problems = resolve(RunConfig(rollout_engine="vllm", correction=("routing_replay",)), reg)
    assert any("'routed_experts', which engine 'vllm' does not provide" in p.message for p in problems), problems
