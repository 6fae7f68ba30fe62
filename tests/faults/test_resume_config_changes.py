"""Config changes on resume, one setting at a time (issue 18 items 2, 4, 5): each optimizer
setting, the data, the estimator and the other run-identity settings are either refused
with exit 2 before any model loads, or applied from the next step and listed.  The run
directory is a real one (config.json + a complete checkpoint) built without training."""

from __future__ import annotations

import json

import pytest
from fault_helpers import run_train, tiny_args

import relax_core.run.launch as launch_mod
from relax_core.config import build_config, config_to_dict, parse_cli
from relax_core.host.plugins import default_registry
from relax_core.run import checkpoint as ckpt


class _Backend:
    def save_checkpoint(self, path: str, include_optimizer: bool = True) -> None:
        from pathlib import Path

        Path(path).mkdir(parents=True)
        Path(path, "weights.bin").write_bytes(b"w")


@pytest.fixture
def saved_run(tiny_model_dir, prompts_file, tmp_path, monkeypatch):
    """A run stopped at step 2 of 4 (config.json and a complete checkpoint holding the data
    fingerprint), and `relax train` patched so that nothing past the pre-model checks runs."""
    from relax_core.data import load_dataset

    args = tiny_args(tiny_model_dir, prompts_file, tmp_path, "--num-rollout", "4")
    schemas = default_registry().param_schemas()
    cli, _, _ = parse_cli(args, schemas)
    cfg = build_config(cli=cli, param_schemas=schemas)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(config_to_dict(cfg), default=str))
    fingerprint = load_dataset(cfg.data, cfg, default_registry()).fingerprint  # as relax train reads it
    ckpt.save_checkpoint(run / "checkpoints", 2, _Backend(), {"step": 2, "data": fingerprint, "history": []})
    reached = []
    monkeypatch.setattr(launch_mod, "_launch", lambda *a: (reached.append(a) or 0, None))  # (exit code, no trainer)
    return tmp_path, reached


def _resume(out, *extra):
    return run_train(["--output-dir", str(out), "--run-name", "run", "--resume", *extra])


@pytest.mark.parametrize("flag, value, saved", [
    ("--weight-decay", "0.5", "0.0"),
    ("--adam-beta1", "0.8", "0.9"),
    ("--adam-beta2", "0.9", "0.999"),
    ("--adam-eps", "1e-06", "1e-08"),
    ("--advantage-estimator", "rloo", "'grpo'"),
    ("--seed", "4", "3"),
    ("--bf16", None, "False"),
    ("--train-backend", "megatron", "'torch'"),
    ("--lora-rank", "8", "0"),
    ("--sampler", "difficulty", "'uniform'"),
])
def test_a_setting_the_checkpoint_cannot_honour_is_refused_before_any_model(saved_run, flag, value, saved):
    out, reached = saved_run
    code, text = _resume(out, flag, *([value] if value is not None else []))
    assert code == 2, text
    assert f"--resume: {flag} {saved} → " in text and "cannot change on resume" in text
    assert f"resume with {flag} {saved} (as saved in" in text
    assert not reached


@pytest.mark.parametrize("flag, value, line", [
    ("--lr", "0.001", "override: --lr 0.01 → 0.001 from step 3"),
    ("--lr-warmup-steps", "5", "override: --lr-warmup-steps 0 → 5 from step 3"),
    ("--clip-grad", "0.5", "override: --clip-grad 1.0 → 0.5 from step 3"),
    ("--rollout-temperature", "1.0", "override: --rollout-temperature 0.7 → 1.0 from step 3"),
    ("--num-rollout", "6", "override: --num-rollout 4 → 6 from step 3"),
])
def test_a_setting_read_every_step_is_applied_and_listed(saved_run, flag, value, line):
    out, reached = saved_run
    code, text = _resume(out, flag, value)
    assert code == 0, text
    assert line in text and len(reached) == 1
    cfg = reached[0][0]
    assert str(getattr(cfg, flag[2:].replace("-", "_"))) == value


def test_nothing_given_resumes_with_the_saved_config_and_lists_no_override(saved_run, tiny_model_dir):
    out, reached = saved_run
    code, text = _resume(out)
    assert code == 0, text
    assert "override:" not in text and f"resuming run {out / 'run'} from" in text
    cfg = reached[0][0]
    assert cfg.model == str(tiny_model_dir) and cfg.num_rollout == 4 and cfg.custom_rm_path == "fault_scorers:vowel_fraction"


def test_other_data_is_refused_unless_allowed(saved_run, tmp_path):
    out, reached = saved_run
    other = tmp_path / "other.jsonl"
    other.write_text('{"prompt": "What is 1 + 1?", "label": "2"}\n')
    code, text = _resume(out, "--data", str(other))
    assert code == 2 and "the training data differ" in text and not reached
    code, text = _resume(out, "--data", str(other), "--resume-allow-data-change")
    assert code == 0, text
    assert "--resume-allow-data-change: training data changed" in text and len(reached) == 1
