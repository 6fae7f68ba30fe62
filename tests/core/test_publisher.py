"""The weight publisher's checkpoint state: which weights the engine gets on resume, and
what counts as posted (issue 18 item 1; the fully-async resume that waited forever)."""

from __future__ import annotations

import pytest
import torch

from relax_core.stages.rollout import Publisher


class Engine:
    def __init__(self):
        self.pushed = []

    def update_weights(self, weights, version):
        self.pushed.append((float(weights["w"]), version))


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
