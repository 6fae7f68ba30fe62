"""``difficulty``: draw the prompts the model can still learn from.

A group-relative estimator learns nothing from a prompt whose samples all pass or all
fail (every advantage is 0).  This sampler remembers, per prompt (dataset index ``i``), the
outcomes of its ``W`` most recent samples (``--difficulty-window``; a sample passes when its
raw reward ≥ ``--difficulty-pass-threshold``), and draws the prompts of each step with the
weights

    w_i = 1        if prompt i was never sampled, or  p_min < pass_rate_i < p_max
    w_i = ε        otherwise (too hard: rate ≤ p_min; too easy: rate ≥ p_max)

(``--difficulty-min-pass-rate`` p_min, ``--difficulty-max-pass-rate`` p_max,
``--difficulty-explore-floor`` ε > 0, so a prompt the model has outgrown or not yet reached
is still drawn now and then and its rate can change).  ``take(k)`` draws ``k`` distinct
indices without replacement, with probabilities proportional to ``w`` (Efraimidis &
Spirakis 2006, 'Weighted random sampling with a reservoir', algorithm A: the ``k`` largest
keys ``log(u_i) / w_i``, ``u_i ~ U(0, 1)``); more than ``num_rows`` indices are drawn as
successive draws of distinct ones.  The ``d``-th call's uniforms come from
``random.Random(f"relax-difficulty:{seed}:{d}")``, so the draws are a pure function of the
state (draw count and outcomes), which a checkpoint saves as JSON.

Metrics (per step): ``sampler/difficulty/seen_frac`` (prompts sampled at least once /
rows), ``sampler/difficulty/in_band_frac`` (seen prompts in the band / seen prompts; 0 when
none is seen), and the histogram of the seen prompts' pass rates,
``sampler/difficulty/pass_rate_hist/<lo>-<hi>``: the number of prompts whose rate is in
``[lo, hi)`` for the five bins of width 0.2 (the last one includes 1).
"""

from __future__ import annotations

import math
import random
from typing import Any, Callable

from relax_core.data import DataError
from relax_core.sampling import PromptResults, Sampler

BINS = 5
_HIST = [f"sampler/difficulty/pass_rate_hist/{i / BINS:.1f}-{(i + 1) / BINS:.1f}" for i in range(BINS)]


class DifficultySampler(Sampler):
    """See the module docstring.  ``params``: :class:`relax_difficulty.plugin.DifficultyParams`."""

    def __init__(self, num_rows: int, seed: int, params: Any):
        self.n, self.seed, self.p = num_rows, seed, params
        self.draws = 0
        self.outcomes: dict[int, list[int]] = {}
        """prompt index -> its most recent outcomes (1 pass, 0 fail), oldest first, at most ``window``."""

    def weights(self) -> list[float]:
        """``w_i`` for every row (module docstring)."""
        lo, hi, floor = self.p.min_pass_rate, self.p.max_pass_rate, self.p.explore_floor
        out = []
        for i in range(self.n):
            seen = self.outcomes.get(i)
            rate = sum(seen) / len(seen) if seen else None
            out.append(1.0 if rate is None or lo < rate < hi else floor)
        return out

    def take(self, k: int) -> list[int]:
        rng = random.Random(f"relax-difficulty:{self.seed}:{self.draws}")
        self.draws += 1
        w = self.weights()
        out: list[int] = []
        while len(out) < k:
            keys = [math.log(1.0 - rng.random()) / wi for wi in w]  # log(u), u in (0, 1]
            best = sorted(range(self.n), key=lambda i: keys[i], reverse=True)
            out += best[: k - len(out)]
        return out

    def observe(self, results: PromptResults) -> None:
        idx = results.prompt_index.tolist()
        rewards = results.rewards.tolist()
        for i, r in zip(idx, rewards):
            if math.isnan(r):  # unscored: no outcome
                continue
            seen = self.outcomes.setdefault(int(i), [])
            seen.append(int(r >= self.p.pass_threshold))
            del seen[: -self.p.window]

    def metrics(self) -> dict[str, float]:
        hist = [0] * BINS
        in_band = 0
        for seen in self.outcomes.values():
            passes, count = sum(seen), len(seen)
            hist[min(BINS - 1, BINS * passes // count)] += 1  # integer arithmetic: exact bin edges
            in_band += self.p.min_pass_rate < passes / count < self.p.max_pass_rate
        seen_n = len(self.outcomes)
        return {"sampler/difficulty/seen_frac": seen_n / self.n,
                "sampler/difficulty/in_band_frac": in_band / seen_n if seen_n else 0.0,
                **{name: float(c) for name, c in zip(_HIST, hist)}}

    def state(self) -> dict:
        return {"n": self.n, "seed": self.seed, "draws": self.draws,
                "outcomes": {str(i): list(v) for i, v in sorted(self.outcomes.items())}}

    def load(self, state: dict, allow_other_data: bool = False) -> None:
        """Restore :meth:`state`.

        Raises:
            DataError: the checkpoint's sampler is for another row count or seed (the
                startup validation refuses ``--resume-allow-data-change`` with this sampler).
        """
        if state.get("n") != self.n or state.get("seed") != self.seed or "outcomes" not in state:
            raise DataError(f"the checkpoint's difficulty sampler state is for {state.get('n')} rows / seed "
                            f"{state.get('seed')}, but this run has {self.n} rows / seed {self.seed}: resume with "
                            "the same --data, --seed and --sampler")
        self.draws = int(state["draws"])
        self.outcomes = {int(i): [int(x) for x in v] for i, v in state["outcomes"].items()}


def build(params: Any, config: Any) -> Callable[[int, int], DifficultySampler]:
    """``fn(num_rows, seed) -> DifficultySampler`` with these parameters."""
    return lambda num_rows, seed: DifficultySampler(num_rows, seed, params)
