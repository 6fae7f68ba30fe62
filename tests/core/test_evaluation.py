"""Evaluation metrics against hand-derived values (relax_core.evaluation.metrics)."""

from __future__ import annotations

import math

import pytest
import torch

from relax_core.evaluation.metrics import Z95, estimate, majority_correct, pass_at_k, sample_metrics


def test_pass_at_k_pinned_values():
    n, c = torch.tensor([10]), torch.tensor([3])
    assert pass_at_k(n, c, 1).item() == pytest.approx(0.3, abs=1e-12)
    # 1 - C(7,5)/C(10,5) = 1 - 21/252
    assert pass_at_k(n, c, 5).item() == pytest.approx(1 - 21 / 252, abs=1e-12)
    assert round(pass_at_k(n, c, 5).item(), 6) == 0.916667


def test_pass_at_k_edges_and_mixed_rows():
    # k = 2. n = 10, c = 9 (n - c < k): every draw of 2 holds a correct one; c = 0: none does;
    # n = 4, c = 2: 1 - C(2,2)/C(4,2) = 1 - 1/6; n = 10, c = 8: 1 - C(2,2)/C(10,2) = 1 - 1/45
    n, c = torch.tensor([10, 10, 4, 10]), torch.tensor([9, 0, 2, 8])
    got = pass_at_k(n, c, 2)
    assert got.tolist() == pytest.approx([1.0, 0.0, 1 - 1 / 6, 1 - 1 / 45], abs=1e-12)
    assert got.dtype == torch.float64


def test_pass_at_k_is_stable_where_binomials_overflow():
    # C(2000, 1000) overflows float64; the product form does not: n = 2000, c = 1, k = 1000 → k/n = 0.5
    assert pass_at_k(torch.tensor([2000]), torch.tensor([1]), 1000).item() == pytest.approx(0.5, abs=1e-12)


def test_pass_at_k_rejects_k_above_n_and_bad_counts():
    with pytest.raises(ValueError, match="1 <= k <= the samples per prompt"):
        pass_at_k(torch.tensor([4]), torch.tensor([1]), 5)
    with pytest.raises(ValueError, match=r"\[0, n\]"):
        pass_at_k(torch.tensor([4]), torch.tensor([5]), 1)


def test_majority_vote_with_a_tie_takes_the_answer_seen_first():
    # prompt 0: "7" and "5" two votes each; "5" appears first (sample 0), and sample 0 is wrong → 0
    # prompt 1: the same votes with "7" first; sample 0 (the first "7") is right → 1
    # prompt 2: no answers at all → 0; prompt 3: "3" wins 2 to 1 and its first sample is right → 1
    # (answers compare after stripping white space: " 7" is "7")
    answers = [["5", "7", " 7", "5"], ["7", "5", "5 ", "7"], [None, None, None, None], ["3", None, "4", "3 "]]
    correct = torch.tensor([[0, 1, 1, 0], [1, 0, 0, 1], [0, 0, 0, 0], [1, 0, 0, 1]], dtype=torch.bool)
    assert majority_correct(answers, correct, 4).tolist() == [0.0, 1.0, 0.0, 1.0]
    # only the first k vote: maj@1 is the first sample with an answer
    assert majority_correct(answers, correct, 1).tolist() == [0.0, 1.0, 0.0, 1.0]
    # first 3: prompt 0 "7" wins 2 to 1 (sample 1, right); prompt 1 "5" wins 2 to 1 (sample 1, wrong);
    # prompt 3 is a 1-1 tie of "3" and "4": "3" came first (right)
    assert majority_correct(answers, correct, 3).tolist() == [1.0, 0.0, 0.0, 1.0]


def test_estimate_on_a_hand_computed_example():
    # values 1, 0, 1, 1: mean 0.75; sample variance (3·0.25² + 0.75²)/3 = 0.25, sd 0.5, se 0.5/2 = 0.25
    e = estimate(torch.tensor([1.0, 0.0, 1.0, 1.0]))
    assert (e.mean, e.se) == pytest.approx((0.75, 0.25), abs=1e-12)
    assert (e.low, e.high) == pytest.approx((0.75 - 0.25 * 1.959964, 0.75 + 0.25 * 1.959964), abs=1e-6)
    assert Z95 == pytest.approx(1.96, abs=1e-3)
    assert math.isnan(estimate(torch.tensor([1.0])).se) and estimate(torch.tensor([1.0])).mean == 1.0


def test_sample_metrics_average_per_prompt_then_over_prompts():
    rewards = torch.tensor([[1.0, 0.0], [1.0, float("nan")], [0.5, 1.0]])
    lengths = torch.tensor([[4, 6], [10, 2], [1, 1]])
    truncated = torch.tensor([[False, True], [False, False], [False, False]])
    m = sample_metrics(rewards, lengths, truncated)
    # accuracy per prompt 0.5, 0.5, 0.5 → mean 0.5, se 0; NaN reward counts 0: 0.5, 0.5, 0.75
    assert (m["accuracy"].mean, m["accuracy"].se) == pytest.approx((0.5, 0.0))
    assert m["reward_mean"].mean == pytest.approx((0.5 + 0.5 + 0.75) / 3)
    assert m["response_len"].mean == pytest.approx((5 + 6 + 1) / 3)
    assert m["truncated_ratio"].mean == pytest.approx(0.5 / 3)


class _FakeRollout:
    """Records the sampling of each generate() call; sampled rewards are fixed per prompt."""

    def __init__(self, rewards: dict[int, list[float]]):
        self.rewards, self.calls = rewards, []

    def generate(self, rows, indices, n, sampling, group_offset):
        from types import SimpleNamespace

        self.calls.append((n, sampling))
        rep = [i for i in indices for _ in range(n)]
        r = [self.rewards[n][j] for j in range(len(rep))]
        return SimpleNamespace(size=len(rep), prompt_index=torch.tensor(rep), prompts=[f"p{i}" for i in rep],
                               responses=[str(int(x)) for x in r], labels=["1"] * len(rep), metadata=[{}] * len(rep),
                               rewards=torch.tensor(r), response_lengths=torch.full((len(rep),), 3),
                               truncated=torch.zeros(len(rep), dtype=torch.bool))

    def score(self, batch):
        return batch, {}


class _Scorer:
    def resolve(self, meta):
        fn = lambda response, label, metadata: float(response == label)  # noqa: E731
        fn.extract_answer = lambda response, label, metadata: response
        return fn


def test_eval_sampling_is_its_own_not_the_runs():
    from cli.eval import EvalSet, EvalSettings, evaluate_set

    # greedy: prompt 0 right, prompt 1 wrong; sampled (n = 4): prompt 0 right twice, prompt 1 never
    fake = _FakeRollout({1: [1.0, 0.0], 4: [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]})
    settings = EvalSettings(n_samples=4, pass_k=(1, 2), temperature=1.3, top_p=0.5, seed=11, max_prompts=2)
    ev = EvalSet("s", "src", type("D", (), {"rows": [{}, {}, {}]})())  # 3 rows, the first 2 evaluated
    metrics, records = evaluate_set(fake, _Scorer(), ev, settings, max_len=5, stop=("###",))
    (n0, greedy), (n1, sampled) = fake.calls
    assert (n0, greedy.temperature, greedy.max_new_tokens, greedy.stop) == (1, 0.0, 5, ("###",))
    assert (n1, sampled.temperature, sampled.top_p, sampled.max_new_tokens, sampled.seed) == (4, 1.3, 0.5, 5, 11)
    assert metrics["greedy"]["pass@1"]["mean"] == 0.5
    s = metrics["sampled"]
    # per prompt accuracy 0.5 and 0: mean 0.25, se = sd(0.5, 0)/sqrt(2) = 0.25
    assert (s["accuracy"]["mean"], s["accuracy"]["se"]) == pytest.approx((0.25, 0.25))
    assert s["pass@2"]["mean"] == pytest.approx((1 - 1 / 6) / 2)  # prompt 0: 1 - C(2,2)/C(4,2)
    # maj@2: prompt 0's first two, "1" and "0", tie 1-1 and "1" (sample 0, right) came first; prompt 1 all "0"
    assert s["maj@2"]["mean"] == 0.5 and s["maj@1"]["mean"] == 0.5
    assert len(records) == 2 + 8 and records[0]["answer"] == "1"
