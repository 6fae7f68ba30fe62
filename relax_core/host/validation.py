"""Startup validation: every problem of a run configuration, found before anything loads.

Runs before any model, engine or Ray cluster starts.  Collects every problem (it does not
stop at the first) and reports each with the component, its distribution and version,
the capability or constraint violated, and the fix.  The CLI exits with code 2.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relax_core.config import DEFAULT_MODEL, RunConfig, check_bounds, config_fields, param_flag, value_problems
from relax_core.data import data_sources, parse_data
from relax_core.host.capabilities import CAPABILITIES, Context, Selected
from relax_core.host.plugins import PluginError, Registry
from relax_core.run.lora import lora_problems
from relax_core.stages.reward_mix import problems as reward_mix_problems


@dataclass(frozen=True)
class Problem:
    """One validation problem."""

    component: str  # e.g. "estimator 'm2po' (relax-m2po 0.1.0)" or "config"
    constraint: str  # capability field or constraint name
    message: str
    fix: str = ""

    def __str__(self) -> str:
        fix = f"\n    fix: {self.fix}" if self.fix else ""
        return f"{self.component} [{self.constraint}]: {self.message}{fix}"


class ValidationError(Exception):
    """Raised with every problem found."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


@dataclass(frozen=True)
class Resolved:
    """The components chosen for a run (names, specs, params, capabilities)."""

    context: Context
    specs: dict[str, Any]  # "estimator" -> spec, "correction:tis" -> spec, ...
    warnings: tuple[Problem, ...] = ()
    """Capability rows declared ``warn`` that this run violates (printed, not refused)."""


def model_config(model: str) -> dict | None:
    """``--model``'s ``config.json`` (no weights; the default model's ``model_type``), or
    ``None`` when it cannot be read before loading (hub names)."""
    if model == DEFAULT_MODEL:
        return {"model_type": "llama"}  # SmolLM2
    try:
        return json.loads((Path(model).expanduser() / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None


def model_is_moe(model: str) -> bool | None:
    """Whether ``--model`` is a mixture-of-experts model, from its config.json only
    (no weights).  ``None`` when it cannot be told without loading (hub names)."""
    c = model_config(model)
    if c is None:
        return None
    keys = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
    return any(int(c.get(k) or 0) > 1 for k in keys)


def in_range(cfg: RunConfig) -> RunConfig:
    """``cfg`` with every out-of-range value (already reported by
    :func:`~relax_core.config.value_problems`) replaced by its default, so that the
    cross-field checks run on numbers they can divide by and still report their own problems."""
    bad = {f.name: f.default for f in config_fields() if check_bounds(getattr(cfg, f.name), f.metadata, f.name)}
    params = {}
    for comp, p in cfg.plugin_params.items():
        if p is None:
            continue
        fix = {f.name: f.default for f in dataclasses.fields(p) if check_bounds(getattr(p, f.name), f.metadata, f.name)}
        if fix:
            params[comp] = dataclasses.replace(p, **fix)
    if not bad and not params:
        return cfg
    return dataclasses.replace(cfg, **bad, plugin_params={**cfg.plugin_params, **params})


def _select(reg: Registry, kind: str, name: str, cfg: RunConfig, problems: list[Problem]) -> tuple[Selected | None, Any]:
    try:
        r = reg.get(kind, name)
    except PluginError as e:
        problems.append(Problem(f"{kind} '{name}'", "unknown component", str(e), "`relax plugins` lists what is installed"))
        return None, None
    caps = r.spec.capabilities_for(cfg.params_for(name))
    return Selected(kind, name, caps, r.origin), r.spec


def _batch_problems(cfg: RunConfig) -> list[Problem]:
    """Batch-shape arithmetic: the training workers split into whole model replicas
    (tensor × context × pipeline parallel ranks), a rollout into whole optimizer steps, a
    step into equal data-parallel shares (one per replica), a share into whole micro-batches."""
    out = []
    n = cfg.rollout_batch_size * cfg.n_samples_per_prompt
    steps = cfg.num_steps_per_rollout
    gbs = cfg.effective_global_batch_size
    workers, mp, dp = cfg.training_workers, cfg.model_parallel_size, cfg.data_parallel_size

    def add(msg: str, fix: str) -> None:
        out.append(Problem("config", "batch shape", msg, fix))

    if n % steps:
        add(f"rollout_batch_size × n_samples_per_prompt = {cfg.rollout_batch_size}×{cfg.n_samples_per_prompt} = {n} "
            f"samples per rollout is not divisible by --num-steps-per-rollout {steps}",
            "make the samples per rollout a multiple of --num-steps-per-rollout")
    elif gbs * steps != n:
        add(f"--global-batch-size {gbs} × --num-steps-per-rollout {steps} = {gbs * steps} != {n} samples per rollout "
            f"(rollout_batch_size × n_samples_per_prompt = {cfg.rollout_batch_size}×{cfg.n_samples_per_prompt})",
            f"omit --global-batch-size (it is derived: {n // steps}) or set --num-steps-per-rollout "
            f"{n // gbs if gbs and n % gbs == 0 else 'to samples per rollout / global batch size'}")
    sizes = (f"--tensor-parallel-size × --context-parallel-size × --pipeline-parallel-size = "
             f"{cfg.tensor_parallel_size}×{cfg.context_parallel_size}×{cfg.pipeline_parallel_size}")
    replicas = (f"{dp} data-parallel training workers" if mp == 1 else
                f"{dp} data-parallel replicas ({workers} training workers / model-parallel size {mp})")
    if cfg.launcher == "local" and mp > 1:
        add(f"model-parallel size {mp} ({sizes}) needs {mp} training processes, but --launcher local starts one",
            f"use --launcher ray --actor-num-gpus-per-node {mp} (one training worker per model-parallel rank), "
            "or set the parallel sizes to 1")
    elif workers % mp:
        add(f"{workers} training workers (--actor-num-nodes {cfg.actor_num_nodes} × --actor-num-gpus-per-node "
            f"{cfg.actor_num_gpus_per_node}) are not a multiple of the model-parallel size {mp} ({sizes})",
            f"make --actor-num-nodes × --actor-num-gpus-per-node a multiple of {mp} "
            f"(e.g. --actor-num-gpus-per-node {mp}), or lower the parallel sizes")
    elif gbs % dp:
        add(f"--global-batch-size {gbs} is not divisible by the {replicas}",
            "choose a global batch size divisible by (--actor-num-nodes × --actor-num-gpus-per-node) / "
            "(--tensor-parallel-size × --context-parallel-size × --pipeline-parallel-size)")
    elif cfg.micro_batch_size is not None and (gbs // dp) % cfg.micro_batch_size:
        add(f"each training worker's share of the global batch ({gbs} / {dp} = {gbs // dp} samples) is not "
            f"divisible by --micro-batch-size {cfg.micro_batch_size}",
            "choose a micro-batch size that divides global_batch_size / data-parallel replicas")
    if cfg.max_tokens_per_micro_batch is not None and cfg.max_tokens_per_micro_batch < cfg.rollout_max_response_len:
        add(f"--max-tokens-per-micro-batch {cfg.max_tokens_per_micro_batch} cannot hold one full-length response "
            f"(--rollout-max-response-len {cfg.rollout_max_response_len}, plus its prompt)",
            "raise --max-tokens-per-micro-batch above the longest prompt + --rollout-max-response-len")
    return out


def _data_problems(cfg: RunConfig, reg: Registry) -> list[Problem]:
    """``--data`` / ``--eval-data``: a registered ``scheme:spec``, a file format's
    ``scheme:<existing file>`` or an existing file."""
    out = []
    schemes = data_sources(reg)
    formats = sorted(s for s, r in schemes.items() if r.spec.file_keys)
    for flag, val in (("--data", cfg.data), ("--eval-data", cfg.eval_source)):
        if not val:
            continue
        ref = parse_data(val, schemes)
        if ref.kind == "source" and ref.scheme not in formats:
            continue
        if ref.kind == "unknown":
            known = ", ".join(f"{s}:" for s in sorted(schemes))
            out.append(Problem("config", flag, f"unknown data source scheme '{ref.scheme}:' in {val}",
                               f"use one of {known}, or a file path (`relax plugins` lists data sources)"))
        elif not Path(ref.target).expanduser().exists():
            forms = "".join(f", {s}:<file>" for s in formats)
            out.append(Problem("config", flag, f"data file {ref.target} not found",
                               f"give an existing JSONL/JSON/Parquet file{forms}, or a data source (`relax plugins`)"))
    return out


def _run_problems(cfg: RunConfig) -> list[Problem]:
    out = []
    if cfg.ref_load and not Path(cfg.ref_load).expanduser().exists():
        out.append(Problem("config", "--ref-load", f"reference model {cfg.ref_load} not found", "give an existing path, or omit it to use the initial weights"))
    t = cfg.teacher_model
    if t and t != DEFAULT_MODEL and t.startswith(("/", ".", "~")) and not Path(t).expanduser().exists():
        out.append(Problem("config", "--teacher-model", f"teacher model {t} not found",
                           f"give a local Hugging Face model directory, a hub name, or the default {DEFAULT_MODEL}"))
    m = cfg.model
    if m != DEFAULT_MODEL and m.startswith(("/", ".", "~")) and not Path(m).expanduser().exists():
        out.append(Problem("config", "--model", f"model path {m} not found", "give a local Hugging Face model directory, or the default smollm2-135m-instruct"))
    if cfg.load_debug_rollout_data and not Path(cfg.load_debug_rollout_data).is_dir():
        out.append(Problem("config", "--load-debug-rollout-data", f"{cfg.load_debug_rollout_data} is not a directory", "give the DIR written by --save-debug-rollout-data"))
    if cfg.eval_source and cfg.n_samples_per_eval_prompt > 1 and cfg.eval_temperature == 0:
        out.append(Problem("config", "--n-samples-per-eval-prompt",
                           f"{cfg.n_samples_per_eval_prompt} samples per evaluation prompt at --eval-temperature 0 "
                           "are the same greedy response", "set --eval-temperature above 0 (e.g. 0.7), or 1 sample"))
    if cfg.use_kl_loss and cfg.kl_loss_coef == 0:
        out.append(Problem("config", "--use-kl-loss", "--use-kl-loss with --kl-loss-coef 0 adds nothing", "set --kl-loss-coef > 0"))
    if cfg.fully_async and cfg.launcher != "ray":
        out.append(Problem("config", "--fully-async", "fully-async training needs separate rollout and training workers", "add --launcher ray"))
    ray_only = [flag for flag, on in (("--ray-address", cfg.ray_address), ("--colocate", cfg.colocate),
                                      ("--actor-num-nodes", cfg.actor_num_nodes > 1),
                                      ("--actor-num-gpus-per-node", cfg.actor_num_gpus_per_node > 1),
                                      ("--rollout-num-engines", cfg.rollout_num_engines > 1)) if on]
    if ray_only and cfg.launcher != "ray":
        out.append(Problem("config", "--launcher", f"{', '.join(ray_only)} only take effect with --launcher ray "
                           "(--launcher local runs everything in one process)", "add --launcher ray, or drop them"))
    if cfg.max_staleness > 0 and not cfg.fully_async:
        out.append(Problem("config", "--max-staleness", "--max-staleness > 0 only has meaning with --fully-async", "add --fully-async or use --max-staleness 0"))
    if cfg.fully_async and cfg.max_staleness < cfg.update_weights_interval - 1:
        out.append(Problem("config", "--max-staleness",
                           f"--fully-async with --update-weights-interval {cfg.update_weights_interval} cannot keep "
                           f"--max-staleness {cfg.max_staleness}: the engines get new weights only every "
                           f"{cfg.update_weights_interval} steps, so samples are up to {cfg.update_weights_interval - 1} steps stale",
                           f"use --max-staleness {cfg.update_weights_interval - 1} or more, or a smaller --update-weights-interval"))
    if len(set(cfg.correction)) != len(cfg.correction):
        out.append(Problem("config", "--correction", "a correction is selected twice", "give each --correction once"))
    return out


def unread_parameters(cfg: RunConfig, reg: Registry, selected: set[tuple[str, str]]) -> list[Problem]:
    """Plugin parameters set to a value other than their component's default whose flag no
    selected component declares: e.g. ``--eps-clip 0.3`` (the :class:`~relax_core.specs.PPOClipParams`
    block that grpo, ppo, ... compose) with m2po, which would be a silent no-op.  A flag
    shared by several components (``--tis-clip``) is read when any selected one declares it.
    ``selected``: the run's (kind, name) pairs; with ``--reward auto`` the scorer is chosen
    from the data later, so scorers' parameters are not checked."""
    auto = "auto" in cfg.reward
    read = {param_flag(name, f) for kind, name in selected if (schema := reg.get(kind, name).spec.params)
            for f in dataclasses.fields(schema)}
    unread: dict[str, tuple[Any, list[str]]] = {}
    for kind, comps in reg.components.items():
        if kind == "reward" and auto:
            continue
        for name in sorted(comps):
            p = cfg.params_for(name)
            if p is None or (kind, name) in selected:
                continue
            for f in dataclasses.fields(p):
                flag = param_flag(name, f)
                if flag not in read and getattr(p, f.name) != f.default:
                    unread.setdefault(flag, (getattr(p, f.name), []))[1].append(name)
    return [Problem("config", "unread option",
                    f"{flag} {value} is read by no selected component (it is a parameter of {', '.join(names)}): "
                    "set, it would be a silent no-op",
                    "drop it (or set it to its default), or select a component that reads it")
            for flag, (value, names) in sorted(unread.items())]


def resolve(cfg: RunConfig, reg: Registry) -> tuple[Resolved, list[Problem]]:
    """Select the run's components and check every capability and constraint.

    Returns the resolved components and the list of problems (empty = valid)."""
    problems: list[Problem] = [Problem("config", "value range", p) for p in value_problems(cfg)]
    cfg = in_range(cfg)  # the checks below assume values in range (a batch size 0 divides by 0)
    problems += _batch_problems(cfg)
    problems += _run_problems(cfg)
    problems += [Problem("config", flag, msg, fix) for flag, msg, fix in lora_problems(cfg)]
    problems += _data_problems(cfg, reg)
    specs: dict[str, Any] = {}
    est, specs["estimator"] = _select(reg, "estimator", cfg.advantage_estimator, cfg, problems)
    engine, specs["engine"] = _select(reg, "engine", cfg.rollout_engine, cfg, problems)
    backend, specs["backend"] = _select(reg, "backend", cfg.train_backend, cfg, problems)
    sampler, specs["sampler"] = _select(reg, "sampler", cfg.sampler, cfg, problems)
    env, specs["environment"] = _select(reg, "environment", cfg.environment, cfg, problems)
    corrections, processors = [], []
    for name in cfg.correction:
        sel, specs[f"correction:{name}"] = _select(reg, "correction", name, cfg, problems)
        if sel:
            corrections.append(sel)
    for name in cfg.reward_processor:
        sel, specs[f"reward_processor:{name}"] = _select(reg, "reward_processor", name, cfg, problems)
        if sel:
            processors.append(sel)
    rewards = []
    for name in dict.fromkeys(cfg.reward):
        if name != "auto":
            sel, specs[f"reward:{name}"] = _select(reg, "reward", name, cfg, problems)
            rewards += [sel] if sel else []
    corrections.sort(key=lambda s: s.caps.order)
    problems += [Problem("config", option, msg, fix) for option, msg, fix in
                 reward_mix_problems(cfg, advantage_terms=any(c.caps.advantage_term for c in corrections))]
    readers = [s for s in [est, *corrections] if s and "teacher_log_probs" in s.caps.requires_fields]
    if cfg.teacher_model and est and not readers:
        problems.append(Problem("config", "--teacher-model", f"--teacher-model {cfg.teacher_model} is set, but no "
                                "selected component reads its log-probs (teacher_log_probs): it would be loaded and "
                                "run every step for nothing", "add --correction opd (on-policy distillation), or drop "
                                "--teacher-model"))
    ctx = Context(cfg=cfg, estimator=est, corrections=tuple(corrections), engine=engine, backend=backend,
                  processors=tuple(processors), sampler=sampler, model_is_moe=model_is_moe(cfg.model),
                  model_type=(model_config(cfg.model) or {}).get("model_type"), environment=env)
    warnings: list[Problem] = []

    for cap in CAPABILITIES:
        if cap.check is None:
            continue
        targets: list[Selected] = {
            "estimator": [est] if est else [],
            "correction": list(corrections),
            "engine": [engine] if engine else [],
            "backend": [backend] if backend else [],
            "reward_processor": list(processors),
            "sampler": [sampler] if sampler else [],
            "environment": [env] if env else [],
        }[cap.kind]
        for sel in targets:
            msg = cap.check(ctx, sel.caps)
            if msg:
                fix = cap.fix(ctx, sel.caps) if callable(cap.fix) else cap.fix
                (warnings if cap.warn else problems).append(Problem(sel.label, cap.field, f"{sel.name} {msg}", fix))
    for sel in [s for s in (est, engine, backend, sampler, env) if s] + corrections + processors + rewards:
        # a parameter schema may define problems() -> [(message, fix)] for constraints across
        # its fields (e.g. tis: --tis-clip-low <= --tis-clip); checked only for selected components
        check = getattr(cfg.params_for(sel.name), "problems", None)
        problems += [Problem(sel.label, "parameters", f"{sel.name}: {msg}", fix) for msg, fix in (check() if callable(check) else ())]
    chosen = {(s.kind, s.name) for s in [est, engine, backend, sampler, env, *corrections, *processors, *rewards] if s}
    problems += unread_parameters(cfg, reg, chosen)
    problems += [Problem("plugins", "duplicate component", p, "") for p in reg.problems]
    return Resolved(ctx, specs, tuple(warnings)), problems


def validate(cfg: RunConfig, reg: Registry) -> Resolved:
    """Like :func:`resolve` but raises :class:`ValidationError` listing every problem."""
    resolved, problems = resolve(cfg, reg)
    if problems:
        raise ValidationError(problems)
    return resolved
