"""relax-uniform: the contract kit, and the exact order of the data cursor it stands for."""

import importlib.metadata as md
import random

from relax_authoring.testing import check_contract
from relax_uniform.plugin import relax_register_samplers


def test_contract():
    check_contract(relax_register_samplers()[0])


def test_order_is_the_seeded_shuffle_of_each_epoch():
    make = relax_register_samplers()[0].build()
    s = make(5, 3)
    first = list(range(5))
    random.Random("relax-data:3:0").shuffle(first)
    assert s.take(3) + s.take(2) == first  # one epoch: every row once, in that order
    assert s.metrics() == {}


def test_rewards_do_not_change_the_order():
    import torch

    from relax_core.sampling import PromptResults

    make = relax_register_samplers()[0].build()
    a, b = make(6, 0), make(6, 0)
    idx = a.take(2)
    assert b.take(2) == idx
    a.observe(PromptResults(torch.tensor(idx), torch.tensor([1.0, 0.0]), torch.tensor([0, 1])))
    assert a.take(3) == b.take(3)


def test_entry_point():
    eps = {ep.name: ep.value for ep in md.entry_points(group="relax.plugins")}
    assert eps.get("uniform") == "relax_uniform.plugin"
