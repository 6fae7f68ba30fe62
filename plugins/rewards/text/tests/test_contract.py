"""relax-text against the plugin contract kit."""

import pytest

from relax_authoring.testing import check_contract
from relax_text.plugin import relax_register_reward_scorers


@pytest.mark.parametrize("spec", relax_register_reward_scorers(), ids=lambda s: s.name)
def test_contract(spec):
    check_contract(spec)
