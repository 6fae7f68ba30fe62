"""A throwaway plugin that adds one per-token field to the batch: the whole change a new
correction input needs is the field's declaration (``TOY_FIELD``), the component that
provides it (``ToyFieldEngine``: the fake engine plus one keyword) and the correction that
reads it (``ToyScale``: ``inp.toy_weight``).  Nothing in the core is touched."""

from __future__ import annotations

import torch
from fakes import FakeEngine

from relax_core import CorrectionCapabilities, CorrectionSpec, EngineCapabilities, EngineSpec, hookimpl
from relax_core.batch import Field
from relax_core.contracts import CorrectionOutput

TOY_FIELD = Field(name="toy_weight", per="token", dtype="float32", stage="rollout", pad=0.0,
                  doc="a per-token weight the toy engine attaches to every sampled token")


class ToyFieldEngine(FakeEngine):
    """The fake engine, also returning ``toy_weight = 1 + position / 10`` at every token."""

    def generate(self, prompt_ids, sampling):
        out = super().generate(prompt_ids, sampling)
        b, t = out.response_ids.shape
        return out.replace(toy_weight=1.0 + torch.arange(t, dtype=torch.float32).expand(b, t) / 10)


class ToyScale:
    """Scales the per-token loss by ``toy_weight``; remembers what it saw."""

    def __init__(self) -> None:
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []  # (toy_weight, loss_mask) per micro-batch

    def apply(self, inp):
        self.seen.append((inp.toy_weight.detach().clone(), inp.loss_mask.clone()))
        return CorrectionOutput(loss=inp.loss * inp.toy_weight)


def build_scale(params, config):
    return ToyScale()


class Plugin:
    @hookimpl
    def relax_register_corrections(self):
        return [CorrectionSpec(name="toy_scale", summary="scale the loss by toy_weight", source="test",
                               factory="relax_toy_field:build_scale", fields=(TOY_FIELD,),
                               capabilities=CorrectionCapabilities(behaviour_numerators=frozenset({"*"}),
                                                                   requires_fields=frozenset({"toy_weight"}),
                                                                   supports_fully_async=True))]

    @hookimpl
    def relax_register_rollout_engines(self):
        return [EngineSpec(name="toy_engine", summary="the fake engine with toy_weight", source="test",
                           factory="relax_toy_field:ToyFieldEngine",
                           capabilities=EngineCapabilities(provides_fields=frozenset({"rollout_log_probs", "toy_weight"}),
                                                           supports_weight_update=True))]
