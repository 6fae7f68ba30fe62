"""Cost of safe scoring: 512 responses through ``relax_core.stages.rewarding.score_batch`` (worker
processes with a per-call deadline) against plain serial calls in the training process.

Two scorers, side by side in one run:

- ``math``: the real math scorer (math-verify on LaTeX fractions, no numeric fast path),
  ~half of the answers correct;
- ``constant``: returns 1.0 at once, so its pool time is the pure messaging overhead.

For each: serial in-process time, then the pool with 1 and 2 workers (the pool is started
and warmed by a first batch, whose time is reported as start-up; the timed batch is the
second, as in training where the pool lives across steps).

Run:  .venv/bin/python benchmarks/reward_scoring.py [--n 512]
Results of one run are kept in benchmarks/results/reward_scoring.txt.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from relax_core.stages.rewarding import ScoringPool

N_DEFAULT = 512


def constant(response, label, metadata):
    return 1.0


def make_batch(n: int) -> tuple[list[str], list[str]]:
    responses, labels = [], []
    for i in range(n):
        a, b = i % 13 + 1, i % 7 + 2
        responses.append(f"Some reasoning about step {i}. So the answer is \\boxed{{\\frac{{{a}}}{{{b}}}}}.")
        labels.append(f"\\frac{{{a * 2}}}{{{b * 2}}}" if i % 2 == 0 else f"\\frac{{{a + 1}}}{{{b}}}")
    return responses, labels


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=N_DEFAULT)
    args = ap.parse_args()
    from relax_math.scorers import MathScorer

    responses, labels = make_batch(args.n)
    meta = [{} for _ in responses]
    print(f"# {args.n} responses; {os.cpu_count()} CPUs; Python {platform.python_version()}")
    print(f"{'scorer':10} {'mode':10} {'start-up s':>10} {'batch s':>9} {'ms/sample':>10} {'vs serial':>9}")
    for name, fn in (("math", MathScorer()), ("constant", constant)):
        fn(responses[0], labels[0], {})  # imports outside the timing
        t0 = time.perf_counter()
        serial = [fn(r, l, m) for r, l, m in zip(responses, labels, meta)]
        t_serial = time.perf_counter() - t0
        print(f"{name:10} {'serial':10} {'':>10} {t_serial:9.3f} {1e3 * t_serial / args.n:10.3f} {1.0:9.2f}")
        for workers in (1, 2):
            t0 = time.perf_counter()
            with ScoringPool(fn, workers) as pool:
                pool.score(responses[:workers * 2], labels[:workers * 2], meta[:workers * 2], timeout=30)
                t_start = time.perf_counter() - t0
                t0 = time.perf_counter()
                rewards, stats = pool.score(responses, labels, meta, timeout=30)
                t_pool = time.perf_counter() - t0
            assert rewards == serial and stats == {"reward_errors": 0, "reward_timeouts": 0}
            print(f"{name:10} {f'{workers} worker':10} {t_start:10.3f} {t_pool:9.3f} "
                  f"{1e3 * t_pool / args.n:10.3f} {t_pool / t_serial:9.2f}")


if __name__ == "__main__":
    main()
