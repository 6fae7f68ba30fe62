"""Every benchmark script still runs (``--smoke``: tiny sizes), and the suite driver's and
the end-to-end comparison's bookkeeping is right.  Benchmarks are not tests: nothing here
checks a timing, only that each script exits 0 and prints its table.  The smoke runs that load
models or start Ray take minutes and are marked slow (CI runs them: ``make test PYTEST_ARGS=""``);
the fast ones take about 20 s together, plus the GPU check's smoke run (about 50 s)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path[:0] = [str(BENCH), str(BENCH / "gpu")]
import check as gpu_check  # noqa: E402
import distillation  # noqa: E402
import e2e_trl  # noqa: E402
import learning_race  # noqa: E402
import run_all  # noqa: E402


def _smoke(name: str) -> subprocess.CompletedProcess:
    part = next(p for p in run_all.SUITE if p[0] == name)
    _, interp, script, _, smoke, _ = part
    if not Path(interp).exists():
        pytest.skip(f"{interp} is not installed here")
    if not (BENCH / script).exists():
        pytest.skip(f"benchmarks/{script} has not landed")
    if "--smoke" in smoke and not run_all.has_smoke_mode(BENCH / script):
        pytest.skip(f"benchmarks/{script} has no --smoke mode yet")
    return subprocess.run([str(interp), str(BENCH / script), *smoke], capture_output=True, text=True,
                          cwd=BENCH.parent, timeout=900)


def test_every_script_is_in_the_suite():
    """A new benchmark script must be added to run_all.SUITE (and so to this smoke test)."""
    listed = {p[2] for p in run_all.SUITE} | {"run_all.py", "e2e_reward.py"}
    # run on demand (distillation.py needs trained students); estimators.py is imported by algorithm.py
    helpers = {"hf_torch_smollm2.py", "estimators.py", "tools_call_probe.py", "distillation.py", "memory_stages.py"}
    assert {p.name for p in BENCH.glob("*.py")} - listed - helpers == set()


def test_run_part_stops_a_part_at_the_deadline():
    """The --budget safeguard: a part still running at the deadline is stopped (its whole
    process group), and what it printed so far is kept."""
    code = "import subprocess, sys, time; print('started', flush=True); " \
           "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    t0 = time.perf_counter()
    rc, out, _, stopped = run_all.run_part([sys.executable, "-c", code], {}, deadline=time.perf_counter() + 2.0)
    assert stopped and rc != 0 and out == ["started"]
    assert time.perf_counter() - t0 < 30  # the grandchild did not keep the pipe open for its 60 s
    rc, out, _, stopped = run_all.run_part([sys.executable, "-c", "print('done')"], {}, time.perf_counter() + 30)
    assert (rc, out, stopped) == (0, ["done"], False)


def test_e2e_summary_medians_and_paired_ratio():
    """Hand values: the warm-up step is dropped, each column is the median of the per-step
    values, and the paired ratio is the median of the back-to-back steps' ratios."""
    def rows(seconds, tokens):
        return [{"seconds": s, "cpu_seconds": s / 2, "gen_seconds": s / 4, "gen_tokens": t, "trained_tokens": t,
                 "rss_mb": 100.0 + i, "helpers_rss_mb": 1.0} for i, (s, t) in enumerate(zip(seconds, tokens))]

    results = {"relax": rows([10, 2, 4, 3], [100, 100, 100, 60]),  # counted rates 50, 25, 20
               "trl": rows([20, 4, 4, 6], [100, 100, 80, 60])}  # counted rates 25, 20, 10
    s = e2e_trl.summarise("tiny", results, {"relax": 1.0, "trl": 2.0}, warmup=1, batch=[2, 8, 64])
    assert s["counted"] == 3
    assert s["relax"]["trained_tok_s"] == 25 and s["trl"]["trained_tok_s"] == 20  # medians: ratio 1.25
    assert s["paired_trained_ratio"] == 2.0  # median of 50/25, 25/20, 20/10
    assert s["relax"]["s_per_step"] == 3 and s["trl"]["s_per_step"] == 4
    assert s["relax"]["gen_tok_s"] == 100 and s["trl"]["gen_tok_s"] == 80  # per step 4·tokens/seconds
    assert s["relax"]["gen_share"] == 0.25 and s["trl"]["peak_rss_mb"] == 103.0  # the warm-up counts for the peak
    text = e2e_trl.report([s], type("A", (), {"threads": 2, "bf16": True})())
    assert "paired trained tok/s ratio" in text and "2 torch threads per side; bfloat16 autocast on both sides" in text


def test_both_sides_of_the_matched_work_get_the_same_precision():
    common = dict(prompts=2, group=4, max_new=8, lr=1e-5, temperature=0.7, seed=0)
    for bf16 in (True, False):
        flags = e2e_trl.matched_relax_flags(model="m", data="d", **common, bf16=bf16)
        assert flags[-1] == ("--bf16" if bf16 else "--no-bf16")
        assert e2e_trl.matched_grpo_config(**common, bf16=bf16)["bf16"] is bf16


def test_algorithm_smoke():
    """The one smoke run in the fast suite (about 15 s): the pure-tensor benchmark."""
    p = _smoke("algorithm")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "agreement" in p.stdout and "relax/loop" in p.stdout and "grpo+icepop" in p.stdout
    assert "M2PO band solver" in p.stdout


@pytest.mark.slow
@pytest.mark.parametrize("name", [p[0] for p in run_all.SUITE if p[0] not in ("algorithm", "learning_race")])
def test_script_smoke(name):
    if name == "e2e_trl" and not (BENCH / ".envs" / "trl" / "bin" / "python").exists():
        pytest.skip("TRL venv absent (make benchmarks/.envs/trl/bin/python)")
    p = _smoke(name)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip()


def test_distillation_reverse_kl_is_zero_for_the_teacher_and_does_not_depend_on_padding(tmp_path):
    """``distillation.reverse_kl`` on prompts of different lengths (so rows are left-padded)
    and responses of 0-5 tokens: each row's value equals the same row computed alone (no
    padding) to 1e-5; the teacher against itself gives 0; a noisy copy gives more than 0;
    an empty response gives 0."""
    from transformers import AutoModelForCausalLM

    from relax_authoring.testing.models import make_tiny_model, noisy_copy

    teacher_dir = make_tiny_model(tmp_path / "teacher", config={"initializer_range": 0.3})
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir).eval()
    student = AutoModelForCausalLM.from_pretrained(noisy_copy(teacher_dir, tmp_path / "student", sigma=0.1)).eval()
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17], [18, 19, 20]]
    responses = [[30, 31, 32], [33, 34, 35, 36, 37], [], [38]]
    batched = distillation.reverse_kl(student, teacher, prompts, responses, pad=0, chunk=4)
    alone = [distillation.reverse_kl(student, teacher, [p], [r], pad=0)[0] for p, r in zip(prompts, responses)]
    assert batched == pytest.approx(alone, abs=1e-5)
    assert batched[2] == 0.0 and all(k > 0.01 for i, k in enumerate(batched) if i != 2)
    assert distillation.reverse_kl(teacher, teacher, prompts, responses, pad=0) == pytest.approx([0.0] * 4, abs=1e-6)


@pytest.mark.slow
def test_distillation_smoke():
    """``distillation.py --smoke``: a tiny teacher against itself (0 nats) and a noisy copy of
    it (more), on 4 prompts of the default held-out set."""
    p = subprocess.run([sys.executable, str(BENCH / "distillation.py"), "--smoke"], capture_output=True, text=True,
                       cwd=BENCH.parent, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = {line.split("|")[1].strip(): float(line.split("|")[2]) for line in p.stdout.splitlines()
            if line.startswith(("| teacher |", "| noisy |"))}
    assert rows["teacher"] == pytest.approx(0.0, abs=1e-4) and rows["noisy"] > 0.01, p.stdout


def test_learning_race_epsilon_prediction_and_criteria():
    """The check's prediction: one group std s = std(1, 0, 0, 1) = 0.57735 (unbiased), so
    Relax's gradient is TRL's × (s + 1e-4)/(s + 1e-6) = 1.000171; and each criterion fails
    on figures that miss it."""
    assert learning_race.predicted_norm_ratio(learning_race.CHECK_REWARDS) == pytest.approx(1.000171, abs=5e-7)
    good = {"same_initial_weights": True, "loss_relax": 3e-8, "loss_trl": -1.5e-8, "grad_cosine": 1.0,
            "norm_ratio": 1.000172, "norm_ratio_predicted": 1.000171, "delta_rel": 1e-5}
    assert learning_race.check_failures(good) == []
    for key, bad in [("same_initial_weights", False), ("loss_trl", 1e-3), ("grad_cosine", 0.9999),
                     ("norm_ratio", 1.0), ("delta_rel", 1e-2)]:
        failures = learning_race.check_failures({**good, key: bad})
        assert len(failures) == 1, (key, failures)


def test_learning_race_summary_by_hand():
    """TRL's best mean accuracy is 0.5 (step 4); Relax's mean curve reaches it at step 2
    (mean of 10 and 14 s = 12 s), TRL's at step 4 (40 s): ratio 0.3; per run, Relax seed 1
    first reaches 0.5 at step 4 (30 s)."""
    def run(side, seed, points):
        return {"side": side, "seed": seed, "checkpoints": [{"step": st, "t_s": t, "acc": acc} for st, t, acc in points]}

    runs = [run("relax", 0, [(2, 10, 0.6), (4, 20, 0.7)]), run("relax", 1, [(2, 14, 0.4), (4, 30, 0.6)]),
            run("trl", 0, [(2, 20, 0.2), (4, 40, 0.5)]), run("trl", 1, [(2, 22, 0.3), (4, 40, 0.5)])]
    s = learning_race.summary(runs)
    assert s["trl_best"] == 0.5 and s["t_relax"] == 12 and s["t_trl"] == 40 and s["ratio"] == pytest.approx(0.3)
    assert s["per_seed"] == {"relax": [10, 30], "trl": [40, 40]}
    assert s["final_relax"] == pytest.approx(0.65) and s["final_trl"] == 0.5
    c = learning_race.curves(runs, "relax")
    assert [(x["step"], x["min"], x["max"], x["seeds"]) for x in c] == [(2, 0.4, 0.6, 2), (4, 0.6, 0.7, 2)]
    assert learning_race.time_to(c, 0.9) is None


def test_learning_race_trl_gets_relax_prompt_order(tmp_path):
    """TRL's rows are Relax's recorded prompts, one per group, in Relax's order."""
    rows = [{"prompt": f"p{i}", "label": str(i)} for i in range(5)]
    (tmp_path / "trained_prompts.jsonl").write_text(
        '{"step": 1, "prompt_index": [3, 3, 0, 0], "group_index": [2, 2, 3, 3]}\n'
        '{"step": 2, "prompt_index": [4, 4, 3, 3], "group_index": [5, 5, 4, 4]}\n')
    assert [r["prompt"] for r in learning_race.trl_rows(tmp_path, rows)] == ["p3", "p0", "p4", "p3"]


def test_learning_race_knob_mismatch_is_found():
    """A knob that must be equal and differs stops the race (here the learning rate)."""
    relax = {"advantage_estimator": "grpo", "train_backend": "torch",
             "plugin_params": {"grpo": {"eps_clip": 0.2}, "torch": {"adam_beta1": 0.9}}, "lr": 3e-5}
    trl = {"learning_rate": 1e-6, "epsilon": 0.2, "adam_beta1": 0.9}
    bad = learning_race.knob_mismatches(relax, trl)
    assert any(b.startswith("learning rate:") for b in bad)
    assert not any(b.startswith(("PPO clip ε (low)", "AdamW β1")) for b in bad)  # the plugins' parameters are read


@pytest.mark.slow
def test_learning_race_smoke():
    """``learning_race.py --smoke``: the same-update check passes, then both sides train 2
    steps and every checkpoint is scored (Relax only, said so, without TRL's venv).  58 s at
    load average 0.1 on the 2-core machine (7 processes: 2 for the check, 2 trainings, 3
    evaluations)."""
    p = _smoke("learning_race")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    if (BENCH / ".envs" / "trl" / "bin" / "python").exists():
        assert "**passed**" in p.stdout and "| trl | 0 |" in p.stdout and "ratio Relax/TRL" in p.stdout
    else:
        assert "Relax only" in p.stdout
    assert "| relax | 0 |" in p.stdout and "start-up, checkpoint saves, exit" in p.stdout


def test_gpu_check_flops_reproduce_prime_rl_mfu():
    """The MFU convention is prime-rl's: its published 11896 tokens/s on an H100 for
    Qwen3-0.6B at 16384 tokens per sequence is 11.08 % MFU by its own figure."""
    from relax_authoring.testing.models import QWEN3_0_6B

    a = gpu_check.PRIME_RL_ANCHOR
    mfu = 100 * gpu_check.flops_per_token(QWEN3_0_6B, a["seq_len"]) * a["tokens_per_s"] / gpu_check.PEAK_BF16_FLOPS
    assert mfu == pytest.approx(a["mfu_pct"], abs=0.01)
    # by hand: 6 N (N = 176.2 M attention + 264.2 M MLP + 155.6 M head) + 12 L H q T
    assert gpu_check.flops_per_token(QWEN3_0_6B, 1) == 6 * (176_160_768 + 264_241_152 + 155_582_464) + 12 * 28 * 16 * 64


def test_gpu_check_smoke(tmp_path):
    """``benchmarks/gpu/check.py --smoke``: every part of the GPU check on the CPU at tiny
    sizes (CUDA tests collected and skipped, torch and megatron throughput rows, the whole
    loop), so that a broken script is found here and not on the GPU machine.  In the fast
    suite: about 50 s at load average 9 (23 s of CPU time), most of it the subprocesses'
    imports."""
    p = subprocess.run([sys.executable, str(BENCH / "gpu" / "check.py"), "--smoke", "--out", str(tmp_path)],
                       capture_output=True, text=True, cwd=BENCH.parent, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    text = (tmp_path / "gpu-check.md").read_text()
    tests = text.split("## CUDA tests", 1)[1].split("##", 1)[0]
    assert "exit 0" in tests and " skipped" in tests and "failed" not in tests
    rows = [line for line in text.splitlines() if line.startswith("| torch |")]
    assert len(rows) == 4 and all("OOM" not in r and "FAILED" not in r for r in rows)
    if importlib.util.find_spec("megatron") is not None:
        assert sum(line.startswith("| megatron | 32 |") or line.startswith("| megatron | 64 |")
                   for line in text.splitlines()) == 2
    loop = [line for line in text.splitlines() if line.startswith("| loop-cpu-0 | cpu |")]
    assert len(loop) == 1 and "FAILED" not in loop[0]


def test_learning_race_rerun_plan(tmp_path):
    """With --keep: --rerun's runs and both sides of --seeds' are done now; a TRL run needs
    its seed's Relax run, done now or in --work-dir; --rerun needs --keep, --keep needs
    --work-dir and something to run."""
    import argparse

    keep = tmp_path / "race.json"
    keep.write_text(json.dumps({"runs": [{"side": "relax", "seed": 1}, {"side": "trl", "seed": 1}]}))
    (tmp_path / "relax-seed1").mkdir()
    (tmp_path / "relax-seed1" / "trained_prompts.jsonl").write_text("")

    def plan(**kw):
        return learning_race.rerun_plan(argparse.Namespace(**{"rerun": None, "seeds": None, "keep": str(keep),
                                                              "work_dir": str(tmp_path), **kw}))

    kept, todo = plan(rerun="trl:1")
    assert todo == {("trl", 1)} and len(kept["runs"]) == 2
    assert plan(seeds="0")[1] == {("relax", 0), ("trl", 0)}
    assert plan(seeds="0", rerun="trl:1")[1] == {("relax", 0), ("trl", 0), ("trl", 1)}
    with pytest.raises(SystemExit, match="add relax:2"):
        plan(rerun="trl:2")
    with pytest.raises(SystemExit, match="add trl:1"):
        plan(rerun="relax:1")  # the kept runs say nothing of the order
    assert plan(rerun="relax:1,trl:1")[1] == {("relax", 1), ("trl", 1)}
    # Relax alone beside its kept TRL run: where the TRL run recorded its prompt order (checked
    # after the new run), or where the kept Relax run's order is the uniform sampler's seeded
    # shuffle, decided by code unchanged since the kept commit (here HEAD itself)
    head = subprocess.run(["git", "-C", str(learning_race.ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    uniform = {"sampler": "uniform", "reward_processor": []}
    for trl, relax, commit, ok in [({"prompt_order_sha256": "ab"}, {}, "", True),
                                   ({}, uniform, head, True),
                                   ({}, uniform, head + " (uncommitted changes)", False),
                                   ({}, uniform, "0000000", False),
                                   ({}, {**uniform, "sampler": "curriculum"}, head, False),
                                   ({}, {**uniform, "reward_processor": ["dynamic_filter"]}, head, False)]:
        keep.write_text(json.dumps({"machine": {"git commit": commit},
                                    "runs": [{"side": "relax", "seed": 1, "config": relax},
                                             {"side": "trl", "seed": 1, **trl}]}))
        if ok:
            assert plan(rerun="relax:1")[1] == {("relax", 1)}
        else:
            with pytest.raises(SystemExit, match="may not repeat: add trl:1"):
                plan(rerun="relax:1")
    learning_race.check_kept_order({"seed": 1, "prompt_order_sha256": "ab"}, {"prompt_order_sha256": "ab"})
    learning_race.check_kept_order({"seed": 1, "prompt_order_sha256": "ab"}, {})
    with pytest.raises(RuntimeError, match="another prompt order"):
        learning_race.check_kept_order({"seed": 1, "prompt_order_sha256": "ab"}, {"prompt_order_sha256": "cd"})
    with pytest.raises(SystemExit, match="expected relax:SEED"):
        plan(rerun="ppo:1")
    with pytest.raises(SystemExit, match="nothing to run"):
        plan()
    with pytest.raises(SystemExit, match="needs the --work-dir"):
        plan(rerun="trl:1", work_dir=None)
    with pytest.raises(SystemExit, match="needs --keep"):
        plan(rerun="trl:1", keep=None)
    assert plan(keep=None) == (None, set())
