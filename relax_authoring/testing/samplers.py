"""Contract checks of a prompt sampler (:mod:`relax_core.sampling`).

The sampler is driven as the loop drives it, on 12 rows with 3 prompts a step and 4
samples a prompt whose rewards are a fixed function of the prompt (prompt ``i`` passes
``i % 5`` of its 4 samples), so that a sampler that learns from rewards sees every pass
rate from 0 to 1.
"""

from __future__ import annotations

import json
import math
from typing import Any

from relax_authoring.testing.contract import Checks, require

ROWS, PER_STEP, N = 12, 3, 4


def _results(indices: list[int]) -> Any:
    import torch

    from relax_core.sampling import PromptResults

    prompt = torch.tensor([i for i in indices for _ in range(N)])                       # [B] long
    rewards = torch.tensor([1.0 if j < i % 5 else 0.0 for i in indices for j in range(N)])  # [B] float32
    return PromptResults(prompt_index=prompt, rewards=rewards, group_index=torch.arange(len(indices)).repeat_interleave(N))


def _steps(sampler: Any, steps: int) -> list[tuple[list[int], dict]]:
    out = []
    for _ in range(steps):
        idx = sampler.take(PER_STEP)
        sampler.observe(_results(idx))
        out.append((idx, sampler.metrics()))
    return out


def check_sampler(spec: Any, params: Any, config: Any, checks: Checks) -> None:
    """``take`` gives ``k`` distinct indices in range; ``state`` is JSON and a copy;
    ``load(state)`` of a fresh sampler continues exactly (indices and metrics) as the
    sampler that wrote it; metrics are finite floats named ``sampler/...``."""
    make = None
    with checks.check("factory builds fn(num_rows, seed)"):
        built = spec.build(params, config)
        require(callable(built), f"the factory returned {type(built).__name__}, expected fn(num_rows, seed) -> Sampler")
        extra = ([[i * 3 // ROWS for i in range(ROWS)]] if spec.capabilities_for(params).row_metadata else [])
        make = lambda n, seed: built(n, seed, *extra)  # noqa: E731
    if make is None:
        return
    with checks.check("take"):
        s = make(ROWS, 0)
        for idx, metrics in _steps(s, 6):
            require(len(idx) == PER_STEP and all(isinstance(i, int) and 0 <= i < ROWS for i in idx),
                    f"take({PER_STEP}) gave {idx}: expected {PER_STEP} ints in [0, {ROWS})")
            require(len(set(idx)) == PER_STEP, f"take({PER_STEP}) repeated an index within one batch: {idx}")
            for k, v in metrics.items():
                require(k.startswith("sampler/") and isinstance(v, float) and math.isfinite(v),
                        f"metric {k}={v!r}: expected a finite float named sampler/...")
    with checks.check("state and load resume exactly"):
        a = make(ROWS, 0)
        _steps(a, 3)
        state = a.state()
        saved = json.loads(json.dumps(state))
        after = _steps(a, 4)
        require(state == saved, "state() is not a JSON-able copy (it changed as the sampler moved on, or is not JSON)")
        b = make(ROWS, 0)
        b.load(saved)
        require(_steps(b, 4) == after, "a sampler restored from state() draws other prompts (or logs other metrics) "
                "than the one that saved it")
