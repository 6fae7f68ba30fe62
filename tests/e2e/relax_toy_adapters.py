"""A throwaway engine that takes LoRA adapters (``supports_lora_adapters``), as vLLM does, so
that the core's adapter push is tested on CPU without vLLM: the hf engine, keeping its base
weights, which on each push applies the pushed PEFT adapter to a copy of them (``peft``
loads the directory :meth:`AdapterWeights.save` writes and merges it)."""

from __future__ import annotations

import copy
import tempfile
from dataclasses import replace

from relax_core import hookimpl
from relax_core.contracts import AdapterWeights
from relax_hf.engine import HFEngine, build


class AdapterHFEngine(HFEngine):
    """The hf engine whose pushes are adapters (built by :func:`build_adapter_engine`);
    ``pushed`` lists what it was given."""

    base: object
    pushed: list[str]

    def update_weights(self, state_dict, version, *, share=False):
        if not isinstance(state_dict, AdapterWeights):
            self.pushed.append("weights")
            return super().update_weights(state_dict, version, share=share)
        from peft import PeftModel

        self.pushed.append("adapter")
        with tempfile.TemporaryDirectory() as d:
            state_dict.save(d)
            self.model = PeftModel.from_pretrained(copy.deepcopy(self.base), d).merge_and_unload().eval()
        self.weight_version = int(version)


ENGINES: list[AdapterHFEngine] = []


def build_adapter_engine(params, config):
    engine = build(params, config)
    engine.__class__ = AdapterHFEngine
    engine.base, engine.pushed = copy.deepcopy(engine.model), []
    ENGINES.append(engine)
    return engine


class Plugin:
    @hookimpl
    def relax_register_rollout_engines(self):
        from relax_hf.plugin import relax_register_rollout_engines as hf

        (spec,) = hf()
        caps = replace(spec.capabilities, supports_lora_adapters=True, supports_shared_weights=False)
        return [replace(spec, name="hf_adapters", factory="relax_toy_adapters:build_adapter_engine", capabilities=caps)]
