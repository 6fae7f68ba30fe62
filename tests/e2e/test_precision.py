"""``--bf16``'s default in a run (relax_core.run.precision): decided at start-up, said on the
screen, kept in config.json and on resume; bf16 on trains under autocast with a bfloat16
hf engine, whose log-probs then differ from the trainer's by bfloat16 rounding."""

from __future__ import annotations

import json

import pytest
from conftest import run_train, tiny_args

from relax_core.run import precision


def _auto_args(*a):
    return [x for x in tiny_args(*a) if x != "--no-bf16"]  # the flag not given: auto


def _mismatch(run):
    """|log p_trainer − log q_engine| per step, mean over the response tokens (nats)."""
    return [json.loads(x)["train/train_rollout_logprob_abs_diff"] for x in (run / "metrics.jsonl").read_text().splitlines()]


def _bf16_noise(run, bf16):
    """Every step's mismatch is bfloat16 rounding (above 1e-4) with bf16, float32's (below 1e-5) without."""
    diffs = _mismatch(run)
    return min(diffs) > 1e-4 if bf16 else max(diffs) < 1e-5


@pytest.mark.parametrize("native", [True, False])
def test_auto_decides_once_and_a_resume_keeps_the_decision(tiny_model_dir, prompts_file, tmp_path, monkeypatch,
                                                           native):
    monkeypatch.setattr(precision, "native_bf16", lambda dev: "the CPU has AMX-BF16 units" if native else None)
    code, out = run_train(_auto_args(tiny_model_dir, prompts_file, tmp_path, "--save-interval", "1"))
    assert code == 0, out
    run = tmp_path / "run"
    assert ("precision: bfloat16 autocast (auto: the CPU has AMX-BF16 units; --no-bf16 keeps float32)" if native else
            "precision: float32 (auto: this CPU has no native bfloat16 units; --bf16 uses bfloat16 anyway)") in out
    saved = json.loads((run / "config.json").read_text())
    assert saved["bf16"] is native and saved["plugin_params"]["hf"]["dtype"] == "auto"
    assert _bf16_noise(run, native)

    monkeypatch.setattr(precision, "native_bf16", lambda dev: pytest.fail("a resume asked the device"))
    code, out = run_train(_auto_args(tiny_model_dir, prompts_file, tmp_path, "--resume", "--num-rollout", "3"))
    assert code == 0, out
    assert "precision:" not in out and json.loads((run / "config.json").read_text())["bf16"] is native
    assert len(_mismatch(run)) == 3 and _bf16_noise(run, native)


def test_the_flags_override_auto(tiny_model_dir, prompts_file, tmp_path, monkeypatch):
    monkeypatch.setattr(precision, "native_bf16", lambda dev: pytest.fail("asked the device"))
    code, out = run_train(tiny_args(tiny_model_dir, prompts_file, tmp_path, "--bf16", "--hf-dtype", "float32"))
    assert code == 0, out
    assert "precision:" not in out and json.loads((tmp_path / "run" / "config.json").read_text())["bf16"] is True
    assert _bf16_noise(tmp_path / "run", True)  # the float32 engine against the autocast trainer


def test_eval_takes_the_runs_decision_or_the_flag_or_auto_for_a_model(tiny_model_dir, prompts_file, tmp_path,
                                                                       monkeypatch):
    from typer.testing import CliRunner

    from cli.main import app

    def evaluated_bf16(target, *flags):
        out = tmp_path / f"eval{len(list(tmp_path.iterdir()))}"
        res = CliRunner().invoke(app, ["eval", str(target), "--eval-data", f"p={prompts_file}", "--custom-rm-path",
                                       "relax_e2e_scorers:vowel_fraction", "--max-prompts", "2",
                                       "--eval-max-response-len", "4", "--out", str(out), *flags])
        assert res.exit_code == 0, res.output
        return json.loads((out / "eval.json").read_text())["bf16"]

    code, out = run_train(tiny_args(tiny_model_dir, prompts_file, tmp_path))  # --no-bf16: saved false
    assert code == 0, out
    monkeypatch.setattr(precision, "native_bf16", lambda dev: "the CPU has AMX-BF16 units")
    assert evaluated_bf16(tmp_path / "run") is False  # the run's decision, not this machine's
    assert evaluated_bf16(tmp_path / "run", "--bf16") is True
    assert evaluated_bf16(tiny_model_dir) is True  # a model: auto
    assert evaluated_bf16(tiny_model_dir, "--no-bf16") is False
    monkeypatch.setattr(precision, "native_bf16", lambda dev: None)
    assert evaluated_bf16(tiny_model_dir) is False


def test_dry_run_shows_the_decision(tiny_model_dir, prompts_file, tmp_path, monkeypatch):
    monkeypatch.setattr(precision, "native_bf16", lambda dev: None)
    code, out = run_train(_auto_args(tiny_model_dir, prompts_file, tmp_path, "--dry-run"))
    assert code == 0, out
    assert "precision: float32 (auto: this CPU has no native bfloat16 units" in out and '"bf16": false' in out


def test_an_explicit_bf16_the_backend_cannot_train_in_is_refused_at_start_up(tiny_model_dir, prompts_file, tmp_path):
    code, out = run_train(tiny_args(tiny_model_dir, prompts_file, tmp_path, "--train-backend", "megatron", "--bf16",
                                    "--device", "cpu", "--dry-run"))
    assert code == 2, out
    text = " ".join(out.split())
    assert "megatron" in text and "cannot train in bfloat16 (--bf16) on cpu: it does only on cuda" in text, text
    assert "use --no-bf16 (float32)" in text


def test_a_bf16_engine_is_released_while_the_trainer_steps_and_learns_the_same(tiny_model_dir, prompts_file, tmp_path,
                                                                               monkeypatch):
    """``--bf16`` in a run that shares the weights: the bfloat16 engine frees its copy for
    each optimizer step (checked inside the step) and gets it back from the push after it;
    the run's metrics equal, value for value, a run whose engine keeps its copy (the
    release patched out), over 3 steps and a resume."""
    from relax_core import trainer as trainer_mod
    from relax_core.models import weights_released
    from relax_core.stages.rollout import Publisher

    seen = []
    train_on = trainer_mod.Trainer.train_on

    def spy(self, batch, step):
        seen.append(weights_released(self.c.engine.model))
        return train_on(self, batch, step)

    monkeypatch.setattr(trainer_mod.Trainer, "train_on", spy)

    def run(name):
        args = tiny_args(tiny_model_dir, prompts_file, tmp_path, "--bf16", "--run-name", name, "--save-interval", "1")
        assert run_train(args)[0] == 0
        assert run_train([*args, "--resume", "--num-rollout", "3"])[0] == 0
        rows = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]

    released = run("released")
    assert seen == [True] * 3
    seen.clear()
    monkeypatch.setattr(Publisher, "before_train", lambda self: None)
    kept = run("kept")
    assert seen == [False] * 3
    assert len(released) == 3 and released == kept
