"""Does a prompt form make a model write tool calls before any training?  (BENCHMARKS §11.)

RL can only reinforce a tool call the model already samples.  This probe counts, for the
``tools`` environment's prompt (the task's prompt + the calculator's schema and an example
call, ``relax_tools.tools.instructions``), how many sampled and greedy responses of the
untrained model hold a ``<tool_call>`` tag and how many a well-formed calculator call
(valid JSON, ``name`` ``calculator``, the one argument ``expression``), in two forms:

- ``plain``: the prompt as a ``relax train --environment tools`` run builds it (system
  prompt, one user turn);
- ``example``: the same, preceded by one worked exchange as earlier chat turns (a user
  question, the assistant's call, the ``tool`` result, the assistant's answer), the few-shot
  form an environment cannot produce today (its ``prompt()`` returns one user text).

Generation is ``transformers``' ``generate`` on the chat template (the engine is not what is
measured), temperature 1 for the samples, at most ``--max-new-tokens`` tokens.

    .venv/bin/python benchmarks/tools_call_probe.py [--model default|PATH] [--prompts 32] [--samples 8]
"""

from __future__ import annotations

import argparse
import json
import re
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from relax_core.config import DEFAULT_MODEL, RunConfig
from relax_core.data import load_dataset, prompt_messages
from relax_core.host.plugins import default_registry
from relax_core.models import resolve_model_path
from relax_tools.tools import instructions, tool_calls

DATA = "rg:chain_sum?size=200&seed=7&min_digits=2&max_digits=2"  # the README tools run's held-out set
EXAMPLE = "rg:chain_sum?size=1&seed=99&min_digits=2&max_digits=2"  # the worked exchange's problem


def well_formed(text: str) -> bool:
    """A call of the calculator with exactly its one argument, as valid JSON."""
    for body in tool_calls(text):
        try:
            call = json.loads(body)
        except json.JSONDecodeError:
            continue
        if isinstance(call, dict) and call.get("name") == "calculator" and \
                isinstance(call.get("arguments"), dict) and set(call["arguments"]) == {"expression"}:
            return True
    return False


def worked_exchange(row: dict, suffix: str) -> list[dict]:
    """``row`` asked, answered by a calculator call, its result, and the final answer."""
    expression = re.search(r": (.*) =", row["prompt"]).group(1)
    call = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
    return [{"role": "user", "content": row["prompt"] + suffix},
            {"role": "assistant", "content": f"<tool_call>{call}</tool_call>"},
            {"role": "tool", "content": str(row["label"])},
            {"role": "assistant", "content": str(row["label"])}]


def messages(prompt: str, cfg: RunConfig, suffix: str, example: list[dict]) -> list[dict]:
    """The chat messages of one prompt: system prompt, ``example`` turns (may be empty), the user turn."""
    msgs = prompt_messages(prompt + suffix, cfg)
    return msgs[:-1] + example + msgs[-1:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--samples", type=int, default=8, help="sampled responses per prompt and form")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    cfg = RunConfig(model=DEFAULT_MODEL if a.model == "default" else a.model)
    path = resolve_model_path(cfg.model)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    reg = default_registry()
    rows = load_dataset(DATA, cfg, reg).rows[:a.prompts]
    suffix = instructions(("calculator",))
    forms = {"plain": [], "example": worked_exchange(load_dataset(EXAMPLE, cfg, reg).rows[0], suffix)}
    print(f"# tools_call_probe: {a.model}, {len(rows)} prompts of {DATA}, {a.samples} samples at T=1 "
          f"+ 1 greedy per prompt and form, <= {a.max_new_tokens} new tokens, seed {a.seed}")
    print("| form | sampled: with a tag / well-formed / of | greedy: with a tag / well-formed / of | wall |")
    print("|---|---|---|---|")
    for form, example in forms.items():
        torch.manual_seed(a.seed)
        t0, counts = time.perf_counter(), {"sampled": [0, 0, 0], "greedy": [0, 0, 0]}
        for row in rows:
            text = tok.apply_chat_template(messages(row["prompt"], cfg, suffix, example), add_generation_prompt=True,
                                           tokenize=False)
            ids = tok(text, return_tensors="pt", add_special_tokens=False)
            n = ids["input_ids"].shape[1]
            with torch.no_grad():
                runs = {"greedy": model.generate(**ids, do_sample=False, max_new_tokens=a.max_new_tokens,
                                                 pad_token_id=tok.eos_token_id)}
                if a.samples:
                    runs["sampled"] = model.generate(**ids, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                                                     max_new_tokens=a.max_new_tokens, num_return_sequences=a.samples,
                                                     pad_token_id=tok.eos_token_id)
            for kind, out in runs.items():
                for seq in out:
                    response = tok.decode(seq[n:], skip_special_tokens=True)
                    c = counts[kind]
                    c[0] += bool(tool_calls(response))
                    c[1] += well_formed(response)
                    c[2] += 1
        s, g = counts["sampled"], counts["greedy"]
        print(f"| {form} | {s[0]} / {s[1]} / {s[2]} | {g[0]} / {g[1]} / {g[2]} | {time.perf_counter() - t0:.0f} s |")


if __name__ == "__main__":
    main()
