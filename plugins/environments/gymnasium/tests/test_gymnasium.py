"""The gymnasium adapter: FrozenLake played by hand (the mapping of reset/step onto the episode
contract, rewards, the end), the startup refusals, the contract kit, and episodes of the tiny
model on the hf engine through the host's episode runner (token bookkeeping with real
observations)."""

import torch

from relax_core.contracts import SamplingParams
from relax_core.environments import EPISODE_ENDS, Turn
from relax_core.stages.env_host import ThreadHost
from relax_core.stages.episodes import EpisodeRunner, ReplyRenderer
from relax_gymnasium import plugin
from relax_gymnasium.adapter import seed_of

MAP = "[S]FFF\nFHFH\nFFFH\nHFFG"  # FrozenLake 4x4, the agent at the start


def _spec():
    return plugin.relax_register_environments()[0]


def test_contract(relax_contract):
    relax_contract(_spec())


def test_frozen_lake_by_hand():
    env = _spec().build()
    prompt = env.prompt("Cross the lake.")
    assert prompt == ("Cross the lake.\n\nAnswer each turn with one action: left (0), down (1), right (2), up (3)."
                      "\n\n" + MAP)
    ep = env.start({"prompt": "Cross the lake.", "label": None, "metadata": {}})
    r = ep.step(Turn(text="Not left: I go right.", index=0))  # the last action named counts
    assert not r.done and r.reward == 0.0 and r.messages == (
        {"role": "user", "content": "  (Right)\nS[F]FF\nFHFH\nFFFH\nHFFG"},)
    r = ep.step(Turn(text="hmm", index=1))  # no action: told how to answer, the lake does not move
    assert r.reward == 0.0 and r.messages[0]["content"].startswith("No action found. Answer each turn with")
    for k, move in enumerate(["2", "Down", "down", "down"]):
        assert not ep.step(Turn(text=move, index=2 + k)).done
    last = ep.step(Turn(text="right", index=6))
    assert last.done and last.reward == 1.0  # the goal: the step's reward, the episode's end
    hole = env.start({"prompt": "Cross the lake.", "label": None, "metadata": {}})
    r = hole.step(Turn(text="down", index=0))
    assert not r.done
    r = hole.step(Turn(text="right", index=1))  # (1, 1) is a hole
    assert r.done and r.reward == 0.0
    assert env.action("7") is None and env.action("go UP") == 3


def test_seed_is_the_prompts():
    assert seed_of("a") == int.from_bytes(bytes.fromhex(
        "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb")[:4], "little")
    env = _spec().build(_spec().params(env_id="Blackjack-v1", kwargs="{}", actions="stick,hit"))
    # the same prompt replays the same deal (a group's samples play one task); another prompt deals anew
    assert env.prompt("deal 1") == env.prompt("deal 1")
    assert len({env.prompt(f"deal {i}").split("\n\n")[-1] for i in range(8)}) > 1



def test_a_groups_episodes_share_the_random_draws():
    """reset(seed) seeds the transitions too: on the slippery lake, episodes of one prompt that
    take the same actions see the same observations (the module docstring's claim)."""
    env = _spec().build(_spec().params(kwargs='{"is_slippery": true}'))

    def play(prompt):
        ep = env.start({"prompt": prompt, "label": None, "metadata": {}})
        out = []
        for k in range(6):
            r = ep.step(Turn(text="down", index=k))
            out.append(r.messages[0]["content"] if r.messages else "done")
            if r.done:
                break
        return out

    assert play("Cross the lake.") == play("Cross the lake.")
    assert len({tuple(play(f"lake {i}")) for i in range(8)}) > 1  # other prompts, other draws

def test_bad_parameters_are_refused_at_startup():
    p = _spec().params
    assert p().problems() == []
    (msg, _), = p(env_id="CartPole-v1", kwargs="{}").problems()
    assert msg == "--gymnasium-actions names 4 actions but CartPole-v1 has 2"
    (msg, fix), = p(env_id="NoSuchGame-v0").problems()
    assert msg.startswith("--gymnasium-env-id NoSuchGame-v0: NameNotFound") and "registry" in fix
    (msg, _), = p(kwargs="[1").problems()
    assert msg.startswith("--gymnasium-kwargs is not JSON")
    (msg, _), = p(kwargs='{"no_such_argument": 1}').problems()
    assert msg.startswith("--gymnasium-kwargs for FrozenLake-v1:")
    (msg, _), = p(env_id="MountainCarContinuous-v0", kwargs="{}").problems()
    assert "Box action space, not Discrete" in msg


class Mover:
    """FrozenLake episodes whose turns end with 'right' or 'down' alternately (a random model names
    no action), so that the lake moves between real sampled turns."""

    def __init__(self, env):
        self.env = env

    def start(self, row):
        episode = self.env.start(row)

        class Ep:
            def step(self, turn):
                move = ("right", "down")[turn.index % 2]
                return episode.step(Turn(text=turn.text + " " + move, index=turn.index))

        return Ep()


def test_tiny_model_plays_a_few_steps(tiny_model_dir):
    from relax_hf.engine import HFEngine

    engine = HFEngine(str(tiny_model_dir), seed=0)
    env = _spec().build()
    mover = Mover(env)
    runner = EpisodeRunner(engine, ReplyRenderer(engine.tokenizer, True), max_turns=4,
                           max_episode_tokens=None, score=None, pad_token_id=engine.pad_token_id,
                           host=ThreadHost(mover, 60.0, 4))
    text = env.prompt("Cross the lake.")
    ids = engine.tokenizer(engine.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                                add_generation_prompt=True),
                           add_special_tokens=False)["input_ids"]
    out = runner.generate([{"prompt": "Cross the lake.", "label": None, "metadata": {}}] * 2, [text] * 2, [ids] * 2,
                          SamplingParams(temperature=1.0, max_new_tokens=5, seed=3, stop=("e",)))
    # right, then down: (0, 1), then (1, 1), a hole; the episode ends at turn 2 with reward 0 from gymnasium
    assert out.num_turns.tolist() == [2, 2], out.transcripts
    assert [EPISODE_ENDS[int(e)] for e in out.episode_end] == ["env_done"] * 2
    assert out.env_rewards.tolist() == [0.0, 0.0]
    for b in range(2):
        assert "S[F]FF" in out.transcripts[b]  # the observation after 'right', rendered as environment tokens
        env_ids = out.response_ids[b][out.env_mask[b]].tolist()
        assert "S[F]FF" in engine.tokenizer.decode(env_ids)
        assert not (out.loss_mask[b] & out.env_mask[b]).any() and out.loss_mask[b].sum() >= 2
        assert torch.isfinite(out.rollout_log_probs[b][out.loss_mask[b]]).all()
