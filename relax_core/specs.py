"""Frozen spec objects that plugins register, and the capability declarations they carry.

A spec says *what* a component is (name, summary, source), *which parameters* it takes
(a dataclass schema whose fields carry help text, units, bounds and CLI flag names),
*what it can and cannot do* (a capabilities dataclass, possibly depending on the
parameter values), and *how to build it* (a dotted path to a factory, resolved lazily so
that registering a plugin never imports torch).

Capabilities are declared, never inferred from names, and their defaults are
conservative: what a plugin does not declare, it does not support.

This module imports nothing heavy; it is part of the public plugin API
(:data:`relax_core.__all__`).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Literal

#: Version of the plugin API.  Specs declare the version they were written against;
#: the loader refuses versions it does not support (:func:`api_version_problem`).
#: 2: the batch schema (:mod:`relax_core.batch`): engines return ``loss_mask``,
#: ``rollout_log_probs`` and ``responses`` (were ``log_probs`` and ``texts``), backends take
#: a ``Batch`` (was ``TrainBatch`` with a ``tensors`` dict), specs may declare ``fields``,
#: ``provides`` and ``requires``.
#: 3: one optimizer step (:mod:`relax_core.stages.optimizer`): backends give
#: ``accumulate_gradients``, ``grad_norm``, ``apply_gradients``, ``zero_grad`` and
#: ``optimizer_steps`` instead of ``train_step``.
#: 4: the PPO-clip options are a parameter block (:class:`PPOClipParams`,
#: :class:`DualClipParams`) that estimators compose: ``RunConfig.eps_clip``,
#: ``eps_clip_high``, ``eps_clip_c`` and ``effective_eps_clip_high`` are gone, and
#: ``uses_options`` no longer lists them; estimators declare the fact corrections read,
#: ``behaviour_numerator``, instead of a ``policy_loss_kind``, and corrections the values they
#: accept, ``behaviour_numerators`` (was ``compatible_policy_loss_kinds``); ``CorrectionInput``
#: carries ``behaviour_numerator`` (was ``policy_loss_kind``).
API_VERSION = 5
SUPPORTED_API_VERSIONS = frozenset({1, 2, 3, 4, 5})
#: version -> the kinds whose contract changed in it (and how); their plugins written for an
#: earlier version are refused
CHANGED_IN = {
    2: {"engine": "GenerationOutput must hold loss_mask, and log_probs/texts are now rollout_log_probs/responses",
        "backend": "the training batch is relax_core.batch.Batch (TrainBatch and its tensors dict are gone: read "
                   "batch.<field>)"},
    3: {"backend": "the core owns the optimizer step (relax_core.stages.optimizer): train_step is gone, a backend gives "
                   "accumulate_gradients, grad_norm, apply_gradients, zero_grad and optimizer_steps"},
    4: {"estimator": "the PPO-clip options are a parameter block: compose relax_core.PPOClipParams (or DualClipParams "
                     "for --eps-clip-c) in your parameters and read params.eps_clip (RunConfig.eps_clip, eps_clip_high, "
                     "eps_clip_c are gone, and uses_options no longer lists them); policy_loss_kind is replaced by "
                     "behaviour_numerator (old_log_probs for a loss with a ratio to the old policy, log_probs for "
                     "one without)",
        "correction": "compatible_policy_loss_kinds is replaced by behaviour_numerators (old_log_probs, log_probs or "
                      "*), and CorrectionInput.policy_loss_kind by behaviour_numerator (the field to read: "
                      "getattr(inp, inp.behaviour_numerator))"},
}


#: version -> the kinds whose plugins written for an earlier version still load but may need a
#: change (and which): shown when such a component fails to build (:func:`api_notes`)
NOTES_SINCE = {
    5: {"reward": "relax_core.answers is now the library relax_answers (distribution relax-answers): import it from "
                  "there and add relax-answers to your plugin's dependencies"},
}


def api_notes(kind: str, version: int) -> str:
    """``" (written for plugin API <version>; since <v>: ...)"`` for a ``kind`` written for an
    earlier ``version`` than a change of :data:`NOTES_SINCE` (appended to its build error), or ``""``."""
    notes = [f"since {v}: {NOTES_SINCE[v][kind]}" for v in sorted(NOTES_SINCE) if v > version and kind in NOTES_SINCE[v]]
    return f" (written for plugin API {version}; {'; '.join(notes)})" if notes else ""


def api_version_problem(kind: str, version: int) -> str | None:
    """Why a spec of ``kind`` written for plugin API ``version`` cannot load, or ``None``.
    Scorers, post-processors and data sources of every supported version still load (the
    inputs they read kept their attribute names); engines need 2, backends 3, estimators and
    corrections 4."""
    if version not in SUPPORTED_API_VERSIONS:
        return f"this relax-core supports {sorted(SUPPORTED_API_VERSIONS)}"
    changes = [(v, CHANGED_IN[v][kind]) for v in sorted(CHANGED_IN) if v > version and kind in CHANGED_IN[v]]
    if changes:
        return (f"api_version {version} {kind}s no longer load: "
                + "; ".join(f"since api_version {v} {why}" for v, why in changes) + " (docs/guide/writing-plugins.md)")
    return None

#: The values of ``EstimatorCapabilities.behaviour_numerator``: batch fields (log-probs of the
#: sampled tokens) that can be the numerator of the policy in a loss.
BEHAVIOUR_NUMERATORS = ("old_log_probs", "log_probs")

_MISSING = dataclasses.MISSING


def param(
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    unit: str | None = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    choices: tuple[Any, ...] | None = None,
    recommended: Any = _MISSING,
    why_default: str | None = None,
) -> Any:
    """Declare one field of a plugin's parameter schema (use inside a ``@dataclass``).

    Args:
        default: default value (immutable).
        help: one-line description, shown by ``relax plugins show`` and ``--help``.
        flag: CLI flag, e.g. ``"--tis-clip"``.  Defaults to ``--<component>-<field>``
            with underscores as dashes.  Two plugins may share a flag (e.g. ``--gamma``);
            the value given applies to both, and each keeps its own default.
        unit: unit of the value, if any (``"s"``, ``"tokens"``...).
        ge/gt/le/lt: numeric bounds, checked at startup (non-finite values are always
            refused for floats).
        choices: allowed values.
        recommended: a recommended value shown in the docs (not applied).
        why_default: why the default differs from ``recommended`` (shown with it by
            ``relax plugins show`` and the docs).
    """
    meta = {"help": help, "flag": flag, "unit": unit, "ge": ge, "gt": gt, "le": le,
            "lt": lt, "choices": choices}
    if recommended is not _MISSING:
        meta["recommended"] = recommended
    if why_default:
        meta["why_default"] = why_default
    return field(default=default, metadata=meta)


# --------------------------------------------------------------------------- capabilities


@dataclass(frozen=True)
class GroupAdvantageParams:
    """The parameter block of the group-mean advantage stage
    (:func:`relax_core.policy.group_mean_advantages`), declared once and composed by the
    estimators that use it: ``class MyParams(GroupAdvantageParams)``, or
    ``params=GroupAdvantageParams`` for an estimator with no other parameter."""

    disable_grpo_std_normalization: bool = param(
        False, "Dr.GRPO: group advantages R - mean without dividing by the group std.",
        flag="--disable-grpo-std-normalization")


@dataclass(frozen=True)
class PPOClipParams:
    """The parameter block of PPO's clipped ratio band [1 − ε, 1 + ε_high] (Schulman et al.
    2017, PPO, eq. (7); the decoupled ε_high: Yu et al. 2025, DAPO, §3.1), declared once and
    composed by the estimators that clip a ratio (``class MyParams(PPOClipParams)``); read
    the margins from the parameters your factory receives (``params.eps_clip``)."""

    eps_clip: float = param(0.2, "PPO clip margin (ratio in [1-eps, 1+eps_high]).", flag="--eps-clip", ge=0)
    eps_clip_high: float | None = param(None, "Upper clip margin (default: --eps-clip).", flag="--eps-clip-high", ge=0)

    @property
    def effective_eps_clip_high(self) -> float:
        """ε_high: ``--eps-clip-high``, or ``--eps-clip`` when it is not set."""
        return self.eps_clip if self.eps_clip_high is None else self.eps_clip_high


@dataclass(frozen=True)
class DualClipParams(PPOClipParams):
    """:class:`PPOClipParams` with the dual clip for negative advantages, L = min(L, −c·A)
    (Ye et al. 2020, 'Mastering Complex Control in MOBA Games with Deep RL', §3.2 eq. (5);
    :func:`relax_core.policy.ppo_clip`)."""

    eps_clip_c: float | None = param(None, "Dual-clip constant c > 1 for negative advantages.", flag="--eps-clip-c", gt=1)


@dataclass(frozen=True, kw_only=True)
class EstimatorCapabilities:
    """What an advantage estimator supports and requires.  Conservative defaults."""

    supports_context_parallel: bool = False
    """Same loss and gradient when each sequence is split over CP ranks (verified by the kit)."""
    sync_only: bool = True
    """Needs on-policy updates: no async, no staleness, one optimizer step per rollout,
    and ``rollout_batch_size * n_samples_per_prompt == global_batch_size``."""
    supports_fully_async: bool = False
    """May run with ``--fully-async`` (rollout runs ahead of training)."""
    needs_critic: bool = False
    """Needs a value model (critic role)."""
    min_group_size: int = 1
    """Smallest ``--n-samples-per-prompt`` for which the reward stage is defined."""
    requires_complete_groups: bool = True
    """Every group must hold all ``n_samples_per_prompt`` samples (no partial groups)."""
    requires_normalize_advantages: bool = False
    forbids_normalize_advantages: bool = False
    requires_rewards_normalization: bool = False
    """Refuses ``--disable-rewards-normalization``."""
    requires_per_token_loss: bool = False
    """Needs ``--calculate-per-token-loss`` (token-mean over the global batch)."""
    forbids_per_token_loss: bool = False
    uses_options: frozenset[str] = frozenset()
    """Which of the run options that only some estimators read it reads
    (:data:`relax_core.host.capabilities.SCOPED_OPTIONS`: the reward-side ``kl_coef``); any of
    them set to a non-default value is refused with an estimator that does not list it.
    (Options of a parameter block, e.g. :class:`PPOClipParams`, are read by the estimators
    whose parameters compose it; one that no selected component reads is refused.)"""
    requires_reward_side_kl: bool = False
    """Needs ``--kl-coef > 0`` (e.g. REINFORCE++'s shaped reward)."""
    required_kl_loss_type: str | None = None
    """If set, ``--kl-loss-type`` must be this value (when any KL term is active)."""
    requires_kl_loss: bool = False
    """Needs ``--use-kl-loss`` with a positive ``--kl-loss-coef``."""
    forbids_kl_loss: bool = False
    kl_level: Literal["token", "sequence"] = "token"
    behaviour_numerator: str | None = None
    """The batch field whose log-prob is the numerator of the policy in its loss
    (:data:`BEHAVIOUR_NUMERATORS`): ``old_log_probs`` when the loss has an importance ratio
    π_θ/π_old (PPO-clip, CISPO's weight, SAPO's gate, GSPO's sequence ratio...),
    ``log_probs`` when it has none (REINFORCE, −sg(A)·log π_θ).  A train/inference mismatch
    correction weights by ρ = exp(log num − log q) with it, detached: ρ = p_old/q completes
    the ratio to π_θ/q, and sg(π_θ)/q corrects a ratio-free loss (the corrections guide, "The
    behaviour ratio ρ").  ``None``: undeclared, refused by the corrections that read it."""
    needs_full_sequence: bool = False
    """The loss of a token depends on the whole sequence's log-ratios (per-sample reduction)."""
    allows_reward_post_processors: bool = False
    requires_fields: frozenset[str] = frozenset()
    """Batch fields it reads beyond the core's (:mod:`relax_core.batch`); a run in which no
    selected component provides one is refused."""
    supports_loss_mask_holes: bool = False
    """Correct when ``loss_mask`` has holes inside a response (environment tokens of a
    multi-turn episode): the advantages, loss and gradient at the model tokens equal those of
    the same tokens without the holes, and per-token counts exclude the holes (verified by
    the contract kit).  Required by multi-turn environments."""
    accepts_advantage_terms: bool = False
    """Its loss is correct when a per-token term is added to the advantages it computed
    (``A_t ← A_t + a_t`` between ``compute_advantages`` and ``policy_loss``, e.g. on-policy
    distillation's ``−coef·(log π_old − log π_teacher)``): its policy loss treats each token's
    advantage on its own (a token-level ratio or REINFORCE), and nothing it computes from the
    advantages before the loss would go stale.  Required by corrections that declare
    ``advantage_term``.  The contract kit verifies it: a term added at one token per response
    changes the gradient w.r.t. ``log_probs`` at those tokens and nowhere else."""
    uses_turn_rewards: bool = False
    """Reads the per-turn rewards (``turn_rewards``) of environments that give them;
    otherwise it trains on each episode's return (their sum, ``rewards``)."""
    metrics: tuple[str, ...] = ()
    """Names of the estimator-specific metrics it reports (``train/...``, ``rollout/...``)."""


@dataclass(frozen=True, kw_only=True)
class SamplingConstraints:
    """Rollout sampling settings a correction needs (checked at startup)."""

    temperature_positive: bool = False
    top_p_one: bool = False
    top_k_disabled: bool = False
    no_penalties: bool = False


@dataclass(frozen=True, kw_only=True)
class CorrectionCapabilities:
    """What a train/inference mismatch correction needs and conflicts with."""

    requires_fields: frozenset[str] = frozenset()
    """Batch fields it reads that not every run has (:mod:`relax_core.batch`), e.g.
    ``rollout_log_probs``, the top-k heads ``top_k_ids``/``top_k_log_probs``/
    ``train_top_k_log_probs``, ``routed_experts``, or a plugin's own; a run in which no
    selected component provides one is refused."""
    needs_moe_model: bool = False
    needs_routing_replay: bool = False
    """The backend must replay the engine's recorded MoE routes in its forwards."""
    behaviour_numerators: frozenset[str] = frozenset()
    """The estimators' ``behaviour_numerator`` values it is correct for
    (:data:`BEHAVIOUR_NUMERATORS`); ``"*"``: any estimator, also one that declares none (it
    does not read the estimator's ratio).  Empty = none."""
    conflicts_with_rollout_logprobs_as_old: bool = False
    """Refuses ``--use-rollout-logprobs``."""
    conflicts_with: frozenset[str] = frozenset()
    """Names of other corrections it cannot be combined with."""
    sampling: SamplingConstraints = SamplingConstraints()
    advantage_term: bool = False
    """It corrects the advantages, not the loss: its object has ``advantage_term(AdvantageInput)
    -> AdvantageTerm`` (:mod:`relax_core.contracts`), a per-token term the core adds to the
    estimator's advantages before ``--normalize-advantages``, and no ``apply``.  Needs an
    estimator that declares ``accepts_advantage_terms``."""
    order: int = 100
    """Application order (lower first) when several corrections are selected."""
    supports_context_parallel: bool = False
    supports_fully_async: bool = False
    metrics: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class EngineCapabilities:
    """What a rollout engine provides."""

    devices: frozenset[str] = frozenset({"cpu"})
    provides_fields: frozenset[str] = frozenset()
    """Batch fields it returns beyond those every engine returns (tokens, ``loss_mask``,
    lengths, truncation, texts): ``rollout_log_probs``, ``top_k_ids``/``top_k_log_probs``
    (when asked for a top-k head), ``routed_experts`` (when asked), a plugin's own."""
    supports_weight_update: bool = False
    supports_shared_weights: bool = False
    """``update_weights(state_dict, version, share=True)`` may keep the given tensors as its
    weights instead of copying them (where dtype, device and shape match its own).  The core
    asks for it only when the caller owns those tensors in the same process and changes them
    only between generation calls, pushing after every change: a synchronous local run with
    ``--update-weights-interval 1``, where the trainer's weights then serve the engine too
    (one copy of the model in memory, not two).  Such an engine also implements
    ``release_weights()``, called before each training step: it frees the weights it holds
    of its own (e.g. a bfloat16 copy beside a float32 trainer) until the push after the step."""
    supports_lora_adapters: bool = False
    """In a LoRA run (``--lora-rank``) ``update_weights`` takes the adapter alone
    (:class:`~relax_core.contracts.AdapterWeights`, PEFT format) and applies it to its base
    weights, instead of the merged weights; ``--no-lora-engine-adapter`` pushes merged weights
    anyway.  The engine's factory reads ``--lora-rank`` to reserve room for the adapter."""
    supports_tensor_parallel: bool = False
    supports_sampling_penalties: bool = False
    supports_stop_strings: bool = False
    supports_token_continuation: bool = False
    """``generate`` continues from any token-id prefix exactly as given (a multi-turn
    episode's earlier turns: the sampled ids and the rendered environment replies), never
    re-tokenising it.  Required by multi-turn environments."""
    supports_prefix_caching: bool = False
    """Reuses the KV cache of a prefix it has seen (the earlier turns of an episode) instead
    of prefilling it again."""
    max_context: int | None = None
    """The most prompt + response tokens of one sequence it accepts (``None``: no limit of its
    own); a multi-turn run must bound its episodes below it (``--max-episode-tokens``)."""


@dataclass(frozen=True, kw_only=True)
class BackendCapabilities:
    """What a training backend provides."""

    devices: frozenset[str] = frozenset({"cpu"})
    supports_data_parallel: bool = False
    supports_tensor_parallel: bool = False
    supports_context_parallel: bool = False
    supports_pipeline_parallel: bool = False
    supports_critic: bool = False
    supports_routing_replay: bool = False
    provides_fields: frozenset[str] = frozenset()
    """Batch fields its forward gives beyond ``log_probs`` and ``entropy``, e.g.
    ``train_top_k_log_probs`` (log-probs at the engine's top-k ids)."""
    supports_gradient_checkpointing: bool = False
    bf16_devices: frozenset[str] = frozenset()
    """Devices on which it trains under bfloat16 autocast when ``--bf16`` is on (empty: it
    does not read ``--bf16``); an explicit ``--bf16`` elsewhere is refused at start-up, and
    the default (auto, :mod:`relax_core.run.precision`) turns it on only there."""
    supports_shared_prefix: bool = False
    """Can encode the shared prompt of a group once in the training forward, each response
    attending to it, with the same log-probs and gradients (Prefix Grouper, Liu et al. 2025,
    arXiv 2506.05433); the torch backend's ``--shared-prefix``."""
    supports_token_budget: bool = False
    """Packs micro-batches to ``--max-tokens-per-micro-batch`` padded tokens (otherwise the
    flag is refused rather than ignored)."""
    supports_lora: bool = False
    """Trains LoRA adapters (``--lora-rank > 0``, :mod:`relax_core.run.lora`): only the adapters
    are optimised and checkpointed, ``engine_state_dict`` gives the merged weights under the
    base model's names, ``engine_adapter`` the adapter alone
    (:class:`~relax_core.contracts.AdapterWeights`), and the ``ref`` role is the base model
    with the adapter disabled."""
    lora_default_targets: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """The modules it adapts when ``--lora-target-modules`` is not given, by Hugging Face
    ``model_type`` (e.g. ``{"llama": ("q_proj", "k_proj", ...)}``); a LoRA run on a model type
    without an entry must name its modules."""
    lora_excluded_modules: frozenset[str] = frozenset()
    """Module names that cannot carry an adapter in this backend (e.g. the embeddings, when the
    log-probs read the output embedding's weight directly); refused in ``--lora-target-modules``."""
    requires: frozenset[str] = frozenset()
    """Conditions of declared capabilities, as ``"<capability field>:<requirement>"``; a
    requirement is ``cuda`` (a CUDA device) or the name of a module that must be importable,
    e.g. ``{"supports_context_parallel:cuda", "supports_context_parallel:transformer_engine"}``.
    Startup validation refuses a run that uses the capability where one does not hold."""


@dataclass(frozen=True, kw_only=True)
class RewardProcessorCapabilities:
    """What a reward post-processor does to a batch."""

    allowed_with_strict_estimators: bool = False
    """May be combined with estimators that forbid post-processors (it does not replace
    the raw reward signal they diagnose)."""
    may_request_more_samples: bool = False
    """Drops groups and asks the loop to sample more (dynamic sampling)."""


@dataclass(frozen=True, kw_only=True)
class SamplerCapabilities:
    """What a prompt sampler needs of the run."""

    needs_stable_prompt_ids: bool = False
    """Keeps per-prompt statistics keyed by the dataset index (``prompt_index``), so an index
    must name the same prompt for the whole run, resumes included: refused with
    ``--resume-allow-data-change`` (after a data change the indices name other rows)."""
    row_metadata: str | None = None
    """A metadata key it reads of every training row (e.g. ``rg_level``, a row's curriculum
    level): its factory's function is called ``fn(num_rows, seed, values)`` with
    ``values[i] = rows[i]["metadata"][key]``, and a run whose data lack the key in any row is
    refused at startup (``relax train`` / ``--dry-run``, exit 2) with ``row_metadata_fix``."""
    row_metadata_fix: str = ""
    """Which data provide ``row_metadata`` (the fix named when the data lack it)."""


@dataclass(frozen=True, kw_only=True)
class EnvironmentCapabilities:
    """What an environment's episodes need (:mod:`relax_core.environments`).  Conservative
    defaults: one turn, no tools, no per-turn rewards."""

    multi_turn: bool = False
    """Its episodes may have more than one model turn: the engine must continue from tokens
    (``supports_token_continuation``) and the estimator accept holes in ``loss_mask``."""
    tool_format: str | None = None
    """The tool-call format it parses (e.g. ``"hermes"``: ``<tool_call>{json}</tool_call>``),
    ``None`` = no tools."""
    turn_rewards: bool = False
    """Gives a reward for several turns of an episode (the episode reward is their sum);
    ``False`` = one reward per episode at most."""
    scores_turns: bool = False
    """Its ``step`` receives the run's scorer's score of each model turn (e.g. ``retry``)."""
    max_context: int | None = None
    """The most tokens (prompt + episode) it is designed for; ``None`` = no limit of its own.
    A run whose longest possible episode exceeds it is refused."""
    max_step_seconds: float | None = None
    """The longest one ``start`` or ``step`` call may take within its own limits (e.g. the
    ``tools`` environment: python calls per turn × seconds per call); ``None`` = unbounded or
    negligible.  A run whose ``--env-timeout`` is not longer is refused: every call that used
    its own limit would end its episode as ``env_timeout`` instead of returning."""


# --------------------------------------------------------------------------- specs


def resolve(path: str) -> Any:
    """The object a ``"package.module:attr"`` path names (a factory, a predicate), imported.

    Raises:
        ValueError: ``path`` is not of that form.
        ImportError, AttributeError: the module or the attribute does not exist.
    """
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ValueError(f"expected 'package.module:callable', got {path!r}")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True, kw_only=True)
class ComponentSpec:
    """Base of every spec.  Subclasses fix ``kind`` and the capabilities type."""

    kind: ClassVar[str] = "component"
    capabilities_type: ClassVar[type | None] = None

    name: str
    """Component name, as selected on the CLI (``[a-z][a-z0-9_]*``)."""
    summary: str
    """One line: what it is."""
    source: str
    """Paper (title, section/equation) or other source of the method."""
    factory: str
    """Dotted path ``package.module:callable`` called as ``factory(params, config)``;
    imported only when the component is built (keeps registration light)."""
    params: type | None = None
    """Parameter schema: a dataclass whose fields are declared with :func:`param`.  It may
    define ``problems(self) -> list[tuple[str, str]]`` (message, fix) for constraints across
    fields; startup validation reports them when the component is selected."""
    capabilities: Any = None
    """A capabilities instance, or a callable ``params -> capabilities``."""
    fields: tuple[Any, ...] = ()
    """New batch fields this plugin declares (:class:`relax_core.batch.Field`), registered
    when the plugin loads; components then provide (``provides_fields``) and read
    (``requires_fields``) them by name, declared in their capabilities."""
    api_version: int = API_VERSION

    def default_params(self) -> Any:
        return self.params() if self.params is not None else None

    def capabilities_for(self, params: Any = None) -> Any:
        """The capabilities for the given parameter values (defaults when ``None``)."""
        caps = self.capabilities
        if callable(caps) and not dataclasses.is_dataclass(caps):
            caps = caps(params if params is not None else self.default_params())
        if caps is None:
            caps = self.capabilities_type() if self.capabilities_type else None
        return caps

    def build(self, params: Any = None, config: Any = None) -> Any:
        """Import the factory and build the component."""
        fn: Callable[..., Any] = resolve(self.factory)
        return fn(params if params is not None else self.default_params(), config)


@dataclass(frozen=True, kw_only=True)
class EstimatorSpec(ComponentSpec):
    """An advantage estimator: reward normalisation, advantages/returns, policy loss.

    The factory returns an object with ``compute_advantages(AdvantageInput) ->
    AdvantageOutput`` and ``policy_loss(PolicyLossInput) -> PolicyLossOutput``
    (see :mod:`relax_core.contracts`).
    """

    kind: ClassVar[str] = "estimator"
    capabilities_type: ClassVar[type] = EstimatorCapabilities


@dataclass(frozen=True, kw_only=True)
class CorrectionSpec(ComponentSpec):
    """A train/inference mismatch correction applied to the per-token policy loss."""

    kind: ClassVar[str] = "correction"
    capabilities_type: ClassVar[type] = CorrectionCapabilities


@dataclass(frozen=True, kw_only=True)
class RewardScorerSpec(ComponentSpec):
    """A scorer: the factory returns ``fn(response: str, label, metadata: dict) -> float | None``,
    or, when ``batched``, ``fn(responses: list[str], labels: list, metadata: list[dict]) ->
    list[float | None]`` (one reward per sample, in order).

    The function may also have ``extract_answer(response, label, metadata) -> str | None``,
    the answer text it compares (shown when a run's rewards never vary)."""

    kind: ClassVar[str] = "reward"
    capabilities_type: ClassVar[type | None] = None
    batched: bool = False
    """The factory's function scores a whole batch in one call (a reward model: one forward
    for many responses) instead of one sample per call; the reward workers give it every
    sample it scores in a batch, with ``--reward-timeout`` for the whole call
    (:func:`relax_core.stages.rewarding.score_batch`)."""
    self_check: bool = True
    """Whether scoring a label as the response is cheap and local, so that ``relax train``
    (and ``--dry-run``) can check that a correct answer scores before any model loads
    (:mod:`relax_core.host.reward_check`); ``False`` for scorers that call a service."""
    model_based: bool = False
    """A learned model gives the score (a reward model, an LLM judge): it can be fooled, so
    ``relax train`` scores a few known-bad responses with it before training (empty, the
    prompt echoed, a refusal, the bare label where the prompt asks for reasoning) and warns
    when they score as high as a correct answer (:func:`relax_core.host.reward_check.bad_response_probe`)."""
    ray_num_gpus: Callable[[Any], float] | None = None
    """Set for a scorer that, under ``--launcher ray``, runs in a Ray actor of its own: the
    GPUs that actor needs, from the scorer's parameters (a reward model: 1 on ``cuda``, 0 on
    ``cpu``; :mod:`relax_core.distributed.scoring`).  ``None``: scored in the driver's reward
    workers.  Only with ``--reward NAME`` (``auto`` chooses the scorer per sample).  A
    module-level function: the spec travels with the scorer to its workers."""
    auto_labels: str | None = None
    """``"module:function"``, a predicate ``(label) -> bool``: under ``--reward auto``, a row of
    a file whose metadata names no scorer and whose label it accepts is scored by this scorer
    (``gsm8k``: a plain number), instead of the default ``math``; the first accepting scorer
    by name wins (:func:`relax_core.data.load_dataset`)."""
    suggest: str = ""
    """The fix offered when another scorer rewards no correct answer (the label check and the
    reward watch, :func:`relax_core.host.reward_check.what_to_try`), e.g. ``"--reward gsm8k
    (the final number, or the last \\boxed{}) for numeric labels"``."""
    fixes: tuple[str, ...] = ()
    """What to try when this scorer itself rewards no correct answer (its own options, e.g.
    ``--math-answer-format anchors``), listed before the generic fixes."""
    counts: tuple[str, ...] = ()
    """Names of the counts the scorer reports (e.g. ``("invalid",)`` for an LLM judge's
    unparseable verdicts): its function has ``pop_counts() -> dict[str, int]``, called by the
    reward worker after each call (the counts since the last call), and each count is logged as
    ``rollout/reward/<name>/<count>``, summed over the step (0 when none)."""


@dataclass(frozen=True, kw_only=True)
class RewardProcessorSpec(ComponentSpec):
    """A post-processor: the factory returns an object with
    ``process(RewardBatch) -> RewardBatch`` (see :mod:`relax_core.contracts`)."""

    kind: ClassVar[str] = "reward_processor"
    capabilities_type: ClassVar[type] = RewardProcessorCapabilities


@dataclass(frozen=True, kw_only=True)
class EngineSpec(ComponentSpec):
    """A rollout engine (generation with per-token log-probs, weight updates)."""

    kind: ClassVar[str] = "engine"
    capabilities_type: ClassVar[type] = EngineCapabilities


@dataclass(frozen=True, kw_only=True)
class BackendSpec(ComponentSpec):
    """A training backend (forward/backward/optimizer for actor, critic, reference)."""

    kind: ClassVar[str] = "backend"
    capabilities_type: ClassVar[type] = BackendCapabilities


@dataclass(frozen=True, kw_only=True)
class DataSourceSpec(ComponentSpec):
    """A data source for ``--data <scheme>:<spec>`` (e.g. ``rg:`` for reasoning-gym).

    ``scheme`` is matched against the part of ``--data`` before the first ``:``.  A
    generating source's factory returns ``fn(spec: str, config) -> list[dict]`` of rows with
    prompt/label/metadata.  A *file format* (``file_keys`` set, e.g. ``gsm8k:<path>``) reads
    the records of a JSONL/JSON/Parquet file at ``<spec>``: its factory returns
    ``fn(record: dict) -> dict``, one row from one record, raising ``ValueError`` or
    ``TypeError`` for a bad record (which the core names by file and line, or skips under
    ``--skip-bad-rows``).
    """

    kind: ClassVar[str] = "data_source"
    capabilities_type: ClassVar[type | None] = None
    scheme: str
    file_keys: tuple[str, ...] = ()
    """Non-empty: the source is a file format, and a bare file path whose first JSON-object
    record has all of these keys and neither ``--prompt-key`` nor ``--label-key`` is read by it
    (``("question", "answer")`` for GSM8K).  A tuple of non-empty strings."""


@dataclass(frozen=True, kw_only=True)
class SamplerSpec(ComponentSpec):
    """A prompt sampler (``--sampler``): which dataset rows each step's prompts are.

    The factory returns ``fn(num_rows: int, seed: int) -> Sampler``
    (:class:`relax_core.sampling.Sampler`: ``take``, ``observe``, ``metrics``, ``state``,
    ``load``), called once per run with the training set's size and ``--seed`` (and each
    row's ``metadata[key]`` as a third argument when its capabilities declare
    ``row_metadata``).
    """

    kind: ClassVar[str] = "sampler"
    capabilities_type: ClassVar[type] = SamplerCapabilities


@dataclass(frozen=True, kw_only=True)
class EnvironmentSpec(ComponentSpec):
    """An environment: the episode driver of each sample (``--environment``).

    The factory returns an object with ``start(row) -> episode`` whose episode has
    ``step(turn: Turn) -> Reply`` (:mod:`relax_core.environments`); the core's episode runner
    owns the tokens (:mod:`relax_core.stages.episodes`)."""

    kind: ClassVar[str] = "environment"
    capabilities_type: ClassVar[type] = EnvironmentCapabilities


@dataclass(frozen=True)
class Kind:
    """One kind of component: the one place that names it.  The hooks, the plugin loader,
    the capability matrix, the generated docs, the scaffold and the CLI all read
    :data:`KINDS`.

    Attributes:
        name: the kind (``spec.kind``), e.g. ``"reward_processor"``.
        spec_type: its spec class.
        hook: the registration hook returning its specs.
        title: the plural heading in docs and tables.
        slug: the docs folder (``docs/components/<slug>/``).
        option: the :class:`~relax_core.config.RunConfig` field that selects components of
            this kind (``--advantage-estimator`` → ``"advantage_estimator"``); ``None`` when
            no flag selects it (data sources follow ``--data``).
        scaffold: ``relax plugins new --kind`` can write one.
    """

    name: str
    spec_type: type
    hook: str
    title: str
    slug: str
    option: str | None
    scaffold: bool = True


#: Every component kind, in the order tables and docs list them.
KINDS: tuple[Kind, ...] = (
    Kind("estimator", EstimatorSpec, "relax_register_estimators", "Estimators", "estimators", "advantage_estimator"),
    Kind("correction", CorrectionSpec, "relax_register_corrections", "Corrections", "corrections", "correction"),
    Kind("engine", EngineSpec, "relax_register_rollout_engines", "Rollout engines", "engines", "rollout_engine"),
    Kind("backend", BackendSpec, "relax_register_train_backends", "Training backends", "backends", "train_backend"),
    Kind("reward_processor", RewardProcessorSpec, "relax_register_reward_processors", "Reward post-processors",
         "reward-processors", "reward_processor"),
    Kind("reward", RewardScorerSpec, "relax_register_reward_scorers", "Reward scorers", "rewards", "reward"),
    Kind("sampler", SamplerSpec, "relax_register_samplers", "Samplers", "samplers", "sampler"),
    Kind("data_source", DataSourceSpec, "relax_register_data_sources", "Data sources", "data-sources", None,
         scaffold=False),
    Kind("environment", EnvironmentSpec, "relax_register_environments", "Environments", "environments",
         "environment"),
)
KIND: dict[str, Kind] = {k.name: k for k in KINDS}
SPEC_TYPES: dict[str, type[ComponentSpec]] = {k.name: k.spec_type for k in KINDS}
