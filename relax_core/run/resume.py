"""``--resume``: which run it continues, and with which configuration.

Called by ``relax train`` right after the flags are parsed, before validation and long
before any model loads, so that every refusal is a configuration problem (exit 2):

- **Which run.** ``--run-name NAME`` resumes ``<--output-dir>/NAME``.  Without it, the one
  run directory under ``--output-dir`` that holds a complete checkpoint; when several do,
  the choice is refused and they are listed (give ``--run-name``).  The directory resumed
  is always printed.
- **Which checkpoint.** The newest *complete* one (:func:`relax_core.run.checkpoint.resume_checkpoint`),
  with a note when ``latest`` names one that is missing or incomplete.
- **Which configuration.** The run's saved ``config.json`` is the base; the flags and
  ``--config`` file given now override it, and each override is listed with the step from
  which it applies.  Settings that a checkpoint cannot honour are refused
  (:data:`REFUSED_ON_RESUME`): the estimator, model, backend, sampler, seed, and the optimizer
  settings that live in the optimizer's restored state (weight decay, AdamW betas and eps).
  The learning rate, warm-up and gradient clip are read every step, so a change applies.
- **A finished run** (newest checkpoint at ``--num-rollout`` or beyond) is refused unless
  ``--num-rollout`` grows.

A run directory that holds a run but no complete checkpoint is refused too, unless
``--force`` (a fresh start there, see :func:`relax_core.run.launch.prepare_run_dir`).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Mapping

from relax_core.config import ConfigError, RunConfig, build_config, config_fields, flag_of, param_flag
from relax_core.run import checkpoint as ckpt

#: Options that describe this invocation, not the run: never taken from config.json.
PER_INVOCATION = ("resume", "resume_allow_data_change", "force")
#: Options that locate the run; they follow the directory chosen, never listed as overrides.
LOCATION = ("output_dir", "run_name")
#: Core options a resume refuses to change, with why.
REFUSED_ON_RESUME = {
    "advantage_estimator": "the checkpoint holds this estimator's state (critic, statistics)",
    "model": "the checkpoint holds weights of the saved model",
    "train_backend": "the checkpoint is in the saved backend's format",
    "sampler": "the checkpoint holds this sampler's state (its data position and statistics)",
    "seed": "the data order and the sampling seeds of every step derive from it",
    "bf16": "the optimizer state was built for the saved precision",
    "weight_decay": "it lives in the optimizer state restored from the checkpoint",
    "lora_rank": "the checkpoint holds adapters of the saved rank (or all the weights, without LoRA)",
    "lora_alpha": "the adapters' scale α/r is part of the saved weights",
    "lora_target_modules": "the checkpoint holds adapters of the saved modules",
}
#: Plugin parameters of the training backend a resume refuses to change (restored optimizer state).
REFUSED_BACKEND_PARAMS = ("adam_beta1", "adam_beta2", "adam_eps")


def checkpoint_dir(cfg: RunConfig, run_dir: Path) -> Path:
    """``--save`` or ``<run dir>/checkpoints``."""
    return Path(cfg.save).expanduser() if cfg.save else run_dir / "checkpoints"


def holds_run(run_dir: Path, ckpt_dir: Path) -> list[str]:
    """What of an earlier run ``run_dir`` holds (empty: nothing a fresh start would mix
    with): metrics records, checkpoints, a final model."""
    found = []
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size:
        found.append(f"metrics.jsonl ({sum(1 for x in metrics.read_text().splitlines() if x.strip())} records)")
    if ckpt.holds_checkpoints(ckpt_dir):
        steps = [p.name for p in ckpt.complete_checkpoints(ckpt_dir)]
        found.append(f"checkpoints in {ckpt_dir} (complete: {', '.join(steps) or 'none'})")
    if (run_dir / "final").exists():
        found.append("final/")
    return found


def saved_values(saved: dict, schemas: Mapping[str, type]) -> tuple[dict, list[str]]:
    """config.json as ``build_config`` YAML values; keys this version does not know are
    dropped and named.  A top-level key that is a plugin parameter's flat name is kept: a
    parameter block's option saved when it was a core option (``eps_clip`` before the
    PPO-clip block, plugin API 4) applies to every component that declares it."""
    core = {f.name for f in config_fields()}
    core |= {param_flag(c, f)[2:].replace("-", "_") for c, schema in schemas.items() for f in dataclasses.fields(schema)}
    values, dropped = {}, []
    for key, value in saved.items():
        if key == "plugin_params":
            for comp, params in (value or {}).items():
                names = {f.name for f in dataclasses.fields(schemas[comp])} if comp in schemas else set()
                kept = {k: v for k, v in params.items() if k in names}
                dropped += [f"{comp}.{k}" for k in params if k not in names]
                if kept:
                    values[comp] = kept
        elif key in core:
            if key not in PER_INVOCATION:
                values[key] = value
        else:
            dropped.append(key)
    return values, dropped


def _overrides(base: RunConfig, new: RunConfig) -> list[tuple[str, str, Any, Any]]:
    """``(key, flag, saved, now)`` for every option whose value differs."""
    out = []
    for f in config_fields():
        if f.name in PER_INVOCATION or f.name in LOCATION:
            continue
        a, b = getattr(base, f.name), getattr(new, f.name)
        if a != b:
            out.append((f.name, flag_of(f), a, b))
    for comp, params in new.plugin_params.items():
        old = base.plugin_params.get(comp)
        if params is None or old is None:
            continue
        for pf in dataclasses.fields(params):
            a, b = getattr(old, pf.name), getattr(params, pf.name)
            if a != b:
                out.append((f"{comp}.{pf.name}", param_flag(comp, pf), a, b))
    return out


def _candidates(out: Path) -> list[Path]:
    if not out.is_dir():
        return []
    return sorted((d for d in out.iterdir() if d.is_dir() and ckpt.complete_checkpoints(d / "checkpoints")),
                  key=lambda d: d.name)


def _say(text: str) -> None:
    print(f"relax: {text}", file=sys.stderr, flush=True)


def resume_config(cfg: RunConfig, *, cli: Mapping[str, Any], yaml_values: Mapping[str, Any],
                  param_schemas: Mapping[str, type], yaml_source: str = "config") -> RunConfig:
    """The configuration of a ``--resume`` run (see the module docstring); ``cfg`` itself
    when ``--resume`` is not set or there is nothing to resume (a fresh start: the
    directory is then checked by :func:`relax_core.run.launch.prepare_run_dir`).

    Prints, on stderr, the directory and checkpoint resumed and each override.

    Args:
        cfg: the configuration built from the flags and YAML given now.
        cli / yaml_values / param_schemas / yaml_source: what ``cfg`` was built from
            (:func:`relax_core.config.build_config`).

    Raises:
        ConfigError: an ambiguous or missing run to resume, a directory with a run but no
            complete checkpoint (without ``--force``), a refused change, a finished run
            whose ``--num-rollout`` does not grow, or an unreadable ``config.json``.
    """
    if not cfg.resume:
        return cfg
    out = Path(cfg.output_dir).expanduser()
    if cfg.run_name:
        run_dir = out / cfg.run_name
    else:
        if cfg.save:
            raise ConfigError(["--resume with --save needs --run-name: which run do the checkpoints belong to?"])
        found = _candidates(out)
        if not found:
            raise ConfigError([f"--resume: no run directory under {out} holds a complete checkpoint; "
                               "drop --resume to start a new run, or give --run-name / --output-dir"])
        if len(found) > 1:
            names = ", ".join(d.name for d in found[:10]) + (f", … ({len(found)} in all)" if len(found) > 10 else "")
            raise ConfigError([f"--resume: {len(found)} runs under {out} can be resumed ({names}); "
                               "choose one with --run-name NAME"])
        run_dir = found[0]
    ckpt_dir = checkpoint_dir(cfg, run_dir)
    path, note = ckpt.resume_checkpoint(ckpt_dir)
    if path is None:
        held = holds_run(run_dir, ckpt_dir)
        if held and not cfg.force:
            raise ConfigError([f"--resume: {run_dir} holds a run ({'; '.join(held)}) but no complete checkpoint, "
                               "so there is nothing to resume; pass --force to start over there (this deletes "
                               "them), or choose another --run-name"])
        _say(f"--resume: {run_dir} holds no complete checkpoint; starting a fresh run there")
        return cfg

    state = json.loads((path / "trainer_state.json").read_text())
    step = int(state["step"])
    config_path = run_dir / "config.json"
    try:
        saved = json.loads(config_path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError([f"--resume: cannot read {config_path} ({type(e).__name__}: {e}); it is the base "
                           "configuration of a resumed run"]) from None
    values, dropped = saved_values(saved, param_schemas)
    try:
        base = build_config(yaml_values=values, param_schemas=param_schemas, yaml_source=str(config_path))
    except ConfigError as e:
        raise ConfigError([f"--resume: the saved {p}" for p in e.problems]) from None
    location = {"output_dir": str(out), "run_name": run_dir.name}
    new = build_config(cli={**cli, **location}, yaml_values={**values, **yaml_values}, param_schemas=param_schemas,
                       yaml_source=yaml_source)
    changes = _overrides(base, new)

    problems = []
    for key, flag, a, b in changes:
        comp, _, name = key.partition(".")
        why = REFUSED_ON_RESUME.get(key) or (
            "it lives in the optimizer state restored from the checkpoint"
            if comp == new.train_backend and name in REFUSED_BACKEND_PARAMS else None)
        if why:
            problems.append(f"--resume: {flag} {a!r} → {b!r} cannot change on resume ({why}); resume with "
                            f"{flag} {a!r} (as saved in {config_path}), or start a new run")
    if step >= new.num_rollout:
        problems.append(f"--resume: run {run_dir} is finished (its newest checkpoint {path.name} is at step {step} "
                        f"and --num-rollout is {new.num_rollout}); to train it further pass a larger --num-rollout, "
                        f"e.g. --num-rollout {2 * step}")
    if problems:
        raise ConfigError(problems)

    _say(f"resuming run {run_dir} from {path} (step {step})")
    if note:
        _say(note)
    if dropped:
        _say(f"saved options unknown to this version, ignored: {', '.join(dropped)}")
    for _, flag, a, b in changes:
        _say(f"override: {flag} {a!r} → {b!r} from step {step + 1}")
    if not state.get("optimizer_state", True):
        _say(f"{path.name} is the final checkpoint of a completed run and holds no optimizer state: "
             f"the optimizer starts afresh at step {step + 1}")
    return new
