"""The data contract between the stages of one training step.

    rollout ──► reward ──► advantage ──► loss ──► optimizer step ──► weights to the engine

Shapes: ``B`` = samples in the batch (or micro-batch), ``T`` = padded response length,
``k`` = top-k width, ``L`` = MoE layers, ``E`` = experts chosen per token.  Token-level
fields are right-padded; ``loss_mask`` (bool ``[B, T]``) says which positions are real
response tokens that carry loss.  Values at masked positions are *garbage by contract*
(they may hold NaN or 1e9): every consumer must mask before it reduces or differentiates.

Groups are identified by ``group_index`` (long ``[B]``), never by position.

Per-sample and per-token fields are declared once, in :mod:`relax_core.batch`: the samples
of a step are a :class:`~relax_core.batch.Batch`, and the inputs below that carry batch
fields (:class:`GenerationOutput`, :class:`AdvantageInput`, :class:`PolicyLossInput`,
:class:`CorrectionInput`) are read-only :class:`~relax_core.batch.Fields` views: any
declared field reads as an attribute (``None`` when absent), so a component needing a new
field declares it and reads it, and nothing in between changes.

This module imports torch only for type checking, so it is safe to import anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from relax_core.batch import TOP_K_HEAD, Batch, Fields

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor
else:
    Tensor = Any


class AdvantageInput(Fields):
    """Input of ``Estimator.compute_advantages`` (runs once per step, on the whole batch):
    a read-only view of the step's batch fields.

    Fields (see :data:`relax_core.batch.CORE_FIELDS`): ``rewards`` float32 ``[B]`` (after
    post-processors; NaN = unscored), ``group_index`` long ``[B]``, ``loss_mask`` bool
    ``[B, T]``, ``response_lengths`` long ``[B]``, ``old_log_probs`` float32 ``[B, T]``
    (recomputed, or the rollout log-probs under ``--use-rollout-logprobs``; ``None`` when
    no forward was needed), ``ref_log_probs`` (with a reference model), ``values`` (critic
    values, for estimators that need a critic), and any other declared field present.

    Extra:
        process_group: torch.distributed group for statistics reduced across data-parallel
            ranks (``None`` = this process holds the whole batch).
    """

    __slots__ = ()
    extra: ClassVar[frozenset[str]] = frozenset({"process_group"})


@dataclass(frozen=True, kw_only=True)
class AdvantageOutput:
    """Output of ``compute_advantages``.

    Attributes:
        advantages: float32 ``[B, T]`` token advantages (0 at masked positions).
        returns: float32 ``[B, T]`` returns (critic targets for PPO; else equal to the
            advantages' pre-normalisation signal or the advantages).
        metrics: scalar metrics (python floats), e.g. ``rollout/zero_std_group_frac``.
        normalized: the advantages are already normalised over the global batch by the
            estimator's own method (REINFORCE++'s global token normalisation over
            ``AdvantageInput.process_group``); the core then does not normalise them again
            under ``--normalize-advantages``.
    """

    advantages: Tensor
    returns: Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    normalized: bool = False


class PolicyLossInput(Fields):
    """Input of ``Estimator.policy_loss`` for one micro-batch: a read-only view of the
    micro-batch's fields and the backend's forward.

    Fields: ``log_probs`` ``[B, T]`` log π_θ of the sampled tokens (requires grad),
    ``old_log_probs`` ``[B, T]`` log π_old (detached), ``advantages`` ``[B, T]`` (detached),
    ``loss_mask`` bool ``[B, T]``, ``rollout_log_probs`` ``[B, T]`` log q from the engine
    when available, and any other declared field of the micro-batch.

    Extra:
        process_group: data/context-parallel group for statistics the estimator reduces
            across ranks (``None`` = local only).
    """

    __slots__ = ()
    extra: ClassVar[frozenset[str]] = frozenset({"process_group"})


@dataclass(frozen=True, kw_only=True)
class PolicyLossOutput:
    """Output of ``policy_loss``.

    Attributes:
        loss: ``[B, T]`` per-token policy loss (finite everywhere; masked positions are
            ignored by the reduction).  The core reduces it with the run's reduction.
        token_metrics: name -> ``[B, T]`` per-token values (e.g. ``pg_clipfrac`` as a
            0/1 indicator, ``ppo_kl``), reduced by the core as a masked token mean
            Σ mask·x / N; finite everywhere (0 at masked positions is the rule), since
            the mean is a multiply-and-sum, not a select (the contract kit checks it).
        scalar_metrics: name -> 0-dim tensor or float (e.g. ``m2po_eps_low``), averaged
            over micro-batches by the core.
    """

    loss: Tensor
    token_metrics: dict[str, Tensor] = field(default_factory=dict)
    scalar_metrics: dict[str, Any] = field(default_factory=dict)


class Estimator(Protocol):
    """What an estimator factory returns."""

    def compute_advantages(self, inp: AdvantageInput) -> AdvantageOutput: ...

    def policy_loss(self, inp: PolicyLossInput) -> PolicyLossOutput: ...


@dataclass(frozen=True, kw_only=True)
class ValueLossInput:
    """Input of ``CriticEstimator.value_loss`` for one critic micro-batch.

    The critic (a value head on its own copy of the backbone, or ``--critic-load``) is
    trained by the core's optimizer step with ``role="critic"``; ``loss_fn``
    builds this from the critic forward and the batch tensors.

    Attributes:
        values: float ``[B, T]`` V_θ(s_t) of the critic being trained (requires grad).
        old_values: float ``[B, T]`` V_old(s_t), the critic's values when the rollout was
            scored (the ``values`` of :class:`AdvantageInput`; detached).
        returns: float ``[B, T]`` value targets R_t (``AdvantageOutput.returns``; detached).
        loss_mask: bool ``[B, T]``.
    """

    values: Tensor
    old_values: Tensor
    returns: Tensor
    loss_mask: Tensor


@dataclass(frozen=True, kw_only=True)
class CriticSettings:
    """How the core sets up and schedules the critic of a critic estimator.

    Attributes:
        lr: critic learning rate (PPO ``--critic-lr``, default ``--lr``).
        load: initial critic weights (``--critic-load``): a model directory; ``None`` = a
            copy of the actor's initial backbone with a fresh scalar value head.
        num_critic_only_steps: first steps that train only the critic (the actor's
            optimizer step is skipped), ``--num-critic-only-steps``.
    """

    lr: float
    load: str | None = None
    num_critic_only_steps: int = 0


class CriticEstimator(Estimator, Protocol):
    """What the factory of an estimator declaring ``needs_critic`` returns: an estimator
    that also gives the critic's per-token loss (``loss`` ``[B, T]``, reduced by the core
    with the run's reduction like the policy loss; metrics as in :class:`PolicyLossOutput`,
    e.g. ``value_clipfrac``) and the critic's settings."""

    critic_settings: CriticSettings

    def value_loss(self, inp: ValueLossInput) -> PolicyLossOutput: ...


class CorrectionInput(Fields):
    """Input of ``Correction.apply`` for one micro-batch: a read-only view of the
    micro-batch's fields and the backend's forward, plus the loss so far.

    Fields: ``log_probs`` ``[B, T]`` log p_θ (current policy, requires grad),
    ``old_log_probs`` ``[B, T]`` log p_0 (detached), ``rollout_log_probs`` ``[B, T]`` log q
    (engine), ``advantages``, ``loss_mask``, ``response_ids``, ``top_k_ids`` /
    ``top_k_log_probs`` ``[B, T, k]`` (engine head: ids, log q_v),
    ``train_top_k_log_probs`` ``[B, T, k]`` (log p_v of the trainer at the same ids, with
    grad), and any other declared field (a plugin's own, e.g.).

    Extra:
        loss: ``[B, T]`` per-token policy loss after the estimator's own clipping (and
            after earlier corrections).
        behaviour_numerator: the estimator's declared ``behaviour_numerator``, the name of
            the field holding the numerator's log-probs (``old_log_probs`` or ``log_probs``).
        is_weight: optional callable ``ratio [..] -> weight [..]`` giving the IS rule of an
            importance-weight correction selected in the same run (for score centering).
        process_group: as :class:`PolicyLossInput`.
    """

    __slots__ = ()
    extra: ClassVar[frozenset[str]] = frozenset({"loss", "behaviour_numerator", "is_weight", "process_group"})


@dataclass(frozen=True, kw_only=True)
class CorrectionOutput:
    """Output of ``Correction.apply``: the corrected per-token loss ``[B, T]`` and metrics
    (same conventions as :class:`PolicyLossOutput`)."""

    loss: Tensor
    token_metrics: dict[str, Tensor] = field(default_factory=dict)
    scalar_metrics: dict[str, Any] = field(default_factory=dict)


class Correction(Protocol):
    def apply(self, inp: CorrectionInput) -> CorrectionOutput: ...


@dataclass(frozen=True, kw_only=True)
class AdvantageTerm:
    """Output of ``advantage_term`` of a correction that declares ``advantage_term``
    (:class:`~relax_core.specs.CorrectionCapabilities`): a per-token term the core adds to
    the estimator's advantages, ``A_t ← A_t + term_t``, before ``--normalize-advantages``.

    Attributes:
        term: float32 ``[B, T]``, detached, 0 at masked positions (which may hold NaN in
            the inputs).
        metrics: scalar metrics (python floats) of the whole batch, e.g. ``opd/reverse_kl``.
    """

    term: Tensor
    metrics: dict[str, float] = field(default_factory=dict)


class AdvantageCorrection(Protocol):
    def advantage_term(self, inp: AdvantageInput) -> AdvantageTerm: ...


@dataclass(frozen=True, kw_only=True)
class RewardBatch:
    """What reward post-processors transform (whole batch, before the estimator).

    Attributes:
        rewards: float32 ``[B]`` (NaN = unscored).
        group_index: long ``[B]``.
        response_lengths: long ``[B]`` model tokens of each response (``loss_mask.sum(-1)``: the
            environment tokens of an episode are not counted).
        truncated: bool ``[B]``.
        responses: the response texts.
        keep: bool ``[B]`` samples to train on (a filter clears whole groups).
        raw_rewards: float32 ``[B]``, the scorer's rewards before any post-processor (NaN =
            unscored), the signal a filter tests (a length penalty must not make an
            all-wrong group look informative); read-only (a processor that changes it is
            refused by :func:`relax_core.stages.rewarding.apply_processors`).  Default: ``rewards``
            (a batch no processor has changed).
        metrics: scalar metrics the processors add, each a mean over this batch (a
            fraction or an average per sample or per group); a step of several
            oversampling rounds reports their mean over the rounds (:func:`relax_core.stages.rewarding.mean_over_rounds`).
    """

    rewards: Tensor
    group_index: Tensor
    response_lengths: Tensor
    truncated: Tensor
    responses: list[str]
    keep: Tensor
    raw_rewards: Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.raw_rewards is None:
            object.__setattr__(self, "raw_rewards", self.rewards)

    def replace(self, **changes: Any) -> "RewardBatch":
        return replace(self, **changes)


# --------------------------------------------------------------------------- engines


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """Sampling settings of one generation call (from the run config)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 64
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    fields: frozenset[str] = frozenset()
    """Rollout-stage fields asked for beyond those every engine returns: the selected
    components' ``requires_fields`` of stage ``rollout`` (``top_k_ids`` / ``top_k_log_probs``,
    ``routed_experts``, a plugin's own)."""
    top_k_width: int = 0
    """``k`` of the top-k head, when its fields are asked."""

    @property
    def return_top_k(self) -> int:
        """``k`` when the top-k head (``top_k_ids`` / ``top_k_log_probs``) is asked, else 0."""
        return self.top_k_width if TOP_K_HEAD & self.fields else 0

    @property
    def return_routed_experts(self) -> bool:
        """``routed_experts`` is asked."""
        return "routed_experts" in self.fields


class GenerationOutput(Fields):
    """What ``RolloutEngine.generate`` returns for B prompts (one sample each; repeat a
    prompt to get a group): a view of rollout-stage batch fields.  The engine owns the
    tokens and the mask: the loop trains on exactly these ids and this ``loss_mask``.

    Fields: ``response_ids`` long ``[B, T]`` (pad id after each response),
    ``response_lengths`` long ``[B]``, ``loss_mask`` bool ``[B, T]`` (the positions that
    carry loss; a single completion: :func:`relax_core.batch.length_mask`),
    ``rollout_log_probs`` float32 ``[B, T]`` log q of each sampled token under the sampling
    distribution (temperature, top-p, top-k applied; garbage past the length),
    ``truncated`` bool ``[B]`` (hit ``max_new_tokens`` without EOS/stop), ``responses``
    (decoded texts), ``top_k_ids`` / ``top_k_log_probs`` ``[B, T, k]`` and
    ``routed_experts`` long ``[B, T, L, E]`` when requested, and any declared field the
    engine provides.
    """

    __slots__ = ()
    stages: ClassVar[frozenset[str] | None] = frozenset({"rollout"})


@dataclass(frozen=True, kw_only=True)
class AdapterWeights:
    """A LoRA adapter as PEFT saves it (``PeftModel.save_pretrained``), in memory: what a
    LoRA run pushes to an engine declaring
    :attr:`~relax_core.specs.EngineCapabilities.supports_lora_adapters` instead of the merged
    weights (the base model's weights stay in the engine; only the adapter moves).

    Attributes:
        tensors: the ``adapter_model.safetensors`` entries, PEFT's names
            (``base_model.model.<module>.lora_A.weight`` ``[r, d_in]``,
            ``....lora_B.weight`` ``[d_out, r]``), float tensors on the CPU.
        config: the ``adapter_config.json`` object (``peft_type`` ``"LORA"``, ``r``,
            ``lora_alpha``, ``target_modules``, ...): the layer computes
            ``W x + (lora_alpha / r) · B A x`` (Hu et al. 2021, arXiv 2106.09685, eq. 3).
    """

    tensors: dict[str, Tensor]
    config: dict[str, Any]

    def save(self, path: Any) -> None:
        """Write the PEFT adapter directory ``path`` (created if missing):
        ``adapter_model.safetensors`` and ``adapter_config.json``, loadable by
        ``peft.PeftModel.from_pretrained(base, path)`` and by vLLM's ``LoRARequest``."""
        import json
        from pathlib import Path

        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().contiguous() for k, v in self.tensors.items()}, str(path / "adapter_model.safetensors"))
        (path / "adapter_config.json").write_text(json.dumps(self.config, indent=2))


class RolloutEngine(Protocol):
    """What an engine factory returns (``factory(params, config)``)."""

    tokenizer: Any

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams) -> GenerationOutput: ...

    def update_weights(self, state_dict: Any, version: int, *, share: bool = False) -> None:
        """Load new weights (a name -> tensor mapping in Hugging Face naming) between
        generation calls; ``version`` is the trainer step that produced them.  ``share=True``
        (passed only to engines declaring
        :attr:`~relax_core.specs.EngineCapabilities.supports_shared_weights`): the engine may
        keep these tensors as its weights rather than copy them; the caller changes them only
        between generation calls and calls ``update_weights`` after each change.  In a LoRA
        run, an engine declaring
        :attr:`~relax_core.specs.EngineCapabilities.supports_lora_adapters` gets an
        :class:`AdapterWeights` instead (unless ``--no-lora-engine-adapter``): it samples
        from its base weights with that adapter applied, replacing the previous one."""

    def release_weights(self) -> None:
        """Free the weights the engine holds of its own (not those a ``share=True`` push
        shared) until the next ``update_weights``; generating in between is an error.  Called
        only on engines declaring
        :attr:`~relax_core.specs.EngineCapabilities.supports_shared_weights`, in the runs that
        share, before each training step: the step's peak memory then holds no engine copy
        of the model (a bfloat16 engine beside a float32 trainer)."""

    def shutdown(self) -> None: ...


# --------------------------------------------------------------------------- backends


@dataclass(frozen=True, kw_only=True)
class ForwardOutput:
    """The backend's forward on one micro-batch (all ``[b, T]`` aligned with responses).

    Attributes:
        log_probs: float32 ``[b, T]`` log π_θ of the response tokens (with grad in training).
        entropy: float32 ``[b, T]`` token entropy (when asked).
        top_k_log_probs: ``[b, T, k]`` log π_θ at the batch's ``top_k_ids`` (when asked).
        values: ``[b, T]`` critic values (critic forward).
    """

    log_probs: Tensor
    entropy: Tensor | None = None
    top_k_log_probs: Tensor | None = None
    values: Tensor | None = None


@dataclass(frozen=True, kw_only=True)
class Gradients:
    """What ``TrainBackend.accumulate_gradients`` returns (the gradients stay in the backend).

    Attributes:
        sums: ``loss`` and each metric of ``loss_fn`` summed over the micro-batches (python
            floats; over the whole batch the call was given).
        nonfinite: names of the losses and metrics that were not finite on this rank, and
            ``other_rank`` when only another rank's were (the step is skipped on every rank).
        micro_batches: micro-batches run.
    """

    sums: dict[str, float]
    nonfinite: frozenset[str] = frozenset()
    micro_batches: int = 0


@dataclass(frozen=True, kw_only=True)
class StepResult:
    """One optimizer step of one role (:func:`relax_core.stages.optimizer.optimizer_step`).

    Attributes:
        sums: as :attr:`Gradients.sums` (``loss``, then the loss function's own metrics,
            e.g. ``value_loss``).
        grad_norm: global L2 norm of the gradient over all ranks, before clipping.
        lr: the learning rate of this step (after warm-up).
        skipped: the step was not taken (a non-finite loss, metric or gradient norm).
        micro_batches: micro-batches run.
        nonfinite: the offenders' names, sorted (``grad_norm`` among them when the norm is).
    """

    sums: dict[str, float]
    grad_norm: float
    lr: float
    skipped: bool
    micro_batches: int
    nonfinite: tuple[str, ...] = ()


class TrainBackend(Protocol):
    """What a backend factory returns (``factory(params, config)``).

    The backend supplies the model's forwards, backward over micro-batches and its
    collectives; the core owns the optimizer step itself (non-finite skipping, gradient
    clipping, learning-rate warm-up: :func:`relax_core.stages.optimizer.optimizer_step`).  Per step
    the loop calls ``forward(batch, role="actor"|"ref"|"critic")`` without grad to get
    old/ref log-probs or values, then per optimizer step of a trained role (``actor``, or
    ``critic`` for estimators with a critic), on every rank:

    1. ``accumulate_gradients(batch, loss_fn, role=...)``: clears the role's gradients,
       splits the batch into micro-batches, calls ``loss_fn(micro_batch, forward_output)`` →
       (scalar loss already scaled by the *global* denominators, metrics) and backpropagates
       each finite loss, then reduces the gradients across ranks (data-parallel sum, and
       whatever its model parallelism needs) → :class:`Gradients`.
    2. ``grad_norm(role)``: the global L2 norm of those gradients over all ranks (the same
       float on every rank).
    3. unless something was not finite, ``apply_gradients(role, lr=..., grad_scale=...)``:
       multiply the gradients by ``grad_scale`` (≤ 1, the clip; 1 = leave them), set the
       learning rate, step the optimizer and count the step;
    4. ``zero_grad(role)``: release the gradients.

    ``optimizer_steps(role)`` is the number of steps applied so far (restored by
    :meth:`load_checkpoint`; it drives the warm-up).

    Optional: ``packed_positions(batch) -> (positions computed, positions holding a token)``
    of the training forward's layout; the trainer then logs ``perf/padding_fraction``.

    Optional, for backends whose ranks split one model (tensor/context/pipeline parallel):
    ``data_parallel() -> (dp_rank, dp_size, dp_group)``, this rank's model replica, the
    number of replicas and the torch.distributed group over the replicas (``None`` for one).
    The Ray launcher gives every rank of a replica the same batch shard, reads one of them,
    and reduces batch-wide estimator statistics over ``dp_group``; without the method every
    rank is its own replica (``rank``, ``world size``, the whole group).
    """

    def forward(self, batch: Batch, *, role: str = "actor", entropy: bool = False,
                top_k: bool = False) -> ForwardOutput: ...

    def accumulate_gradients(self, batch: Batch, loss_fn: Any, *, role: str = "actor") -> Gradients: ...

    def grad_norm(self, role: str = "actor") -> float: ...

    def apply_gradients(self, role: str = "actor", *, lr: float, grad_scale: float = 1.0) -> None: ...

    def zero_grad(self, role: str = "actor") -> None: ...

    def optimizer_steps(self, role: str = "actor") -> int: ...

    def engine_state_dict(self) -> Any: ...

    def engine_adapter(self) -> AdapterWeights:
        """LoRA runs of backends declaring ``supports_lora``: the actor's adapter alone, for
        engines that take adapters (:class:`AdapterWeights`)."""

    def save_checkpoint(self, path: str, include_optimizer: bool = True) -> None:
        """Write the trained roles' weights (and, unless ``include_optimizer`` is False,
        their optimizer states) under ``path``."""

    def load_checkpoint(self, path: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote; a checkpoint without optimizer state
        leaves the optimizer freshly initialised (the step counts are restored)."""

    def save_hf(self, path: str) -> None: ...
