"""``relax train``: check the data, build the run's components, run the loop.

Order matters for the user: everything that can be checked without a model (data files,
label keys, empty datasets, the reward scorer, the run directory, a resumed checkpoint's
data fingerprint) is checked first (:func:`preflight`, also run by ``--dry-run``), so a
mistake costs seconds, not a model load.  Exit codes: :mod:`relax_core.run.exits`.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relax_core.run.exits import (
    EXIT_ADAPTER_NOT_REACHED,
    EXIT_BAD_INPUT,
    EXIT_CHECKPOINT_FAILED,
    EXIT_ENVIRONMENT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_WORKER_DIED,
)
from relax_core.run.lora import AdapterCheck, AdapterNotReached
from relax_core.stages.episodes import EnvironmentPromptError


class BadInput(ValueError):
    """Problems found before any model loads (exit 2); each names its fix.

    Attributes:
        problems: one line per problem (the message joins them)."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


def configure(args: list[str], reg: Any) -> tuple[Any, Any, Any]:
    """The flags of ``relax train`` (and the YAML file and ``--resume`` they name) as a
    validated run configuration; nothing is loaded.

    Args:
        args: the command line after ``train``, as typed.
        reg: the plugin registry.

    Returns:
        ``(cfg, resolved, ns)``: the :class:`~relax_core.config.RunConfig`, the resolved
        components (:func:`~relax_core.host.validation.resolve`) and the parsed namespace
        (``ns.dry_run``).

    Raises:
        BadInput: every problem of the flags, the YAML file or the selected components
            (configuration problems prefixed ``config:``).
    """
    from relax_core.config import ConfigError, build_config, load_yaml, parse_cli
    from relax_core.host.validation import resolve
    from relax_core.run.resume import resume_config

    schemas = reg.param_schemas()
    from relax_core.specs import KINDS

    # every selecting flag takes the installed names of its kind ('auto' also for --reward)
    choices = {k.option: sorted(reg.components.get(k.name, {})) for k in KINDS if k.option}
    choices["reward"] = ["auto", *choices["reward"]]
    try:
        cli, config_path, ns = parse_cli(list(args), schemas, choices=choices)
        yaml_values = load_yaml(config_path) if config_path else {}
        cfg = build_config(cli=cli, yaml_values=yaml_values, param_schemas=schemas,
                           yaml_source=config_path or "config")
        cfg = resume_config(cfg, cli=cli, yaml_values=yaml_values, param_schemas=schemas,
                            yaml_source=config_path or "config")
    except ConfigError as e:
        raise BadInput([f"config: {p}" for p in e.problems]) from None
    resolved, problems = resolve(cfg, reg)
    if problems:
        raise BadInput([str(p) for p in problems])
    return cfg, resolved, ns


def _error(msg: str) -> int:
    print(f"relax: error: {msg}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _error_worker_died(e: Exception, ckpt_dir: Path) -> int:
    """Name the checkpoint to resume from after a training worker died."""
    from relax_core.run import checkpoint as ckpt

    last = ckpt.latest_checkpoint(ckpt_dir)
    where = (f"the last checkpoint is {last} (step {json.loads((last / 'trainer_state.json').read_text())['step']}); "
             "continue with the same flags and --resume" if last else
             "no checkpoint was saved (use --save-interval N to keep resumable state)")
    print(f"relax: error: {e}; {where}", file=sys.stderr, flush=True)
    return EXIT_WORKER_DIED


def find_run_dir(cfg: Any) -> Path:
    """The run directory: ``<output_dir>/<run_name>`` (with ``--resume``, the run that
    :func:`relax_core.run.resume.resume_config` chose); without ``--run-name`` a new
    ``<estimator>-<timestamp>`` directory (``-2``, ``-3``, … appended if it exists)."""
    out = Path(cfg.output_dir).expanduser()
    if cfg.run_name:
        return out / cfg.run_name
    base = out / f"{cfg.advantage_estimator}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


@dataclass
class Preflight:
    """What :func:`preflight` checked and loaded."""

    train_data: Any
    eval_data: Any
    scorers: list[Any]
    """One :class:`~relax_core.stages.rewarding.Scorer` per ``--reward`` (:mod:`relax_core.stages.reward_mix`)."""
    run_dir: Path
    resume_from: Path | None
    """The checkpoint ``--resume`` continues from (``None``: a fresh start)."""
    warnings: list[str]
    """Lines to show the user (e.g. a scorer that gives a correct label less than full reward)."""
    notes: list[str]
    """What the checks changed, for the user (training rows left out as evaluation prompts)."""


def preflight(cfg: Any, resolved: Any, reg: Any) -> Preflight:
    """Everything ``relax train`` checks before a model loads, changing nothing on disk, and
    what ``--dry-run`` checks too: the model name (:func:`relax_core.models.model_problem`),
    the teacher's and its tokenizer (:func:`teacher_problems`),
    the data (file, line and column of a fault), the scorer (installed, builds, and a correct
    label scores: :func:`relax_core.host.reward_check.label_check`; a model-based scorer's
    bad-response probe warns: :func:`~relax_core.host.reward_check.bad_response_probe`), the engine's log-probs, the
    run directory (a fresh start into one that holds a run needs ``--force``) and, with
    ``--resume``, the checkpoint's data fingerprint.

    Raises:
        BadInput: listing the problems, each with its fix.
    """
    from relax_core.data import DataError, fingerprint_change, run_datasets
    from relax_core.host.reward_check import bad_response_probe, label_check
    from relax_core.models import model_problem
    from relax_core.run import checkpoint as ckpt
    from relax_core.run.resume import checkpoint_dir, holds_run
    from relax_core.stages.rewarding import RewardSetupError, resolve_scorers

    problems = [p for p in [model_problem(cfg.model)] if p]
    if cfg.teacher_model:
        problems += teacher_problems(cfg, bool(problems))
    try:
        train_data, eval_data = run_datasets(cfg, reg)
    except DataError as e:
        raise BadInput(problems + [str(e)]) from None
    notes = [f"{train_data.held_out} of {len(train_data) + train_data.held_out} training rows left out: their "
             "prompt is an evaluation prompt (--no-exclude-eval-prompts keeps them)"] if train_data.held_out else []
    datasets = [("--data", train_data)] + ([("--eval-data", eval_data)] if eval_data else [])
    try:
        scorers = resolve_scorers(cfg, reg)
        for scorer in scorers:
            for _, ds in datasets:
                scorer.check([r["metadata"] for r in ds.rows])
    except RewardSetupError as e:
        raise BadInput(problems + [str(e)]) from None
    warnings = []
    for scorer in scorers:
        label_problems, label_warnings = label_check(scorer, datasets, cfg)
        problems += label_problems
        warnings += label_warnings
        if not label_problems:
            warnings += bad_response_probe(scorer, train_data, cfg)
    sampler = resolved.context.sampler
    key = sampler.caps.row_metadata if sampler else None
    lacking = sum(key not in (r["metadata"] or {}) for r in train_data.rows) if key else 0
    if lacking:
        problems.append(f"--sampler {sampler.name} reads each training row's metadata['{key}'], which {lacking} of "
                        f"the {len(train_data)} rows of --data {cfg.data} lack; {sampler.caps.row_metadata_fix}")
    if cfg.use_rollout_logprobs and "rollout_log_probs" not in resolved.context.engine.caps.provides_fields:
        problems.append(f"--use-rollout-logprobs needs an engine that returns log-probs; '{cfg.rollout_engine}' does not")
    if problems:
        raise BadInput(problems)

    run_dir = find_run_dir(cfg)
    ckpt_dir = checkpoint_dir(cfg, run_dir)
    resume_from = ckpt.latest_checkpoint(ckpt_dir) if cfg.resume else None
    if resume_from is None:
        held = holds_run(run_dir, ckpt_dir)
        if held and not cfg.force:
            raise BadInput(f"{run_dir} already holds a run ({'; '.join(held)}); continue it with --resume, "
                           "choose another --run-name, or pass --force to start over there (this deletes them)")
    else:
        saved = json.loads((resume_from / "trainer_state.json").read_text()).get("data")
        change = saved and fingerprint_change(saved, train_data.fingerprint)
        if change and not cfg.resume_allow_data_change:
            raise BadInput(f"--resume: the training data differ from those of {resume_from}: {change}; resume with "
                           "the same --data, or pass --resume-allow-data-change to continue on these data (same "
                           "row count: the data position carries over; otherwise they are read from their start)")
        if change:
            print(f"relax: --resume-allow-data-change: training data changed ({change})", file=sys.stderr)
    return Preflight(train_data, eval_data, scorers, run_dir, resume_from, warnings, notes)


def teacher_problems(cfg: Any, model_failed: bool) -> list[str]:
    """``--teacher-model``: it can load (:func:`relax_core.models.model_problem`), and its
    tokenizer is ``--model``'s (:func:`relax_core.models.tokenizer_difference`), and its
    embedding has a row for every id the student can sample (padded vocabularies differ in
    one family: Qwen2.5-0.5B has 151,936 rows, Qwen2.5-7B 152,064), compared before any
    weights load (``model_failed``: ``--model`` itself cannot load, so there is nothing to
    compare with)."""
    from relax_core.models import embedding_rows, load_tokenizer, model_problem, tokenizer_difference

    problem = model_problem(cfg.teacher_model, flag="--teacher-model")
    if problem or model_failed:
        return [problem] if problem else []
    diff = tokenizer_difference(load_tokenizer(cfg.model), load_tokenizer(cfg.teacher_model))
    if diff is not None:
        return [f"--teacher-model {cfg.teacher_model}: its tokenizer is not --model's ({diff}; student first); the "
                "teacher scores the student's token ids, so both must share one tokenizer: choose a teacher of the "
                "student's model family (same vocabulary and chat-template special tokens)"]
    student, teacher = embedding_rows(cfg.model), embedding_rows(cfg.teacher_model)
    if teacher < student:
        return [f"--teacher-model {cfg.teacher_model}: its embedding has {teacher} rows, fewer than --model's "
                f"{student}, so a sampled id in {teacher}..{student - 1} (a padding row) would have no teacher "
                "log-prob: choose a teacher whose vocab_size is at least the student's"]
    return []


def prepare_run_dir(cfg: Any, run_dir: Path, fresh: bool) -> None:
    """Create the run directory.  On a ``fresh`` start with ``--force``, first delete what
    an earlier run left there (metrics, samples, trained-prompt log, checkpoints, final
    model), so that nothing is appended to it (:func:`preflight` refused it without
    ``--force``)."""
    from relax_core.run.resume import checkpoint_dir, holds_run

    ckpt_dir = checkpoint_dir(cfg, run_dir)
    held = holds_run(run_dir, ckpt_dir) if fresh and cfg.force else []
    if held:
        for name in ("metrics.jsonl", "samples.jsonl", "trained_prompts.jsonl"):
            (run_dir / name).unlink(missing_ok=True)
        shutil.rmtree(run_dir / "final", ignore_errors=True)
        shutil.rmtree(ckpt_dir, ignore_errors=True)
        print(f"relax: --force: removed the earlier run in {run_dir} ({'; '.join(held)})", file=sys.stderr)
    run_dir.mkdir(parents=True, exist_ok=True)


def make_score(scorers: list[Any], cfg: Any, pools: list[Any] | None = None) -> Any:
    """``score(responses, labels, metadata, prompts) -> (rewards, metrics)`` over the run's
    scorers (one per ``--reward``), each run in a worker pool with timeouts
    (:func:`relax_core.stages.rewarding.score_batch`; the prompts reach the scorers as
    ``metadata["prompt"]``), combined with ``--reward-weights``
    (:mod:`relax_core.stages.reward_mix`: with several, or a weight other than 1, each one's unweighted
    mean is ``rollout/reward/<name>``).
    ``pools[j]``, where given, is the pool scorer ``j`` runs in (its Ray actor)."""
    from relax_core.stages import reward_mix, rewarding

    weights = reward_mix.weights(cfg)
    pools = pools or [None] * len(scorers)

    def score(responses: list[str], labels: list[Any], metadata: list[dict],
              prompts: list[str]) -> tuple[list[Any], dict[str, float]]:
        parts, metrics = [], {f"rollout/{k}": 0.0 for k in ("reward_errors", "reward_timeouts")}
        for scorer, pool in zip(scorers, pools):
            rewards, stats = rewarding.score_batch(scorer, responses, labels, metadata, timeout=cfg.reward_timeout,
                                                   num_workers=cfg.reward_num_workers, prompts=prompts, pool=pool)
            parts.append(rewards)
            for k, v in stats.items():
                metrics[f"rollout/{k}"] = metrics.get(f"rollout/{k}", 0.0) + float(v)
        if reward_mix.is_composite(cfg) or weights != (1.0,):  # each part's own mean, whenever weighted
            metrics.update(reward_mix.part_metrics([s.reward for s in scorers], parts))
        return (parts[0] if weights == (1.0,) else reward_mix.combine(parts, weights)), metrics

    return score


def plugin_versions(reg: Any) -> dict[str, str]:
    return {p.dist: p.version for p in reg.plugins}


def shares_weights(cfg: Any, engine_caps: Any, *, ray: bool) -> bool:
    """Whether the trainer's weight tensors also serve the engine (one copy of the model, not
    two): a local, synchronous run pushing after every step (``--update-weights-interval 1``,
    not ``--fully-async``, not ``--load-debug-rollout-data``, which never pushes) to an engine
    that declares ``supports_shared_weights``.  Anywhere else the engine must hold weights the
    trainer has moved past, or lives in another process."""
    return (not ray and not cfg.fully_async and cfg.update_weights_interval == 1
            and not cfg.load_debug_rollout_data and engine_caps.supports_shared_weights)


def launch(cfg: Any, resolved: Any, reg: Any) -> int:
    """Run ``relax train`` with a validated config; returns the exit code.

    The run's display (:mod:`relax_core.reporting.progress`) is open from the first check on and names
    each start-up phase; a run that reached its loop ends with the summary
    (:mod:`relax_core.reporting.summary`).  A Ctrl-C that stops the run at once (a second one during
    training, or one before training starts) gives one line and exit 130, no traceback; a
    checkpoint that cannot be written gives one line naming the previous (intact)
    checkpoint and exit 5.
    """
    from relax_core.reporting import progress
    from relax_core.run import checkpoint as ckpt
    from relax_core.run.resume import checkpoint_dir

    # transformers' "Loading weights" / "Writing model shards" bars: read at its import by
    # worker processes (Ray), switched off in this one by _launch
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    t0 = time.monotonic()
    display = progress.start(cfg)
    run_dir, trainer = None, None

    def last_checkpoint() -> Any:
        """The newest complete checkpoint of the run, once its directory is known."""
        return ckpt.latest_checkpoint(checkpoint_dir(cfg, run_dir)) if run_dir else None

    try:
        display.phase("checking the data and the scorer")
        checked = preflight(cfg, resolved, reg)
        run_dir = checked.run_dir
        for line in checked.notes + [f"warning: {w}" for w in checked.warnings]:
            display.message(line)
        code, trainer = _launch(cfg, resolved, reg, checked, display)
    except BadInput as e:
        for p in e.problems:
            _error(p)
        return EXIT_BAD_INPUT
    except AdapterNotReached as e:
        print(f"relax: error: {e}", file=sys.stderr)
        return EXIT_ADAPTER_NOT_REACHED
    except ckpt.CheckpointError as e:
        print(f"relax: error: {e}; free space or fix the directory, then continue with --resume", file=sys.stderr)
        return EXIT_CHECKPOINT_FAILED
    except EnvironmentPromptError as e:
        last = last_checkpoint()
        print(f"relax: error: {e}; fix the environment, then " + (f"continue from {last} with --resume" if last else
                                                                   "start again"), file=sys.stderr)
        return EXIT_ENVIRONMENT_FAILED
    except KeyboardInterrupt:
        last = last_checkpoint()
        print("relax: aborted by Ctrl-C; " + (f"the last complete checkpoint is {last} (continue with --resume)"
                                              if last else "no checkpoint was written"), file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    finally:
        progress.close()
    if trainer is not None:
        from relax_core.reporting.summary import summary_lines

        print("\n".join(summary_lines(trainer.run_dir, total=cfg.num_rollout, wall_s=time.monotonic() - t0,
                                      ckpt_dir=trainer.ckpt_dir)), flush=True)
    return code


def _launch(cfg: Any, resolved: Any, reg: Any, checked: Preflight, display: Any) -> tuple[int, Any]:
    """The body of :func:`launch`: ``(exit code, the trainer once its loop ran, else None)``."""
    train_data, eval_data, scorers = checked.train_data, checked.eval_data, checked.scorers

    display.phase("importing torch")
    import numpy as np
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    from relax_core.batch import FIELDS
    from relax_core.config import config_to_dict
    from relax_core.host.reward_check import RewardWatch
    from relax_core.reporting.metrics import git_commit
    from relax_core.run.components import Components
    from relax_core.run.precision import resolve_bf16
    from relax_core.stages import reward_mix
    from relax_core.stages.episodes import build_runner
    from relax_core.stages.rewarding import build_processors
    from relax_core.trainer import build_trainer

    random.seed(cfg.seed)
    np.random.seed(cfg.seed % 2**32)
    torch.manual_seed(cfg.seed)

    # --bf16 auto, decided here once: config.json keeps the decision
    cfg, precision = resolve_bf16(cfg, resolved.context.backend.caps.bf16_devices)
    if precision:
        display.message(precision)
    run_dir = checked.run_dir
    prepare_run_dir(cfg, run_dir, fresh=checked.resume_from is None)
    config_dict = config_to_dict(cfg)
    (run_dir / "config.json").write_text(json.dumps(config_dict, indent=2, default=str))

    # ---- components
    ctx, specs = resolved.context, resolved.specs
    build = lambda key, name: specs[key].build(cfg.params_for(name), cfg)  # noqa: E731
    estimator = build("estimator", cfg.advantage_estimator)
    # advantage-term corrections (e.g. opd) act on the advantages, the others in the loss
    loss_corrections = [c for c in ctx.corrections if not c.caps.advantage_term]
    corrections = [build(f"correction:{c.name}", c.name) for c in loss_corrections]
    advantage_terms = [build(f"correction:{c.name}", c.name) for c in ctx.corrections if c.caps.advantage_term]
    processors = build_processors(cfg, reg)
    key = ctx.sampler.caps.row_metadata
    sampler = build("sampler", cfg.sampler)(len(train_data), cfg.seed,
                                            *([[r["metadata"][key] for r in train_data.rows]] if key else []))
    est_caps = ctx.estimator.caps
    corr_caps = [c.caps for c in ctx.corrections]
    rollout_fields = frozenset(f for caps in (est_caps, *corr_caps) for f in caps.requires_fields
                               if f in FIELDS and FIELDS[f].stage == "rollout")
    top_k = max([int(getattr(c, "top_k", 0) or 0) for c in corrections] + [0])
    if "top_k_log_probs" in rollout_fields and top_k == 0:
        return _error("a selected correction needs top-k log-probs but does not say how many (its object has no 'top_k')"), None
    routed = "routed_experts" in rollout_fields
    critic_settings = getattr(estimator, "critic_settings", None) if est_caps.needs_critic else None

    needs_ref = cfg.needs_reference_model or cfg.lora_rank > 0  # LoRA: the adapter check reads the base model
    runtime = None
    if cfg.launcher == "ray":  # engines and training ranks as Ray actors (relax_core.distributed)
        display.phase(f"starting Ray: rollout engines and training workers load {cfg.model}"
                      + (f", the teacher worker {cfg.teacher_model}" if cfg.teacher_model else ""))
        from relax_core.distributed.runtime import start_ray
        from relax_core.models import load_tokenizer

        runtime = start_ray(cfg, config_dict, corrections=[c.name for c in loss_corrections],
                            tokenizer=load_tokenizer(cfg.model),
                            setup={"needs_ref": needs_ref, "needs_critic": est_caps.needs_critic,
                                   "needs_top_k": top_k > 0, "routing_replay": routed})
        engine, backend = runtime.engine, runtime.backend
    else:
        display.phase(f"loading the model {cfg.model} into the rollout engine ({cfg.rollout_engine})")
        engine = build("engine", cfg.rollout_engine)
        display.phase(f"loading the model {cfg.model} into the training backend ({cfg.train_backend})")
        backend = build("backend", cfg.train_backend)
        backend.setup(needs_ref=needs_ref, needs_critic=est_caps.needs_critic,
                      needs_top_k=top_k > 0, routing_replay=routed, critic_settings=critic_settings)

    pools = runtime.scorer_pools(scorers, cfg.reward_num_workers) if runtime else None  # model rewards' actors
    score = make_score(scorers, cfg, pools)
    if any(reward_mix.weights(cfg)):  # every weight 0 (pure distillation): rewards 0 by design, nothing to watch
        score = RewardWatch(score, scorers, notify=display.message)
    push_adapter = cfg.lora_rank > 0 and cfg.lora_engine_adapter and ctx.engine.caps.supports_lora_adapters
    comps = Components(
        engine=engine, backend=backend, estimator=estimator, corrections=corrections,
        advantage_terms=advantage_terms, processors=processors,
        score=score, sampler=sampler, episodes=build_runner(cfg, reg, engine, score),
        needs_critic=est_caps.needs_critic,
        processor_resamples=any(p.caps.may_request_more_samples for p in ctx.processors),
        rollout_fields=rollout_fields, top_k=top_k,
        num_critic_only_steps=critic_settings.num_critic_only_steps if critic_settings else 0,
        share_weights=shares_weights(cfg, ctx.engine.caps, ray=runtime is not None) and not push_adapter,
        push_adapter=push_adapter,
        adapter_check=AdapterCheck(engine, backend, cfg, display.message) if cfg.lora_rank else None)
    trainer = build_trainer(cfg, comps, train_data, eval_data, run_dir, est_caps.behaviour_numerator, config_dict)
    info = {
        "relax_core": __import__("relax_core").__version__, "plugins": plugin_versions(reg),
        "git_commit": git_commit(Path(__file__).resolve().parent), "python": sys.version.split()[0],
        "torch": torch.__version__, "old_log_probs": ["detach(current)", "recomputed", "rollout"][trainer.old_logp_source],
        "engine_weights": "lora adapter" if comps.push_adapter else "shared" if comps.share_weights else "state dict",
        "train_data": {"name": train_data.name, "rows": len(train_data), "skipped_rows": train_data.skipped,
                       "eval_prompt_rows_left_out": train_data.held_out},
        "eval_data": None if eval_data is None else {"name": eval_data.name, "rows": len(eval_data)},
        "command": sys.argv,
        **({"ray_startup_s": runtime.startup_s} if runtime else {}),
    }
    (run_dir / "run_info.json").write_text(json.dumps(info, indent=2, default=str))
    try:
        return trainer.run(), trainer
    except Exception as e:
        if runtime is None or not runtime.worker_died(e):
            raise
        return _error_worker_died(e, trainer.ckpt_dir), trainer
    finally:
        shutdown = getattr(engine, "shutdown", None)
        if shutdown:
            shutdown()
        if runtime:
            runtime.shutdown()
