"""On-policy distillation: the pinned term and its reduction, masking, the policy gradient it
gives, the startup refusals (estimator, teacher, backend, tokenizer), and a run of the real
loop that is a learning test (a noisy student distilled towards its clean teacher)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from relax_core.config import RunConfig
from relax_core.contracts import AdvantageInput
from relax_core.host.plugins import default_registry
from relax_core.host.validation import resolve
from relax_core.numerics import reduce_loss
from relax_core.policy import ppo_clip_loss
from relax_opd.opd import OPD, build, reverse_kl
from relax_opd.plugin import OPDParams

NAN = float("nan")


def term(coef, old, teacher, mask):
    out = OPD(coef).advantage_term(AdvantageInput(old_log_probs=torch.tensor(old), teacher_log_probs=torch.tensor(teacher),
                                                  loss_mask=torch.tensor(mask)))
    return out.term, out.metrics


def test_pinned_term_and_metrics():
    """The module docstring's values: d = [0.5, −1.5], −β·d = [−0.25, 0.75], mean d = −0.5."""
    t, m = term(0.5, [[-1.0, -2.0]], [[-1.5, -0.5]], [[True, True]])
    torch.testing.assert_close(t, torch.tensor([[-0.25, 0.75]]), atol=0, rtol=0)
    assert t.dtype == torch.float32 and not t.requires_grad
    assert m == {"opd/reverse_kl": -0.5, "opd/advantage_term_abs_mean": 0.5}


def test_masked_positions_hold_garbage_and_the_reduction_is_over_valid_tokens():
    """Row 0: d = [0.5, −0.6, −2.0]; row 1 (one valid token): d = [2.0], NaN/1e9 beyond.
    Token mean over the 4 valid tokens: −0.1/4 = −0.025; |β·d| mean (β = 2): 2·5.1/4 = 2.55."""
    old = [[-0.2, -1.0, -3.0], [-0.1, NAN, 1e9]]
    teacher = [[-0.7, -0.4, -1.0], [-2.1, 1e9, NAN]]
    mask = [[True, True, True], [True, False, False]]
    t, m = term(2.0, old, teacher, mask)
    torch.testing.assert_close(t, torch.tensor([[-1.0, 1.2, 4.0], [-4.0, 0.0, 0.0]]), rtol=1e-6, atol=1e-6)
    assert m["opd/reverse_kl"] == pytest.approx(-0.025, abs=1e-6)
    assert m["opd/advantage_term_abs_mean"] == pytest.approx(2.55, abs=1e-6)
    d = reverse_kl(torch.tensor(old), torch.tensor(teacher), torch.tensor(mask))
    assert torch.isfinite(d).all() and d[1, 1:].eq(0).all()


def test_no_valid_token():
    t, m = term(1.0, [[NAN, 1e9]], [[1e9, NAN]], [[False, False]])
    assert t.eq(0).all() and m == {"opd/reverse_kl": 0.0, "opd/advantage_term_abs_mean": 0.0}


def test_missing_inputs_and_bad_coef_raise():
    with pytest.raises(ValueError, match="teacher_log_probs"):
        OPD(1.0).advantage_term(AdvantageInput(old_log_probs=torch.zeros(1, 2), loss_mask=torch.ones(1, 2, dtype=torch.bool)))
    with pytest.raises(ValueError, match="old_log_probs"):
        OPD(1.0).advantage_term(AdvantageInput(teacher_log_probs=torch.zeros(1, 2), loss_mask=torch.ones(1, 2, dtype=torch.bool)))
    with pytest.raises(ValueError, match="opd-coef"):
        OPD(0.0)
    assert build(OPDParams(coef=0.3), None).coef == 0.3


def test_gradient_of_the_policy_loss_with_the_term_matches_the_analytic_one():
    """GRPO's PPO-clip loss with A' = A − β·d, token-mean over the 4 valid tokens; every ratio
    inside the clip band, so dL/d log π_θ(y_t) = −r_t·A'_t / 4 (0 at masked positions), and d
    itself carries no gradient (it is built from the detached old and teacher log-probs)."""
    old = torch.tensor([[-0.2, -1.0, -3.0], [-0.1, NAN, 1e9]])
    teacher = torch.tensor([[-0.7, -0.4, -1.0], [-2.1, 1e9, NAN]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    task = torch.tensor([[1.0, 1.0, 1.0], [-1.0, 0.0, 0.0]])  # a group advantage broadcast to tokens
    adv = task + OPD(0.5).advantage_term(AdvantageInput(old_log_probs=old, teacher_log_probs=teacher,
                                                         loss_mask=mask)).term
    torch.testing.assert_close(adv[mask], torch.tensor([0.75, 1.3, 2.0, -2.0]), rtol=1e-6, atol=1e-6)
    delta = torch.tensor([[0.05, -0.1, 0.02], [0.15, 0.0, 0.0]])
    log_probs = torch.where(mask, old + delta, torch.zeros(())).requires_grad_(True)
    pl = ppo_clip_loss(log_probs, old, adv, mask, eps_clip=0.2)
    loss = reduce_loss(pl.loss, mask, "token-mean", num_tokens=4.0)
    (grad,) = torch.autograd.grad(loss, log_probs)
    r = torch.exp(delta)
    expected = torch.where(mask, -r * torch.nan_to_num(adv) / 4, torch.zeros(()))
    torch.testing.assert_close(grad, expected, rtol=1e-6, atol=1e-7)
    assert loss.item() == pytest.approx(float(-(r[mask] * adv[mask]).sum() / 4), rel=1e-6)


def test_contract_kit():
    from relax_authoring.testing import check_contract
    from relax_opd.plugin import relax_register_corrections

    check_contract(relax_register_corrections()[0])


# --------------------------------------------------------------------------- startup refusals


def problems(**cfg):
    _, out = resolve(RunConfig(**cfg), default_registry())
    return out


def test_estimator_that_cannot_take_an_advantage_term_is_refused():
    [p] = problems(advantage_estimator="gspo", correction=("opd",), teacher_model="smollm2-135m-instruct")
    assert p.constraint == "accepts_advantage_terms" and p.component.startswith("estimator 'gspo'")
    assert "gspo cannot take a per-token advantage term, which correction 'opd' adds" in p.message
    assert "adv terms" in p.fix and "drop that --correction" in p.fix
    from typer.testing import CliRunner

    from cli.main import app

    res = CliRunner().invoke(app, ["train", "--dry-run", "--estimator", "gspo", "--correction", "opd",
                                   "--teacher-model", "smollm2-135m-instruct"])
    assert res.exit_code == 2 and "accepts_advantage_terms" in res.output
    for name in ("grpo", "rloo", "cispo", "sapo", "m2po", "ppo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"):
        extra = {"kl_coef": 0.01} if name == "reinforce_plus_plus" else {}
        assert not [q for q in problems(advantage_estimator=name, correction=("opd",), teacher_model="smollm2-135m-instruct",
                                        **extra) if q.constraint == "accepts_advantage_terms"], name


def test_teacher_refusals():
    [p] = problems(correction=("opd",))
    assert "'teacher_log_probs', which needs a teacher: --teacher-model is not set" in p.message
    assert p.fix == "set --teacher-model"
    [p] = problems(teacher_model="smollm2-135m-instruct")
    assert p.constraint == "--teacher-model" and "no selected component reads its log-probs" in p.message
    assert "--correction opd" in p.fix
    [p] = problems(correction=("opd",), teacher_model="/nonexistent/teacher")
    assert p.message == "teacher model /nonexistent/teacher not found"
    by = {q.constraint: q for q in problems(train_backend="megatron", correction=("opd",),
                                            teacher_model="smollm2-135m-instruct")}
    assert "megatron does not compute a teacher's log-probs" in by["provides_fields"].message
    assert "'teacher_log_probs', which backend 'megatron' does not provide" in by["requires_fields"].message


def test_every_reward_weight_zero_is_pure_distillation_only_with_the_term():
    [p] = problems(reward_weights=(0.0,))
    assert p.message.startswith("every weight is 0") and "--correction opd" in p.fix
    assert problems(reward_weights=(0.0,), correction=("opd",), teacher_model="smollm2-135m-instruct") == []


def test_tokenizer_difference_names_it():
    from relax_authoring.testing.models import byte_tokenizer
    from relax_core.models import tokenizer_difference

    a, b = byte_tokenizer(), byte_tokenizer()
    assert tokenizer_difference(a, b) is None
    b.eos_token = "<|im_start|>"
    assert tokenizer_difference(a, b) == "eos id 256 vs 258"


def test_teacher_with_another_tokenizer_exits_2_before_weights_load(tiny_model_dir, tiny_bytes_model_dir):
    from typer.testing import CliRunner

    from cli.main import app

    res = CliRunner().invoke(app, ["train", "--dry-run", "--model", str(tiny_model_dir), "--correction", "opd",
                                   "--teacher-model", str(tiny_bytes_model_dir)])
    assert res.exit_code == 2
    out = " ".join(res.output.split())
    assert f"--teacher-model {tiny_bytes_model_dir}: its tokenizer is not --model's (vocab size 49152 vs 259; " \
           "eos id 2 vs 256" in out
    from relax_core.run.launch import teacher_problems

    same = RunConfig(model=str(tiny_model_dir), teacher_model=str(tiny_model_dir))
    assert teacher_problems(same, model_failed=False) == []
    assert teacher_problems(RunConfig(teacher_model="/nonexistent/t"), model_failed=False) == [
        "--teacher-model /nonexistent/t: no such directory; give a local Hugging Face model directory, a hub name, "
        "or the default smollm2-135m-instruct"]


def test_teacher_with_fewer_embedding_rows_is_refused(tiny_model_dir, tmp_path):
    """Same tokenizer, but the student's padded vocabulary is larger than the teacher's: an
    id the student can sample would index past the teacher's embedding."""
    import json
    import shutil

    from relax_core.run.launch import teacher_problems

    student = tmp_path / "student"
    shutil.copytree(tiny_model_dir, student)
    config = json.loads((student / "config.json").read_text())
    rows = config["vocab_size"]
    config["vocab_size"] = rows + 64
    (student / "config.json").write_text(json.dumps(config))
    assert teacher_problems(RunConfig(model=str(student), teacher_model=str(tiny_model_dir)), model_failed=False) == [
        f"--teacher-model {tiny_model_dir}: its embedding has {rows} rows, fewer than --model's {rows + 64}, so a "
        f"sampled id in {rows}..{rows + 63} (a padding row) would have no teacher log-prob: choose a teacher whose "
        "vocab_size is at least the student's"]
    # a teacher with more rows than the student is fine (a larger model of the family)
    assert teacher_problems(RunConfig(model=str(tiny_model_dir), teacher_model=str(student)), model_failed=False) == []


# --------------------------------------------------------------------------- runs of the real loop


def held_out_reverse_kl(student_dir, teacher_dir):
    """Mean full-vocabulary KL(π_student ‖ π_teacher) (nats per token) over 8 tokens the
    student samples (temperature 1, seed 0) after each of 4 prompts the run never trains on."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(teacher_dir)
    student = AutoModelForCausalLM.from_pretrained(student_dir)
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir)
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"What is {a} + {b}?"}], tokenize=False,
                                       add_generation_prompt=True) for a, b in ((3, 4), (5, 1), (2, 8), (7, 7))]
    enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left")
    torch.manual_seed(0)
    with torch.no_grad():
        ids = student.generate(**enc, do_sample=True, temperature=1.0, top_k=0, max_new_tokens=8,
                               min_new_tokens=8, pad_token_id=tok.pad_token_id)
        att = torch.cat([enc.attention_mask, torch.ones(ids.shape[0], ids.shape[1] - enc.input_ids.shape[1],
                                                        dtype=torch.long)], 1)
        p = enc.input_ids.shape[1]
        ls = torch.log_softmax(student(ids, attention_mask=att).logits[:, p - 1:-1].float(), -1)
        lt = torch.log_softmax(teacher(ids, attention_mask=att).logits[:, p - 1:-1].float(), -1)
    return float((ls.exp() * (ls - lt)).sum(-1).mean())


def test_noisy_student_learns_towards_its_clean_teacher(tmp_path):
    """Teacher: a tiny Qwen3 with weights of std 0.3 (peaked distributions); student: the same
    with N(0, 0.1²) added to every matrix.  6 steps of pure distillation (8 samples each, lr
    3e-3) must cut the held-out reverse KL by at least 10 % (measured: 3.97 → 3.15 nats).
    Every step the teacher's log-probs are computed (the logged reverse KL is finite and not
    0), the old log-probs are recomputed, and with every reward weight 0 (GRPO's group
    advantages all 0) the advantages are the distillation term alone."""
    from relax_authoring.testing.models import make_tiny_model, noisy_copy
    from relax_core.run.launch import configure, launch

    teacher = make_tiny_model(tmp_path / "teacher", config={"initializer_range": 0.3})
    student = noisy_copy(teacher, tmp_path / "student", sigma=0.1)
    before = held_out_reverse_kl(student, teacher)
    reg = default_registry()
    cfg, resolved, _ = configure([
        "--model", str(student), "--teacher-model", str(teacher), "--correction", "opd", "--reward-weights", "0",
        "--num-rollout", "6", "--rollout-batch-size", "4", "--n-samples-per-prompt", "2",
        "--rollout-max-response-len", "8", "--lr", "3e-3", "--rollout-temperature", "1", "--eval-data", "none",
        "--output-dir", str(tmp_path / "runs"), "--run-name", "r", "--quiet", "--wandb-mode", "disabled"], reg)
    assert launch(cfg, resolved, reg) == 0
    after = held_out_reverse_kl(tmp_path / "runs" / "r" / "final", teacher)
    rows = [json.loads(x) for x in (tmp_path / "runs" / "r" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/loss" in r]
    assert len(steps) == 6
    for m in steps:
        assert math.isfinite(m["opd/reverse_kl"]) and m["opd/reverse_kl"] != 0
        assert m["train/old_logp_source"] == 1.0
        assert m["rollout/advantage_abs_mean"] == pytest.approx(m["opd/advantage_term_abs_mean"], rel=1e-6)
    print(f"held-out reverse KL: {before:.4f} -> {after:.4f} nats/token")
    assert after < 0.9 * before, (before, after)
