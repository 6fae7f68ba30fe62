"""The episode runner: the host side of every rollout, token in, token out.

Every sample of every run is an episode of the run's environment (``--environment``,
:mod:`relax_core.environments`); ``single_turn`` is the one-turn episode of a plain run.  Per
turn, the runner asks the engine to continue each running episode from its token ids
(prompt, then every earlier turn's tokens, exactly as held), then hands the turn's text to
the environment and appends what it replies:

    context_i  = prompt_ids_i                                    (list of ids, the host's)
    turn k:      y = engine.generate(context_i)                  sampled ids, log q, mask 1
                 reply = episode_i.step(Turn(text(y), k))
                 r = render(reply.messages)                      ids of the rendered reply, mask 0
                 context_i += y + r                              never re-tokenised

The response of an episode is everything after the prompt: ``response_ids = y_0 r_0 y_1 r_1
… y_K`` with ``loss_mask`` 1 exactly on the ``y`` (the engine's own mask there) and the
engine's per-token fields (``rollout_log_probs``, top-k heads, routed experts) at the ``y``
positions, their declared pad at the ``r`` positions.  The trained ids are the sampled ids by
construction: nothing is decoded and encoded again (re-encoding changes tokens: slime #2389, #117;
re-rendering whole conversations shifts template boundaries: verl #6719).

Rendering a reply.  Chat templates render whole conversations; the runner renders a reply
on its own as the difference of two renders of a fixed conversation (:class:`ReplyRenderer`):
the text that closes a model turn (``<|im_end|>\\n`` in ChatML), minus the part of it the
model sampled itself (its EOS), then the reply messages and the next generation prompt.
Tokenisers without a template use the fallback ``"\\n<role>: <content>" … "\\nassistant: "``.

Faults.  Every call into the environment (``prompt(text)``, ``start(row)``, ``step(turn)``)
runs through a host (:mod:`relax_core.stages.env_host`, ``--env-isolation``: threads, or worker processes
that can be killed), ``--env-num-workers`` at a time, each under ``--env-timeout`` seconds.
A call that raises ends its episode as ``env_error``, one past its timeout as
``env_timeout`` (counted in ``rollout/env_errors`` / ``rollout/env_timeouts``; replaced
worker processes in ``rollout/env_restarts``); the episode keeps the tokens it has, gets no
reward (NaN, not scored: an unscored sample, advantage 0) and the other episodes go on.  An
episode whose ``start`` failed still takes its first model turn (the prompt is already
batched) and then ends.  A failed ``prompt`` stops the run (:class:`EnvironmentPromptError`).  Tools that run untrusted code isolate it themselves (the
``python`` tool's sandbox).

The loop over episodes is Python (one ``step`` per episode and turn); tokens move as
tensors and lists, never one by one.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Callable

import torch
from torch.nn.utils.rnn import pad_sequence

from relax_core.batch import FIELDS, PAD_TOKEN
from relax_core.contracts import GenerationOutput, SamplingParams
from relax_core.environments import EPISODE_ENDS, SingleTurn, Turn
from relax_core.stages.env_host import ENV_ERROR, ENV_TIMEOUT, ProcessHost, ThreadHost
from relax_core.stages.reward_mix import is_count

log = logging.getLogger("relax.episodes")


class EnvironmentPromptError(RuntimeError):
    """The environment's ``prompt(text)`` raised or ran past ``--env-timeout``: the sample has
    no prompt, so the run stops (exit 7, :data:`~relax_core.run.exits.EXIT_ENVIRONMENT_FAILED`)."""

_MARK = "\x00relax-turn\x00"
ENV_DONE, MAX_TURNS, MAX_EPISODE_TOKENS, TURN_LENGTH = (EPISODE_ENDS.index(e) for e in
                                                        ("env_done", "max_turns", "max_episode_tokens", "turn_length"))
#: the per-token fields the runner builds itself (the engine's own per-token fields are carried)
_OWN = frozenset({"response_ids", "loss_mask", "env_mask", "turn_index", "turn_rewards", "response_lengths",
                  "truncated", "responses", "num_turns", "episode_end", "env_rewards", "transcripts"})


class ReplyRenderer:
    """Environment messages → token ids, through the tokenizer's chat template, without
    touching the tokens before them (see the module docstring).

    Args:
        tokenizer: a Hugging Face tokenizer.
        chat_template: render with the chat template (``--apply-chat-template`` and the
            tokenizer has one); else the plain-text fallback.
    """

    def __init__(self, tokenizer: Any, chat_template: bool):
        self.tokenizer = tokenizer
        self.templated = bool(chat_template and getattr(tokenizer, "chat_template", None))
        if self.templated:
            self._base = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _MARK}]
            closed = tokenizer.apply_chat_template(self._base, tokenize=False)
            self._closed = closed
            self.close_turn = closed[closed.rindex(_MARK) + len(_MARK):]
        else:
            self.close_turn = ""

    def text(self, messages: tuple[dict, ...] | list[dict], last_token: str) -> str:
        """The text appended after a model turn whose last sampled token decodes to
        ``last_token``: the rest of the turn's closing text, the messages, the next
        generation prompt."""
        close = self.close_turn
        close = close[len(last_token):] if last_token and close.startswith(last_token) else close
        if not self.templated:
            return close + "".join(f"\n{m['role']}: {m['content']}" for m in messages) + "\nassistant: "
        full = self.tokenizer.apply_chat_template([*self._base, *messages], tokenize=False, add_generation_prompt=True)
        if not full.startswith(self._closed):
            raise ValueError("the chat template renders a conversation differently when a message is added, so a "
                             "reply cannot be rendered on its own (use --no-apply-chat-template)")
        return close + full[len(self._closed):]

    def render(self, messages: tuple[dict, ...] | list[dict], last_token: str) -> tuple[str, list[int]]:
        """:meth:`text` and its token ids (special tokens in it are parsed, none added)."""
        text = self.text(messages, last_token)
        return text, self.tokenizer(text, add_special_tokens=False)["input_ids"]


@dataclasses.dataclass
class _Part:
    """A piece of an episode's response: a model turn (row ``row`` of the engine output ``out``,
    its first ``n`` tokens) or a rendered reply (``ids``); ``text`` is its text."""

    turn: int
    text: str = ""
    out: Any = None
    row: int = 0
    n: int = 0
    reward: float | None = None
    ids: torch.Tensor | None = None

    @property
    def model(self) -> bool:
        return self.out is not None

    def __len__(self) -> int:
        return self.n if self.model else len(self.ids)


@dataclasses.dataclass
class _Episode:
    """One running episode: its context and the parts of its response."""

    episode: Any
    context: list[int]
    fault: int | None = None
    parts: list[_Part] = dataclasses.field(default_factory=list)
    used: int = 0
    turns: int = 0
    end: int = -1
    rewards: list[float] = dataclasses.field(default_factory=list)

    @property
    def last_text(self) -> str:
        """The text of its last model turn."""
        return next(p.text for p in reversed(self.parts) if p.model)


def turn_seed(seed: int | None, turn: int) -> int | None:
    """The sampling seed of turn ``turn`` (turn 0: the step's own seed)."""
    return seed if seed is None or turn == 0 else (seed + 1_000_003 * turn) % (2**31 - 1)


class EpisodeRunner:
    """Runs the episodes of one generation call (see the module docstring).

    Args:
        engine: the rollout engine (``generate(prompt_ids, sampling)``).
        renderer: the :class:`ReplyRenderer` of the engine's tokenizer.
        max_turns: ``--max-turns``.
        max_episode_tokens: ``--max-episode-tokens`` (``None`` = no limit).
        score: for environments declaring ``scores_turns``, the run's
            ``score(responses, labels, metadata, prompts) -> (rewards, metrics)``; else ``None``.
        pad_token_id: pads ``response_ids``.
        host: where the environment's calls run, under ``--env-timeout``, ``--env-num-workers``
            at once (:mod:`relax_core.stages.env_host`: a ``ThreadHost`` of ``environment`` or
            a ``ProcessHost`` of its spec); :meth:`close` closes it.
        name: the environment's name, in the log line of a failed call.
    """

    def __init__(self, engine: Any, renderer: ReplyRenderer, *, max_turns: int,
                 max_episode_tokens: int | None, score: Callable | None, pad_token_id: int, host: Any,
                 name: str = "environment"):
        self.engine = engine
        self.name = name
        self.renderer = renderer
        self.max_turns = max_turns
        self.max_episode_tokens = max_episode_tokens
        self.score = score
        self.pad_token_id = pad_token_id
        self.host = host
        self._warned = False  # the first failed environment call of a generate() call is logged
        self.metrics: dict[str, float] = {}
        """Counts of the last :meth:`generate` call: the scorer's (``rollout/reward_errors``, …)
        summed over the turns it scored, and ``rollout/env_errors`` / ``rollout/env_timeouts``
        (episodes ended by a failed environment call)."""

    def prompts(self, texts: list[str]) -> list[str]:
        """The prompt text the environment wants for each data prompt (its optional
        ``prompt(text)``, else the text), computed where its calls run (the host: in a worker
        with ``--env-isolation process``), each under ``--env-timeout``.

        Raises:
            EnvironmentPromptError: a ``prompt`` call raised or ran past ``--env-timeout``
                (the first such text is named); a run stops on it, since the sample has no
                prompt to generate from.
        """
        results = self.host.prompts(texts)
        for i, (fault, value) in enumerate(results):
            if fault is not None:
                what = "ran past --env-timeout" if fault == ENV_TIMEOUT else "failed"
                raise EnvironmentPromptError(f"environment '{self.name}': prompt() {what} on the prompt "
                                             f"{texts[i][:60]!r}: {value}")
        return [v for _, v in results]

    def _faults(self, eps: list[_Episode], results: list[tuple[int | None, Any]]) -> list[Any]:
        """The host's results of one call per episode of ``eps``: a failed call ends its
        episode (``fault``, counted) and gives ``None``."""
        for e, (fault, value) in zip(eps, results):
            if fault is not None:
                e.fault = fault
                name = "rollout/env_errors" if fault == ENV_ERROR else "rollout/env_timeouts"
                self.metrics[name] = self.metrics.get(name, 0.0) + 1.0
                if not self._warned:
                    self._warned = True
                    log.warning("environment %s: %s", self.name, value)
        return [v if f is None else None for f, v in results]

    def close(self) -> None:
        """Close the host (stops a ``ProcessHost``'s workers); idempotent."""
        self.host.close()

    def generate(self, rows: list[dict], prompts: list[str], prompt_ids: list[list[int]],
                 sampling: SamplingParams) -> GenerationOutput:
        """One episode per ``(rows[i], prompt_ids[i])`` (repeat a row for a group).

        Returns:
            :class:`~relax_core.contracts.GenerationOutput` with ``T`` = the longest episode
            response: the engine's fields at the model tokens, and ``env_mask``,
            ``turn_index``, ``turn_rewards`` ``[B, T]``, ``num_turns``, ``episode_end``,
            ``env_rewards`` ``[B]``, ``transcripts``.

        Raises:
            ValueError: the engine returned no ``loss_mask``, or a reply cannot be rendered.
        """
        self.metrics = {}
        self._warned = False
        restarts = self.host.restarts
        eps = [_Episode(None, list(p)) for p in prompt_ids]
        for e, episode in zip(eps, self._faults(eps, self.host.start(rows))):
            e.episode = episode
        limit = self.max_episode_tokens
        tok = self.renderer.tokenizer
        for k in range(self.max_turns):
            active = [i for i, e in enumerate(eps) if e.end < 0]
            if not active:
                break
            room = [sampling.max_new_tokens if limit is None else min(sampling.max_new_tokens, limit - eps[i].used)
                    for i in active]
            out = self.engine.generate([eps[i].context for i in active], dataclasses.replace(
                sampling, max_new_tokens=max(room), seed=turn_seed(sampling.seed, k)))
            if out.loss_mask is None:
                raise ValueError(f"the rollout engine {type(self.engine).__name__} returned no loss_mask")
            lengths = out.response_lengths.tolist()
            stepping = []
            for j, (i, n_room) in enumerate(zip(active, room)):
                e, n = eps[i], min(lengths[j], n_room)
                ids = out.response_ids[j, :n]
                text = out.responses[j] if n == lengths[j] else tok.decode(ids.tolist(), skip_special_tokens=True)
                e.parts.append(_Part(turn=k, text=text, out=out, row=j, n=n))
                e.context += ids.tolist()
                e.used += n
                e.turns += 1
                cut = bool(out.truncated[j]) or n < lengths[j]
                if e.fault is not None:  # its start failed: this turn was its only one
                    e.end = e.fault
                elif cut and n == n_room and n_room < sampling.max_new_tokens:
                    e.end = MAX_EPISODE_TOKENS  # cut by the episode's budget, not by the turn's limit
                elif cut:
                    e.end = TURN_LENGTH
                else:
                    stepping.append((i, j))
            scores = [None] * len(stepping)
            if self.score is not None and stepping:
                scores, counts = self.score([eps[i].last_text for i, _ in stepping],
                                            [rows[i]["label"] for i, _ in stepping],
                                            [rows[i]["metadata"] for i, _ in stepping], [prompts[i] for i, _ in stepping])
                for name, v in counts.items():  # counts add up over turns; per-scorer means of a turn are
                    if is_count(name):          # not the step's (its final scoring gives those)
                        self.metrics[name] = self.metrics.get(name, 0.0) + v
            stepped = [eps[i] for i, _ in stepping]
            replies = self._faults(stepped, self.host.step([e.episode for e in stepped],
                                                           [Turn(text=e.last_text, index=k, score=s)
                                                            for e, s in zip(stepped, scores)]))
            for e, reply in zip(stepped, replies):
                if e.fault is not None:  # raised or hung: no reward, not scored (task advantage 0)
                    e.end, e.rewards = e.fault, []
                    for p in e.parts:
                        p.reward = None
                    continue
                if reply.reward is not None:
                    e.parts[-1].reward = float(reply.reward)
                    e.rewards.append(float(reply.reward))
                if reply.done:
                    e.end = ENV_DONE
                    continue
                if k == self.max_turns - 1:
                    e.end = MAX_TURNS
                    continue
                last = tok.decode([e.context[-1]], skip_special_tokens=False)
                env_text, env_ids = self.renderer.render(reply.messages, last)
                if limit is not None and e.used + len(env_ids) >= limit:
                    e.end = MAX_EPISODE_TOKENS  # no room for the reply and a model token after it
                    continue
                e.parts.append(_Part(turn=k, text=env_text, ids=torch.tensor(env_ids, dtype=torch.long)))
                e.context += env_ids
                e.used += len(env_ids)
        if self.host.restarts > restarts:
            self.metrics["rollout/env_restarts"] = float(self.host.restarts - restarts)
        return self._assemble(eps)

    def _assemble(self, eps: list[_Episode]) -> GenerationOutput:
        """The episodes' parts as right-padded ``[B, T]`` fields (one ``cat`` per episode and field)."""
        first = next(p.out for e in eps for p in e.parts if p.model)
        carried = [n for n in first.names() if n not in _OWN]

        def token_field(name: str, model: Callable[[_Part], torch.Tensor],
                        env: Callable[[_Part], torch.Tensor]) -> torch.Tensor:
            f = FIELDS[name]
            pad = self.pad_token_id if f.pad == PAD_TOKEN else f.pad
            rows = [torch.cat([model(p) if p.model else env(p) for p in e.parts]) for e in eps]
            return pad_sequence(rows, batch_first=True, padding_value=pad)

        def carry(name: str) -> Any:
            """An engine field: per token, its values at model tokens and its pad at replies; per
            sample or object, its value at the episode's last model turn."""
            ref = getattr(first, name)
            if FIELDS[name].per != "token":
                last = [next(p for p in reversed(e.parts) if p.model) for e in eps]
                values = [getattr(p.out, name)[p.row] for p in last]
                return values if FIELDS[name].per == "object" else torch.stack(values)
            return token_field(name, lambda p: getattr(p.out, name)[p.row, :p.n],
                               lambda p: torch.full((len(p), *ref.shape[2:]), FIELDS[name].pad, dtype=ref.dtype))

        def turn_rewards(p: _Part) -> torch.Tensor:
            r = torch.zeros(p.n, dtype=torch.float32)
            if p.reward is not None:
                r[-1] = p.reward
            return r

        fields: dict[str, Any] = {
            "response_ids": token_field("response_ids", lambda p: p.out.response_ids[p.row, :p.n], lambda p: p.ids),
            "loss_mask": token_field("loss_mask", lambda p: p.out.loss_mask[p.row, :p.n].bool(),
                                     lambda p: torch.zeros(len(p), dtype=torch.bool)),
            "env_mask": token_field("env_mask", lambda p: torch.zeros(p.n, dtype=torch.bool),
                                    lambda p: torch.ones(len(p), dtype=torch.bool)),
            "turn_index": token_field("turn_index", lambda p: torch.full((p.n,), p.turn),
                                      lambda p: torch.full((len(p),), p.turn)),
            "turn_rewards": token_field("turn_rewards", turn_rewards, lambda p: torch.zeros(len(p))),
            **{name: carry(name) for name in carried},
        }
        lengths = torch.tensor([e.used for e in eps], dtype=torch.long)
        end = torch.tensor([e.end for e in eps], dtype=torch.long)
        return GenerationOutput(
            **fields, response_lengths=lengths, num_turns=torch.tensor([e.turns for e in eps], dtype=torch.long),
            truncated=(end == TURN_LENGTH) | (end == MAX_EPISODE_TOKENS), episode_end=end,
            env_rewards=torch.tensor([sum(e.rewards) if e.rewards else math.nan for e in eps], dtype=torch.float32),
            responses=[e.last_text for e in eps],
            transcripts=["".join(p.text for p in e.parts) for e in eps])


def episode_metrics(batch: Any) -> dict[str, float]:
    """``rollout/*`` metrics of multi-turn episodes: ``num_turns/mean``, ``num_turns/max``,
    ``env_token_frac`` (environment tokens over all response tokens) and ``episode_end/<why>``
    (the fraction of episodes that ended so, :data:`~relax_core.environments.EPISODE_ENDS`)."""
    if not batch.size:
        return {}
    turns = batch.num_turns.float()
    env = float(batch.env_mask.sum()) / max(float(batch.response_lengths.sum()), 1.0)
    ends = torch.bincount(batch.episode_end, minlength=len(EPISODE_ENDS)).float() / batch.size
    return {"rollout/num_turns/mean": float(turns.mean()), "rollout/num_turns/max": float(turns.max()),
            "rollout/env_token_frac": env,
            **{f"rollout/episode_end/{name}": float(ends[k]) for k, name in enumerate(EPISODE_ENDS)}}


def build_runner(cfg: Any, reg: Any, engine: Any, score: Callable | None) -> EpisodeRunner:
    """The run's :class:`EpisodeRunner`: ``--environment`` built from the registry, its limits
    from the config, its calls hosted as ``--env-isolation`` says, the run's scorer for
    environments that declare ``scores_turns``."""
    r = reg.get("environment", cfg.environment)
    params = cfg.params_for(cfg.environment)
    caps = r.spec.capabilities_for(params)
    # with --env-isolation process the environment is built in the workers only (never here)
    host = ProcessHost(r.spec.factory, params, cfg, cfg.env_timeout, cfg.env_num_workers) \
        if cfg.env_isolation == "process" else ThreadHost(r.spec.build(params, cfg), cfg.env_timeout,
                                                          cfg.env_num_workers)
    tokenizer = engine.tokenizer
    return EpisodeRunner(engine, ReplyRenderer(tokenizer, cfg.apply_chat_template),
                         max_turns=cfg.max_turns if caps.multi_turn else 1, max_episode_tokens=cfg.max_episode_tokens,
                         score=score if caps.scores_turns else None, pad_token_id=tokenizer.pad_token_id or 0,
                         host=host, name=cfg.environment)


def single_turn_runner(engine: Any, cfg: Any) -> EpisodeRunner:
    """The runner of a loop built without an environment (tests): :class:`SingleTurn`."""
    return EpisodeRunner(engine, ReplyRenderer(engine.tokenizer, False), max_turns=1,
                         max_episode_tokens=cfg.max_episode_tokens, score=None,
                         pad_token_id=engine.tokenizer.pad_token_id or 0,
                         host=ThreadHost(SingleTurn(), cfg.env_timeout, cfg.env_num_workers), name="single_turn")
