"""A new per-token field, end to end: declared by a throwaway plugin, provided by its engine,
read by its correction, carried by the unchanged loop (replay files included), and
checked at startup when no selected component provides it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from fakes import make_fakes  # noqa: E402
from test_loop_fakes import make_trainer  # noqa: E402

import relax_toy_field  # noqa: E402
from relax_core.batch import FIELDS, Batch  # noqa: E402
from relax_core.config import RunConfig  # noqa: E402
from relax_core.host.plugins import load_registry  # noqa: E402
from relax_core.host.validation import resolve  # noqa: E402
from relax_core.run.exits import EXIT_OK  # noqa: E402


@pytest.fixture(scope="module")
def registry():
    reg = load_registry([("toy", relax_toy_field.Plugin(), "relax-toy", "0.1")])
    assert FIELDS["toy_weight"].declared_by == "relax-toy"
    return reg


def test_the_loop_carries_a_plugin_field_from_engine_to_correction(registry, tmp_path):
    f = make_fakes(seed=0)
    f = type(f)(f.model, relax_toy_field.ToyFieldEngine(f.model), f.backend)
    scale = relax_toy_field.ToyScale()
    tr, _ = make_trainer(tmp_path, fakes=f, num_rollout=2, save_debug_rollout_data=str(tmp_path / "replay"))
    tr.c.corrections = [scale]
    assert tr.run() == EXIT_OK
    assert sum(len(x) for x, _ in scale.seen) == 2 * 8  # every sample of both steps (2 prompts × 4), by micro-batch
    for seen, mask in scale.seen:  # the engine's values at the sampled tokens (garbage elsewhere, by contract)
        t = seen.shape[1]
        expected = 1.0 + torch.arange(t, dtype=torch.float32).expand_as(seen) / 10
        assert mask.any()
        torch.testing.assert_close(seen[mask], expected[mask])
    replay = Batch.load(tmp_path / "replay" / "step_000001")
    assert replay.toy_weight.shape == replay.response_ids.shape


def test_a_required_field_that_no_selected_component_provides_is_refused(registry, tmp_path):
    cfg = RunConfig(correction=("toy_scale",), advantage_estimator="rloo", calculate_per_token_loss=True)
    _, problems = resolve(cfg, registry)
    msgs = [str(p) for p in problems if p.constraint == "requires_fields"]
    assert msgs == ["correction 'toy_scale' (relax-toy 0.1) [requires_fields]: toy_scale reads the batch field "
                    "'toy_weight' (declared by relax-toy), which engine 'hf' does not provide\n"
                    "    fix: choose a rollout engine / training backend whose `provides` column lists them "
                    "(`relax capabilities`; hf + torch provide all the core's)"]
    cfg = RunConfig(correction=("toy_scale",), advantage_estimator="rloo", calculate_per_token_loss=True,
                    rollout_engine="toy_engine")
    _, problems = resolve(cfg, registry)
    assert [p for p in problems if p.constraint == "requires_fields"] == []
