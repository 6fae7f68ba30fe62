"""The hf engine against independent references: teacher-forced forwards of the same model
on each sample alone (no padding, no KV cache), hand-derived warper values, and the
route recorder on a full forward."""

import math

import pytest
import torch

from relax_core.batch import TOP_K_HEAD
from relax_core.contracts import SamplingParams
from relax_hf.engine import HFEngine, apply_repetition_penalty, sample_categorical, warp_logits


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return HFEngine(str(tiny_model_dir), seed=0)


@pytest.fixture(scope="module")
def prompts(engine):
    tok = engine.tokenizer
    msgs = ["What is 2+3?", "Hi", "Name a prime number larger than ten, please."]
    out = [tok.apply_chat_template([{"role": "user", "content": m}], add_generation_prompt=True)["input_ids"]
           for m in msgs]
    return out + [[7, 8], out[0], out[0]]  # a 2-token prompt (heavy left padding); a repeated prompt (a group)


def teacher_forced_logits(model, prompt, response):
    """float32 [len(response), V]: logits predicting each response token, one sample alone."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    return logits[len(prompt) - 1: len(prompt) - 1 + len(response)]


def responses(out):
    return [row[:n].tolist() for row, n in zip(out.response_ids, out.response_lengths.tolist())]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_log_probs_equal_teacher_forced_forward(engine, prompts, temperature):
    out = engine.generate(prompts, SamplingParams(temperature=temperature, max_new_tokens=12, seed=3))
    assert out.rollout_log_probs.dtype == torch.float32 and out.response_ids.dtype == torch.long
    assert out.response_ids.shape == out.rollout_log_probs.shape == (len(prompts), int(out.response_lengths.max()))
    for i, (p, r) in enumerate(zip(prompts, responses(out))):
        ref = (teacher_forced_logits(engine.model, p, r) / temperature).log_softmax(-1)
        ref = ref.gather(1, torch.tensor(r)[:, None]).squeeze(1)
        torch.testing.assert_close(out.rollout_log_probs[i, :len(r)], ref, atol=1e-5, rtol=0)


def test_greedy_is_argmax_with_zero_log_prob(engine, prompts):
    s = SamplingParams(temperature=0.0, max_new_tokens=6)
    out = engine.generate(prompts, s)
    for i, (p, r) in enumerate(zip(prompts, responses(out))):
        assert r == teacher_forced_logits(engine.model, p, r).argmax(-1).tolist()
        assert torch.all(out.rollout_log_probs[i, :len(r)] == 0)  # point-mass sampling distribution
    # greedy does not depend on how prompts are chunked
    chunked = HFEngine.__new__(HFEngine)
    chunked.__dict__.update(engine.__dict__, max_batch_size=2)
    again = chunked.generate(prompts, s)
    assert torch.equal(again.response_ids, out.response_ids)
    with pytest.raises(ValueError, match="top-k head needs temperature"):
        engine.generate(prompts, SamplingParams(temperature=0.0, fields=TOP_K_HEAD, top_k_width=4))


def test_seed_reproducible_and_stream_advances(engine, prompts):
    s = SamplingParams(max_new_tokens=8, seed=11)
    a, b = engine.generate(prompts, s), engine.generate(prompts, s)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.rollout_log_probs, b.rollout_log_probs)
    c = engine.generate(prompts, SamplingParams(max_new_tokens=8, seed=12))
    assert not torch.equal(a.response_ids, c.response_ids)
    u = SamplingParams(max_new_tokens=8)  # no seed: the engine's stream moves on
    assert not torch.equal(engine.generate(prompts, u).response_ids, engine.generate(prompts, u).response_ids)


def test_warp_logits_hand_values():
    z = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    p = torch.tensor([math.exp(v) for v in (2.0, 1.0, 0.0, -1.0)])
    p = p / p.sum()  # [0.6439, 0.2369, 0.0871, 0.0321]
    inf = float("-inf")
    # top-p 0.5: the first token alone reaches 0.64 >= 0.5
    assert warp_logits(z, 1.0, -1, 0.5).tolist() == [[2.0, inf, inf, inf]]
    # top-p 0.7: mass before token 2 is 0.64 < 0.7 -> kept; before token 3 is 0.88 -> dropped
    assert warp_logits(z, 1.0, -1, 0.7).tolist() == [[2.0, 1.0, inf, inf]]
    assert warp_logits(z, 1.0, -1, 0.9).tolist() == [[2.0, 1.0, 0.0, inf]]  # 0.88 < 0.9
    assert warp_logits(z, 0.5, 3, 1.0).tolist() == [[4.0, 2.0, 0.0, inf]]
    # log q after top-k 2: log(p0 / (p0 + p1))
    lq = warp_logits(z, 1.0, 2, 1.0).log_softmax(-1)
    assert lq[0, 0].item() == pytest.approx(math.log(p[0] / (p[0] + p[1])), abs=1e-6)
    # ties at the k-th value are kept; rows are independent
    zz = torch.tensor([[1.0, 1.0, 0.0], [3.0, 2.0, 1.0]])
    assert warp_logits(zz, 1.0, 1, 1.0).tolist() == [[1.0, 1.0, inf], [3.0, inf, inf]]


def test_repetition_penalty_hand_values():
    z = torch.tensor([[2.0, -1.0, 0.5, 0.0]])
    seen = torch.tensor([[True, True, False, True]])
    assert apply_repetition_penalty(z, seen, 2.0).tolist() == [[1.0, -2.0, 0.5, 0.0]]


def test_top_k_top_p_log_q_and_support(engine, prompts):
    s = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, repetition_penalty=1.2, max_new_tokens=8, seed=5)
    out = engine.generate(prompts, s)
    vocab = engine.model.config.vocab_size
    for i, (p, r) in enumerate(zip(prompts, responses(out))):
        logits = teacher_forced_logits(engine.model, p, r)
        seen = torch.zeros(vocab, dtype=torch.bool)
        seen[p] = True
        for t, y in enumerate(r):
            z = apply_repetition_penalty(logits[t:t + 1], seen[None], 1.2)
            w = warp_logits(z, 0.8, 20, 0.9)
            assert torch.isfinite(w[0, y])  # sampled inside the kept set
            assert out.rollout_log_probs[i, t].item() == pytest.approx(w.log_softmax(-1)[0, y].item(), abs=1e-5)
            seen[y] = True


def test_top_k_head(engine, prompts):
    s = SamplingParams(temperature=0.9, max_new_tokens=6, seed=2, fields=TOP_K_HEAD, top_k_width=5)
    out = engine.generate(prompts, s)
    assert out.top_k_ids.shape == out.top_k_log_probs.shape == (*out.response_ids.shape, 5)
    for i, (p, r) in enumerate(zip(prompts, responses(out))):
        ref = (teacher_forced_logits(engine.model, p, r) / 0.9).log_softmax(-1)  # full vocabulary
        torch.testing.assert_close(out.top_k_log_probs[i, :len(r)], ref.gather(1, out.top_k_ids[i, :len(r)]),
                                   atol=1e-5, rtol=0)
        torch.testing.assert_close(out.top_k_log_probs[i, :len(r)], ref.topk(5, -1).values, atol=1e-5, rtol=0)


def test_eos_first_gives_empty_text(engine, prompts):
    # make the greedy first token of every prompt an EOS token
    firsts = [teacher_forced_logits(engine.model, p, [0])[0].argmax().item() for p in prompts]
    saved = engine.eos_token_ids
    engine.eos_token_ids = sorted(set(firsts))
    try:
        out = engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=5))
    finally:
        engine.eos_token_ids = saved
    assert out.response_lengths.tolist() == [1] * len(prompts)
    assert out.response_ids[:, 0].tolist() == firsts
    assert not out.truncated.any()
    assert out.response_ids.shape == (len(prompts), 1)


def test_truncation_and_eos_lengths(engine, prompts):
    out = engine.generate(prompts, SamplingParams(max_new_tokens=5, seed=0))
    # a random tiny model essentially never samples EOS: every row hits the limit
    assert out.truncated.all() and out.response_lengths.tolist() == [5] * len(prompts)
    # a real EOS ends the row: stop at the greedy token of step 2 of prompt 0
    greedy = engine.generate(prompts[:1], SamplingParams(temperature=0.0, max_new_tokens=5))
    saved = engine.eos_token_ids
    engine.eos_token_ids = [greedy.response_ids[0, 2].item()]
    try:
        out = engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=5))
    finally:
        engine.eos_token_ids = saved
    first_eos = greedy.response_ids[0].tolist().index(greedy.response_ids[0, 2].item()) + 1
    assert out.response_lengths[0].item() == first_eos and not out.truncated[0]
    assert (out.response_ids[0, first_eos:] == engine.pad_token_id).all()


def test_stop_strings(engine, prompts):
    s = SamplingParams(temperature=0.0, max_new_tokens=8)
    full = engine.generate(prompts, s)
    ids0 = full.response_ids[0, :8].tolist()
    stop = engine.tokenizer.decode(ids0[2:4])  # text of tokens 2..3 of row 0
    out = engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=8, stop=(stop,)))
    n = out.response_lengths[0].item()
    assert n <= 4 and stop in engine.tokenizer.decode(ids0[:n])
    assert stop not in engine.tokenizer.decode(ids0[:n - 1])
    assert out.response_ids[0, :n].tolist() == ids0[:n] and not out.truncated[0]
    for i in range(1, len(prompts)):  # other rows: stopped where their own text first contains it, or full
        r = full.response_ids[i].tolist()
        texts = [engine.tokenizer.decode(r[:j]) for j in range(1, 9)]
        want = next((j + 1 for j, x in enumerate(texts) if stop in x), 8)
        assert out.response_lengths[i].item() == want


def test_update_weights_changes_outputs(tiny_model_dir, tmp_path, prompts):
    from relax_authoring.testing.models import make_tiny_model
    from relax_core.models import load_model

    eng = HFEngine(str(tiny_model_dir), seed=0)
    s = SamplingParams(max_new_tokens=6, seed=1)
    before = eng.generate(prompts, s)
    other = load_model(str(make_tiny_model(tmp_path / "other", seed=1)))
    eng.update_weights(other.state_dict(), version=3)
    assert eng.weight_version == 3
    after = eng.generate(prompts, s)
    assert not torch.equal(before.rollout_log_probs, after.rollout_log_probs)
    for i, (p, r) in enumerate(zip(prompts, responses(after))):  # now sampling from the new weights
        ref = teacher_forced_logits(other, p, r).log_softmax(-1).gather(1, torch.tensor(r)[:, None]).squeeze(1)
        torch.testing.assert_close(after.rollout_log_probs[i, :len(r)], ref, atol=1e-5, rtol=0)
    sd = dict(other.state_dict())
    sd.pop("model.norm.weight")
    with pytest.raises(KeyError, match="missing"):
        eng.update_weights(sd, version=4)
    sd = dict(other.state_dict(), **{"extra.weight": torch.zeros(1)})
    with pytest.raises(KeyError, match="unknown"):
        eng.update_weights(sd, version=4)



def test_shared_weights_sample_what_copied_weights_sample(tiny_model_dir, tmp_path, prompts):
    """``update_weights(..., share=True)`` (a synchronous local run's push): the engine
    samples from the trainer's tensors themselves, exactly as from a copy, and sees their
    in-place updates (an optimizer step) without another copy."""
    from relax_authoring.testing.models import make_tiny_model
    from relax_core.models import load_model

    trainer = load_model(str(make_tiny_model(tmp_path / "trainer", seed=1)))
    shared, copied = HFEngine(str(tiny_model_dir), seed=0), HFEngine(str(tiny_model_dir), seed=0)
    s = SamplingParams(max_new_tokens=6, seed=1)
    for step in (1, 2):
        sd = {k: v.detach() for k, v in trainer.state_dict().items()}
        shared.update_weights(sd, version=step, share=True)
        copied.update_weights(sd, version=step)
        a, b = shared.generate(prompts, s), copied.generate(prompts, s)
        assert torch.equal(a.response_ids, b.response_ids)
        assert torch.equal(a.rollout_log_probs, b.rollout_log_probs)
        assert shared.model.lm_head.weight.data_ptr() == trainer.lm_head.weight.data_ptr()
        assert copied.model.lm_head.weight.data_ptr() != trainer.lm_head.weight.data_ptr()
        with torch.no_grad():
            for p in trainer.parameters():
                p.mul_(0.9)  # the next optimizer step, in place
    assert torch.equal(shared.model.model.norm.weight, trainer.model.norm.weight)


def test_bf16_engine_released_between_pushes_samples_as_one_that_kept_its_copy(tiny_model_dir, tmp_path, prompts):
    """A bfloat16 engine beside a float32 trainer (``--bf16``): ``release_weights`` (before
    each training step) frees its bfloat16 copy, the push after the step converts the new
    weights into fresh storage, and it samples exactly what an engine that kept its copy
    samples; generating while released raises instead of sampling from nothing."""
    from relax_authoring.testing.models import make_tiny_model
    from relax_core.models import load_model

    trainer = load_model(str(make_tiny_model(tmp_path / "trainer", seed=1)))
    released, kept = (HFEngine(str(tiny_model_dir), seed=0, dtype="bfloat16") for _ in range(2))
    s = SamplingParams(max_new_tokens=6, seed=1)
    for step in (1, 2):
        released.release_weights()
        assert all(p.numel() == 0 for p in released.model.parameters())
        with pytest.raises(RuntimeError, match="released"):
            released.generate(prompts, s)
        with torch.no_grad():
            for p in trainer.parameters():
                p.mul_(0.9)  # the optimizer step
        sd = {k: v.detach() for k, v in trainer.state_dict().items()}
        released.update_weights(sd, version=step, share=True)
        kept.update_weights(sd, version=step, share=True)
        a, b = released.generate(prompts, s), kept.generate(prompts, s)
        assert released.model.lm_head.weight.dtype == torch.bfloat16
        assert torch.equal(a.response_ids, b.response_ids)
        assert torch.equal(a.rollout_log_probs, b.rollout_log_probs)


def test_bad_inputs(engine):
    with pytest.raises(ValueError):
        engine.generate([], SamplingParams())
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate([[1, 2], []], SamplingParams())
    with pytest.raises(ValueError, match="not a mixture-of-experts"):
        engine.generate([[1, 2]], SamplingParams(fields=frozenset({"routed_experts"})))


def test_routed_experts_match_a_full_forward(tiny_moe_model_dir):
    from relax_routing_replay.routes import record_routes

    eng = HFEngine(str(tiny_moe_model_dir), seed=0)
    prompts = [[1, 4093, 198, 1780, 314], [1, 520, 9531]]
    out = eng.generate(prompts, SamplingParams(max_new_tokens=5, seed=0, fields=frozenset({"routed_experts"})))
    n_layers = eng.model.config.num_hidden_layers
    assert out.routed_experts.shape == (2, out.response_ids.shape[1], n_layers, 2)
    for i, (p, r) in enumerate(zip(prompts, responses(out))):
        ref = (teacher_forced_logits(eng.model, p, r) ).log_softmax(-1).gather(1, torch.tensor(r)[:, None]).squeeze(1)
        torch.testing.assert_close(out.rollout_log_probs[i, :len(r)], ref, atol=1e-5, rtol=0)
        with record_routes(eng.model) as rec, torch.no_grad():
            eng.model(input_ids=torch.tensor([p + r]))
        full = rec.routes()[0]  # [S, L, E]
        want = full[len(p) - 1: len(p) - 1 + len(r)]  # input positions predicting each response token
        assert torch.equal(out.routed_experts[i, :len(r)].sort(-1).values, want.sort(-1).values)
        assert (out.routed_experts[i, len(r):] == -1).all()


def test_contract():
    from relax_authoring.testing import check_contract
    from relax_hf.plugin import relax_register_rollout_engines

    check_contract(relax_register_rollout_engines()[0])


def test_sample_categorical_frequencies_support_and_seed():
    """Inverse-CDF sampling draws each token with its probability (within 5 standard
    errors over 200 000 draws per row), never a zero-probability token, and repeats a
    seeded stream."""
    p = torch.tensor([[0.5, 0.0, 0.2, 0.3, 0.0],
                      [0.0, 0.0, 0.0, 0.0, 1.0],  # all mass on the last token
                      [1.0, 0.0, 0.0, 0.0, 0.0],  # ... on the first
                      [0.1, 0.1, 0.1, 0.1, 0.1]])  # unnormalised (sums to 0.5): normalised by the sampler
    n = 200_000
    log_probs = p.log().repeat_interleave(n, 0)  # [4n, 5], -inf at zero probability
    tok = sample_categorical(log_probs, torch.Generator().manual_seed(0))
    assert tok.shape == (4 * n,) and tok.dtype == torch.long
    freq = torch.stack([torch.bincount(tok[i * n:(i + 1) * n], minlength=5) for i in range(4)]).double() / n
    q = (p / p.sum(-1, keepdim=True)).double()
    assert torch.all(freq[q == 0] == 0)
    assert torch.all((freq - q).abs() <= 5 * (q * (1 - q) / n).sqrt() + 1e-12)
    again = sample_categorical(log_probs[:1000], torch.Generator().manual_seed(0))
    assert torch.equal(again, tok[:1000])


def test_sample_categorical_refuses_a_non_finite_distribution():
    """NaN logits must fail loudly, not return the out-of-range id V (review finding)."""
    log_probs = torch.log_softmax(torch.randn(4, 3), -1)
    log_probs[2] = float("nan")
    with pytest.raises(ValueError, match=r"rows \[2\] .* not finite"):
        sample_categorical(log_probs, torch.Generator().manual_seed(0))
