"""single_turn: one turn, done at once, no reward of its own (the scorer scores the response)."""

from relax_core.environments import Reply, Turn
from relax_single_turn import plugin


def test_contract(relax_contract):
    relax_contract(plugin.relax_register_environments()[0])


def test_one_turn_no_reward():
    spec = plugin.relax_register_environments()[0]
    assert not spec.capabilities_for().multi_turn
    assert spec.build().start({"prompt": "p", "label": 1, "metadata": {}}).step(Turn(text="x", index=0)) == \
        Reply(done=True)
