"""The loop alone, with a fake engine/backend (a bigram policy) and the real GRPO estimator:
stage wiring, global-batch metrics, learning, exact resume, non-finite skips, debug replay."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from fakes import count_sevens, make_fakes  # noqa: E402

from relax_core.config import RunConfig  # noqa: E402
from relax_core.data import DataCursor, load_dataset  # noqa: E402
from relax_core.reporting.metrics import read_metrics  # noqa: E402
from relax_core.run.components import Components  # noqa: E402
from relax_core.run.exits import EXIT_INTERRUPTED, EXIT_OK, EXIT_SKIPPED  # noqa: E402
from relax_core.trainer import OLD_LOGP_CURRENT, OLD_LOGP_RECOMPUTED, Trainer, build_trainer  # noqa: E402

grpo = pytest.importorskip("relax_grpo.grpo")
GRPOParams = pytest.importorskip("relax_grpo.plugin").GRPOParams


def _data(tmp: Path, n: int = 6) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    p = tmp / "train.jsonl"
    p.write_text("".join(json.dumps({"prompt": f"q{i}" * (i + 1), "label": i}) + "\n" for i in range(n)))
    return p


def make_trainer(tmp: Path, fakes=None, sampler=DataCursor, **over) -> tuple[Trainer, object]:
    """A trainer on the fakes; ``sampler``: ``fn(num_rows, seed)`` (a sampler factory's result)."""
    kw = dict(data=str(_data(tmp)), output_dir=str(tmp / "runs"), run_name="r", num_rollout=3, rollout_batch_size=2,
              n_samples_per_prompt=4, rollout_max_response_len=6, quiet=True, seed=7, lr=0.5)
    kw.update(over)
    cfg = RunConfig(**kw)
    fakes = fakes or make_fakes(seed=0)
    est = grpo.build(GRPOParams(), cfg)
    data = load_dataset(cfg.data, cfg)
    comps = Components(engine=fakes.engine, backend=fakes.backend, estimator=est, corrections=[], processors=[],
                       score=count_sevens, sampler=sampler(len(data), cfg.seed))
    run_dir = tmp / "runs" / "r"
    run_dir.mkdir(parents=True, exist_ok=True)
    return build_trainer(cfg, comps, data, None, run_dir, "ppo_clip", {}), fakes


def test_one_run_writes_metrics_samples_checkpoint_and_final_model(tmp_path):
    tr, f = make_trainer(tmp_path)
    assert tr.run() == EXIT_OK
    recs = read_metrics(tmp_path / "runs" / "r")
    assert [r["step"] for r in recs] == [1, 2, 3]
    for key in ("rollout/raw_reward", "rollout/response_len/mean", "rollout/truncated_ratio", "rollout/zero_std_group_frac",
                "rollout/reward_errors", "train/loss", "train/pg_loss", "train/pg_clipfrac", "train/ppo_kl",
                "train/entropy", "train/grad_norm", "train/skipped_steps", "perf/step_time", "perf/rollout_time",
                "perf/train_time", "perf/rollout_tokens_per_s", "perf/peak_rss_gib", "train/old_logp_source"):
        assert key in recs[0], key
    peaks = [r["perf/peak_rss_gib"] for r in recs]
    assert 0 < peaks[0] <= peaks[1] <= peaks[2]  # a peak so far never falls
    # one update per rollout, no KL before the update: old = detach(current), so ratio = 1
    assert recs[0]["train/old_logp_source"] == OLD_LOGP_CURRENT
    assert recs[0]["train/ppo_kl"] == 0.0 and recs[0]["train/pg_clipfrac"] == 0.0
    assert f.engine.versions == [1, 2, 3]  # weights pushed after every step
    samples = (tmp_path / "runs" / "r" / "samples.jsonl").read_text().splitlines()
    assert {json.loads(s)["step"] for s in samples} == {1, 2, 3}
    assert (tmp_path / "runs" / "r" / "final" / "model.safetensors").is_file()
    assert (tmp_path / "runs" / "r" / "checkpoints" / "latest").read_text() == "step_000003"


def test_each_step_takes_fresh_prompts_until_the_epoch_ends(tmp_path, monkeypatch):
    seen = []
    tr, _ = make_trainer(tmp_path, num_rollout=3)
    real = tr.source.rollout.generate

    def spy(rows, indices, n, sampling, group_offset):
        seen.append(list(indices))
        return real(rows, indices, n, sampling, group_offset)

    monkeypatch.setattr(tr.source.rollout, "generate", spy)
    tr.run()
    flat = [i for s in seen for i in s]
    assert sorted(flat) == list(range(6))  # 3 steps × 2 prompts = one epoch of 6, no repeats


def test_recomputed_old_log_probs_with_two_updates_per_rollout(tmp_path):
    tr, _ = make_trainer(tmp_path, num_steps_per_rollout=2, num_rollout=2)
    assert tr.old_logp_source == OLD_LOGP_RECOMPUTED
    assert tr.run() == EXIT_OK
    recs = read_metrics(tmp_path / "runs" / "r")
    assert recs[0]["train/global_batch_size"] == 4.0
    assert recs[-1]["train/ppo_kl"] != 0.0  # the second update sees moved weights


def test_learns_to_emit_sevens(tmp_path):
    tr, _ = make_trainer(tmp_path, num_rollout=24, rollout_batch_size=2, n_samples_per_prompt=8, save_hf=False)
    assert tr.run() == EXIT_OK
    r = [x["rollout/raw_reward"] for x in read_metrics(tmp_path / "runs" / "r")]
    # chance is about 1/16 of tokens; the last quarter must clearly beat the first
    assert sum(r[-6:]) / 6 > sum(r[:6]) / 6 + 0.15, r


def _final_weights(f) -> dict:
    return {k: v.clone() for k, v in f.model.state_dict().items()}


def test_resume_equals_uninterrupted_run(tmp_path):
    a, fa = make_trainer(tmp_path / "a", num_rollout=4)
    assert a.run() == EXIT_OK
    # interrupted after step 2 (as the first Ctrl-C does: the checkpoint keeps the optimizer
    # state, which the final checkpoint of a completed run drops), then a fresh process resumes
    b, _ = make_trainer(tmp_path / "b", num_rollout=4, save_interval=1)
    step = b.step
    b.step = lambda k: (setattr(b, "_interrupted", k == 2), step(k))[1]
    assert b.run() == EXIT_INTERRUPTED
    c, fc = make_trainer(tmp_path / "b", num_rollout=4, resume=True)
    assert c.run() == EXIT_OK
    ma, mc = read_metrics(tmp_path / "a" / "runs" / "r"), read_metrics(tmp_path / "b" / "runs" / "r")
    assert [m["step"] for m in mc] == [1, 2, 3, 4]
    for x, y in zip(ma, mc):
        for k in ("rollout/raw_reward", "train/loss", "train/grad_norm", "rollout/response_len/mean"):
            assert x[k] == pytest.approx(y[k], rel=1e-6, abs=1e-9), (x["step"], k)
    wa, wc = _final_weights(fa), _final_weights(fc)
    for k in wa:
        torch.testing.assert_close(wa[k], wc[k])


def test_difficulty_sampler_state_resumes_exactly(tmp_path):
    """--sampler difficulty, stopped after step 2 and resumed: the same prompts are drawn at
    steps 3-5 as in the uninterrupted run (its outcomes and draw count are in the
    checkpoint), with the same pass-rate histogram; without the restored outcomes they differ."""
    plugin = pytest.importorskip("relax_difficulty.plugin")
    spec = plugin.relax_register_samplers()[0]
    # count_sevens gives fractions < 2: every sample fails, every seen prompt is too hard, and
    # later steps avoid them (weight 0.01)
    make = spec.build(plugin.DifficultyParams(pass_threshold=2.0, explore_floor=0.01))
    over = dict(num_rollout=5, rollout_batch_size=2, data=str(_data(tmp_path / "data", n=10)))
    a, _ = make_trainer(tmp_path / "a", sampler=make, **over)
    assert a.run() == EXIT_OK
    b, _ = make_trainer(tmp_path / "b", sampler=make, save_interval=1, **over)
    step = b.step
    b.step = lambda k: (setattr(b, "_interrupted", k == 2), step(k))[1]
    assert b.run() == EXIT_INTERRUPTED
    c, _ = make_trainer(tmp_path / "b", sampler=make, resume=True, **over)
    assert c.run() == EXIT_OK

    def trained(d):
        return [json.loads(x)["prompt_index"] for x in (d / "runs" / "r" / "trained_prompts.jsonl").read_text().splitlines()]

    assert trained(tmp_path / "b") == trained(tmp_path / "a")
    ma, mc = read_metrics(tmp_path / "a" / "runs" / "r"), read_metrics(tmp_path / "b" / "runs" / "r")
    hist = [k for k in ma[0] if k.startswith("sampler/difficulty/")]
    assert len(hist) == 7 and [[m[k] for k in hist] for m in mc] == [[m[k] for k in hist] for m in ma]
    assert ma[-1]["sampler/difficulty/seen_frac"] > 0
    # control: the draws of steps 3-5 depend on the restored outcomes (the same draw count
    # with no outcomes draws other prompts)
    state = json.loads((tmp_path / "b" / "runs" / "r" / "checkpoints" / "step_000002" / "trainer_state.json")
                       .read_text())["cursor"]
    assert state["draws"] == 2 and len(state["outcomes"]) == 4
    amnesic = make(10, 7)
    amnesic.load({**state, "outcomes": {}})
    later = [p[::4] for p in trained(tmp_path / "a")[2:]]  # each prompt's 4 samples are adjacent
    assert [amnesic.take(2) for _ in range(3)] != later


@pytest.mark.parametrize("interval", [2, 3])
def test_resume_between_two_weight_pushes_equals_the_uninterrupted_run(tmp_path, interval):
    """Stopped after every step k (also between two pushes, when the engine holds older
    weights than the trainer) and resumed: every later step equals the uninterrupted run,
    staleness and weight versions included (the checkpoint keeps the engine's weights)."""
    over = dict(update_weights_interval=interval, num_steps_per_rollout=1, lr=0.5)
    a, _ = make_trainer(tmp_path / "a", num_rollout=5, **over)
    assert a.run() == EXIT_OK
    ma = read_metrics(tmp_path / "a" / "runs" / "r")
    for stop in range(1, 5):
        d = tmp_path / f"stop{stop}"
        b, _ = make_trainer(d, num_rollout=5, **over)  # interrupted after step `stop` (the first Ctrl-C)
        step = b.step
        b.step = lambda k, step=step, b=b: (setattr(b, "_interrupted", k == stop), step(k))[1]
        assert b.run() == EXIT_INTERRUPTED
        lagging = stop % interval != 0 and stop > interval  # (before the first push it holds the initial weights)
        assert (d / "runs" / "r" / "checkpoints" / f"step_{stop:06d}" / "engine.safetensors").is_file() == lagging
        c, _ = make_trainer(d, num_rollout=5, resume=True, **over)
        assert c.run() == EXIT_OK
        mc = read_metrics(d / "runs" / "r")
        assert [m["step"] for m in mc] == [1, 2, 3, 4, 5]
        for x, y in zip(ma, mc):
            for k in ("rollout/raw_reward", "train/loss", "train/grad_norm", "staleness/max", "staleness/mean"):
                assert x[k] == pytest.approx(y[k], rel=1e-6, abs=1e-9), (stop, x["step"], k)


def test_non_finite_steps_are_skipped_then_the_run_stops_with_a_checkpoint(tmp_path):
    f = make_fakes(seed=0, nan_steps=(2, 3))
    tr, _ = make_trainer(tmp_path, fakes=f, num_rollout=5, max_skipped_steps=2)
    assert tr.run() == EXIT_SKIPPED
    recs = read_metrics(tmp_path / "runs" / "r")
    assert [r["train/skipped_steps"] for r in recs] == [0.0, 1.0, 1.0]
    assert recs[1]["train/grad_norm"] == "nan"  # the offending metric is logged
    assert (tmp_path / "runs" / "r" / "checkpoints" / "latest").read_text() == "step_000003"


def test_training_continues_after_a_single_skipped_step_with_finite_weights(tmp_path):
    f = make_fakes(seed=0, nan_steps=(2,))
    tr, _ = make_trainer(tmp_path, fakes=f, num_rollout=3, max_skipped_steps=2)
    assert tr.run() == EXIT_OK
    recs = read_metrics(tmp_path / "runs" / "r")
    assert [r["train/skipped_steps"] for r in recs] == [0.0, 1.0, 0.0]
    assert recs[-1]["train/skipped_steps_total"] == 1.0
    assert all(math.isfinite(v) for v in f.model.w.flatten().tolist())


def test_debug_rollout_replay_reproduces_the_optimizer_steps(tmp_path):
    store = tmp_path / "rollouts"
    a, fa = make_trainer(tmp_path / "a", num_rollout=3, save_debug_rollout_data=str(store))
    a.run()
    assert len(list(store.glob("step_*.safetensors"))) == 3
    b, fb = make_trainer(tmp_path / "b", num_rollout=3, load_debug_rollout_data=str(store))
    b.run()
    ma, mb = read_metrics(tmp_path / "a" / "runs" / "r"), read_metrics(tmp_path / "b" / "runs" / "r")
    for x, y in zip(ma, mb):
        assert x["train/loss"] == pytest.approx(y["train/loss"], rel=1e-6, abs=1e-9)
        assert x["rollout/raw_reward"] == y["rollout/raw_reward"]
    assert fb.engine.versions == []  # nothing generated, nothing pushed
    torch.testing.assert_close(fa.model.w, fb.model.w)


def test_sigint_finishes_the_step_saves_and_exits_cleanly(tmp_path):
    import os
    import signal


    calls = []

    def score(responses, labels, metadata, prompts):
        calls.append(1)
        if len(calls) == 2:  # Ctrl-C while step 2 is being scored
            os.kill(os.getpid(), signal.SIGINT)
        return count_sevens(responses, labels, metadata, prompts)

    before = signal.getsignal(signal.SIGINT)  # default_int_handler, unless an earlier test in this process changed it
    tr, _ = make_trainer(tmp_path, num_rollout=5)
    tr.c.score = score
    assert tr.run() == EXIT_INTERRUPTED
    assert [r["step"] for r in read_metrics(tmp_path / "runs" / "r")] == [1, 2]
    assert (tmp_path / "runs" / "r" / "checkpoints" / "latest").read_text() == "step_000002"
    assert signal.getsignal(signal.SIGINT) is before  # the run's handler is removed again
    again, _ = make_trainer(tmp_path, num_rollout=3, resume=True)
    assert again.run() == EXIT_OK
    assert [r["step"] for r in read_metrics(tmp_path / "runs" / "r")] == [1, 2, 3]


def test_wandb_offline_mode_writes_a_local_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    tr, _ = make_trainer(tmp_path, num_rollout=1, wandb_project="relax-test", wandb_mode="offline", save_hf=False)
    assert tr.run() == EXIT_OK
    runs = list((tmp_path / "runs" / "r" / "wandb").glob("offline-run-*"))
    assert runs, "no offline W&B run directory"


class _DropGroups:
    """Keeps only groups whose index is odd (a stand-in for a dynamic-sampling filter)."""

    def process(self, rb):
        return rb.replace(keep=rb.group_index % 2 == 1, metrics={"filter/kept_frac": float((rb.group_index % 2 == 1).float().mean())})


class _DropFirstRound:
    """Drops every group of a step's first round (groups (step·3 + round)·2 + j, with
    --rollout-batch-size 2 and 3 rounds), keeps the later rounds' groups."""

    def process(self, rb):
        first = (rb.group_index // 2) % 3 == 0
        return rb.replace(keep=~first, metrics={"rollout/filtered_group_frac": float(first.float().mean())})


class _DropAll:
    def process(self, rb):
        return rb.replace(keep=torch.zeros_like(rb.keep))


def test_filtering_processor_with_oversampling_fills_the_batch(tmp_path):
    tr, _ = make_trainer(tmp_path, num_rollout=2, rollout_batch_size=2, max_oversampling_rounds=2)
    tr.c.processors, tr.c.processor_resamples = [_DropGroups()], True
    assert tr.run() == EXIT_OK
    recs = read_metrics(tmp_path / "runs" / "r")
    # each round keeps 1 of 2 groups: two rounds give the 2 groups × 4 samples to train on
    assert [r["rollout/num_samples"] for r in recs] == [8.0, 8.0]
    assert recs[0]["filter/kept_frac"] == 0.5 and math.isfinite(recs[0]["train/loss"])


def test_processor_metrics_report_the_whole_step_across_oversampling_rounds(tmp_path):
    """Round 1 drops both its groups, round 2 none: 2 of the step's 4 groups were filtered.
    Before the fix the step reported the last round only (0.0)."""
    tr, _ = make_trainer(tmp_path, num_rollout=2, rollout_batch_size=2, max_oversampling_rounds=2)
    tr.c.processors, tr.c.processor_resamples = [_DropFirstRound()], True
    assert tr.run() == EXIT_OK
    recs = read_metrics(tmp_path / "runs" / "r")
    assert [r["rollout/filtered_group_frac"] for r in recs] == [0.5, 0.5]
    assert [r["rollout/num_samples"] for r in recs] == [8.0, 8.0]


def test_a_step_whose_samples_are_all_filtered_out_trains_nothing(tmp_path):
    tr, f = make_trainer(tmp_path, num_rollout=1, max_oversampling_rounds=1)
    tr.c.processors, tr.c.processor_resamples = [_DropAll()], True
    before = f.model.w.detach().clone()
    assert tr.run() == EXIT_OK
    rec = read_metrics(tmp_path / "runs" / "r")[0]
    assert rec["train/empty_batch"] == 1.0 and rec["rollout/num_samples"] == 0.0
    assert rec["rollout/response_len/mean"] > 0  # lengths describe what was generated
    torch.testing.assert_close(f.model.w, before)


def test_scorer_receives_each_samples_prompt(tmp_path):
    """The loop hands the scorer one prompt per sample, aligned with the responses (the
    ``remote`` scorer sends it to the reward server)."""
    seen = []

    def recording(responses, labels, metadata, prompts):
        seen.append((list(prompts), list(labels)))
        return count_sevens(responses, labels, metadata, prompts)

    tr, _ = make_trainer(tmp_path, num_rollout=1)
    tr.c.score = recording
    assert tr.run() == EXIT_OK
    (prompts, labels), = seen
    assert len(prompts) == len(labels) == 8
    # the data rows are {"prompt": "q<i>" * (i+1), "label": i}: each prompt text holds its own row's prompt
    for p, i in zip(prompts, labels):
        assert f"q{i}" * (i + 1) in p
        assert p.count(f"q{i}") == i + 1


def test_make_score_gives_the_prompt_to_scorers_as_metadata(tmp_path):
    from relax_core.run.launch import make_score
    from relax_e2e_scorers import prompt_length

    cfg = RunConfig(reward_timeout=30, reward_num_workers=1)
    rewards, metrics = make_score([prompt_length], cfg)(["a", "b"], [None, None], [{}, None], ["four", "sixsix"])
    assert rewards == [4.0, 6.0]
    assert metrics == {"rollout/reward_errors": 0.0, "rollout/reward_timeouts": 0.0}


def test_weight_version_and_staleness_follow_the_update_weights_interval(tmp_path, monkeypatch):
    """With weights pushed every 2 steps, steps 1-2 generate with version 0 and steps 3-4 with
    version 2: staleness (k - 1) - version is 0, 1, 0, 1."""
    versions = []
    tr, f = make_trainer(tmp_path, num_rollout=4, update_weights_interval=2)
    real = tr.source.rollout.generate

    def spy(rows, indices, n, sampling, group_offset):
        out = real(rows, indices, n, sampling, group_offset)
        versions.append(int(out.weight_version[0]))
        return out

    monkeypatch.setattr(tr.source.rollout, "generate", spy)
    assert tr.run() == EXIT_OK
    assert versions == [0, 0, 2, 2]
    assert f.engine.versions == [2, 4]
    recs = read_metrics(tmp_path / "runs" / "r")
    assert [r["staleness/max"] for r in recs] == [0.0, 1.0, 0.0, 1.0]
    assert [r["staleness/mean"] for r in recs] == [0.0, 1.0, 0.0, 1.0]


def test_normalize_advantages_whitens_with_the_sample_variance(tmp_path):
    """--normalize-advantages over the valid tokens of the batch, variance × N/(N−1) (issue 18
    item 11): four one-token samples with raw advantages [1, 2, 3, 4] whiten to
    ±1.161895, ±0.387298 (the population variance gave ±1.341641, ±0.447214)."""
    from relax_core.batch import Batch
    from relax_core.contracts import AdvantageOutput

    class Fixed:
        def compute_advantages(self, inp):
            adv = torch.tensor([[1.0, 0.0], [2.0, 0.0], [3.0, 0.0], [4.0, 0.0]])
            return AdvantageOutput(advantages=adv, returns=adv)

    tr, _ = make_trainer(tmp_path, normalize_advantages=True)
    tr.c.estimator = Fixed()
    mask = torch.tensor([[True, False]] * 4)
    batch = Batch(rewards=torch.zeros(4), group_index=torch.arange(4), loss_mask=mask, response_lengths=torch.ones(4, dtype=torch.long))
    out, _ = tr.advantages(batch)
    torch.testing.assert_close(out.advantages[:, 0], torch.tensor([-1.161895, -0.387298, 0.387298, 1.161895]), atol=1e-6, rtol=0)
    assert (out.advantages[:, 1] == 0).all()


def test_the_async_source_checkpoints_the_cursor_of_the_last_batch_trained(tmp_path):
    """With --fully-async the rollout thread reads prompts ahead of training; a checkpoint
    holds the cursor as of the batch trained (each step takes 2 of the 6 prompts)."""
    tr, _ = make_trainer(tmp_path, num_rollout=3, fully_async=True, max_staleness=1, save_interval=1,
                         keep_checkpoints=3)
    assert tr.run() == EXIT_OK
    ckpts = tmp_path / "runs" / "r" / "checkpoints"
    for step in (1, 2, 3):
        state = json.loads((ckpts / f"step_{step:06d}" / "trainer_state.json").read_text())
        assert state["cursor"]["position"] == 2 * step and state["data"] == tr.source.rollout.data.fingerprint


def test_evaluation_samples_with_its_own_settings(tmp_path, monkeypatch):
    """--eval-temperature / --eval-top-p / --eval-max-response-len apply to the evaluation
    only; unset (None), each is its --rollout-* counterpart (issue 23 §1); by default the
    evaluation is one greedy sample per prompt."""
    seen = []

    def spying(tr):
        real = tr.source.rollout.generate

        def spy(rows, indices, n, sampling, group_offset):
            seen.append((sampling.temperature, sampling.top_p, sampling.max_new_tokens, n))
            return real(rows, indices, n, sampling, group_offset)

        monkeypatch.setattr(tr.source.rollout, "generate", spy)
        return tr

    tr = spying(make_trainer(tmp_path / "a", rollout_temperature=0.9, rollout_top_p=0.8, eval_temperature=0.0,
                             eval_top_p=0.5, eval_max_response_len=3, n_samples_per_eval_prompt=2)[0])
    tr.source.rollout.evaluate(tr.source.rollout.data, 0)
    tr.source.rollout.produce(1)  # a training batch
    assert seen == [(0.0, 0.5, 3, 2), (0.9, 0.8, 6, 4)]
    seen.clear()
    tr = spying(make_trainer(tmp_path / "b", rollout_temperature=0.9, rollout_top_p=0.8, eval_temperature=None,
                             n_samples_per_eval_prompt=2)[0])
    tr.source.rollout.evaluate(tr.source.rollout.data, 0)
    assert seen == [(0.9, 0.8, 6, 2)]
    seen.clear()
    tr = spying(make_trainer(tmp_path / "c", rollout_temperature=0.9, rollout_top_p=0.8)[0])
    tr.source.rollout.evaluate(tr.source.rollout.data, 0)
    assert seen == [(0.0, 0.8, 6, 1)]  # the defaults: one greedy sample per prompt


def test_evaluation_asks_no_top_k_head_so_greedy_evaluation_works_with_score_centering(tmp_path, monkeypatch):
    """A correction that needs the top-k head (score_centering) asks it of training rollouts;
    the evaluation (greedy by default, where engines refuse a top-k head) asks none."""
    from relax_core.batch import TOP_K_HEAD

    tr = make_trainer(tmp_path)[0]
    rollout = tr.source.rollout
    rollout.c.rollout_fields, rollout.c.top_k = TOP_K_HEAD | {"routed_experts"}, 3
    seen = []
    monkeypatch.setattr(rollout, "generate", lambda rows, idx, n, sampling, off: seen.append(sampling) or 1 / 0)
    with pytest.raises(ZeroDivisionError):
        rollout.evaluate(rollout.data, 0)
    (ev,) = seen
    assert ev.temperature == 0.0 and ev.return_top_k == 0 and ev.fields == {"routed_experts"}
    assert rollout.sampling(0).return_top_k == 3  # training rollouts still get it


def test_evaluation_reports_pass_at_1_with_its_standard_error_over_prompts(tmp_path, monkeypatch):
    """Per-prompt accuracies [1, 0.5, 0, 0] (2 samples each): pass@1 = 0.375 and
    se = s / sqrt(4) with s² = (0.625² + 0.125² + 2 · 0.375²) / 3 = 0.6875 / 3 (hand-derived);
    one prompt gives no standard error."""
    tr = make_trainer(tmp_path, n_samples_per_eval_prompt=2, eval_temperature=0.5, eval_max_prompts=4)[0]
    rollout = tr.source.rollout
    real = rollout.score

    def fixed(batch, task_only=False):
        assert task_only  # the evaluation scores with the task's own scorer, unweighted
        scored, metrics = real(batch, task_only)
        return scored.replace(rewards=torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0])), metrics

    monkeypatch.setattr(rollout, "score", fixed)
    m = rollout.evaluate(rollout.data, 0)
    assert m["eval/train/pass@1"] == pytest.approx(0.375)
    assert m["eval/train/pass@1_se"] == pytest.approx(math.sqrt(0.6875 / 3) / 2)
    one = make_trainer(tmp_path / "one", eval_max_prompts=1)[0].source.rollout
    assert "eval/train/pass@1_se" not in one.evaluate(one.data, 0)


def test_an_environments_turn_scoring_counts_reach_the_step_metrics(tmp_path, monkeypatch):
    """An environment that scores its turns (scores_turns: the runner calls the scorer) reports
    the scorer's counts in the runner's metrics; the step's rollout/reward_errors (and a
    scorer's own counts) are those plus the final scoring's, not overwritten by the latter."""
    tr, _ = make_trainer(tmp_path, num_rollout=1)
    runner = tr.source.rollout.episodes
    real = runner.generate

    def with_turn_counts(*args, **kwargs):
        out = real(*args, **kwargs)
        runner.metrics.update({"rollout/reward_errors": 3.0, "rollout/reward/judge/invalid": 2.0})
        return out

    monkeypatch.setattr(runner, "generate", with_turn_counts)
    assert tr.run() == EXIT_OK
    (rec,) = read_metrics(tmp_path / "runs" / "r")
    assert rec["rollout/reward_errors"] == 3.0  # count_sevens itself never fails
    assert rec["rollout/reward_timeouts"] == 0.0 and rec["rollout/reward/judge/invalid"] == 2.0
