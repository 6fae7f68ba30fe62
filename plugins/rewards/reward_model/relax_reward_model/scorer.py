"""``reward_model``: r = head(model(prompt + response)), a whole batch per call.

The model is an ``AutoModelForSequenceClassification`` with one output (``num_labels`` 1):
the scalar head on the last non-padding token's hidden state (Ouyang et al. 2022, §3.5).
Each sample's text is its prompt as the rollout engine saw it (chat template included,
``metadata["prompt"]``) followed by the response; texts are right-padded in micro-batches
of ``--reward-model-batch-size`` and cut to their last ``--reward-model-max-length``
tokens.  ``--reward-model-normalize sigmoid`` maps the logit s to σ(s) in (0, 1) (the
Bradley-Terry probability of beating a response of logit 0); ``none`` keeps s.  Float32,
no gradients; a sample's reward does not depend on its batch-mates (the contract kit
checks it).  Loaded once per reward worker (``--reward-num-workers`` copies), from a local
directory only.
"""

from __future__ import annotations

import math
from typing import Any


class RewardModelScorer:
    """``scorer(responses, labels, metadata) -> list[float]`` (labels unused).

    Raises (at construction):
        ValueError: the model has more than one output, or ``cuda`` without a CUDA device.
    """

    def __init__(self, params: Any):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if params.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--reward-model-device cuda, but no CUDA device is visible; use --reward-model-device cpu")
        self.p = params
        self.tok = AutoTokenizer.from_pretrained(params.path, local_files_only=True)
        self.tok.padding_side, self.tok.truncation_side = "right", "left"
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(
            params.path, local_files_only=True, torch_dtype=torch.float32).to(params.device).eval()
        if self.model.config.num_labels != 1:
            raise ValueError(f"{params.path} has {self.model.config.num_labels} outputs (num_labels); a reward model "
                             "has one")
        self.model.config.pad_token_id = self.tok.pad_token_id

    def __call__(self, responses: list[str], labels: list[Any], metadata: list[dict]) -> list[float | None]:
        """One reward per sample; ``None`` for an empty text (no prompt, no response)."""
        import torch

        texts = [(m or {}).get("prompt", "") + r for r, m in zip(responses, metadata)]
        todo = [i for i, t in enumerate(texts) if t]
        scores: list[float] = []
        for lo in range(0, len(todo), self.p.batch_size):
            chunk = [texts[i] for i in todo[lo:lo + self.p.batch_size]]
            enc = self.tok(chunk, padding=True, truncation=True, max_length=self.p.max_length,
                           return_tensors="pt").to(self.p.device)
            with torch.no_grad():
                scores += self.model(**enc).logits[:, 0].float().tolist()  # [b]
        if self.p.normalize == "sigmoid":
            scores = [1.0 / (1.0 + math.exp(-s)) for s in scores]
        out: list[float | None] = [None] * len(texts)
        for i, s in zip(todo, scores):
            out[i] = s
        return out


def build(params: Any, config: Any) -> RewardModelScorer:
    if params.path is None:
        raise ValueError("reward_model needs --reward-model-path (a local sequence-classification model directory)")
    return RewardModelScorer(params)
