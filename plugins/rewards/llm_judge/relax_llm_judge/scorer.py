"""``llm_judge``: a generative judge grades each response against its reference.

For each sample the judge's user message is ``--llm-judge-template`` filled with
``{prompt}`` (the prompt as the policy saw it, ``metadata["prompt"]``), ``{response}`` (its
last ``--llm-judge-max-response-chars`` characters: the final answer is at the end) and
``{reference}`` (the label), wrapped in the judge model's chat template.  The whole batch
is one ``generate`` call of a rollout engine plugin (``--llm-judge-engine``, default ``hf``:
a separate instance of that engine built by its own factory, on ``--llm-judge-model``,
default ``--model``), at ``--llm-judge-temperature`` (0: greedy, so the verdict of a
response is a function of the texts).  The verdict is the first of the words of
``--llm-judge-verdicts`` (whole word, any case) in the judge's reply, and the reward is that
word's score (``yes:1,no:0``).

A reply with none of the words is **invalid**: the sample is unscored (``None``: NaN
reward, no learning signal, as for a scorer error) and counted in
``rollout/reward/llm_judge/invalid``; it is never scored 0, which would teach the policy
that the judge's failure is a wrong answer.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from relax_llm_judge.plugin import parse_verdicts


def _config(config: Any) -> Any:
    if config is not None:
        return config
    from relax_core.config import RunConfig

    return RunConfig()


class LLMJudge:
    """``judge(responses, labels, metadata) -> list[float | None]``; ``pop_counts()`` gives
    ``{"invalid": n}`` since the last call.

    Args:
        params: :class:`~relax_llm_judge.plugin.LLMJudgeParams`.
        config: the run's :class:`~relax_core.config.RunConfig` (the judge engine's flags and
            seed; ``--model`` when ``--llm-judge-model`` is not given).
        registry: the plugin registry to find the engine in (default: the installed plugins).

    Raises (at construction, so that ``relax train`` refuses the run, exit 2):
        ValueError: an engine that is not installed, one that cannot run on
            ``--llm-judge-device``, ``cuda`` without a CUDA device, or bad verdict words.
    """

    def __init__(self, params: Any, config: Any = None, registry: Any = None):
        import torch

        from relax_core.host.plugins import PluginError, default_registry
        from relax_core.models import load_tokenizer, model_problem

        config = _config(config)
        self.p = params
        self.verdicts = parse_verdicts(params.verdicts)
        self._pattern = re.compile(r"\b(" + "|".join(map(re.escape, self.verdicts)) + r")\b", re.IGNORECASE)
        reg = registry if registry is not None else default_registry()
        try:
            spec = reg.get("engine", params.engine).spec
        except PluginError as e:
            raise ValueError(f"--llm-judge-engine: {e}") from None
        engine_params = config.params_for(params.engine) or spec.default_params()
        devices = spec.capabilities_for(engine_params).devices
        if params.device not in devices:
            raise ValueError(f"--llm-judge-engine {params.engine} cannot run on --llm-judge-device {params.device} "
                             f"(its devices: {', '.join(sorted(devices))}); choose one of them")
        if params.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--llm-judge-device cuda, but no CUDA device is visible; use --llm-judge-device cpu")
        model = params.model or config.model
        problem = model_problem(model)
        if problem:
            raise ValueError(f"--llm-judge-model: {problem}")
        judge_cfg = dataclasses.replace(config, model=model, device=params.device)
        self.tokenizer = load_tokenizer(model)
        self.engine = spec.build(engine_params, judge_cfg)
        self.seed = config.seed
        self._invalid = 0

    def judge_prompt(self, response: str, label: Any, metadata: dict) -> str:
        """The text the judge model reads for one sample (chat template applied when the
        judge's tokenizer has one)."""
        message = self.p.template.format(prompt=(metadata or {}).get("prompt", ""),
                                         response=response[-self.p.max_response_chars:], reference=label)
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template([{"role": "user", "content": message}],
                                                      add_generation_prompt=True, tokenize=False)
        return message

    def verdict(self, reply: str) -> float | None:
        """The reward of a judge's reply: the score of its first verdict word, ``None`` if it has none."""
        m = self._pattern.search(reply)
        return None if m is None else self.verdicts[m.group(1).lower()]

    def replies(self, responses: list[str], labels: list[Any], metadata: list[dict]) -> list[str]:
        """The judge's reply to each sample: one ``generate`` call for the batch."""
        from relax_core.contracts import SamplingParams

        texts = [self.judge_prompt(r, lab, m) for r, lab, m in zip(responses, labels, metadata)]
        templated = getattr(self.tokenizer, "chat_template", None) is not None
        ids = [self.tokenizer(t, add_special_tokens=not templated)["input_ids"] for t in texts]
        out = self.engine.generate(ids, SamplingParams(temperature=self.p.temperature,
                                                       max_new_tokens=self.p.max_new_tokens, seed=self.seed))
        return list(out.responses)

    def __call__(self, responses: list[str], labels: list[Any], metadata: list[dict]) -> list[float | None]:
        if not responses:
            return []
        scores = [self.verdict(r) for r in self.replies(responses, labels, metadata)]
        self._invalid += sum(s is None for s in scores)
        return scores

    def pop_counts(self) -> dict[str, int]:
        """``{"invalid": verdicts that could not be parsed since the last call}``."""
        n, self._invalid = self._invalid, 0
        return {"invalid": n}


def build(params: Any, config: Any) -> LLMJudge:
    return LLMJudge(params, config)
