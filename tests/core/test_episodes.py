"""The episode runner (relax_core.stages.episodes): token bookkeeping by hand on a scripted engine,
the chat-template rendering of replies, the episode limits, and the core's per-token counts
with environment tokens."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from relax_core.batch import Batch, length_mask
from relax_core.config import RunConfig
from relax_core.contracts import GenerationOutput, SamplingParams
from relax_core.environments import EPISODE_ENDS, Reply
from relax_core.stages.env_host import ThreadHost
from relax_core.stages.episodes import EpisodeRunner, ReplyRenderer, episode_metrics, turn_seed

EOS = 2  # <|im_end|> of the SmolLM2 tokenizer (also its pad id)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from relax_core.models import load_tokenizer

    return load_tokenizer(str(tiny_model_dir))


class ScriptedEngine:
    """Answers the episode whose prompt starts with ``p`` with its next scripted turn (cut to
    ``max_new_tokens``; truncated when it does not end in EOS); log q of a token at absolute
    context position ``c`` is ``-c / 100``.  Records every context it is given."""

    def __init__(self, tokenizer, scripts: dict[int, list[list[int]]]):
        self.tokenizer, self.scripts = tokenizer, scripts
        self.calls: dict[int, int] = {p: 0 for p in scripts}
        self.contexts: list[list[int]] = []
        self.seeds: list[int | None] = []

    def generate(self, prompt_ids, sampling: SamplingParams) -> GenerationOutput:
        self.seeds.append(sampling.seed)
        outs = []
        for ctx in prompt_ids:
            self.contexts.append(list(ctx))
            turn = self.scripts[ctx[0]][self.calls[ctx[0]]][:sampling.max_new_tokens]
            self.calls[ctx[0]] += 1
            outs.append((turn, [-(len(ctx) + t) / 100 for t in range(len(turn))]))
        t = max(len(o[0]) for o in outs)
        ids = torch.tensor([o[0] + [EOS] * (t - len(o[0])) for o in outs])
        lp = torch.tensor([o[1] + [0.0] * (t - len(o[1])) for o in outs])
        lengths = torch.tensor([len(o[0]) for o in outs])
        return GenerationOutput(response_ids=ids, response_lengths=lengths, loss_mask=length_mask(lengths, t),
                                rollout_log_probs=lp, truncated=torch.tensor([o[0][-1] != EOS for o in outs]),
                                responses=[self.tokenizer.decode(o[0], skip_special_tokens=True) for o in outs])


class ScriptedEnv:
    """Episode of prompt ``p``: the replies ``replies[p][k]`` to turn k (``None`` = done), and
    the reward ``rewards[p][k]`` of turn k.  Records the turns it sees."""

    def __init__(self, replies, rewards):
        self.replies, self.rewards, self.seen = replies, rewards, []

    def start(self, row):
        env, p = self, row["prompt"]

        class Episode:
            def step(self, turn):
                env.seen.append((p, turn.index, turn.text))
                reply, reward = env.replies[p][turn.index], env.rewards[p][turn.index]
                if reply is None:
                    return Reply(done=True, reward=reward)
                return Reply(messages=({"role": "user", "content": reply},), reward=reward)

        return Episode()


def run(tokenizer, scripts, replies, rewards, *, max_turns=4, limit=None, max_new=4, seed=7):
    engine = ScriptedEngine(tokenizer, scripts)
    env = ScriptedEnv(replies, rewards)
    runner = EpisodeRunner(engine, ReplyRenderer(tokenizer, True), max_turns=max_turns,
                           max_episode_tokens=limit, score=None, pad_token_id=EOS, host=ThreadHost(env, 60.0, 4))
    rows = [{"prompt": p, "label": None, "metadata": {}} for p in scripts]
    out = runner.generate(rows, [""] * len(rows), [[p, 51] for p in scripts], SamplingParams(max_new_tokens=max_new,
                                                                                               seed=seed))
    return out, engine, env


def test_chatml_reply_rendering_by_hand(tokenizer):
    r = ReplyRenderer(tokenizer, True)
    msgs = ({"role": "user", "content": "no"},)
    # after the model's own <|im_end|>, only the newline of the turn's closing text is the host's
    assert r.text(msgs, "<|im_end|>") == "\n<|im_start|>user\nno<|im_end|>\n<|im_start|>assistant\n"
    # a turn that did not end at EOS (a stop string) is closed by the host
    assert r.text(msgs, "x") == "<|im_end|>\n<|im_start|>user\nno<|im_end|>\n<|im_start|>assistant\n"
    assert r.text(({"role": "tool", "content": "7"},), "<|im_end|>") == \
        "\n<|im_start|>tool\n7<|im_end|>\n<|im_start|>assistant\n"
    text, ids = r.render(msgs, "<|im_end|>")
    assert text == r.text(msgs, "<|im_end|>")
    assert ids[1] == tokenizer.convert_tokens_to_ids("<|im_start|>") and ids[-2:] == tokenizer(
        "assistant\n", add_special_tokens=False)["input_ids"][-2:]
    plain = ReplyRenderer(tokenizer, False)
    assert plain.text(msgs, "x") == "\nuser: no\nassistant: "


def test_two_turn_episode_bookkeeping_by_hand(tokenizer):
    out, engine, env = run(tokenizer, {100: [[1010, 1011, EOS], [1012, EOS]]}, {100: ["no", None]}, {100: [0.5, 1.0]})
    reply = ReplyRenderer(tokenizer, True).render(({"role": "user", "content": "no"},), "<|im_end|>")[1]
    r = len(reply)
    assert out.response_ids[0].tolist() == [1010, 1011, EOS, *reply, 1012, EOS]
    assert out.loss_mask[0].tolist() == [True] * 3 + [False] * r + [True] * 2
    assert out.env_mask[0].tolist() == [False] * 3 + [True] * r + [False] * 2
    assert out.turn_index[0].tolist() == [0] * (3 + r) + [1, 1]
    assert out.turn_rewards[0].tolist() == [0, 0, 0.5] + [0] * r + [0, 1.0]
    # log q at absolute context positions 2, 3, 4 (prompt of 2), then 5 + r + (0, 1)
    lp = out.rollout_log_probs[0]
    torch.testing.assert_close(lp[out.loss_mask[0]], torch.tensor([-0.02, -0.03, -0.04, -(5 + r) / 100,
                                                                   -(6 + r) / 100]))
    assert not lp[~out.loss_mask[0]].any()  # the engine's pad (0) at environment tokens
    # the engine continued from exactly the host's tokens: prompt, turn 0, the rendered reply
    assert engine.contexts == [[100, 51], [100, 51, 1010, 1011, EOS, *reply]]
    assert engine.seeds == [7, turn_seed(7, 1)] and engine.seeds[1] != 7
    assert out.response_lengths.tolist() == [5 + r] and out.num_turns.tolist() == [2]
    assert EPISODE_ENDS[int(out.episode_end[0])] == "env_done" and not out.truncated[0]
    assert out.env_rewards.tolist() == [1.5]
    assert out.responses == [tokenizer.decode([1012], skip_special_tokens=True)]  # the last turn: what is scored
    assert env.seen == [(100, 0, tokenizer.decode([1010, 1011])), (100, 1, tokenizer.decode([1012]))]
    reply_text = "\n<|im_start|>user\nno<|im_end|>\n<|im_start|>assistant\n"
    assert out.transcripts == [tokenizer.decode([1010, 1011]) + reply_text + tokenizer.decode([1012])]


def test_episode_ends_turn_length_max_turns_and_no_reward(tokenizer):
    out, engine, env = run(tokenizer, {100: [[1020, 1021, 1022, 1023, 1024]], 101: [[1030, EOS], [1031, EOS], [1032, EOS]]},
                           {101: ["a", "b", "c"]}, {101: [None, None, None]}, max_turns=3)
    ends = [EPISODE_ENDS[int(e)] for e in out.episode_end]
    assert ends == ["turn_length", "max_turns"]
    assert out.truncated.tolist() == [True, False] and out.num_turns.tolist() == [1, 3]
    assert [s[0] for s in env.seen] == [101, 101, 101]  # a truncated turn ends the episode unseen
    assert out.response_ids[0, :4].tolist() == [1020, 1021, 1022, 1023] and out.loss_mask[0].sum() == 4
    assert out.loss_mask[1].sum() == 6 and out.env_mask[1].sum() == out.response_lengths[1] - 6
    assert out.response_ids[1][out.loss_mask[1]].tolist() == [1030, EOS, 1031, EOS, 1032, EOS]
    assert out.loss_mask[1, out.response_lengths[1] - 1]  # no reply after the last turn
    assert all(math.isnan(x) for x in out.env_rewards.tolist())  # no reward: the scorer scores responses
    assert engine.calls == {100: 1, 101: 3}
    m = episode_metrics(Batch(**out.items()))
    assert m["rollout/num_turns/mean"] == 2.0 and m["rollout/episode_end/turn_length"] == 0.5
    assert m["rollout/env_token_frac"] == pytest.approx(float(out.env_mask.sum()) / float(out.response_lengths.sum()))


def test_max_episode_tokens_cuts_a_turn_and_refuses_a_reply(tokenizer):
    reply = len(ReplyRenderer(tokenizer, True).render(({"role": "user", "content": "no"},), "<|im_end|>")[1])
    # limit 6 < max_new 8: 100's first turn is cut to its first 6 tokens by the budget, not by the turn's limit
    out, engine, _ = run(tokenizer, {100: [[1010, 1011, 1012, 1013, 1014, 1015, 1016, EOS]], 101: [[1030, EOS], [1031, EOS]]},
                         {100: ["no"], 101: ["no", None]}, {100: [None], 101: [None, None]}, limit=6, max_new=8)
    ends = [EPISODE_ENDS[int(e)] for e in out.episode_end]
    assert ends == ["max_episode_tokens", "max_episode_tokens"] and out.truncated.tolist() == [True, True]
    assert out.response_ids[0, :6].tolist() == [1010, 1011, 1012, 1013, 1014, 1015] and out.response_lengths[0] == 6
    assert 2 + reply >= 6  # 101's reply does not fit: the episode ends after its first turn, reply not appended
    assert out.response_lengths[1] == 2 and out.num_turns.tolist() == [1, 1]
    # with room for the reply, the next turn gets only what is left of the budget
    limit = 2 + reply + 1
    out, engine, _ = run(tokenizer, {101: [[1030, EOS], [1031, 1032, EOS]]}, {101: ["no", None]}, {101: [None, None]},
                         limit=limit, max_new=8)
    assert out.response_lengths.tolist() == [limit] and out.response_ids[0, -1] == 1031
    assert EPISODE_ENDS[int(out.episode_end[0])] == "max_episode_tokens"


def test_per_token_counts_exclude_environment_tokens():
    """--calculate-per-token-loss divides by the model tokens: an episode with environment
    tokens reduces to the value of the same model tokens without them."""
    from relax_core.numerics import reduce_loss
    from relax_core.stages.loss import global_denominators

    loss = torch.tensor([[1.0, 2.0, 9e9, float("nan"), 3.0], [4.0, 5.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0, 0, 1], [1, 1, 0, 0, 0]], dtype=torch.bool)  # row 0: 2 environment tokens
    n_tokens, n_samples = global_denominators(mask)
    assert (n_tokens, n_samples) == (5.0, 2.0)
    got = reduce_loss(loss, mask, "token-mean", num_tokens=n_tokens)
    assert float(got) == pytest.approx((1 + 2 + 3 + 4 + 5) / 5)
    per_sample = reduce_loss(loss, mask, "seq-mean-token-mean")
    assert float(per_sample) == pytest.approx(((1 + 2 + 3) / 3 + (4 + 5) / 2) / 2)


def test_contract_kit_verifies_mask_holes_and_one_turn_declarations():
    """An estimator that spreads advantages over the first response_lengths positions passes
    every check until it declares supports_loss_mask_holes; an environment that continues
    without declaring multi_turn is caught."""
    from relax_authoring.testing import check_contract
    from relax_core import EnvironmentCapabilities, EnvironmentSpec, EstimatorCapabilities, EstimatorSpec

    def toy(holes):
        caps = EstimatorCapabilities(sync_only=False, supports_fully_async=True, min_group_size=2,
                                     behaviour_numerator="old_log_probs", supports_loss_mask_holes=holes)
        return EstimatorSpec(name="toy", summary="toy", source="tests", capabilities=caps,
                             factory="relax_core_test_toys:build_length_adv")

    check_contract(toy(False), distributed=False)
    with pytest.raises(AssertionError, match="supports_loss_mask_holes.*advantages are not 0 in the holes"):
        check_contract(toy(True), distributed=False)
    check_contract(dataclasses.replace(toy(True), factory="relax_core_test_toys:build_toy_reinforce"), distributed=False)
    chatty = EnvironmentSpec(name="chatty", summary="toy", source="tests", factory="relax_retry.retry:build",
                             params=__import__("relax_retry.plugin").plugin.RetryParams,
                             capabilities=EnvironmentCapabilities(scores_turns=True))
    with pytest.raises(AssertionError, match="does not declare multi_turn but is not done after its first turn"):
        check_contract(chatty)


def test_contract_kit_verifies_accepts_advantage_terms():
    """A per-token advantage term must stay credit at its own token: a loss that uses each
    sequence's mean advantage passes every check until it declares accepts_advantage_terms;
    the token-local toy passes with it."""
    from relax_authoring.testing import check_contract
    from relax_core import EstimatorCapabilities, EstimatorSpec

    def toy(factory, accepts):
        caps = EstimatorCapabilities(sync_only=False, supports_fully_async=True, min_group_size=2,
                                     behaviour_numerator="old_log_probs", accepts_advantage_terms=accepts)
        return EstimatorSpec(name="toy", summary="toy", source="tests", capabilities=caps,
                             factory=f"relax_core_test_toys:{factory}")

    check_contract(toy("build_seq_adv", False), distributed=False)
    with pytest.raises(AssertionError, match="accepts_advantage_terms.*away from the tokens whose advantage"):
        check_contract(toy("build_seq_adv", True), distributed=False)
    check_contract(toy("build_toy_reinforce", True), distributed=False)


def test_scored_turns_reach_the_environment_and_their_counts_are_kept(tokenizer):
    """retry with a scorer that fails on one sample per call: the failures are counted over
    the turns, and the unscored (None) turn counts as wrong.  A composite scorer's per-part
    mean of a turn is not summed over the turns (nor kept: the final scoring gives it)."""
    from relax_retry.retry import Retry

    calls = []

    def score(texts, labels, metadata, prompts):
        calls.append(texts)
        return [None] + [1.0] * (len(texts) - 1), {"rollout/reward_errors": 1.0, "rollout/reward/math": 0.75,
                                                   "rollout/reward/math/invalid": 1.0}

    engine = ScriptedEngine(tokenizer, {100: [[1010, EOS], [1011, EOS], [1012, EOS]], 101: [[1020, EOS]]})
    env = Retry(3, 0.5, 1.0, "again")
    runner = EpisodeRunner(engine, ReplyRenderer(tokenizer, True), max_turns=3,
                           max_episode_tokens=None, score=score, pad_token_id=EOS, host=ThreadHost(env, 60.0, 4))
    out = runner.generate([{"prompt": "", "label": "5", "metadata": {}}] * 2, ["", ""], [[100, 51], [101, 51]],
                          SamplingParams(max_new_tokens=4))
    # turn 0: 100 unscored (wrong: feedback), 101 right (reward 1 · 0.5⁰); turns 1, 2: 100 alone, unscored,
    # the last attempt ends it without a reward (the run's scorer then scores its last answer)
    assert out.num_turns.tolist() == [3, 1] and [len(c) for c in calls] == [2, 1, 1]
    assert runner.metrics == {"rollout/reward_errors": 3.0, "rollout/reward/math/invalid": 3.0}
    assert math.isnan(out.env_rewards[0]) and out.env_rewards[1] == 1.0
    assert [EPISODE_ENDS[int(e)] for e in out.episode_end] == ["env_done", "env_done"]


@pytest.mark.parametrize("name, params", [("tis", {"level": "token"}), ("tis", {"level": "sequence"}),
                                          ("tis", {"level": "geometric"}), ("icepop", {})])
def test_corrections_count_only_model_tokens(name, params):
    """A correction applied to episodes with environment tokens (garbage in them) gives the
    loss and gradient of the same model tokens without them: its per-sequence statistics
    (sequence and geometric ratios) run over loss_mask, not over positions."""
    from relax_authoring.testing.components import synthetic_batch, with_holes
    from relax_core.contracts import CorrectionInput
    from relax_core.host.plugins import default_registry
    from relax_core.numerics import reduce_loss

    if name not in default_registry().names("correction"):
        pytest.skip(f"correction {name} not installed")
    spec = default_registry().get("correction", name).spec
    corr = spec.build(spec.params(**params))
    compact = synthetic_batch(4).variant(False)
    holed, dest = with_holes(compact)

    def loss_and_grad(b):
        log_probs = b.log_probs.clone().requires_grad_(True)
        adv = torch.where(b.loss_mask, 1.0, float("nan"))  # garbage where masked
        log_ratio = torch.where(b.loss_mask, log_probs - b.old_log_probs, 0.0)
        loss = torch.where(b.loss_mask, -torch.exp(log_ratio), float("nan"))  # −A·r, A = 1
        out = corr.apply(CorrectionInput(loss=loss, log_probs=log_probs, old_log_probs=b.old_log_probs,
                                         advantages=adv, loss_mask=b.loss_mask, behaviour_numerator="old_log_probs",
                                         rollout_log_probs=b.rollout_log_probs))
        total = reduce_loss(out.loss, b.loss_mask, "token-mean")
        total.backward()
        return total.detach(), log_probs.grad

    l0, g0 = loss_and_grad(compact)
    l1, g1 = loss_and_grad(holed)
    torch.testing.assert_close(l1, l0)
    torch.testing.assert_close(g1[:, dest], g0)
    assert not g1[~holed.loss_mask].any()


class FaultyEnv(ScriptedEnv):
    """ScriptedEnv whose episode of prompt ``p`` raises at ``start`` (``faults[p] == "start"``),
    raises at turn k (``("raise", k)``), hangs at turn k (``("hang", k)``: until ``release``
    is set, at most 10 s) or returns a non-Reply at turn k (``("junk", k)``)."""

    def __init__(self, replies, rewards, faults):
        super().__init__(replies, rewards)
        self.faults, self.release = faults, __import__("threading").Event()

    def start(self, row):
        fault = self.faults.get(row["prompt"])
        if fault == "start":
            raise RuntimeError("no such game")
        episode, env = super().start(row), self

        class Faulty:
            def step(self, turn):
                if fault is not None and fault[1] == turn.index:
                    if fault[0] == "raise":
                        raise KeyError("boom")
                    if fault[0] == "hang":
                        env.release.wait(10)
                    if fault[0] == "junk":
                        return "done"
                return episode.step(turn)

        return Faulty()


def test_a_raising_or_hanging_environment_ends_only_its_episode(tokenizer, caplog):
    import time

    from relax_core.stages.rollout import Rollout

    scripts = {p: [[1010 + p, EOS], [1020 + p, EOS], [1030 + p, EOS]] for p in (100, 101, 102, 103, 104)}
    replies = {p: ["again", "again", None] for p in scripts}
    rewards = {p: [0.25, 0.25, 1.0] for p in scripts}
    env = FaultyEnv(replies, rewards, {101: ("raise", 0), 102: ("hang", 1), 103: "start", 104: ("junk", 1)})
    engine = ScriptedEngine(tokenizer, scripts)
    runner = EpisodeRunner(engine, ReplyRenderer(tokenizer, True), max_turns=3, max_episode_tokens=None,
                           score=None, pad_token_id=EOS, host=ThreadHost(env, 0.5, 2))
    rows = [{"prompt": p, "label": "x", "metadata": {}} for p in scripts]
    start = time.monotonic()
    try:
        out = runner.generate(rows, [""] * 5, [[p, 51] for p in scripts], SamplingParams(max_new_tokens=4))
    finally:
        env.release.set()
    assert time.monotonic() - start < 3.0  # the hung step cost one --env-timeout, not its 10 s
    ends = [EPISODE_ENDS[int(e)] for e in out.episode_end]
    assert ends == ["env_done", "env_error", "env_timeout", "env_error", "env_error"]
    assert runner.metrics == {"rollout/env_errors": 3.0, "rollout/env_timeouts": 1.0}
    assert "KeyError: 'boom'" in caplog.text or "RuntimeError: no such game" in caplog.text
    # the healthy episode went on to its end, with its rewards; the failed ones keep their tokens, no reward
    assert out.num_turns.tolist() == [3, 1, 2, 1, 2] and engine.calls == {100: 3, 101: 1, 102: 2, 103: 1, 104: 2}
    assert out.env_rewards[0] == 1.5 and all(math.isnan(x) for x in out.env_rewards[1:].tolist())
    assert out.turn_rewards[1:].abs().sum() == 0 and out.turn_rewards[0].sum() == 1.5
    assert out.response_ids[3, :2].tolist() == [1113, EOS] and out.loss_mask[3].sum() == 2
    # not scored (unscored: NaN reward, advantage 0), while an episode without a reward of its own is
    scored = []
    fake = type("R", (), {"cfg": RunConfig(), "c": type("C", (), {"score": staticmethod(
        lambda r, l, m, p: (scored.extend(r) or [0.5] * len(r), {}))})()})()
    b = Batch(**out.items(), rewards=torch.full((5,), math.nan), prompts=[""] * 5, labels=["x"] * 5,
              metadata=[{}] * 5).replace(env_rewards=torch.tensor([math.nan, *out.env_rewards[1:].tolist()]))
    rewards = Rollout.score(fake, b)[0].rewards
    assert rewards[0] == 0.5 and len(scored) == 1 and torch.isnan(rewards[1:]).all()
