"""Gymnasium environments as Relax episodes: ``reset`` / ``step`` mapped onto ``start`` / ``step``.

Gymnasium's episode API (https://gymnasium.farama.org/api/env/)::

    obs, info = env.reset(seed=s)
    obs, reward, terminated, truncated, info = env.step(action)
    env.render()                        # with render_mode="ansi": the state as text

Relax's (:mod:`relax_core.environments`) and the mapping:

- **seed**: ``s`` = the first 4 bytes of SHA-256 of the row's prompt text, so a group's
  episodes (the same prompt, ``--n-samples-per-prompt``) play the same instance (the same
  map, the same start, and the same random draws: ``reset(seed=s)`` also seeds the
  environment's generator, so episodes that take the same actions follow the same
  trajectory, slippery transitions included) and a run is reproducible.  The prompt text says which task to play; any data set works (its labels
  are unused).
- **prompt** (:meth:`Gymnasium.prompt`): the row's prompt, then how to answer (the action
  names) and the initial observation of ``reset(seed=s)``.
- **model turn → action**: the *last* action name (a whole word, any case) or number in the
  turn's text; ``Discrete(n, start)`` numbers count from ``start``.  A turn without one gets
  a user message listing the actions and reward 0; the environment does not step.
- **reply**: after ``step(action)``, the observation as a user message; the turn's reward
  is the step's reward (per-turn rewards, placed on the turn's last token; the episode's
  reward is their sum).  ``terminated`` or ``truncated`` (the environment's own time limit)
  ends the episode; ``--max-turns`` and ``--max-episode-tokens`` still bound it.
- **observation text**: ``render()`` with ``render_mode="ansi"`` where the environment has
  it, with ANSI highlights (FrozenLake's and CliffWalking's current cell) shown as ``[X]``
  and other escape codes dropped; else ``str(obs)``.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from relax_core.environments import Reply, Turn

_HIGHLIGHT = re.compile(r"\x1b\[(?:4[0-7]|10[0-7])m(.*?)\x1b\[0m")
_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


def seed_of(prompt: str) -> int:
    """The episode seed of a prompt text: its SHA-256's first 4 bytes, little-endian."""
    return int.from_bytes(hashlib.sha256(prompt.encode("utf-8")).digest()[:4], "little")


def text_of(env: Any, obs: Any) -> str:
    """The observation as text (see the module docstring)."""
    if env.render_mode == "ansi":
        frame = env.render()
        return _ESCAPE.sub("", _HIGHLIGHT.sub(r"[\1]", frame)).strip("\n")
    return str(obs)


def _make(params: Any) -> Any:
    import gymnasium

    kwargs = json.loads(params.kwargs)
    env = gymnasium.make(params.env_id, **kwargs)
    if "ansi" in env.metadata.get("render_modes", ()):
        env.close()
        env = gymnasium.make(params.env_id, render_mode="ansi", **kwargs)
    return env


def check(params: Any) -> list[tuple[str, str]]:
    """``GymnasiumParams.problems``: ``[(message, fix)]``."""
    try:
        kwargs = json.loads(params.kwargs)
    except json.JSONDecodeError as e:
        return [(f"--gymnasium-kwargs is not JSON ({e.msg})", 'write a JSON object, e.g. {"is_slippery": false}')]
    if not isinstance(kwargs, dict):
        return [("--gymnasium-kwargs must be a JSON object", 'e.g. {"is_slippery": false}')]
    try:
        import gymnasium
    except ImportError:
        return [("the gymnasium environment needs the gymnasium package", "pip install gymnasium")]
    try:
        env = _make(params)
    except gymnasium.error.Error as e:
        return [(f"--gymnasium-env-id {params.env_id}: {type(e).__name__}: {e}",
                 "choose a registered id (python -c 'import gymnasium; gymnasium.pprint_registry()')")]
    except TypeError as e:
        return [(f"--gymnasium-kwargs for {params.env_id}: {e}", "pass only the arguments its constructor takes")]
    space = env.action_space
    env.close()
    if not isinstance(space, gymnasium.spaces.Discrete):
        return [(f"--gymnasium-env-id {params.env_id} has a {type(space).__name__} action space, not Discrete",
                 "choose an environment with discrete actions (FrozenLake-v1, Taxi-v4, CliffWalking-v1, Blackjack-v1)")]
    names = _names(params)
    if len(names) != int(space.n):
        return [(f"--gymnasium-actions names {len(names)} actions but {params.env_id} has {int(space.n)}",
                 f"give {int(space.n)} comma-separated names, in the order of the actions {int(space.start)}, ...")]
    return []


def _names(params: Any) -> tuple[str, ...]:
    return tuple(n.strip() for n in params.actions.split(",") if n.strip())


class Gymnasium:
    """The environment (``factory(params, config)``): one Gymnasium instance per episode."""

    def __init__(self, params: Any):
        self.params = params
        self.names = _names(params)
        probe = _make(params)
        self.start_action = int(probe.action_space.start)
        probe.close()
        words = "|".join(re.escape(n) for n in sorted(self.names, key=len, reverse=True))
        self.pattern = re.compile(rf"\b({words}|-?\d+)\b", re.IGNORECASE)
        self.lowered = [n.lower() for n in self.names]
        self.listing = ", ".join(f"{n} ({self.start_action + i})" for i, n in enumerate(self.names))

    def instructions(self) -> str:
        return f"Answer each turn with one action: {self.listing}."

    def prompt(self, text: str) -> str:
        env = _make(self.params)
        obs, _ = env.reset(seed=seed_of(text))
        first = text_of(env, obs)
        env.close()
        return f"{text}\n\n{self.instructions()}\n\n{first}"

    def action(self, text: str) -> int | None:
        """The action of a model turn: its last action name or number; ``None`` when none."""
        for m in reversed(list(self.pattern.finditer(text))):
            word = m.group(1).lower()
            if word in self.lowered:
                return self.start_action + self.lowered.index(word)
            if word.lstrip("-").isdigit() and 0 <= int(word) - self.start_action < len(self.names):
                return int(word)
        return None

    def start(self, row: dict) -> "GymnasiumEpisode":
        env = _make(self.params)
        env.reset(seed=seed_of(row["prompt"]))
        return GymnasiumEpisode(self, env)


class GymnasiumEpisode:
    def __init__(self, owner: Gymnasium, env: Any):
        self.owner, self.env = owner, env

    def step(self, turn: Turn) -> Reply:
        action = self.owner.action(turn.text)
        if action is None:
            return Reply(messages=({"role": "user", "content": f"No action found. {self.owner.instructions()}"},),
                         reward=0.0)
        obs, reward, terminated, truncated, _ = self.env.step(action)
        if terminated or truncated:
            self.env.close()
            return Reply(done=True, reward=float(reward))
        return Reply(messages=({"role": "user", "content": text_of(self.env, obs)},), reward=float(reward))


def build(params: Any, config: Any) -> Gymnasium:
    """``(GymnasiumParams, RunConfig) -> Gymnasium`` (bad parameters are refused at startup:
    ``GymnasiumParams.problems``)."""
    return Gymnasium(params)
