"""``relax train``: check the data, build the run's components, run the loop.

Order matters for the user: everything that can be checked without a model (data files,
label keys, empty datasets, the reward scorer) is checked first, so a mistake costs
seconds, not a model load.  Exit codes: 0 done, 2 bad input, 3 stopped after too many
non-finite steps, 130 interrupted (checkpoint saved).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EXIT_BAD_INPUT = 2


def _error(msg: str) -> int:
    print(f"relax: error: {msg}", file=sys.stderr)
    return EXIT_BAD_INPUT


def find_run_dir(cfg: Any) -> Path:
    """The run directory: ``<output_dir>/<run_name>``; with ``--resume`` and no
    ``--run-name``, the newest ``<estimator>-*`` run that has a checkpoint."""
    out = Path(cfg.output_dir).expanduser()
    if cfg.run_name:
        return out / cfg.run_name
    if cfg.resume:
        runs = sorted((p for p in out.glob(f"{cfg.advantage_estimator}-*") if (p / "checkpoints" / "latest").is_file()),
                      key=lambda p: p.stat().st_mtime)
        if runs:
            return runs[-1]
    return out / f"{cfg.advantage_estimator}-{time.strftime('%Y%m%d-%H%M%S')}"


def make_score(scorer: Any, cfg: Any) -> Any:
    """``score(responses, labels, metadata, prompts) -> (rewards, metrics)`` over the run's
    scorer, run in a worker pool with timeouts (:func:`relax_core.rewarding.score_batch`; the
    prompts reach the scorers as ``metadata["prompt"]``)."""
    from relax_core import rewarding

    def score(responses: list[str], labels: list[Any], metadata: list[dict],
              prompts: list[str]) -> tuple[list[Any], dict[str, float]]:
        rewards, stats = rewarding.score_batch(scorer, responses, labels, metadata, timeout=cfg.reward_timeout,
                                               num_workers=cfg.reward_num_workers, prompts=prompts)
        return rewards, {f"rollout/{k}": float(v) for k, v in stats.items()}

    return score


def plugin_versions(reg: Any) -> dict[str, str]:
    return {p.dist: p.version for p in reg.plugins}


class InputError(ValueError):
    """Problems with the run's inputs (model name, data, scorer), found before any model loads."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass
class Inputs:
    """What :func:`check_inputs` loaded: the datasets, the scorer, and warnings to print."""

    train_data: Any
    eval_data: Any
    scorer: Any
    warnings: list[str]


def check_inputs(cfg: Any, reg: Any) -> Inputs:
    """Everything ``relax train`` checks before any model loads, shared with ``--dry-run``:
    the model name (:func:`relax_core.models.model_problem`), the data (every row), the
    scorer (installed, builds), and whether a correct answer scores
    (:func:`relax_core.reward_check.label_check`).

    Raises:
        InputError: listing the problems (the CLI exits with code 2).
    """
    from relax_core.data import DataError, load_dataset
    from relax_core.models import model_problem
    from relax_core.reward_check import label_check
    from relax_core.rewarding import RewardSetupError, resolve_scorer

    problems = [p for p in [model_problem(cfg.model)] if p]
    try:
        train_data = load_dataset(cfg.data, cfg, reg)
        eval_data = load_dataset(cfg.eval_source, cfg, reg) if cfg.eval_source else None
    except DataError as e:
        raise InputError(problems + [str(e)]) from None
    datasets = [("--data", train_data)] + ([("--eval-data", eval_data)] if eval_data else [])
    try:
        scorer = resolve_scorer(cfg, reg)
        for _, ds in datasets:
            scorer.check([r["metadata"] for r in ds.rows])
    except RewardSetupError as e:
        raise InputError(problems + [str(e)]) from None
    label_problems, warnings = label_check(scorer, datasets, cfg)
    if problems or label_problems:
        raise InputError(problems + label_problems)
    return Inputs(train_data, eval_data, scorer, warnings)


def launch(cfg: Any, resolved: Any, reg: Any) -> int:
    """Run ``relax train`` with a validated config; returns the exit code.

    The run's display (:mod:`relax_core.progress`) is open from the first check on and names
    each start-up phase; a run that reached its loop ends with the summary
    (:mod:`relax_core.summary`)."""
    from relax_core import progress

    # transformers' "Loading weights" / "Writing model shards" bars: read at its import by
    # worker processes (Ray), switched off below in this one
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    t0 = time.monotonic()
    display = progress.start(cfg)
    try:
        code, trainer = _launch(cfg, resolved, reg, display)
    finally:
        progress.close()
    if trainer is not None:
        from relax_core.summary import summary_lines

        print("\n".join(summary_lines(trainer.run_dir, total=cfg.num_rollout, wall_s=time.monotonic() - t0,
                                      ckpt_dir=trainer.ckpt_dir)), flush=True)
    return code


def _launch(cfg: Any, resolved: Any, reg: Any, display: Any) -> tuple[int, Any]:
    """The body of :func:`launch`: ``(exit code, the trainer once its loop ran, else None)``."""
    # ---- checks that need no model
    display.phase("checking the data and the scorer")
    try:
        inputs = check_inputs(cfg, reg)
    except InputError as e:
        for p in e.problems:
            _error(p)
        return EXIT_BAD_INPUT, None
    for w in inputs.warnings:
        display.message(f"warning: {w}")
    train_data, eval_data, scorer = inputs.train_data, inputs.eval_data, inputs.scorer

    if cfg.use_rollout_logprobs and not resolved.context.engine.caps.returns_log_probs:
        return _error(f"--use-rollout-logprobs needs an engine that returns log-probs; '{cfg.rollout_engine}' does not"), None

    display.phase("importing torch")
    import numpy as np
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    from relax_core.config import config_to_dict
    from relax_core.rewarding import build_processors
    from relax_core.metrics import git_commit
    from relax_core.reward_check import RewardWatch
    from relax_core.trainer import Components, Trainer

    random.seed(cfg.seed)
    np.random.seed(cfg.seed % 2**32)
    torch.manual_seed(cfg.seed)

    run_dir = find_run_dir(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    config_dict = config_to_dict(cfg)
    (run_dir / "config.json").write_text(json.dumps(config_dict, indent=2, default=str))

    # ---- components
    ctx, specs = resolved.context, resolved.specs
    build = lambda key, name: specs[key].build(cfg.params_for(name), cfg)  # noqa: E731
    estimator = build("estimator", cfg.advantage_estimator)
    corrections = [build(f"correction:{c.name}", c.name) for c in ctx.corrections]
    processors = build_processors(cfg, reg)
    est_caps = ctx.estimator.caps
    corr_caps = [c.caps for c in ctx.corrections]
    top_k = max([int(getattr(c, "top_k", 0) or 0) for c in corrections] + [0])
    if any(c.needs_top_k_log_probs for c in corr_caps) and top_k == 0:
        return _error("a selected correction needs top-k log-probs but does not say how many (its object has no 'top_k')"), None
    routed = any(c.needs_routed_experts for c in corr_caps)
    critic_settings = getattr(estimator, "critic_settings", None) if est_caps.needs_critic else None

    runtime = None
    if cfg.launcher == "ray":  # engines and training ranks as Ray actors (relax_core.distributed)
        display.phase(f"starting Ray: rollout engines and training workers load {cfg.model}")
        from relax_core.distributed.runtime import start_ray
        from relax_core.models import load_tokenizer

        runtime = start_ray(cfg, config_dict, corrections=[c.name for c in ctx.corrections],
                            tokenizer=load_tokenizer(cfg.model),
                            setup={"needs_ref": cfg.needs_reference_model, "needs_critic": est_caps.needs_critic,
                                   "needs_top_k": top_k > 0, "routing_replay": routed})
        engine, backend = runtime.engine, runtime.backend
    else:
        display.phase(f"loading the model {cfg.model} into the rollout engine ({cfg.rollout_engine})")
        engine = build("engine", cfg.rollout_engine)
        display.phase(f"loading the model {cfg.model} into the training backend ({cfg.train_backend})")
        backend = build("backend", cfg.train_backend)
        backend.setup(needs_ref=cfg.needs_reference_model, needs_critic=est_caps.needs_critic,
                      needs_top_k=top_k > 0, routing_replay=routed, critic_settings=critic_settings)

    comps = Components(
        engine=engine, backend=backend, estimator=estimator, corrections=corrections, processors=processors,
        score=RewardWatch(make_score(scorer, cfg), scorer, notify=display.message),
        needs_critic=est_caps.needs_critic,
        processor_resamples=any(p.caps.may_request_more_samples for p in ctx.processors),
        top_k=top_k, routed_experts=routed,
        num_critic_only_steps=critic_settings.num_critic_only_steps if critic_settings else 0)
    trainer_class = runtime.trainer_class if runtime else Trainer
    trainer = trainer_class(cfg, comps, train_data, eval_data, run_dir, est_caps.policy_loss_kind, config_dict)
    info = {
        "relax_core": __import__("relax_core").__version__, "plugins": plugin_versions(reg),
        "git_commit": git_commit(Path(__file__).resolve().parent), "python": sys.version.split()[0],
        "torch": torch.__version__, "old_log_probs": ["detach(current)", "recomputed", "rollout"][trainer.old_logp_source],
        "train_data": {"name": train_data.name, "rows": len(train_data), "skipped_rows": train_data.skipped},
        "eval_data": None if eval_data is None else {"name": eval_data.name, "rows": len(eval_data)},
        "command": sys.argv,
        **({"ray_startup_s": runtime.startup_s} if runtime else {}),
    }
    (run_dir / "run_info.json").write_text(json.dumps(info, indent=2, default=str))
    try:
        return trainer.run(), trainer
    finally:
        shutdown = getattr(engine, "shutdown", None)
        if shutdown:
            shutdown()
        if runtime:
            runtime.shutdown()
