"""The episode contract of environments (``--environment``; :class:`~relax_core.specs.EnvironmentSpec`).

An environment runs one *episode* per sample: the model's turn, the environment's reply
(an observation, a tool result, feedback), the model's next turn, ... until the environment
says it is done or a limit is hit (``--max-turns``, ``--max-episode-tokens``, a turn that
reaches ``--rollout-max-response-len``).  It sees and returns **text**; the host (the core's
episode runner, :mod:`relax_core.stages.episodes`) owns the **tokens**:

- each model turn's sampled ids and rollout log-probs are appended exactly as the engine
  produced them (``loss_mask`` 1);
- each reply is rendered through the chat template on its own and appended as tokens
  (``loss_mask`` 0, ``env_mask`` 1); earlier turns are never re-tokenised, so the trained ids
  are the sampled ids by construction (the re-tokenisation bugs of slime #2389 and #117).

The factory of an environment spec returns an :class:`Environment`::

    class Environment:
        def prompt(self, text: str) -> str: ...     # optional: the prompt text it wants (tools)
        def start(self, row: dict) -> Episode: ...  # row: {"prompt", "label", "metadata"}

    class Episode:
        def step(self, turn: Turn) -> Reply: ...

This module imports nothing heavy; it is part of the public plugin API.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

#: ``episode_end`` codes (:data:`relax_core.batch.CORE_FIELDS`): why each episode ended.
#: ``env_done``: the environment said so after a complete model turn (single_turn: the model's
#: EOS); ``max_turns``: ``--max-turns`` model turns were taken; ``max_episode_tokens``: the
#: next turn or reply did not fit in ``--max-episode-tokens``; ``turn_length``: a model turn
#: reached ``--rollout-max-response-len`` without EOS or a stop string (``truncated``);
#: ``env_error`` / ``env_timeout``: the environment's ``start`` or ``step`` raised, or ran past
#: ``--env-timeout`` (the episode is not scored nor trained on, like an unscored sample).
EPISODE_ENDS = ("env_done", "max_turns", "max_episode_tokens", "turn_length", "env_error", "env_timeout")
#: the ends by a failed environment call: such an episode is not scored (an unscored sample)
FAULT_ENDS = ("env_error", "env_timeout")


@dataclass(frozen=True, kw_only=True)
class Turn:
    """One model turn, as the environment sees it.

    Attributes:
        text: the turn's decoded text (special tokens skipped), as the engine returned it.
        index: the turn's number in the episode, from 0.
        score: the run's scorer's score of ``text`` against the row's label (``None``:
            unscored); given only to environments declaring ``scores_turns``.
    """

    text: str
    index: int
    score: float | None = None


@dataclass(frozen=True, kw_only=True)
class Reply:
    """The environment's answer to one model turn.

    Attributes:
        done: the episode ends here (no further model turn).
        messages: chat messages to append before the next model turn, each
            ``{"role": "user" | "tool", "content": str}``; the host renders them through the
            chat template with the next turn's generation prompt (``loss_mask`` 0).
            Ignored when ``done``.
        reward: the reward of the model turn just taken, placed on its last token in
            ``turn_rewards``.  The episode's reward is the sum of the rewards given; when
            none is given in the whole episode, the run's scorer scores the last model
            turn's text (``responses``) as in a single-turn run.
    """

    done: bool = False
    messages: tuple[dict, ...] = ()
    reward: float | None = None


class Episode(Protocol):
    def step(self, turn: Turn) -> Reply: ...


class Environment(Protocol):
    """What an environment factory returns (``factory(params, config)``)."""

    def start(self, row: dict) -> Episode: ...


class SingleTurn:
    """Today's behaviour: prompt → one completion, scored by the run's scorer.  The
    environment of the ``single_turn`` plugin (``relax-single-turn``) and of loops built
    without one (tests)."""

    def start(self, row: dict) -> "SingleTurn":
        return self

    def step(self, turn: Turn) -> Reply:
        return Reply(done=True)


def prompt_of(env: Any, text: str) -> str:
    """The prompt text ``env`` wants for ``text`` (its ``prompt`` method, else ``text``)."""
    fn = getattr(env, "prompt", None)
    return text if fn is None else fn(text)
