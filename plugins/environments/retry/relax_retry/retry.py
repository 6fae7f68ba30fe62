"""The ``retry`` environment: answer, hear whether it is correct, try again.

Each model turn is scored by the run's scorer (the environment declares ``scores_turns``,
so it works with any scorer and any data source).  With score s_k at attempt k (from 0),
N = ``--retry-attempts``, γ = ``--retry-discount`` and c = ``--retry-correct``:

    s_k >= c            done, reward s_k · γ^k             (a correct answer)
    s_k < c, k < N - 1  reply ``--retry-feedback`` (a user message), no reward
    s_k < c, k = N - 1  done, reward s_k · γ^k             (the last attempt)

An unscored turn (``None``: the scorer could not score it) counts as wrong, and an
unscored last attempt gives no reward, so the episode stays unscored (NaN).  When
``--max-turns`` < N, an episode cut at ``--max-turns`` gets no reward from the environment
and the run's scorer scores its last answer (undiscounted).
"""

from __future__ import annotations

from relax_core.environments import Reply, Turn


class Retry:
    def __init__(self, attempts: int, discount: float, correct: float, feedback: str):
        self.attempts, self.discount, self.correct, self.feedback = attempts, discount, correct, feedback

    def start(self, row: dict) -> "RetryEpisode":
        return RetryEpisode(self)


class RetryEpisode:
    def __init__(self, env: Retry):
        self.env = env

    def step(self, turn: Turn) -> Reply:
        env, s = self.env, turn.score
        right = s is not None and s >= env.correct
        if right or turn.index >= env.attempts - 1:
            return Reply(done=True, reward=None if s is None else s * env.discount ** turn.index)
        return Reply(messages=({"role": "user", "content": env.feedback},))


def build(params, config) -> Retry:
    return Retry(params.attempts, params.discount, params.correct, params.feedback)
