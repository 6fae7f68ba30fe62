"""On-policy distillation, measured on held-out prompts: how far each student is from its
teacher, as the mean full-vocabulary reverse KL per sampled token.

For every prompt of the held-out set, each student samples one completion (temperature 1,
no top-k/top-p, up to ``--max-new-tokens`` tokens, stopping at EOS; seeded), and at every
sampled position t both models' next-token distributions are compared over the whole
vocabulary:

    KL_t(π_s ‖ π_T) = Σ_v π_s(v | y_<t) · (log π_s(v | y_<t) − log π_T(v | y_<t))   (nats)

which is the quantity on-policy distillation minimises (Agarwal et al. 2024, "On-Policy
Distillation of Language Models: Learning from Self-Generated Mistakes", arXiv:2306.13649,
eq. 2 with the reverse KL; the training term is its one-sample estimate on the sampled
token, ``opd/reverse_kl`` in ``metrics.jsonl``).  Reported per student: the mean over all
sampled tokens, the standard error over prompts (each prompt's mean first), and the mean
completion length.  Task accuracy is not measured here: ``relax eval`` (or the run's own
``eval/*`` metrics) gives it on the same set.

    .venv/bin/python benchmarks/distillation.py --teacher DIR --student base=DIR --student opd=RUN/final
    .venv/bin/python benchmarks/distillation.py --smoke     # tiny teacher and a noisy copy of it

The measured run (SmolLM2-135M-Instruct, a teacher trained by ``relax train``, pure
distillation of the base model) is in ``BENCHMARKS.md`` ("On-policy distillation").
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile

import torch

from relax_core.config import DEFAULT_EVAL_DATA, RunConfig


def held_out_prompts(source: str, n: int) -> list[str]:
    """The first ``n`` prompts of the data source ``source`` (a ``--eval-data`` value)."""
    from relax_core.data import load_dataset
    from relax_core.host.plugins import default_registry

    rows = load_dataset(source, RunConfig(), default_registry()).rows
    return [row["prompt"] for row in rows[:n]]


def _left_pad(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def sample(student, prompts: list[list[int]], eos: int, pad: int, max_new_tokens: int,
           chunk: int = 16) -> list[list[int]]:
    """One completion per prompt (token ids), sampled by ``student`` at temperature 1 with no
    top-k/top-p, up to ``max_new_tokens`` tokens, cut after the first ``eos`` (kept)."""
    out: list[list[int]] = []
    for start in range(0, len(prompts), chunk):
        ids, mask = _left_pad(prompts[start:start + chunk], pad)
        with torch.no_grad():
            seq = student.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                                   top_p=1.0, max_new_tokens=max_new_tokens, pad_token_id=pad)
        for row in seq[:, ids.shape[1]:].tolist():
            out.append(row[:row.index(eos) + 1] if eos in row else row)
    return out


def reverse_kl(student, teacher, prompts: list[list[int]], responses: list[list[int]], pad: int,
               chunk: int = 16) -> list[float]:
    """Per prompt, the mean of KL(π_s ‖ π_T) (nats) over the positions of its response, whole
    vocabulary, float32.  Prompt + response rows are left-padded in chunks; position ids
    follow the attention mask, so a row's result does not depend on its neighbours.  An
    empty response gives 0."""
    kls: list[float] = []
    for start in range(0, len(prompts), chunk):
        ps, rs = prompts[start:start + chunk], responses[start:start + chunk]
        ids, mask = _left_pad([p + r for p, r in zip(ps, rs)], pad)
        positions = (mask.cumsum(1) - 1).clamp(min=0)
        with torch.no_grad():
            ls = torch.log_softmax(student(ids, attention_mask=mask, position_ids=positions).logits.float(), -1)
            lt = torch.log_softmax(teacher(ids, attention_mask=mask, position_ids=positions).logits.float(), -1)
        kl = (ls.exp() * (ls - lt)).sum(-1)  # [B, L]: at position j, the distribution of token j + 1
        width = ids.shape[1]
        for row, r in zip(kl, rs):
            # the response's tokens are the last len(r) of the row, predicted at the positions before them
            kls.append(float(row[width - len(r) - 1:width - 1].mean()) if r else 0.0)
    return kls


def measure(student_dir: str, teacher_dir: str, prompts: list[str], max_new_tokens: int,
            seed: int = 0) -> tuple[list[float], list[int]]:
    """Per prompt, the mean reverse KL over the student's sampled tokens (see
    :func:`reverse_kl`) and the number of tokens sampled (EOS included).  Prompts are
    rendered as ``relax train`` renders them (the chat template with a generation prompt)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from relax_core.data import encode_prompts

    tok = AutoTokenizer.from_pretrained(student_dir)
    student = AutoModelForCausalLM.from_pretrained(student_dir, dtype=torch.float32).eval()
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32).eval()
    _, ids = encode_prompts(prompts, tok, RunConfig())
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    torch.manual_seed(seed)
    responses = sample(student, ids, tok.eos_token_id, pad, max_new_tokens)
    return reverse_kl(student, teacher, ids, responses, pad), [len(r) for r in responses]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--teacher", help="the teacher's model directory")
    ap.add_argument("--student", action="append", default=[], metavar="NAME=DIR",
                    help="a student to measure (repeatable), e.g. base=<model dir>, opd=<run>/final")
    ap.add_argument("--eval-data", default=DEFAULT_EVAL_DATA, help="held-out prompts (a --eval-data source)")
    ap.add_argument("--prompts", type=int, default=64, help="how many of its prompts (the first ones)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="tiny teacher and a noisy copy of it, 4 prompts")
    a = ap.parse_args(argv)
    if a.smoke:
        from relax_authoring.testing.models import make_tiny_model, noisy_copy

        tmp = tempfile.mkdtemp(prefix="distillation-")
        teacher = make_tiny_model(f"{tmp}/teacher", config={"initializer_range": 0.3})
        a.teacher = str(teacher)
        a.student = [f"teacher={teacher}", f"noisy={noisy_copy(teacher, f'{tmp}/student', sigma=0.1)}"]
        a.prompts, a.max_new_tokens = 4, 8
    if not a.teacher or not a.student:
        ap.error("give --teacher and at least one --student NAME=DIR (or --smoke)")
    students = [s.split("=", 1) for s in a.student]
    if any(len(s) != 2 for s in students):
        ap.error("--student takes NAME=DIR")
    prompts = held_out_prompts(a.eval_data, a.prompts)
    print(f"teacher={a.teacher} eval_data={a.eval_data} prompts={len(prompts)} max_new_tokens={a.max_new_tokens} "
          f"seed={a.seed} threads={torch.get_num_threads()}")
    print("| student | reverse KL, nats/token (mean over tokens) | se over prompts | mean tokens sampled |")
    print("| --- | --- | --- | --- |")
    for name, path in students:
        kls, lengths = measure(path, a.teacher, prompts, a.max_new_tokens, a.seed)
        total = sum(lengths)
        mean = sum(k * n for k, n in zip(kls, lengths)) / max(total, 1)
        se = statistics.stdev(kls) / math.sqrt(len(kls)) if len(kls) > 1 else float("nan")
        print(f"| {name} | {mean:.4f} | {se:.4f} | {total / len(lengths):.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
