"""The objects of one run, built by :func:`relax_core.run.launch.launch` (or ``relax eval``)
from the selected specs and handed to the :class:`~relax_core.trainer.Trainer` and the
rollout side (:class:`~relax_core.stages.rollout.Rollout`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from relax_core.batch import Batch


@dataclass
class Components:
    """The objects of one run, built from the selected specs."""

    engine: Any
    backend: Any
    estimator: Any
    corrections: list[Any]
    """The loss corrections (``apply``), in application order."""
    processors: list[Any]
    score: Callable[[list[str], list[Any], list[dict], list[str]], tuple[list[float | None], dict[str, float]]]
    """``score(responses, labels, metadata, prompts) -> (one reward or None per sample, metrics)``;
    the four lists have one entry per sample (``prompts``: the prompt texts as the engine saw them)."""
    sampler: Any
    """The training data's :class:`~relax_core.sampling.Sampler` (``--sampler``)."""
    advantage_terms: list[Any] = dataclasses.field(default_factory=list)
    """The corrections that declare ``advantage_term`` (e.g. ``opd``): each one's
    ``advantage_term(AdvantageInput)`` is added to the estimator's advantages."""
    needs_critic: bool = False
    processor_resamples: bool = False
    rollout_fields: frozenset[str] = frozenset()
    """The rollout-stage fields the selected components require (asked of the engine)."""
    top_k: int = 0
    """Width of the top-k head, when ``rollout_fields`` asks for it."""
    num_critic_only_steps: int = 0
    adapter_check: Callable[[Batch, int], None] | None = None
    """With LoRA: called after each push (:class:`relax_core.run.lora.AdapterCheck`)."""
    share_weights: bool = False
    """The publisher pushes with ``share=True``: a synchronous local run pushing every step
    to an engine that declares ``supports_shared_weights``."""
    push_adapter: bool = False
    """A LoRA run pushes the adapter alone (``backend.engine_adapter``) rather than the merged
    weights: the engine declares ``supports_lora_adapters`` and ``--lora-engine-adapter`` is on."""
    episodes: Any = None
    """The :class:`~relax_core.stages.episodes.EpisodeRunner` of ``--environment`` (``None``: single turn)."""
