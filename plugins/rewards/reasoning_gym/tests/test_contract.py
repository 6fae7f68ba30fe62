"""relax-reasoning-gym against the plugin contract kit."""

from relax_authoring.testing import check_contract
from relax_reasoning_gym.plugin import relax_register_data_sources, relax_register_reward_scorers


def test_contract():
    for spec in relax_register_reward_scorers() + relax_register_data_sources():
        check_contract(spec)
