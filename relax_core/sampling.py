"""The prompt sampler contract (``--sampler``, the ``sampler`` plugin kind).

A sampler decides which training rows each step's prompts are.  The loop
(:class:`relax_core.stages.rollout.Rollout`) calls, in every sampling round of a step::

    indices = sampler.take(k)        # k = --rollout-batch-size dataset indices
    ... generate n samples of each prompt, score them ...
    sampler.observe(PromptResults)   # every generated sample's raw reward
    metrics |= sampler.metrics()     # once per step, after the last round

and a checkpoint saves ``sampler.state()`` (JSON), which ``sampler.load(state)`` restores
on ``--resume``, so a resumed run draws the prompts the uninterrupted one would.  The
rewards a sampler observes are the scorer's (before any ``--reward-processor``), so a
shaping penalty never changes what counts as solved; a step replayed from
``--load-debug-rollout-data`` draws nothing and observes nothing.

A sampler is built by its spec's factory, ``factory(params, config)``, which returns
``fn(num_rows, seed) -> Sampler``; the default, ``uniform`` (relax-uniform), is
:class:`relax_core.data.DataCursor`: a seeded shuffle per epoch.

This module imports nothing heavy (torch only for type hints).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class PromptResults:
    """The scored samples of one sampling round, as a sampler observes them.

    Attributes:
        prompt_index: long ``[B]``, the dataset index of each sample's prompt (the indices
            :meth:`Sampler.take` returned, each repeated ``--n-samples-per-prompt`` times).
        rewards: float32 ``[B]``, the scorer's raw reward (NaN: unscored; no
            post-processor has run).
        group_index: long ``[B]``, the sample's group (one per prompt and round).
    """

    prompt_index: "torch.Tensor"
    rewards: "torch.Tensor"
    group_index: "torch.Tensor"


class Sampler:
    """Base of the samplers: a sampler overrides :meth:`take`, :meth:`state` and
    :meth:`load`, and :meth:`observe` / :meth:`metrics` when it learns from the rewards."""

    def take(self, k: int) -> list[int]:
        """The next ``k`` dataset indices (each in ``[0, num_rows)``); the loop asks once
        per sampling round.  Must be a pure function of the sampler's state (resume
        exactness)."""
        raise NotImplementedError

    def observe(self, results: PromptResults) -> None:
        """The raw rewards of the samples just generated from the last :meth:`take`
        (called after scoring, before post-processing).  Default: ignored."""

    def metrics(self) -> dict[str, float]:
        """Scalars logged with the step (full names, ``sampler/...``).  Default: none."""
        return {}

    def state(self) -> dict:
        """Everything :meth:`take` depends on, as JSON-able values (a copy: the caller may
        keep it while the sampler moves on)."""
        raise NotImplementedError

    def load(self, state: dict, allow_other_data: bool = False) -> None:
        """Restore :meth:`state`.

        Args:
            allow_other_data: ``--resume-allow-data-change``: the checkpoint may be for
                other rows; restore what still applies instead of raising.

        Raises:
            relax_core.data.DataError: the state does not fit these data (unless allowed).
        """
        raise NotImplementedError
