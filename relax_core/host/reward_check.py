"""Does the run's scorer reward a correct answer?  Two checks against a silent 0-reward run.

A scorer that never rewards (it reads ``\\boxed{}`` while the prompts ask for a bare number,
the label key points at the wrong field, ...) trains on nothing but looks like a run.

- :func:`label_check`, before any model loads (``relax train`` and ``--dry-run``): the first
  rows of each dataset are scored with their own label as the response, bare and inside
  ``\\boxed{}``, through the reward worker pool with ``--reward-timeout`` like every score
  (a scorer that raises or hangs is counted, never trusted to return); such calls carry
  ``metadata["label_check"] = True``.  When no row's label scores in either form a correct answer cannot score,
  and the run is refused (exit 2); when only the boxed form scores while the prompts do not
  ask for a box, or some rows' labels cannot score, it warns.
- :class:`RewardWatch`, during the run: wraps the run's batch score function and warns once
  when every sample of the first score calls got the same reward (all 0, all equal, or all
  unscored), naming the scorer and showing one response, its label and the answer the
  scorer extracted, with what to try.

- :func:`bad_response_probe`, before training: a model-based scorer (``RewardScorerSpec.model_based``:
  a reward model, an LLM judge) scores known-bad responses (empty, the prompt echoed, a
  refusal, the bare label where the prompt asks for reasoning); a warning lists those that
  score as high as a correct answer.

A scorer function may expose ``extract_answer(response, label, metadata) -> str | None``
(the answer text it compares with the label); the warning shows it.  Scorers whose spec sets
``self_check=False`` (calls to a remote service) are not scored on labels.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping, Sequence

#: Rows of each dataset whose labels :func:`label_check` scores.
CHECK_ROWS = 8
#: Score calls (steps, evaluations) :class:`RewardWatch` looks at before it decides.
WATCH_CALLS = 2


def what_to_try(scorer_name: str, specs: Mapping[str, Any]) -> str:
    """The fixes worth trying when scorer ``scorer_name`` does not reward correct answers: the
    other installed scorers' ``suggest`` (by name), this scorer's own ``fixes``, then a
    prompt suffix and the label key.

    Args:
        scorer_name: the scorer that rewards nothing.
        specs: the installed scorers, name -> :class:`~relax_core.specs.RewardScorerSpec`.
    """
    own = specs.get(scorer_name)
    hints = [spec.suggest for name, spec in sorted(specs.items()) if name != scorer_name and spec.suggest]
    hints += list(own.fixes if own is not None else ())
    hints.append("a --prompt-suffix that asks for the form the scorer reads (e.g. ' Put the final answer in "
                 "\\boxed{}.')")
    hints.append("a --label-key that names the answer field")
    return "try: " + "; or ".join(hints)


def _candidates(label: Any) -> list[str]:
    text = str(label).strip()
    return [text, f"\\boxed{{{text}}}"]


def _asks_for_box(row: dict, cfg: Any) -> bool:
    return "boxed" in (getattr(cfg, "system_prompt", None) or "") + row["prompt"]


def label_check(scorer: Any, datasets: Sequence[tuple[str, Any]], cfg: Any) -> tuple[list[str], list[str]]:
    """Score the first :data:`CHECK_ROWS` labels of each dataset through the run's scorer, in
    the reward worker pool (:func:`relax_core.stages.rewarding.score_batch`, ``--reward-timeout``,
    ``--reward-num-workers``).

    Args:
        scorer: the run's :class:`~relax_core.stages.rewarding.Scorer` (its ``check`` has passed).
        datasets: ``(flag, Dataset)`` pairs, e.g. ``[("--data", train), ("--eval-data", ev)]``.
        cfg: the run config (``system_prompt``, ``reward_timeout``, ``reward_num_workers``).

    Returns:
        ``(problems, warnings)``: problems refuse the run (exit 2), warnings are printed.
    """
    problems: list[str] = []
    warnings: list[str] = []
    for flag, ds in datasets:
        by_name: dict[str, list[dict]] = {}
        for row in ds.rows:
            rows = by_name.setdefault(scorer.name_for(row["metadata"]), [])
            if len(rows) < CHECK_ROWS:
                rows.append(row)
        for name, rows in by_name.items():
            spec = scorer.specs.get(name)
            if spec is not None and not getattr(spec, "self_check", True):
                continue
            from relax_core.stages.rewarding import score_batch

            texts = [t for row in rows for t in _candidates(row["label"])]
            labels = [row["label"] for row in rows for _ in range(2)]
            metas = [{**row["metadata"], "label_check": True} for row in rows for _ in range(2)]
            prompts = [row["prompt"] for row in rows for _ in range(2)]
            got, stats = score_batch(scorer, texts, labels, metas, timeout=cfg.reward_timeout,
                                     num_workers=cfg.reward_num_workers, prompts=prompts)
            failed = stats["reward_errors"] + stats["reward_timeouts"]
            bare_ok, boxed_ok, unscored = [], [], []
            for bare, boxed in zip(got[0::2], got[1::2]):
                bare_ok.append(bool(bare and bare > 0))
                boxed_ok.append(bool(boxed and boxed > 0))
                unscored.append(bare is None and boxed is None)
            first = rows[0]
            label = str(first["label"])
            where = f"reward scorer '{name}' on {flag} {ds.name}"
            if failed:  # the run counts such failures per sample; here they are only worth a warning
                warnings.append(f"{where}: {stats['reward_errors']} error(s) and {stats['reward_timeouts']} "
                                f"timeout(s) (--reward-timeout {cfg.reward_timeout} s) scoring labels as the "
                                "response; the label check is skipped for it")
            elif not any(bare_ok) and not any(boxed_ok):
                why = ("cannot score the labels at all (it returns None: not an answer it can read)"
                       if all(unscored) else f"gives 0 to the label itself ('{label}') and to '\\boxed{{{label}}}'")
                problems.append(f"{where}: a correct answer cannot score: it {why}; "
                                f"{what_to_try(name, scorer.specs)}")
            elif not all(a or b for a, b in zip(bare_ok, boxed_ok)):
                n_bad = sum(not (a or b) for a, b in zip(bare_ok, boxed_ok))
                warnings.append(f"{where}: {n_bad} of the first {len(rows)} labels cannot score even as the "
                                f"answer itself; check those rows' labels")
            elif not any(bare_ok) and not any(_asks_for_box(r, cfg) for r in rows):
                warnings.append(f"{where}: rewards '\\boxed{{{label}}}' but not the bare answer '{label}', and the "
                                f"prompts do not ask for a box: a model that answers in words scores 0; {what_to_try(name, scorer.specs)}")
    return problems, warnings


#: Rows of the training data whose prompts :func:`bad_response_probe` uses.
PROBE_ROWS = 4
#: The known-bad responses of the probe: name -> response, from the row's prompt and label.
BAD_RESPONSES: dict[str, Callable[[str, Any], str]] = {
    "empty": lambda prompt, label: "",
    "prompt echoed": lambda prompt, label: prompt,
    "refusal": lambda prompt, label: "I'm sorry, but I can't help with that request.",
    "bare label": lambda prompt, label: str(label).strip(),
}
_REASONING = re.compile(r"step[- ]by[- ]step|show (your|the|all) (work|steps|reasoning)|explain|justify|reason",
                        re.IGNORECASE)


def _needs_reasoning(prompt: str, cfg: Any) -> bool:
    """The prompt (or the system prompt) asks for reasoning, so the bare label is a bad answer."""
    return bool(_REASONING.search((getattr(cfg, "system_prompt", None) or "") + "\n" + prompt))


def bad_response_probe(scorer: Any, train_data: Any, cfg: Any) -> list[str]:
    """Score known-bad responses with the run's model-based scorers and warn when they score
    as high as a correct answer.

    For the first :data:`PROBE_ROWS` training rows whose scorer's spec is ``model_based``
    (a reward model, an LLM judge), the scorer scores a correct answer (``"The answer is
    <label>."``) and the :data:`BAD_RESPONSES`: empty, the prompt echoed, a refusal, and the
    bare label when the prompt asks for reasoning; through the reward workers like every
    score (:func:`relax_core.stages.rewarding.score_batch`, ``--reward-timeout``).  A bad
    response is flagged on a row when it scores at least as much as the correct answer
    there.  Never refuses the run: a learned score may be right to like a bare label.

    Returns:
        Warning lines (empty when nothing is flagged or no scorer is model-based).
    """
    from relax_core.stages.rewarding import score_batch

    by_name: dict[str, list[dict]] = {}
    for row in train_data.rows:
        name = scorer.name_for(row["metadata"])
        if not getattr(scorer.specs.get(name), "model_based", False):
            continue
        rows = by_name.setdefault(name, [])
        if len(rows) < PROBE_ROWS:
            rows.append(row)
    warnings = []
    for name, rows in by_name.items():
        cases = [(j, kind, make(row["prompt"], row["label"])) for j, row in enumerate(rows)
                 for kind, make in (("correct", lambda p, lab: f"The answer is {str(lab).strip()}."),
                                    *BAD_RESPONSES.items())
                 if kind != "bare label" or _needs_reasoning(row["prompt"], cfg)]
        got, stats = score_batch(scorer, [c[2] for c in cases], [rows[c[0]]["label"] for c in cases],
                                 [rows[c[0]]["metadata"] for c in cases], timeout=cfg.reward_timeout,
                                 num_workers=cfg.reward_num_workers, prompts=[rows[c[0]]["prompt"] for c in cases])
        reference = {j: r for (j, kind, _), r in zip(cases, got) if kind == "correct"}
        flagged: dict[str, int] = {}
        probed: dict[str, int] = {}  # rows where the bad response and the correct answer both scored
        for (j, kind, _), r in zip(cases, got):
            if kind != "correct" and r is not None and reference.get(j) is not None:
                probed[kind] = probed.get(kind, 0) + 1
                if r >= reference[j]:
                    flagged[kind] = flagged.get(kind, 0) + 1
        if stats["reward_errors"] or stats["reward_timeouts"]:
            warnings.append(f"reward scorer '{name}': {stats['reward_errors']} error(s) and {stats['reward_timeouts']} "
                            f"timeout(s) (--reward-timeout {cfg.reward_timeout} s) scoring the bad-response probe")
        if flagged:
            which = ", ".join(f"{kind} ({n} of {probed[kind]} prompts)" for kind, n in flagged.items())
            warnings.append(f"model-based reward scorer '{name}' scores known-bad responses as high as a correct "
                            f"answer ('The answer is <label>.'): {which}; the policy can learn to game it: check "
                            f"the model, or combine it with a rule scorer (e.g. --reward math --reward {name} "
                            "--reward-weights 1,0.5)")
    return warnings


def extracted(fn: Any, response: str, label: Any, metadata: dict) -> str:
    """The answer ``fn`` reads in ``response`` (its ``extract_answer``), for messages."""
    extract = getattr(fn, "extract_answer", None)
    if extract is None:
        return "(this scorer does not say)"
    try:
        found = extract(response, label, metadata)
    except Exception as e:  # only for a message
        return f"({type(e).__name__}: {e})"
    return "none found" if found is None else repr(found)


ScoreFn = Callable[[list[str], list[Any], list[dict], list[str]], tuple[list[Any], dict[str, float]]]


class RewardWatch:
    """A batch score function that also warns when the first steps all score the same.

    Args:
        score: ``score(responses, labels, metadata, prompts) -> (rewards, metrics)``.
        scorers: the run's :class:`~relax_core.stages.rewarding.Scorer` objects, one per ``--reward``
            (names and extraction).
        notify: called once with the warning text.
        calls: score calls to look at (each is one training step or one evaluation).
    """

    def __init__(self, score: ScoreFn, scorers: Sequence[Any], notify: Callable[[str], None], calls: int = WATCH_CALLS):
        self.score = score
        self.scorers = list(scorers)
        self.notify = notify
        self.calls = calls
        self.seen = 0
        self.values: set[float | None] = set()
        self.example: tuple[str, Any, dict] | None = None

    def __call__(self, responses: list[str], labels: list[Any], metadata: list[dict],
                 prompts: list[str]) -> tuple[list[Any], dict[str, float]]:
        rewards, metrics = self.score(responses, labels, metadata, prompts)
        if self.seen < self.calls and rewards:
            self.seen += 1
            self.values |= {None if r is None else float(r) for r in rewards}
            if self.example is None:
                self.example = (responses[0], labels[0], metadata[0] or {})
            if self.seen == self.calls and len(self.values) == 1:
                self.notify(self.message())
        return rewards, metrics

    def message(self) -> str:
        """The warning: which scorer, what every sample scored, one example, what to try."""
        (value,) = self.values
        response, label, meta = self.example
        names = [s.name_for(meta) for s in self.scorers]
        got = "was unscored (the scorer returned None)" if value is None else f"scored {value:g}"
        hint = what_to_try(names[0], self.scorers[0].specs) if value is None or value <= 0 else (
            "every sample is already rewarded: use harder prompts (or a stricter scorer)")
        short = response if len(response) <= 200 else response[:200] + "…"
        answers = "; ".join(f"answer {'the scorer' if len(names) == 1 else repr(n)} extracted: "
                            f"{extracted(s.resolve(meta), response, label, meta)}" for n, s in zip(names, self.scorers))
        which = f"reward scorer '{names[0]}'" if len(names) == 1 else "reward scorers " + ", ".join(f"'{n}'" for n in names)
        return (f"warning: every sample of the first {self.calls} scored batches {got} with {which}: the estimator "
                f"gets no signal from identical rewards.\n"
                f"  response: {short!r}\n  label: {label!r}; {answers}\n  {hint}")
