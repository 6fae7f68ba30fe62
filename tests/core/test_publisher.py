"""The weight publisher's checkpoint state: which weights the engine gets on resume, and
what counts as posted (issue 18 item 1; the fully-async resume that waited forever)."""

from __future__ import annotations

import pytest
import torch

from relax_core.stages.rollout import Publisher


class Engine:
    def __init__(self):
        self.pushed = []

    def update_weights(self, weights, version, **kw):
        self.pushed.append((float(weights["w"]), version, *kw.values()))


def trainer_weights():
    return {"w": torch.tensor(3.0)}  # the trainer's weights at the checkpoint's step


@pytest.mark.parametrize("interval", [1, 2])
def test_sync_resume_between_pushes_gives_the_engine_its_saved_weights(interval):
    eng = Engine()
    pub = Publisher(eng, trainer_weights, interval)
    pub.restore({"held": 2}, {"w": torch.tensor(2.0)}, 3)
    assert eng.pushed == [(2.0, 2)] and pub.held == 2 and pub.posted == 2


def test_sync_resume_on_a_push_gives_the_trainers_weights():
    eng = Engine()
    pub = Publisher(eng, trainer_weights, 1)
    pub.restore({"held": 3}, None, 3)
    assert eng.pushed == [(3.0, 3)] and pub.posted == 3


@pytest.mark.parametrize("interval,step,held,posted", [(1, 3, 1, 3), (1, 3, 3, 3), (2, 4, 2, 4), (2, 3, 2, 2),
                                                       (2, 3, 0, 3)])
def test_async_resume_reposts_what_the_crash_lost(interval, step, held, posted):
    """Fully async, the engine may lag the trainer by more than a post: at step 3 with
    --max-staleness 1 the rollout thread's batch 4 needs version ≥ 2 posted.  Before the fix
    `posted` fell back to the engine's 1 and the thread waited forever (the trainer waited
    for batch 4 before posting anything)."""
    eng = Engine()
    pub = Publisher(eng, trainer_weights, interval, post=True)
    pub.restore({"held": held}, {"w": torch.tensor(float(held))} if 0 < held < step else None, step)
    assert pub.held == held and pub.posted == posted
    pub.push_posted()
    assert pub.held == posted
    assert eng.pushed[-1:] == ([(3.0, step)] if posted > held else ([(float(held), held)] if held else []))


def test_shared_weights_reach_the_engine_before_the_first_step_and_at_every_push():
    """``share=True``: ``share_now`` (the trainer's call before a fresh run's first step)
    pushes the initial weights, so the engine's own copy is freed before the first step's
    peak; every push asks to share.  Without ``share`` it does nothing."""
    eng = Engine()
    Publisher(eng, trainer_weights, 1).share_now()
    assert eng.pushed == []
    pub = Publisher(eng, trainer_weights, 1, share=True)
    assert eng.pushed == []
    pub.share_now()
    assert eng.pushed == [(3.0, 0, True)] and pub.held == 0
    pub.after_step(1)
    assert eng.pushed[-1] == (3.0, 1, True) and pub.held == 1
    pub.restore({"held": 1}, None, 1)
    assert eng.pushed[-1] == (3.0, 1, True)


@pytest.mark.parametrize("interval,post", [(2, False), (1, True)])
def test_shared_weights_are_refused_where_the_engine_must_hold_older_ones(interval, post):
    with pytest.raises(ValueError, match="synchronous push after every step"):
        Publisher(Engine(), trainer_weights, interval, post=post, share=True)


@pytest.mark.parametrize("flags,ray,caps,shared", [
    ({}, False, True, True),  # the default run
    ({"load_debug_rollout_data": "x.pt"}, False, True, False),  # replay: nothing is ever pushed
    ({"update_weights_interval": 2}, False, True, False),  # the engine holds older weights
    ({"fully_async": True, "max_staleness": 1}, False, True, False),  # generates while the trainer steps
    ({}, True, True, False),  # another process
    ({}, False, False, False),  # an engine that copies
])
def test_which_runs_share_the_trainers_weights_with_the_engine(flags, ray, caps, shared):
    from relax_core.config import RunConfig
    from relax_core.run.launch import shares_weights
    from relax_core.specs import EngineCapabilities

    cfg = RunConfig(**flags)
    assert shares_weights(cfg, EngineCapabilities(supports_shared_weights=caps), ray=ray) is shared
