"""The retry environment: feedback on a wrong answer, a correct one ends the episode with a
reward discounted by attempt, the last attempt ends it, an unscored turn counts as wrong."""

import math

from relax_core.environments import Turn
from relax_retry import plugin

ROW = {"prompt": "What is 2 + 3?", "label": "5", "metadata": {}}


def _spec():
    return plugin.relax_register_environments()[0]


def test_contract(relax_contract):
    relax_contract(_spec())


def test_correct_at_the_third_attempt_discounted_by_hand():
    episode = _spec().build(_spec().params(attempts=3, discount=0.5)).start(ROW)
    for k, score in enumerate((0.0, None)):  # wrong, then unscored: both get the feedback
        reply = episode.step(Turn(text="4", index=k, score=score))
        assert not reply.done and reply.reward is None
        assert reply.messages == ({"role": "user", "content": "Your answer is not correct, try again."},)
    last = episode.step(Turn(text="5", index=2, score=1.0))
    assert last.done and last.reward == 0.25  # 1 · 0.5²


def test_first_attempt_correct_and_last_attempt_wrong():
    spec = _spec()
    first = spec.build().start(ROW).step(Turn(text="5", index=0, score=1.0))
    assert first.done and first.reward == 1.0 and first.messages == ()
    episode = spec.build(spec.params(attempts=2, discount=0.9, correct=0.8)).start(ROW)
    assert not episode.step(Turn(text="4", index=0, score=0.5)).done  # below --retry-correct
    last = episode.step(Turn(text="4", index=1, score=0.5))
    assert last.done and math.isclose(last.reward, 0.45)  # 0.5 · 0.9
    unscored = spec.build(spec.params(attempts=1)).start(ROW).step(Turn(text="?", index=0, score=None))
    assert unscored.done and unscored.reward is None  # stays unscored: the run's scorer tries it
