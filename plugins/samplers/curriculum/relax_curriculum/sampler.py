"""``curriculum``: prompts of the current difficulty level, one level up when they are learnt.

The training rows carry their level (``metadata["rg_level"]``; the ``rgc:`` data source
writes reasoning-gym's curriculum levels 0, 1, …).  The sampler holds a current level
(``--curriculum-start-level``, clipped to the data's highest) and draws each step's
prompts uniformly without replacement among that level's rows: the ``d``-th call's draw is
``random.Random(f"relax-curriculum:{seed}:{d}").sample(rows of the level, k)`` (more than
the level's rows: successive draws of distinct ones), a pure function of the state.

It observes the raw rewards of every sample of the current level (a sample passes when
its reward ≥ ``--curriculum-pass-threshold``; unscored ones are skipped) and keeps the
outcomes since the last move.  Once ``W`` = ``--curriculum-window`` of them are in, the
accuracy ``a`` of the last ``W`` decides:

    a ≥ threshold          → the next level (if any); the outcomes are cleared
    a < demote_below       → the previous level (if any); the outcomes are cleared

(the levels are reasoning-gym's global levels, ``set_global_level``).  Metrics per step: ``sampler/level`` (the
current level), ``sampler/curriculum/accuracy`` (of the outcomes kept; 0 when none) and
``sampler/curriculum/moves`` (level changes so far).  The state (draw count, level, the
outcomes kept, moves) is JSON, so a resumed run draws what the uninterrupted one would.
"""

from __future__ import annotations

import math
import random
from typing import Any, Callable, Sequence

from relax_core.data import DataError
from relax_core.sampling import PromptResults, Sampler


class CurriculumSampler(Sampler):
    """See the module docstring.

    Args:
        num_rows: training rows.
        seed: ``--seed``.
        levels: each row's level (``metadata["rg_level"]``), ints.
        params: :class:`relax_curriculum.plugin.CurriculumParams`.
    """

    def __init__(self, num_rows: int, seed: int, levels: Sequence[int], params: Any):
        if len(levels) != num_rows:
            raise ValueError(f"{len(levels)} row levels for {num_rows} rows")
        self.n, self.seed, self.p = num_rows, seed, params
        self.levels = sorted({int(v) for v in levels})
        self.rows = {lv: [i for i, v in enumerate(levels) if int(v) == lv] for lv in self.levels}
        self.level_of = [int(v) for v in levels]
        self.pos = min(params.start_level, len(self.levels) - 1)
        """Index of the current level in :attr:`levels`."""
        self.draws = 0
        self.outcomes: list[int] = []
        self.moves = 0

    @property
    def level(self) -> int:
        return self.levels[self.pos]

    def take(self, k: int) -> list[int]:
        rng = random.Random(f"relax-curriculum:{self.seed}:{self.draws}")
        self.draws += 1
        pool = self.rows[self.level]
        out: list[int] = []
        while len(out) < k:
            out += rng.sample(pool, min(len(pool), k - len(out)))
        return out

    def observe(self, results: PromptResults) -> None:
        for i, r in zip(results.prompt_index.tolist(), results.rewards.tolist()):
            if not math.isnan(r) and self.level_of[int(i)] == self.level:
                self.outcomes.append(int(r >= self.p.pass_threshold))
        del self.outcomes[: -self.p.window]
        if len(self.outcomes) < self.p.window:
            return
        accuracy = sum(self.outcomes) / len(self.outcomes)
        step = 1 if accuracy >= self.p.threshold else -1 if accuracy < self.p.demote_below else 0
        if step and 0 <= self.pos + step < len(self.levels):
            self.pos += step
            self.moves += 1
            self.outcomes = []

    def metrics(self) -> dict[str, float]:
        acc = sum(self.outcomes) / len(self.outcomes) if self.outcomes else 0.0
        return {"sampler/level": float(self.level), "sampler/curriculum/accuracy": acc,
                "sampler/curriculum/moves": float(self.moves)}

    def state(self) -> dict:
        return {"n": self.n, "seed": self.seed, "levels": list(self.levels), "draws": self.draws,
                "level": self.level, "outcomes": list(self.outcomes), "moves": self.moves}

    def load(self, state: dict, allow_other_data: bool = False) -> None:
        """Restore :meth:`state`.

        With ``allow_other_data`` (``--resume-allow-data-change``) the level carries over when
        the new data have it (the sampler keeps no per-prompt statistics), else the run starts
        at ``--curriculum-start-level``.

        Raises:
            DataError: the checkpoint's sampler is for another row count, seed or set of
                levels (unless ``allow_other_data``).
        """
        if allow_other_data and int(state.get("level", -1)) not in self.levels:
            return  # --resume-allow-data-change onto data without that level: start from --curriculum-start-level
        if not allow_other_data and (state.get("n"), state.get("seed"), state.get("levels")) != (
                self.n, self.seed, self.levels):
            raise DataError(f"the checkpoint's curriculum sampler state is for {state.get('n')} rows / seed "
                            f"{state.get('seed')} / levels {state.get('levels')}, but this run has {self.n} rows / "
                            f"seed {self.seed} / levels {self.levels}: resume with the same --data, --seed and --sampler")
        self.draws, self.moves = int(state["draws"]), int(state["moves"])
        self.pos = self.levels.index(int(state["level"]))
        self.outcomes = [int(x) for x in state["outcomes"]]


def build(params: Any, config: Any) -> Callable[[int, int, Sequence[int]], CurriculumSampler]:
    """``fn(num_rows, seed, levels) -> CurriculumSampler`` with these parameters."""
    return lambda num_rows, seed, levels: CurriculumSampler(num_rows, seed, levels, params)
