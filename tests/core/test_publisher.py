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


@pytest.mark.parametrize("share", [False, True])
def test_shared_weights_engine_frees_its_own_copy_while_the_trainer_steps(share):
    """``before_train`` (the trainer's call between the rollout and the optimizer step)
    asks a sharing engine to release its own weights; the push after the step gives them
    back.  Without ``share`` the engine is never asked (it may hold weights the trainer
    has moved past)."""
    eng = Engine()
    eng.release_weights = lambda: eng.pushed.append("released")
    pub = Publisher(eng, trainer_weights, 1, share=share)
    pub.before_train()
    pub.after_step(1)
    assert eng.pushed == (["released", (3.0, 1, True)] if share else [(3.0, 1)])


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


def adapter_weights(value: float):
    from relax_core.contracts import AdapterWeights

    return AdapterWeights(tensors={"w": torch.tensor(value)}, config={"r": 4, "peft_type": "LORA"})


class AdapterEngine:
    def __init__(self):
        self.pushed = []

    def update_weights(self, weights, version, **kw):
        kind = "adapter" if hasattr(weights, "config") else "weights"
        self.pushed.append((kind, float((weights.tensors if kind == "adapter" else weights)["w"]), version))


def test_a_lagging_adapter_is_saved_with_its_config_and_given_back_on_resume():
    """Interval 2, adapters: at step 3 the engine holds step 2's adapter; the checkpoint keeps
    its tensors (the engine-weights file) and its config (the state), and a resumed run gives
    the engine that adapter, not merged weights and not the trainer's step-3 adapter."""
    eng = AdapterEngine()
    trainer = {"v": 2.0}
    pub = Publisher(eng, lambda: adapter_weights(trainer["v"]), 2, adapter=True)
    pub.after_step(2)
    trainer["v"] = 3.0
    pub.after_step(3)
    state, weights = pub.state(3)
    assert state == {"held": 2, "adapter_config": {"r": 4, "peft_type": "LORA"}} and float(weights["w"]) == 2.0
    eng2 = AdapterEngine()
    Publisher(eng2, lambda: adapter_weights(3.0), 2, adapter=True).restore(state, weights, 3)
    assert eng2.pushed == [("adapter", 2.0, 2)]


@pytest.mark.parametrize("saved_adapter", [True, False])
def test_saved_engine_weights_of_the_other_kind_give_way_to_the_trainers_with_a_warning(saved_adapter):
    """A run resumed with the other kind of push (``--lora-engine-adapter`` or the engine
    changed) cannot give the engine its saved weights: merged weights to an adapter engine
    would replace its base weights.  It gets the trainer's weights of the checkpoint's step."""
    eng = AdapterEngine()
    now = (lambda: {"w": torch.tensor(3.0)}) if saved_adapter else (lambda: adapter_weights(3.0))
    pub = Publisher(eng, now, 2, adapter=not saved_adapter)
    state = {"held": 2, **({"adapter_config": {"r": 4}} if saved_adapter else {})}
    with pytest.warns(UserWarning, match="this resumed run samples from newer weights"):
        pub.restore(state, {"w": torch.tensor(2.0)}, 3)
    assert eng.pushed == [("weights" if saved_adapter else "adapter", 3.0, 3)] and pub.held == 3
