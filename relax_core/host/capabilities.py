"""The one capability table.

For each capability a plugin can declare: which component kind declares it, the column
title of the capability matrix, a one-line description, the run-config predicate that
needs it (as a check returning the violation, or ``None``), and the fix to print.  The
startup validator (:mod:`relax_core.host.validation`), ``relax capabilities`` and the generated
``docs/capabilities.md`` all read this table, and nothing else.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

from relax_core.config import resolve_device


@dataclass(frozen=True)
class Selected:
    """A component selected for the run, with its resolved capabilities."""

    kind: str
    name: str
    caps: Any
    origin: str  # "<distribution> <version>"

    @property
    def label(self) -> str:
        return f"{self.kind} '{self.name}' ({self.origin})"


@dataclass(frozen=True)
class Context:
    """Everything a capability check can look at."""

    cfg: Any
    estimator: Selected | None
    corrections: tuple[Selected, ...] = ()
    engine: Selected | None = None
    backend: Selected | None = None
    processors: tuple[Selected, ...] = ()
    sampler: Selected | None = None
    model_is_moe: bool | None = None  # None = not known before loading
    model_type: str | None = None  # the model's Hugging Face ``model_type``; None = not known before loading
    environment: Selected | None = None

    @property
    def multi_turn_environment(self) -> str | None:
        """The selected environment's name when its episodes may have several turns."""
        env = self.environment
        return env.name if env is not None and env.caps.multi_turn else None

    @property
    def behaviour_numerator(self) -> str | None:
        return self.estimator.caps.behaviour_numerator if self.estimator else None


@dataclass(frozen=True)
class Capability:
    """One row of the capability table."""

    kind: str
    field: str
    title: str
    description: str
    check: Callable[[Context, Any], str | None] | None = None
    """``check(ctx, caps) -> violation or None``: the run-config predicate that needs it."""
    fix: str | Callable[[Context, Any], str] = ""
    """How to meet it: a text, or ``fix(ctx, caps) -> text`` when it depends on the violation."""
    matrix: bool = True  # shown as a column of the matrix
    satisfy: Callable[[Any], dict[str, Any]] | None = None
    """``satisfy(caps) -> run-config values`` under which :attr:`check` accepts ``caps``
    (``{}`` when any config does): the contract kit's configuration (``config_for``) is
    the union of every row's."""
    warn: bool = False
    """A violation is printed as a warning at startup instead of refusing the run."""


def _sync_reasons(cfg: Any) -> list[str]:
    r = []
    if cfg.fully_async:
        r.append("--fully-async is set")
    if cfg.max_staleness > 0:
        r.append(f"--max-staleness {cfg.max_staleness} lets it train on stale rollouts")
    if cfg.num_steps_per_rollout > 1:
        r.append(f"--num-steps-per-rollout {cfg.num_steps_per_rollout} repeats updates on one rollout")
    if cfg.update_weights_interval > 1:
        r.append(f"--update-weights-interval {cfg.update_weights_interval} generates with weights up to "
                 f"{cfg.update_weights_interval - 1} steps old")
    gbs = cfg.effective_global_batch_size
    if cfg.rollout_batch_size * cfg.n_samples_per_prompt != gbs:
        r.append(f"rollout_batch_size × n_samples_per_prompt = {cfg.rollout_batch_size}×{cfg.n_samples_per_prompt} "
                 f"= {cfg.rollout_batch_size * cfg.n_samples_per_prompt} != global_batch_size {gbs}")
    return r


def _kl_active(cfg: Any) -> bool:
    return cfg.use_kl_loss or cfg.kl_coef != 0


def _strict_processors(ctx: Context) -> list[str]:
    return [p.name for p in ctx.processors if not p.caps.allowed_with_strict_estimators]


def _engine_caps(ctx: Context, attr: str) -> bool:
    return bool(ctx.engine and getattr(ctx.engine.caps, attr))


def _backend_caps(ctx: Context, attr: str) -> bool:
    return bool(ctx.backend and getattr(ctx.backend.caps, attr))


def _sampling(ctx: Context, caps: Any) -> str | None:
    s, cfg, bad = caps.sampling, ctx.cfg, []
    if s.temperature_positive and not cfg.rollout_temperature > 0:
        bad.append(f"--rollout-temperature must be > 0 (got {cfg.rollout_temperature})")
    if s.top_p_one and cfg.rollout_top_p != 1.0:
        bad.append(f"--rollout-top-p must be 1 (got {cfg.rollout_top_p}): a truncated nucleus changes the sampler's head")
    if s.top_k_disabled and cfg.rollout_top_k != -1:
        bad.append(f"--rollout-top-k must be -1 (got {cfg.rollout_top_k})")
    if s.no_penalties and cfg.rollout_repetition_penalty != 1.0:
        bad.append(f"--rollout-repetition-penalty must be 1 (got {cfg.rollout_repetition_penalty})")
    return "; ".join(bad) or None


def _dev(ctx: Context, caps: Any) -> str | None:
    want = ctx.cfg.device
    if want != "auto" and want not in caps.devices:
        return f"runs on {', '.join(sorted(caps.devices))}, but --device is {want}"
    return None


def _bf16(ctx: Context, caps: Any) -> str | None:
    """An explicit ``--bf16`` on a device where the backend does not train in bfloat16 (the
    default, ``None``, is decided per backend at start-up and never refused)."""
    if not ctx.cfg.bf16:
        return None
    dev = resolve_device(ctx.cfg.device)
    if dev in caps.bf16_devices:
        return None
    return (f"cannot train in bfloat16 (--bf16) on {dev}"
            + (f": it does only on {', '.join(sorted(caps.bf16_devices))}" if caps.bf16_devices else ""))


def _unmet(ctx: Context, caps: Any, field: str) -> list[str]:
    """The requirements (``BackendCapabilities.requires``) of capability ``field`` that this
    run does not meet: ``cuda`` needs ``--device cuda``, or ``auto`` with CUDA visible to
    the validating process; any other requirement is a module that must be importable."""
    out = []
    for entry in sorted(getattr(caps, "requires", ())):
        name, _, req = entry.partition(":")
        if name != field:
            continue
        if req == "cuda":
            if resolve_device(ctx.cfg.device) == "cpu":
                out.append("a CUDA device (--device cpu)" if ctx.cfg.device == "cpu" else "a CUDA device (none is visible)")
        elif importlib.util.find_spec(req) is None:
            out.append(f"the {req} module (not installed)")
    return out


def _parallel(flag: str, what: str, field: str) -> Callable[[Context, Any], str | None]:
    """Check of a backend's ``supports_<what>_parallel``: declared, and its requirements met."""
    attr = flag.removeprefix("--").replace("-", "_")

    def check(ctx: Context, caps: Any) -> str | None:
        n = getattr(ctx.cfg, attr)
        if n == 1:
            return None
        if not getattr(caps, field):
            return f"does not support {what}, but {flag} is {n}"
        unmet = _unmet(ctx, caps, field)
        return f"supports {what} only with {' and '.join(unmet)}, but {flag} is {n}" if unmet else None

    return check


#: Run options that only some estimators read (reward-side KL, which the loop also reads for
#: the reference model): a non-default value with an estimator that does not list it in
#: ``uses_options`` is refused, never silently ignored.  (The PPO-clip options are a parameter
#: block, :class:`relax_core.specs.PPOClipParams`, refused by the generic rule for plugin
#: parameters that no selected component reads: :func:`relax_core.host.validation.unread_parameters`.)
SCOPED_OPTIONS = ("kl_coef",)


def _unused_options(ctx: Context, caps: Any) -> str | None:
    import dataclasses

    defaults = {f.name: f.default for f in dataclasses.fields(type(ctx.cfg))}
    unused = [f"--{o.replace('_', '-')} {getattr(ctx.cfg, o)}" for o in SCOPED_OPTIONS
              if getattr(ctx.cfg, o) != defaults[o] and o not in caps.uses_options]
    return f"does not read {', '.join(unused)}: set, it would be a silent no-op" if unused else None


def provided_fields(ctx: Context) -> set[str]:
    """The batch fields a run has: the core's and every engine's and backend's
    (:data:`relax_core.batch.ALWAYS_PROVIDED`), and what the selected engine and backend
    declare in ``provides_fields`` (the teacher's, :data:`~relax_core.batch.TEACHER_FIELDS`,
    only with ``--teacher-model``; the reward parts,
    :data:`~relax_core.batch.REWARD_PARTS_FIELDS`, with several ``--reward``)."""
    from relax_core.batch import ALWAYS_PROVIDED, REWARD_PARTS_FIELDS, TEACHER_FIELDS
    from relax_core.stages import reward_mix

    out = set(ALWAYS_PROVIDED)
    for sel in (ctx.engine, ctx.backend):
        if sel is not None:
            out |= set(sel.caps.provides_fields)
    if reward_mix.is_composite(ctx.cfg):
        out |= REWARD_PARTS_FIELDS
    return out if ctx.cfg.teacher_model else out - TEACHER_FIELDS


def _missing_fields(ctx: Context, caps: Any) -> list[str]:
    """The fields ``caps`` requires that the run does not have, sorted."""
    return sorted(set(caps.requires_fields) - provided_fields(ctx))


def _fields_check(ctx: Context, caps: Any) -> str | None:
    from relax_core.batch import FIELDS, REWARD_PARTS_FIELDS, TEACHER_FIELDS

    missing = _missing_fields(ctx, caps)
    if not missing:
        return None
    backend = f"backend '{ctx.backend.name}'" if ctx.backend else "the backend"
    who = {"rollout": f"engine '{ctx.engine.name}'" if ctx.engine else "the engine",
           "train": backend, "advantage": backend}
    parts = []
    for name in missing:
        f = FIELDS.get(name)
        if name in TEACHER_FIELDS and not ctx.cfg.teacher_model:
            parts.append(f"'{name}', which needs a teacher: --teacher-model is not set")
        elif name in REWARD_PARTS_FIELDS:
            parts.append(f"'{name}', which needs several rewards: give --reward more than once "
                         f"(e.g. --reward math --reward reward_model), got {len(ctx.cfg.reward)}")
        elif f is None:
            parts.append(f"'{name}', which no installed plugin declares")
        else:
            origin = "" if f.declared_by == "relax_core" else f" (declared by {f.declared_by})"
            parts.append(f"'{name}'{origin}, which {who.get(f.stage, 'no selected component')} does not provide")
    return "reads the batch field " + "; ".join(parts)


def _fields_fix(ctx: Context, caps: Any) -> str:
    from relax_core.batch import REWARD_PARTS_FIELDS, TEACHER_FIELDS

    missing = set(_missing_fields(ctx, caps))
    if missing and missing <= REWARD_PARTS_FIELDS | TEACHER_FIELDS:
        return " and ".join(x for x, needed in (("give --reward more than once", missing & REWARD_PARTS_FIELDS),
                                                 ("set --teacher-model", missing & TEACHER_FIELDS)) if needed)
    return ("choose a rollout engine / training backend whose `provides` column lists them (`relax capabilities`; "
            "hf + torch provide all the core's)")


def _group_problem(ctx: Context, c: Any) -> str | None:
    """A group-relative estimator (``min_group_size >= 2``) learns from the differences
    between the samples of a group: too small a group, or greedy sampling (temperature 0
    or top-k 1: every sample of a group is the same), gives zero advantages forever."""
    cfg = ctx.cfg
    if cfg.n_samples_per_prompt < c.min_group_size:
        return (f"needs --n-samples-per-prompt >= {c.min_group_size} (got {cfg.n_samples_per_prompt}): "
                "its reward stage is undefined for a smaller group")
    greedy = ("--rollout-temperature 0" if cfg.rollout_temperature == 0 else
              "--rollout-top-k 1" if cfg.rollout_top_k == 1 else None)
    if c.min_group_size >= 2 and greedy:
        return (f"compares the samples of a group, but with {greedy} every sample of a group is identical, "
                "so every advantage is 0 and nothing is learned")
    return None


def _max_context(ctx: Context, c: Any) -> str | None:
    limit, cfg = c.max_context, ctx.cfg
    if limit is None or (cfg.max_episode_tokens is not None and cfg.max_episode_tokens <= limit):
        return None
    return (f"is designed for at most {limit} tokens per episode, but --max-episode-tokens is "
            f"{cfg.max_episode_tokens or 'unset (no limit)'}")


def _engine_context(ctx: Context, c: Any) -> str | None:
    env, limit, episode = ctx.multi_turn_environment, c.max_context, ctx.cfg.max_episode_tokens
    if env is None or limit is None or (episode is not None and episode < limit):
        return None
    bound = f"--max-episode-tokens {episode} leaves no room for the prompt" if episode is not None else \
        "they are bounded only by --max-turns (no --max-episode-tokens)"
    return (f"accepts at most {limit} tokens of prompt + response, but the episodes of multi-turn environment "
            f"'{env}' grow with every turn and {bound}")


def _lora_defaults(ctx: Context, c: Any) -> str | None:
    cfg, mt = ctx.cfg, ctx.model_type
    if cfg.lora_rank == 0 or cfg.lora_target_modules or not c.supports_lora or mt is None or mt in c.lora_default_targets:
        return None
    return (f"has no default --lora-target-modules for model type {mt!r} (defaults exist for "
            f"{', '.join(sorted(c.lora_default_targets)) or 'none'})")


E, C, G, B, P, S, V = "estimator", "correction", "engine", "backend", "reward_processor", "sampler", "environment"

CAPABILITIES: tuple[Capability, ...] = (
    # ---------------------------------------------------------------- estimators
    Capability(E, "supports_context_parallel", "CP", "Same loss and gradient with each sequence split over context-parallel ranks.",
               lambda ctx, c: None if c.supports_context_parallel or ctx.cfg.context_parallel_size == 1 else
               f"does not support context parallelism, but --context-parallel-size is {ctx.cfg.context_parallel_size}",
               "use --context-parallel-size 1, or an estimator (or estimator parameters, e.g. m2po with --m2po-stat-scope global) whose capabilities show CP (see `relax capabilities`)"),
    Capability(E, "sync_only", "sync only", "Needs on-policy updates: no async or stale rollouts, one optimizer step per rollout, rollout_batch_size × n_samples_per_prompt == global_batch_size.",
               lambda ctx, c: ("is sync-only (on-policy updates only), but " + "; ".join(r)) if c.sync_only and (r := _sync_reasons(ctx.cfg)) else None,
               "run synchronously: --max-staleness 0, no --fully-async, --num-steps-per-rollout 1, --update-weights-interval 1, and --global-batch-size = --rollout-batch-size × --n-samples-per-prompt; or pick an estimator with importance-ratio correction (grpo, m2po)"),
    Capability(E, "supports_fully_async", "async", "May run with --fully-async (rollout ahead of training).",
               lambda ctx, c: "does not support --fully-async" if ctx.cfg.fully_async and not c.supports_fully_async else None,
               "drop --fully-async, or use an estimator that supports it (e.g. m2po with --use-rollout-logprobs)"),
    Capability(E, "needs_critic", "critic", "Needs a value model (critic role).",
               lambda ctx, c: f"needs a critic, but backend '{ctx.backend.name}' cannot train one" if c.needs_critic and ctx.backend and not ctx.backend.caps.supports_critic else None,
               "choose a --train-backend that declares supports_critic (torch)"),
    Capability(E, "min_group_size", "min n", "Smallest --n-samples-per-prompt for which its reward stage is defined (2 or more: a group-relative baseline, which needs samples that differ).",
               _group_problem,
               "raise --n-samples-per-prompt, and sample with --rollout-temperature > 0 and a --rollout-top-k other than 1",
               satisfy=lambda c: {"n_samples_per_prompt": max(4, c.min_group_size)}),
    Capability(E, "requires_complete_groups", "whole groups", "Every group must hold all its samples (post-processors drop whole groups only)."),
    Capability(E, "requires_normalize_advantages", "needs norm-adv", "Requires --normalize-advantages.",
               lambda ctx, c: "requires --normalize-advantages" if c.requires_normalize_advantages and not ctx.cfg.normalize_advantages else None,
               "add --normalize-advantages", satisfy=lambda c: {"normalize_advantages": True} if c.requires_normalize_advantages else {}),
    Capability(E, "forbids_normalize_advantages", "no norm-adv", "Refuses --normalize-advantages (re-whitening changes its semantics).",
               lambda ctx, c: "is incompatible with --normalize-advantages: re-whitening after sharding changes its advantages" if c.forbids_normalize_advantages and ctx.cfg.normalize_advantages else None,
               "remove --normalize-advantages"),
    Capability(E, "requires_rewards_normalization", "needs reward norm", "Refuses --disable-rewards-normalization.",
               lambda ctx, c: "requires rewards normalization (its baseline lives there)" if c.requires_rewards_normalization and ctx.cfg.disable_rewards_normalization else None,
               "remove --disable-rewards-normalization"),
    Capability(E, "requires_per_token_loss", "needs per-token loss", "Requires --calculate-per-token-loss (token-mean over the global batch).",
               lambda ctx, c: "requires --calculate-per-token-loss: a per-sample token mean would reweight responses by 1/length" if c.requires_per_token_loss and not ctx.cfg.calculate_per_token_loss else None,
               "add --calculate-per-token-loss",
               satisfy=lambda c: {"calculate_per_token_loss": True} if c.requires_per_token_loss else {}),
    Capability(E, "forbids_per_token_loss", "no per-token loss", "Uses a per-sample reduction; refuses --calculate-per-token-loss.",
               lambda ctx, c: "uses a per-sample mean reduction; --calculate-per-token-loss is not supported" if c.forbids_per_token_loss and ctx.cfg.calculate_per_token_loss else None,
               "remove --calculate-per-token-loss"),
    Capability(E, "uses_options", "options", "Whether it reads the reward-side --kl-coef (refused when set otherwise).",
               _unused_options,
               "drop --kl-coef (or set it to 0); for a KL penalty without reward-side KL use --use-kl-loss --kl-loss-coef C"),
    Capability(E, "requires_reward_side_kl", "needs reward KL", "Needs --kl-coef > 0 (KL shaped into the reward).",
               lambda ctx, c: "requires --kl-coef > 0 (KL is part of its shaped reward)" if c.requires_reward_side_kl and not ctx.cfg.kl_coef > 0 else None,
               "set --kl-coef, e.g. --kl-coef 0.01", satisfy=lambda c: {"kl_coef": 0.01} if c.requires_reward_side_kl else {}),
    Capability(E, "required_kl_loss_type", "KL type", "The KL estimator it requires, when a KL term is active.",
               lambda ctx, c: f"requires --kl-loss-type {c.required_kl_loss_type} (got {ctx.cfg.kl_loss_type})" if c.required_kl_loss_type and _kl_active(ctx.cfg) and ctx.cfg.kl_loss_type != c.required_kl_loss_type else None,
               "set --kl-loss-type as required",
               satisfy=lambda c: {"kl_loss_type": c.required_kl_loss_type} if c.required_kl_loss_type else {}),
    Capability(E, "requires_kl_loss", "needs KL loss", "Needs --use-kl-loss with --kl-loss-coef > 0.",
               lambda ctx, c: "requires an independent KL penalty: --use-kl-loss and --kl-loss-coef > 0" if c.requires_kl_loss and not (ctx.cfg.use_kl_loss and ctx.cfg.kl_loss_coef > 0) else None,
               "add --use-kl-loss --kl-loss-coef 0.001",
               satisfy=lambda c: {"use_kl_loss": True, "kl_loss_coef": 0.001} if c.requires_kl_loss else {}),
    Capability(E, "forbids_kl_loss", "no KL loss", "Refuses a separate --use-kl-loss.",
               lambda ctx, c: "does not support a separate --use-kl-loss (its KL is in the reward)" if c.forbids_kl_loss and (ctx.cfg.use_kl_loss or ctx.cfg.kl_loss_coef != 0) else None,
               "remove --use-kl-loss / --kl-loss-coef"),
    Capability(E, "kl_level", "KL level", "Level of the policy ratio: token or sequence."),
    Capability(E, "behaviour_numerator", "numerator", "The log-prob of the policy in its loss: old_log_probs (a ratio to the old policy) or log_probs (no ratio); mismatch corrections weight by exp(log num − log q)."),
    Capability(E, "needs_full_sequence", "whole sequence", "A token's loss depends on its whole sequence (per-sample statistics)."),
    Capability(E, "allows_reward_post_processors", "post-procs", "Accepts reward post-processors that replace the raw reward signal.",
               lambda ctx, c: f"does not allow reward post-processors that replace its reward signal ({', '.join(b)})" if not c.allows_reward_post_processors and (b := _strict_processors(ctx)) else None,
               "remove those --reward-processor options"),
    Capability(E, "requires_fields", "reads", "Batch fields it reads that not every run has.", _fields_check,
               _fields_fix,
               satisfy=lambda c: {"reward": ("math", "f1")} if "reward_parts" in c.requires_fields else {}),
    Capability(E, "supports_loss_mask_holes", "mask holes", "Correct with holes in loss_mask (environment tokens inside an episode; verified by the contract kit); needed by multi-turn environments.",
               lambda ctx, c: f"is not declared correct with holes in loss_mask, which the episodes of multi-turn environment '{ctx.multi_turn_environment}' have (its environment tokens)" if ctx.multi_turn_environment and not c.supports_loss_mask_holes else None,
               "choose an estimator whose `mask holes` column says yes (`relax capabilities --kind estimator`), or --environment single_turn"),
    Capability(E, "accepts_advantage_terms", "adv terms", "Correct with a per-token term added to its advantages (a correction's advantage_term, e.g. opd's distillation term; verified by the contract kit: the term moves the gradient at its own token only).",
               lambda ctx, c: f"cannot take a per-token advantage term, which correction {', '.join(repr(x) for x in t)} adds to its advantages" if not c.accepts_advantage_terms and (t := [x.name for x in ctx.corrections if x.caps.advantage_term]) else None,
               "choose an estimator whose `adv terms` column says yes (every built-in one but gspo; `relax capabilities --kind estimator`), or drop that --correction"),
    Capability(E, "uses_turn_rewards", "turn rewards", "Reads per-turn rewards (turn_rewards); otherwise trains on each episode's return, their sum.",
               lambda ctx, c: f"does not read per-turn rewards: it trains on each episode's return, the sum of the turn rewards of environment '{ctx.environment.name}' (no per-turn credit)" if ctx.environment and ctx.environment.caps.turn_rewards and not c.uses_turn_rewards else None,
               "to credit each turn, choose an estimator whose `turn rewards` column says yes", warn=True),
    Capability(E, "metrics", "metrics", "Names of the estimator-specific metrics it reports.", matrix=False),
    # ---------------------------------------------------------------- corrections
    Capability(C, "requires_fields", "reads", "Batch fields it reads that not every run has (engine log-probs, top-k heads, routed experts, a plugin's own).",
               _fields_check, _fields_fix),
    Capability(C, "needs_moe_model", "MoE", "Only meaningful for mixture-of-experts models.",
               lambda ctx, c: "needs a mixture-of-experts model, but --model is dense (routing replay has no meaning there)" if c.needs_moe_model and ctx.model_is_moe is False else None,
               "use an MoE --model (e.g. Qwen3-MoE) or drop this correction"),
    Capability(C, "needs_routing_replay", "replay", "Needs the backend to replay the engine's MoE routes.",
               lambda ctx, c: f"needs routing replay, but backend '{ctx.backend.name}' does not support it" if c.needs_routing_replay and ctx.backend and not ctx.backend.caps.supports_routing_replay else None,
               "choose a --train-backend that declares supports_routing_replay (torch)"),
    Capability(C, "behaviour_numerators", "numerators", "The estimators' behaviour numerators it is correct for (* any).",
               lambda ctx, c: None if ctx.estimator is None or "*" in c.behaviour_numerators or ctx.behaviour_numerator in c.behaviour_numerators else
               f"is not valid with estimator '{ctx.estimator.name}' whose behaviour numerator is {ctx.behaviour_numerator or 'undeclared'} (needs {', '.join(sorted(c.behaviour_numerators)) or 'a declared one'})",
               "use an estimator whose `numerator` column it accepts (`relax capabilities`; log_probs: rloo, or grpo --pg-loss-type reinforce)"),
    Capability(C, "conflicts_with_rollout_logprobs_as_old", "!rollout-as-old", "Refuses --use-rollout-logprobs.",
               lambda ctx, c: "conflicts with --use-rollout-logprobs (the old policy would be the rollout policy, making the weight 1)" if c.conflicts_with_rollout_logprobs_as_old and ctx.cfg.use_rollout_logprobs else None,
               "drop --use-rollout-logprobs or this correction"),
    Capability(C, "conflicts_with", "conflicts", "Other corrections it cannot be combined with.",
               lambda ctx, c: f"conflicts with {', '.join(b)}" if (b := sorted(set(c.conflicts_with) & {x.name for x in ctx.corrections})) else None,
               "select only one of them"),
    Capability(C, "sampling", "sampling", "Rollout sampling settings it needs (temperature, top-p, top-k, penalties).", _sampling,
               "set the sampling flags as stated"),
    Capability(C, "supports_context_parallel", "CP", "Valid with context parallelism.",
               lambda ctx, c: f"does not support context parallelism, but --context-parallel-size is {ctx.cfg.context_parallel_size}" if ctx.cfg.context_parallel_size > 1 and not c.supports_context_parallel else None,
               "use --context-parallel-size 1"),
    Capability(C, "supports_fully_async", "async", "Valid with --fully-async.",
               lambda ctx, c: "does not support --fully-async" if ctx.cfg.fully_async and not c.supports_fully_async else None,
               "drop --fully-async"),
    Capability(C, "advantage_term", "adv term", "Adds a per-token term to the estimator's advantages (before --normalize-advantages) instead of correcting the loss; needs an estimator that accepts it (`adv terms`)."),
    Capability(C, "order", "order", "Application order (lower first)."),
    Capability(C, "metrics", "metrics", "Names of the correction's metrics.", matrix=False),
    # ---------------------------------------------------------------- engines
    Capability(G, "devices", "devices", "Devices it runs on.", _dev, "choose another --device or engine"),
    Capability(G, "provides_fields", "provides", "Batch fields it returns beyond every engine's (tokens, loss_mask, lengths, texts)."),
    Capability(G, "supports_weight_update", "weight update", "Takes new weights from the trainer without restarting.",
               lambda ctx, c: "cannot take weight updates from the trainer" if not c.supports_weight_update and not ctx.cfg.load_debug_rollout_data else None,
               "choose an engine that supports weight updates"),
    Capability(G, "supports_shared_weights", "shared weights", "Can serve from the trainer's weight tensors instead of a copy (a synchronous local run pushing every step: one copy of the model in memory)."),
    Capability(G, "supports_lora_adapters", "LoRA adapters", "In a LoRA run, takes the adapter alone (PEFT format) and applies it to its base weights, instead of the merged weights (--no-lora-engine-adapter: merged anyway)."),
    Capability(G, "supports_tensor_parallel", "TP", "Splits one engine over several devices.",
               lambda ctx, c: f"cannot split an engine over {ctx.cfg.rollout_num_gpus_per_engine} devices" if ctx.cfg.rollout_num_gpus_per_engine > 1 and not c.supports_tensor_parallel else None,
               "use --rollout-num-gpus-per-engine 1"),
    Capability(G, "supports_sampling_penalties", "penalties", "Supports repetition penalty.",
               lambda ctx, c: "does not support --rollout-repetition-penalty" if ctx.cfg.rollout_repetition_penalty != 1.0 and not c.supports_sampling_penalties else None,
               "remove --rollout-repetition-penalty"),
    Capability(G, "supports_stop_strings", "stop", "Supports stop strings.",
               lambda ctx, c: "does not support --rollout-stop" if ctx.cfg.rollout_stop and not c.supports_stop_strings else None,
               "remove --rollout-stop"),
    Capability(G, "supports_token_continuation", "token-in", "Continues generation from any token-id prefix as given (needed by multi-turn environments).",
               lambda ctx, c: f"cannot continue generation from token ids, which the episodes of multi-turn environment '{ctx.multi_turn_environment}' need" if ctx.multi_turn_environment and not c.supports_token_continuation else None,
               "choose a --rollout-engine whose `token-in` column says yes (hf, vllm, sglang), or --environment single_turn"),
    Capability(G, "supports_prefix_caching", "prefix cache", "Reuses the KV cache of a prefix it has seen (an episode's earlier turns)."),
    Capability(G, "max_context", "max context", "The most prompt + response tokens of one sequence it accepts; multi-turn episodes must be bounded below it.",
               _engine_context,
               "set --max-episode-tokens below the engine's limit minus the longest prompt, or raise the engine's limit (e.g. --vllm-max-model-len)"),
    # ---------------------------------------------------------------- backends
    Capability(B, "devices", "devices", "Devices it trains on.", _dev, "choose another --device or backend"),
    Capability(B, "supports_data_parallel", "DP", "Data parallel over several model replicas (training workers / (TP × CP × PP)).",
               lambda ctx, c: f"cannot train data-parallel over {ctx.cfg.data_parallel_size} replicas ({ctx.cfg.training_workers} training workers / model-parallel size {ctx.cfg.model_parallel_size})" if ctx.cfg.data_parallel_size > 1 and not c.supports_data_parallel else None,
               "use one replica: --actor-num-nodes × --actor-num-gpus-per-node = --tensor-parallel-size × --context-parallel-size × --pipeline-parallel-size"),
    Capability(B, "supports_tensor_parallel", "TP", "Tensor parallelism.",
               _parallel("--tensor-parallel-size", "tensor parallelism", "supports_tensor_parallel"),
               "use --tensor-parallel-size 1, or a --train-backend whose TP column says yes and whose requirements (`needs` column) hold (`relax capabilities`)"),
    Capability(B, "supports_context_parallel", "CP", "Context parallelism.",
               _parallel("--context-parallel-size", "context parallelism", "supports_context_parallel"),
               "use --context-parallel-size 1, or a --train-backend whose CP column says yes and whose requirements (`needs` column) hold (`relax capabilities`)"),
    Capability(B, "supports_pipeline_parallel", "PP", "Pipeline parallelism.",
               _parallel("--pipeline-parallel-size", "pipeline parallelism", "supports_pipeline_parallel"),
               "use --pipeline-parallel-size 1, or a --train-backend whose PP column says yes and whose requirements (`needs` column) hold (`relax capabilities`)"),
    Capability(B, "supports_critic", "critic", "Can train a critic (value model)."),
    Capability(B, "supports_routing_replay", "R3", "Replays recorded MoE routes in the training forward."),
    Capability(B, "provides_fields", "provides", "Batch fields its forward gives beyond log_probs and entropy (teacher_log_probs: it loads --teacher-model).",
               lambda ctx, c: f"does not compute a teacher's log-probs (teacher_log_probs), but --teacher-model is {ctx.cfg.teacher_model}" if ctx.cfg.teacher_model and "teacher_log_probs" not in c.provides_fields else None,
               "use --train-backend torch for on-policy distillation, or drop --teacher-model"),
    Capability(B, "supports_gradient_checkpointing", "grad ckpt", "Activation recomputation.",
               lambda ctx, c: "does not support --gradient-checkpointing" if ctx.cfg.gradient_checkpointing and not c.supports_gradient_checkpointing else None,
               "remove --gradient-checkpointing"),
    Capability(B, "bf16_devices", "bf16", "Devices on which it trains under bfloat16 autocast (--bf16; the default, auto, turns it on only there, where the device computes bfloat16 natively).",
               _bf16, "use --no-bf16 (float32), or a --device / --train-backend whose bf16 column lists it"),
    Capability(B, "supports_shared_prefix", "shared prefix", "Encodes a group's shared prompt once in the training forward, exactly (the torch backend's --shared-prefix)."),
    Capability(B, "supports_token_budget", "token budget", "Packs micro-batches to --max-tokens-per-micro-batch.",
               lambda ctx, c: f"cannot pack micro-batches by tokens, so --max-tokens-per-micro-batch {ctx.cfg.max_tokens_per_micro_batch} would be ignored" if ctx.cfg.max_tokens_per_micro_batch and not c.supports_token_budget else None,
               "use --micro-batch-size N instead"),
    Capability(B, "supports_lora", "LoRA", "Trains LoRA adapters (--lora-rank > 0): adapters optimised and checkpointed, merged weights (or the adapter alone, to an engine that takes adapters) to the engine, reference = adapter disabled.",
               lambda ctx, c: f"cannot train LoRA adapters, but --lora-rank is {ctx.cfg.lora_rank}" if ctx.cfg.lora_rank > 0 and not c.supports_lora else None,
               "use --train-backend torch for LoRA, or --lora-rank 0 (full fine-tuning)"),
    Capability(B, "lora_default_targets", "LoRA defaults", "The modules it adapts without --lora-target-modules, by model type.",
               _lora_defaults, "name the linear layers to adapt, e.g. --lora-target-modules q_proj --lora-target-modules v_proj",
               matrix=False),
    Capability(B, "lora_excluded_modules", "LoRA excluded", "Modules that cannot carry an adapter in this backend.",
               lambda ctx, c: f"cannot put an adapter on {', '.join(bad)}" if ctx.cfg.lora_rank > 0 and (bad := sorted(set(ctx.cfg.lora_target_modules) & c.lora_excluded_modules)) else None,
               "target other layers (e.g. the decoder blocks' linear layers: q_proj, v_proj, ...)", matrix=False),
    Capability(B, "requires", "needs", "Conditions of its capabilities (`capability:cuda` needs a CUDA device, `capability:module` that module); checked by the rows above."),
    # ---------------------------------------------------------------- reward processors
    Capability(P, "allowed_with_strict_estimators", "keeps raw signal", "May be combined with estimators that forbid post-processors."),
    Capability(P, "may_request_more_samples", "resamples", "Drops groups and asks the loop to sample more."),
    # ---------------------------------------------------------------- samplers
    Capability(S, "needs_stable_prompt_ids", "stable ids", "Keeps per-prompt statistics by dataset index, so an index must name one prompt for the whole run (every data source gives stable indices: the rows are loaded once and fingerprinted; a resume onto changed data does not).",
               lambda ctx, c: "keeps per-prompt statistics by dataset index, but --resume-allow-data-change may continue on other rows, whose indices name other prompts" if c.needs_stable_prompt_ids and ctx.cfg.resume and ctx.cfg.resume_allow_data_change else None,
               "resume with the same --data (drop --resume-allow-data-change), or start a fresh run on the new data"),
    Capability(S, "row_metadata", "row metadata", "A metadata key it reads of every training row (e.g. `rg_level`, the curriculum level the `rgc:` source writes); data lacking it in any row are refused once the data are loaded (`relax train`, `--dry-run`)."),
    Capability(S, "row_metadata_fix", "row metadata fix", "Which data provide `row_metadata` (named in the refusal).", matrix=False),
    # ---------------------------------------------------------------- environments
    Capability(V, "multi_turn", "multi-turn", "Episodes of several model turns: the engine must continue from tokens and the estimator accept mask holes (rows above)."),
    Capability(V, "tool_format", "tools", "The tool-call format it parses (— = no tools)."),
    Capability(V, "turn_rewards", "turn rewards", "Gives a reward per turn (the episode reward is their sum)."),
    Capability(V, "scores_turns", "scores turns", "Receives the run's scorer's score of every model turn."),
    Capability(V, "max_context", "max context", "The most tokens per episode it is designed for (needs --max-episode-tokens at most that).",
               _max_context, "set --max-episode-tokens to at most the environment's max context"),
    Capability(V, "max_step_seconds", "max step s", "The longest one environment call may take within its own limits (needs a longer --env-timeout).",
               lambda ctx, c: f"may take {c.max_step_seconds:g} s in one call within its own limits, but --env-timeout is {ctx.cfg.env_timeout:g} s, so such a call would end its episode as env_timeout" if c.max_step_seconds is not None and c.max_step_seconds >= ctx.cfg.env_timeout else None,
               "raise --env-timeout above that, or lower the environment's own limits (its parameters: `relax plugins show <environment>`)"),
)


def rows(kind: str) -> tuple[Capability, ...]:
    return tuple(c for c in CAPABILITIES if c.kind == kind)


def matrix_kinds() -> list[str]:
    """The kinds that have capability rows, in :data:`relax_core.specs.KINDS` order."""
    from relax_core.specs import KINDS

    have = {c.kind for c in CAPABILITIES}
    return [k.name for k in KINDS if k.name in have]


def format_value(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "—"
    if isinstance(v, Mapping):
        return "; ".join(f"{k}: {format_value(x)}" for k, x in sorted(v.items())) or "—"
    if isinstance(v, (frozenset, set, tuple, list)):
        return ", ".join(sorted(map(str, v))) or "—"
    if v is None:
        return "—"
    if hasattr(v, "__dataclass_fields__"):
        on = [k.replace("_", " ") for k, x in vars(v).items() if x]
        return ", ".join(on) or "—"
    return str(v)
