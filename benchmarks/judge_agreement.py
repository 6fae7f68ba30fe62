"""The default model (SmolLM2-135M-Instruct) as a temperature-0 ``llm_judge`` on the default
arithmetic task, checked against the task's rule scorer (``reasoning_gym``'s own
``score_answer``) on the same responses (issue 22).

The responses are the default model's own answers to the default task's prompts (the
``hf`` engine, temperature 1, the run's prompt building: chat template and the task's
suffix), so about half are right.  Each is scored by the rule and by the judge (default
template and verdict words, greedy, one ``generate`` call for the whole batch); the
table is the confusion of the two (judge yes / no / invalid against rule 1 / 0), the
agreement on the responses with a valid verdict, and Cohen's kappa (agreement beyond
chance, Cohen 1960).

Run:  .venv/bin/python benchmarks/judge_agreement.py [--n 200] [--judge-model DIR] [--smoke]
Results of one run are kept in benchmarks/results/judge_agreement-20261202.txt.
"""

from __future__ import annotations

import argparse
import os
import time


def kappa(confusion: dict[tuple[int, int], int]) -> float:
    """Cohen's kappa of two binary raters from ``{(rule, judge): count}``: (p_o - p_e) / (1 - p_e)."""
    n = sum(confusion.values())
    if n == 0:
        return float("nan")
    p_o = (confusion.get((1, 1), 0) + confusion.get((0, 0), 0)) / n
    rule1 = (confusion.get((1, 1), 0) + confusion.get((1, 0), 0)) / n
    judge1 = (confusion.get((1, 1), 0) + confusion.get((0, 1), 0)) / n
    p_e = rule1 * judge1 + (1 - rule1) * (1 - judge1)
    return float("nan") if p_e == 1 else (p_o - p_e) / (1 - p_e)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200, help="responses (prompts x --samples)")
    ap.add_argument("--samples", type=int, default=2, help="responses per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--judge-model", default=None, help="the judge (--llm-judge-model; default: the default model)")
    ap.add_argument("--smoke", action="store_true",
                    help="the tiny random model as policy and judge, 4 responses of 8 tokens (checks the script runs)")
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from relax_core.config import RunConfig
    from relax_core.contracts import SamplingParams
    from relax_core.data import encode_prompts, load_dataset
    from relax_core.host.plugins import default_registry
    from relax_llm_judge.plugin import LLMJudgeParams
    from relax_llm_judge.scorer import LLMJudge

    reg = default_registry()
    cfg = RunConfig()
    if a.smoke:
        import tempfile

        from relax_authoring.testing.models import make_tiny_model

        a.n, a.max_new_tokens = 4, 8
        cfg = RunConfig(model=str(make_tiny_model(tempfile.mkdtemp(prefix="judge-smoke-"), seed=0)))
        a.judge_model = cfg.model
    data = load_dataset(cfg.data, cfg, reg)
    rows = data.rows[: (a.n + a.samples - 1) // a.samples]
    engine = reg.get("engine", "hf").spec.build(None, cfg)
    texts, ids = encode_prompts([r["prompt"] for r in rows], engine.tokenizer, cfg)
    rep = [i for i in range(len(rows)) for _ in range(a.samples)][: a.n]
    t0 = time.perf_counter()
    out = engine.generate([ids[i] for i in rep], SamplingParams(temperature=1.0, max_new_tokens=a.max_new_tokens,
                                                                seed=cfg.seed))
    t_gen = time.perf_counter() - t0
    responses = list(out.responses)
    labels = [rows[i]["label"] for i in rep]
    metas = [{**rows[i]["metadata"], "prompt": texts[i]} for i in rep]
    rule = reg.get("reward", "reasoning_gym").spec.build(None, cfg)
    rule_scores = [rule(r, lab, m) for r, lab, m in zip(responses, labels, metas)]
    judge = LLMJudge(LLMJudgeParams(model=a.judge_model), cfg)
    t0 = time.perf_counter()
    judged = judge(responses, labels, metas)
    t_judge = time.perf_counter() - t0
    invalid = judge.pop_counts()["invalid"]
    confusion: dict[tuple[int, int], int] = {}
    for r, j in zip(rule_scores, judged):
        if r is not None and j is not None:
            key = (int(r >= 1), int(j >= 1))
            confusion[key] = confusion.get(key, 0) + 1
    valid = sum(confusion.values())
    agree = confusion.get((1, 1), 0) + confusion.get((0, 0), 0)
    print(f"# llm_judge ({a.judge_model or cfg.model}, greedy, default template) vs the reasoning_gym rule on {len(responses)} "
          f"responses of {cfg.model} to {len(rows)} prompts of {cfg.data}; {os.cpu_count()} CPUs")
    print(f"# generation {t_gen:.1f} s, judging {t_judge:.1f} s (one generate call)")
    print(f"{'':12} {'judge yes':>9} {'judge no':>9} {'invalid':>8}")
    for r in (1, 0):
        inv = sum(1 for x, j in zip(rule_scores, judged) if x is not None and int(x >= 1) == r and j is None)
        print(f"{'rule ' + str(r):12} {confusion.get((r, 1), 0):9d} {confusion.get((r, 0), 0):9d} {inv:8d}")
    print(f"agreement {agree}/{valid} = {agree / valid if valid else float('nan'):.3f} on valid verdicts; "
          f"invalid {invalid}/{len(responses)}; Cohen's kappa {kappa(confusion):.3f}; "
          f"rule accuracy {sum(1 for x in rule_scores if x and x >= 1) / len(responses):.3f}")


if __name__ == "__main__":
    main()
