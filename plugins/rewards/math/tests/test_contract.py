"""relax-math against the plugin contract kit."""

import pytest

from relax_authoring.testing import check_contract
from relax_math.plugin import MathParams, relax_register_data_sources, relax_register_reward_scorers


@pytest.mark.parametrize("spec", [*relax_register_reward_scorers(), *relax_register_data_sources()],
                         ids=lambda s: f"{s.kind}-{s.name}")
def test_contract(spec):
    check_contract(spec)


def test_contract_anchors_format():
    (math_spec,) = [s for s in relax_register_reward_scorers() if s.name == "math"]
    check_contract(math_spec, MathParams(answer_format="anchors"))
