"""The ``math`` and ``gsm8k`` scorers: every value pinned by issue 6, the GSM8K reference
solutions, and registration."""

import json
from pathlib import Path

import pytest

from relax_math.plugin import MathParams, relax_register_reward_scorers
from relax_math.scorers import MathScorer, final_answer, gsm8k_score, label_text

# ../shared/data next to the repository (shared data; never copied into the repo)
GSM8K_TEST = Path(__file__).resolve().parents[4].parent / "shared" / "data" / "gsm8k" / "test.jsonl"

strict = MathScorer()
anchors = MathScorer(answer_format="anchors")


@pytest.mark.parametrize("response, label, expected", [
    ("so the result is \\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0),
    ("so the result is \\boxed{\\frac{1}{2}}", "\\frac{1}{3}", 0.0),
    ("\\boxed{2^{10}}", "1024", 1.0),
    ("so the result is \\boxed{\\frac{1}{2}", "\\frac{1}{2}", 0.0),   # unclosed: truncated
    ("First \\boxed{5}. No, that is wrong: \\boxed{7}.", "7", 1.0),
    ("First \\boxed{5}. No, that is wrong: \\boxed{7}.", "5", 0.0),
    ("First \\boxed{5}. No, that is wrong: \\boxed{7", "5", 0.0),     # never the retracted box
    ("\\fbox{42}", "42", 1.0),
    ("\\boxed{115,000}", "115000", 1.0),
    ("\\boxed{\\$1,234.00}", "1234", 1.0),
    ("\\boxed{\\frac12}", "\\frac{1}{2}", 1.0),
    ("\\boxed{\\dfrac{3}{4}}", "0.75", 1.0),
    ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
    ("\\boxed{\\text{13}}", "13", 1.0),
    ("\\boxed{\\text{E}}", "E", 1.0),
    ("\\boxed{\\text{D}}", "E", 0.0),
    ("<answer>\\boxed{42}</answer>", "42", 1.0),
    ("\\boxed{x+1}", "1+x", 1.0),
    # the same values with numeric labels, as the issue writes them
    ("\\fbox{42}", 42, 1.0),
    ("\\boxed{115,000}", 115000, 1.0),
    ("\\boxed{$1,234.00}", 1234, 1.0),
    ("\\boxed{\\dfrac{3}{4}}", 0.75, 1.0),
    ("\\boxed{\\text{13}}", 13, 1.0),
    ("<answer>\\boxed{42}</answer>", 42, 1.0),
    ("\\boxed{3}", 3, 1.0),
    ("\\boxed{3}", 3.0, 1.0),
    ("\\boxed{4}", 3, 0.0),
    ("The answer is 42.", "42", 0.0),                                # strict: no box
    ("", "42", 0.0),
])
def test_math_pinned_values(response, label, expected):
    assert strict(response, label, {}) == expected


def test_answer_anchor_only_when_allowed():
    response = "Let me think step by step.\nAnswer: $13$"
    assert strict(response, "13", {}) == 0.0
    assert anchors(response, "13", {}) == 1.0
    assert anchors(response, "14", {}) == 0.0
    assert (strict(response, 13, {}), anchors(response, 13, {})) == (0.0, 1.0)
    assert anchors("<answer>42</answer>", "42", {}) == 1.0
    assert strict("<answer>42</answer>", "42", {}) == 0.0
    # a box wins over an anchor
    assert anchors("\\boxed{5}\nAnswer: 6", "5", {}) == 1.0


@pytest.mark.parametrize("label", ["see figure", "", "   ", None, True, float("nan")])
def test_unparseable_label_is_unscored(label):
    assert label_text(label) is None
    assert strict("\\boxed{1}", label, {}) is None
    assert strict("no box at all", label, {}) is None


def test_label_forms():
    assert label_text("Janet makes 9 * 2 = 18 dollars.\n#### 18") == "18"
    assert label_text("$\\frac{1}{2}$") == "\\frac{1}{2}"
    assert label_text("5 \\text{ cm}") == "5 \\text{ cm}"
    assert strict("\\boxed{5}", "5 \\text{ cm}", {}) == 1.0
    assert strict("\\boxed{18}", "Janet ...\n#### 18", {}) == 1.0


def test_final_answer_extraction():
    assert final_answer("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert final_answer("x \\boxed{\\{1,2\\}} y") == "\\{1,2\\}"
    assert final_answer("\\boxed{\\frac{1}{2}") is None
    assert final_answer("Answer: 7", "boxed") is None
    assert final_answer("Answer: 7", "anchors") == "7"
    assert final_answer("work\n#### 1,234", "anchors") == "1,234"


@pytest.mark.parametrize("response, label, expected", [
    ("Janet sells 9 eggs, so she makes $18 every day.", "She makes 9 * 2 = $<<9*2=18>>18.\n#### 18", 1.0),
    ("so she makes $19 every day.", "...\n#### 18", 0.0),
    ("The house costs 115,000 dollars", "115000", 1.0),
    ("The house costs 115,000 dollars", 115000, 1.0),
    ("That is $1,234.00 in total", "1234", 1.0),
    ("That is $1,234.00 in total", 1234, 1.0),
    ("I think \\boxed{18} (not 20)", "#### 18", 1.0),
    ("\\boxed{18 \\text{ dollars}}", 18, 1.0),
    ("2 + -1 = -1", "-1", 1.0),
    ("no number here", "18", 0.0),
    ("18", "see figure", None),
])
def test_gsm8k_pinned_values(response, label, expected):
    assert gsm8k_score(response, label, {}) == expected


def _gsm8k_rows(n: int) -> list[dict]:
    if not GSM8K_TEST.is_file():
        pytest.skip(f"GSM8K test split not found at {GSM8K_TEST} (shared data; never copied into the repo)")
    with GSM8K_TEST.open() as f:
        return [json.loads(line) for _, line in zip(range(n), f)]


def test_gsm8k_reference_solutions_score_1_and_perturbed_0():
    rows = _gsm8k_rows(200)
    assert len(rows) == 200
    for row in rows:
        solution = row["answer"]
        body, final = solution.rsplit("####", 1)
        gold = float(final.strip().replace(",", ""))
        wrong = f"{body}#### {gold + 1:g}"
        # gsm8k scorer: the raw solution against its own label (and a perturbed answer)
        assert gsm8k_score(solution, solution, {}) == 1.0, solution
        assert gsm8k_score(wrong, solution, {}) == 0.0, wrong
        # math scorer: the final line boxed, against the label's number (math-verify path)
        boxed = f"{body}\\boxed{{{final.strip()}}}"
        assert strict(boxed, solution, {}) == 1.0, boxed
        assert strict(f"{body}\\boxed{{{gold + 1:g}}}", solution, {}) == 0.0
        # math scorer in anchors mode accepts the raw '#### N' solution
        assert anchors(solution, final.strip(), {}) == 1.0
        assert strict(solution, final.strip(), {}) == 0.0  # strict: no box


def test_registration_and_build():
    specs = {s.name: s for s in relax_register_reward_scorers()}
    assert set(specs) == {"math", "gsm8k"}
    m = specs["math"].build(MathParams(answer_format="anchors"), None)
    assert m("Answer: 4", "4", {}) == 1.0
    assert specs["math"].build(None, None)("Answer: 4", "4", {}) == 0.0
    g = specs["gsm8k"].build(None, None)
    assert g("it is 4", "#### 4", {}) == 1.0


@pytest.mark.parametrize("response, label", [
    # exact rationals that differ below ~1e-15: math-verify's chopped numeric difference said equal
    ("\\boxed{\\frac{1}{10^{20}}}", "\\frac{3}{10^{20}}"),
    ("\\boxed{\\frac{1}{2^{98}}}", "\\frac{1}{2^{99}}"),                      # Math-Verify issue #14
    ("\\boxed{\\frac{1}{2006!}}", "\\frac{1}{2004!}"),                        # Math-Verify issue #14
    ("\\boxed{\\frac{1}{3 \\cdot 2^{2006}}}", "\\frac{2^{2005}+1}{3 \\cdot 2^{2006}}"),  # issue #14
    ("\\boxed{1000001}", "1000000"),                                        # relative 1e-6 said equal
    ("\\boxed{1,000,001}", 1000000),
    # \sqrt( was dropped: 7\sqrt(3) read as 7, in both orders
    ("\\boxed{7}", "7\\sqrt(3)"),
    ("\\boxed{7\\sqrt(3)}", "7"),
    # \mathrm{e} was dropped: 1 - 1/e read as 1 (Math-Verify issue #14)
    ("\\boxed{1 + \\frac{1}{\\mathrm{e}}}", "1 - \\frac{1}{\\mathrm{e}}"),
    # a repeating decimal was read as its fixed part
    ("\\boxed{0}", "0.\\overline{3}"),
])
def test_math_false_positives_are_guarded(response, label):
    assert strict(response, label, {}) == 0.0


@pytest.mark.parametrize("response, label", [
    ("\\boxed{\\frac{3}{10^{20}}}", "\\frac{3}{10^{20}}"),
    ("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}"),
    ("\\boxed{7\\sqrt(3)}", "7\\sqrt{3}"),
    ("\\boxed{\\sqrt(2)}", "\\sqrt 2"),
    ("\\boxed{1 - e^{-1}}", "1 - \\frac{1}{\\mathrm{e}}"),
    ("\\boxed{\\frac{1}{3}}", "0.\\overline{3}"),
    ("\\boxed{\\frac{1}{6}}", "0.1\\overline{6}"),
    ("\\boxed{120}", "5!"),
    ("\\boxed{\\binom{5}{2}}", "10"),
    ("\\boxed{1\\frac{1}{2}}", "\\frac{3}{2}"),
    ("\\boxed{50\\%}", "\\frac{1}{2}"),
    ("\\boxed{1000000}", "1,000,000"),
])
def test_math_guards_keep_equivalent_answers_correct(response, label):
    assert strict(response, label, {}) == 1.0


@pytest.mark.parametrize("response", ["Final Answer: **73**", "**Final Answer:** 73", "Answer: __73__",
                                      "Answer: **$73$**.", "Answer: $73$."])
def test_anchors_strip_markdown_emphasis(response):
    """`Final Answer: **73**` scored 0 against 73 while `Answer: $73$.` scored 1 (issue 18 item 13)."""
    assert anchors(response, "73", {}) == 1.0
    assert anchors(response.replace("73", "74"), "73", {}) == 0.0


def test_gsm8k_integers_compare_exactly():
    assert gsm8k_score("The total is 1,000,001.", "#### 1000000") == 0.0
    assert gsm8k_score("The total is 1,000,000.", "#### 1000000") == 1.0
    assert gsm8k_score("It costs $2.50", "2.5") == 1.0


def test_math_verify_timeout_notice_is_not_printed():
    """math-verify warns once per process that its timeouts are off (Relax enforces
    --reward-timeout itself): one line per reward worker that the user cannot act on."""
    import subprocess
    import sys

    code = ("import logging; logging.basicConfig(); from relax_math.scorers import build_math; "
            "s = build_math(None, None); print(s('\\\\boxed{2}', '2'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "1.0", out.stderr
    assert "Timeout is disabled" not in out.stderr
