"""The batch schema: selection, concatenation, padding, replay files and transport follow
the fields' declarations; views are read-only and refuse undeclared names."""

from __future__ import annotations

import pickle

import pytest
import torch

from relax_core.batch import FIELDS, Batch, Field, declare, length_mask
from relax_core.contracts import CorrectionInput, GenerationOutput


def _batch(b: int, t: int, offset: int = 0) -> Batch:
    lengths = torch.arange(b) % (t + 1)
    return Batch(prompt_ids=[[1 + i] * (i + 1) for i in range(b)], response_ids=torch.full((b, t), 5),
                 loss_mask=length_mask(lengths, t), response_lengths=lengths,
                 rollout_log_probs=-torch.ones(b, t), routed_experts=torch.zeros(b, t, 2, 2, dtype=torch.long),
                 group_index=torch.arange(b) + offset, responses=[f"r{i}" for i in range(b)])


def test_concat_pads_every_token_field_with_its_declared_value():
    a, b = _batch(2, 3), _batch(3, 5, offset=10)
    c = Batch.concat([a, b], pad_token_id=99)
    assert c.size == 5 and c.response_ids.shape == (5, 5)
    assert (c.response_ids[:2, 3:] == 99).all()  # the tokenizer's pad id
    assert not c.loss_mask[:2, 3:].any()  # False
    assert (c.rollout_log_probs[:2, 3:] == 0).all()
    assert c.routed_experts.shape == (5, 5, 2, 2) and (c.routed_experts[:2, 3:] == -1).all()  # -1 = no expert
    assert c.prompt_ids[2:] == b.prompt_ids and c.responses == a.responses + b.responses
    assert c.group_index.tolist() == [0, 1, 10, 11, 12]


def test_select_and_slice_keep_every_field_aligned():
    b = _batch(4, 3)
    s = b.select([3, 1])
    assert s.group_index.tolist() == [3, 1] and s.responses == ["r3", "r1"] and s.prompt_ids == [[4] * 4, [2] * 2]
    torch.testing.assert_close(s.loss_mask, b.loss_mask[[3, 1]])
    assert b.slice(1, 3).responses == ["r1", "r2"] and b.slice(0, 4) is b


def test_concat_refuses_batches_with_different_fields():
    with pytest.raises(ValueError, match="different fields"):
        Batch.concat([_batch(2, 3), _batch(2, 3).replace(rollout_log_probs=None)])


def test_replay_files_and_transport_round_trip(tmp_path):
    b = _batch(3, 4)
    b.save(tmp_path / "step_000001")
    back = Batch.load(tmp_path / "step_000001")
    assert set(back.names()) == set(b.names())
    for name in b.names():
        x, y = getattr(b, name), getattr(back, name)
        assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
    again = pickle.loads(pickle.dumps(b))
    assert again.names() == b.names() and torch.equal(again.loss_mask, b.loss_mask)
    assert Batch.from_dict(b.to_dict()).names() == b.names()


def test_views_are_read_only_and_refuse_undeclared_names():
    b = _batch(2, 3)
    assert b.old_log_probs is None  # declared, absent
    with pytest.raises(AttributeError, match="read-only"):
        b.loss_mask = None
    with pytest.raises(TypeError, match="'lossmask' is not a declared batch field"):
        Batch(lossmask=torch.ones(2, 3))
    with pytest.raises(AttributeError, match="no field 'lossmask'"):
        _ = b.lossmask
    inp = CorrectionInput(loss=torch.zeros(2, 3), loss_mask=b.loss_mask, behaviour_numerator="old_log_probs")
    assert inp.rollout_log_probs is None and inp.behaviour_numerator == "old_log_probs"


def test_an_engine_output_holds_rollout_fields_only():
    out = GenerationOutput(response_ids=torch.zeros(1, 2, dtype=torch.long), loss_mask=torch.ones(1, 2, dtype=torch.bool))
    with pytest.raises(TypeError, match="of the rollout stage"):
        GenerationOutput(old_log_probs=torch.zeros(1, 2))
    with pytest.raises(AttributeError, match="rollout stage"):
        _ = out.log_probs  # the trainer's log-probs, not the engine's rollout_log_probs


def test_a_conflicting_declaration_names_both_declarers():
    declare(Field(name="toy_a", per="sample", dtype="long", stage="loop", doc="x", declared_by="relax-a"))
    declare(Field(name="toy_a", per="sample", dtype="long", stage="loop", doc="x", declared_by="relax-a"))  # same: fine
    with pytest.raises(ValueError, match="declared by relax-a and differently by relax-b"):
        declare(Field(name="toy_a", per="token", dtype="long", stage="loop", doc="x", declared_by="relax-b"))
    del FIELDS["toy_a"]
    with pytest.raises(ValueError, match="dtype must be"):
        Field(name="x", per="token", dtype="float16", stage="loop", doc="")


def test_length_mask():
    assert length_mask(torch.tensor([0, 2, 3]), 3).tolist() == [[False] * 3, [True, True, False], [True] * 3]
