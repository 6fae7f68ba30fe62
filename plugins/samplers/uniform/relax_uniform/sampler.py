"""``uniform``: the core's seeded epoch-wise shuffle, :class:`relax_core.data.DataCursor`.

Epoch ``e`` visits the rows in ``random.Random(f"relax-data:{seed}:{e}")``'s shuffle of
``range(num_rows)``; a batch that straddles two epochs never repeats a row (the cursor's
docstring).  It observes no rewards and logs no metrics; its state is ``{n, seed, epoch,
position, carry, need}``, the checkpoint format of every earlier Relax version.
"""

from __future__ import annotations

from typing import Any, Callable

from relax_core.data import DataCursor


def build(params: Any, config: Any) -> Callable[[int, int], DataCursor]:
    """``fn(num_rows, seed) -> DataCursor``."""
    return DataCursor
