"""relax-reward-shaping against the plugin contract kit."""

import pytest

from relax_authoring.testing import check_contract
from relax_reward_shaping.plugin import relax_register_reward_processors


@pytest.mark.parametrize("spec", relax_register_reward_processors(), ids=lambda s: s.name)
def test_contract(spec):
    check_contract(spec)
