"""The ``multiple_choice`` and ``f1`` scorers."""

import pytest

from relax_text.plugin import relax_register_reward_scorers
from relax_text.scorers import chosen_letter, f1_score, multiple_choice_score, token_f1


@pytest.mark.parametrize("response, label, expected", [
    ("\\boxed{\\text{E}}", "E", 1.0),
    ("\\boxed{\\text{E}}", "D", 0.0),
    ("<answer>E</answer>", "E", 1.0),
    ("<answer>(e)</answer>", "E", 1.0),
    ("I compared them all.\nAnswer: C", "C", 1.0),
    ("so the answer is (b).", "B", 1.0),
    ("The answer is a cat, so B", "B", 0.0),       # "a" is a word, not option A: no choice found
    ("(E)", "(E)", 1.0),
    ("E", "e", 1.0),
    ("First \\boxed{A}, no: \\boxed{B}", "B", 1.0),
    ("\\boxed{B) Paris}", "B", 1.0),
    ("I think it is probably the second one", "B", 0.0),
    ("", "B", 0.0),
])
def test_multiple_choice_values(response, label, expected):
    assert multiple_choice_score(response, label, {}) == expected


def test_multiple_choice_label_forms():
    meta = {"choices": ["Rome", "Paris", "Berlin"]}
    assert multiple_choice_score("\\boxed{B}", "Paris", meta) == 1.0
    assert multiple_choice_score("\\boxed{C}", "Paris", meta) == 0.0
    assert multiple_choice_score("\\boxed{B}", "Madrid", meta) is None   # not an option
    assert multiple_choice_score("\\boxed{B}", "see figure", {}) is None
    assert multiple_choice_score("\\boxed{B}", 1, {}) is None


def test_chosen_letter():
    assert chosen_letter("blah <answer>D</answer>") == "D"
    assert chosen_letter("I believe the answer is probably A") is None   # "probably" is not a letter
    assert chosen_letter("Answer: A") == "A"


def test_token_f1_values():
    # P = 2/2 (brown, fox), R = 2/3 (quick, brown, fox; articles removed), F1 = 2PR/(P+R) = 0.8
    f1, p, r = token_f1("the brown fox", "a quick brown fox")
    assert (p, r) == (1.0, pytest.approx(2 / 3)) and f1 == pytest.approx(0.8)
    assert token_f1("Brown, fox!", "brown fox") == (1.0, 1.0, 1.0)
    assert token_f1("yes", "no") == (0.0, 0.0, 0.0)
    assert token_f1("yes it is", "yes") == (0.0, 0.0, 0.0)          # HotpotQA yes/no rule
    assert token_f1("noanswer", "brown") == (0.0, 0.0, 0.0)
    # repeated tokens count with multiplicity: pred "fox fox", gold "fox": P 1/2, R 1, F1 2/3
    assert token_f1("fox fox", "fox")[0] == pytest.approx(2 / 3)


def test_f1_scorer():
    assert f1_score("Well... <answer>the brown fox</answer>", "a quick brown fox", {}) == pytest.approx(0.8)
    assert f1_score("\\boxed{\\text{brown fox}}", "brown fox", {}) == 1.0
    assert f1_score("brown fox", ["red dog", "quick brown fox"], {}) == pytest.approx(0.8)
    assert f1_score("anything", "", {}) is None
    assert f1_score("anything", "the", {}) is None     # nothing left after normalisation
    assert f1_score("anything", None, {}) is None


def test_registration():
    specs = {s.name: s for s in relax_register_reward_scorers()}
    assert set(specs) == {"multiple_choice", "f1"}
    assert specs["multiple_choice"].build(None, None)("\\boxed{A}", "A", {}) == 1.0
    assert specs["f1"].build(None, None)("fox", "fox", {}) == 1.0
