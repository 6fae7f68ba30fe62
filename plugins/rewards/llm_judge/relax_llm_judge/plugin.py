"""Hook implementation of relax-llm-judge (registration only; nothing heavy imported)."""

import re
from dataclasses import dataclass

from relax_core import RewardScorerSpec, hookimpl, param

#: The default judge prompt: is the response's final answer the reference answer?
DEFAULT_TEMPLATE = (
    "You are grading a student's answer against the reference answer.\n\n"
    "Reference answer: {reference}\n\n"
    "Student's response:\n{response}\n\n"
    "Is the final answer of the student's response equal to the reference answer? "
    "Reply with one word: yes or no.")
PLACEHOLDERS = ("prompt", "response", "reference")


def parse_verdicts(text: str) -> dict[str, float]:
    """``"yes:1,no:0"`` → ``{"yes": 1.0, "no": 0.0}`` (words lower-cased).

    Raises:
        ValueError: an entry that is not ``word:number``, a repeated word, or none.
    """
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        word, sep, score = part.rpartition(":")
        word = word.strip().lower()
        if not sep or not re.fullmatch(r"\w+", word):
            raise ValueError(f"'{part}' is not word:score")
        if word in out:
            raise ValueError(f"'{word}' given twice")
        out[word] = float(score)
    if not out:
        raise ValueError("no verdict word")
    return out


@dataclass(frozen=True)
class LLMJudgeParams:
    model: str | None = param(None, "The judge model (a name --model accepts: the embedded default, a local "
                              "directory); default: --model, a separate copy of it.")
    engine: str = param("hf", "The rollout engine plugin that runs the judge (a separate instance of it, with "
                        "that engine's own flags).")
    device: str = param("cpu", "Device of the judge engine (each reward worker builds its own).",
                        choices=("cpu", "cuda"))
    template: str = param(DEFAULT_TEMPLATE, "The judge's user message, with {prompt} (the prompt as the policy saw "
                          "it), {response} and {reference} (the label); the judge model's chat template wraps it.")
    verdicts: str = param("yes:1,no:0", "Verdict words and their rewards: the first of these words (whole word, "
                          "any case) in the judge's reply is the verdict.")
    temperature: float = param(0.0, "Judge sampling temperature (0: greedy, deterministic).", ge=0)
    max_new_tokens: int = param(8, "Tokens the judge may write.", unit="tokens", ge=1)
    max_response_chars: int = param(4000, "Characters of the response shown to the judge; a longer response "
                                    "keeps its end (where the final answer is).", unit="characters", ge=1)

    def problems(self) -> list[tuple[str, str]]:
        out = []
        try:
            parse_verdicts(self.verdicts)
        except ValueError as e:
            out.append((f"--llm-judge-verdicts {self.verdicts!r}: {e}", "give word:score pairs, e.g. yes:1,no:0"))
        try:
            fields = {f for _, f, _, _ in __import__("string").Formatter().parse(self.template) if f is not None}
        except ValueError as e:
            fields = set()
            out.append((f"--llm-judge-template cannot be formatted: {e}", "escape literal braces as {{ }}"))
        unknown = sorted(fields - set(PLACEHOLDERS))
        if unknown:
            out.append((f"--llm-judge-template names {', '.join('{' + f + '}' for f in unknown)}",
                        f"use only {', '.join('{' + p + '}' for p in PLACEHOLDERS)}"))
        elif "response" not in fields:
            out.append(("--llm-judge-template has no {response}: the judge would not see what it grades",
                        "put {response} in the template"))
        return out


@hookimpl
def relax_register_reward_scorers():
    return [RewardScorerSpec(
        name="llm_judge",
        summary="A generative judge (through a rollout engine plugin, greedy by default) grades each response "
                "against its reference; unparseable verdicts are unscored and counted.",
        source="Zheng et al. 2023, 'Judging LLM-as-a-Judge with MT-Bench and Chatbot Arena', §3.1 "
               "(reference-guided grading)",
        factory="relax_llm_judge.scorer:build",
        params=LLMJudgeParams,
        batched=True,
        self_check=False,  # a model: scoring labels loads it; the bad-response probe checks it instead
        model_based=True,
        counts=("invalid",),
    )]
