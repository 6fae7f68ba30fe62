"""Small stand-ins for an engine, a backend and a scorer, for testing the loop alone.

The policy is a bigram model over a 16-token vocabulary (``logits = W[last token]``); the
engine samples from it with a seeded generator and returns the exact log-probs of the
sampled tokens, the backend trains the same parameters with AdamW.  Token 0 is EOS; a
response is the digits of its token ids ("3 7 7"), and :func:`count_sevens` rewards the
fraction of 7s, which the policy can learn in a few steps.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from relax_core.batch import Batch, length_mask
from relax_core.contracts import ForwardOutput, GenerationOutput, Gradients, SamplingParams
from relax_core.stages.optimizer import step_torch_optimizer

V = 16
EOS = 0


class FakeTokenizer:
    chat_template = None
    pad_token_id = EOS
    eos_token_id = EOS

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [1 + (ord(ch) % (V - 1)) for ch in text[-8:]]}

    def save_pretrained(self, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "fake_tokenizer.json").write_text(json.dumps({"vocab": V}))


class Bigram(nn.Module):
    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w = nn.Parameter(torch.randn(V, V, generator=g) * 0.1)
        self.value_head = nn.Parameter(torch.zeros(V))

    def logits(self, prev: torch.Tensor) -> torch.Tensor:
        return self.w[prev]  # [..., V]


def _prev_tokens(prompt_ids: list[list[int]], response_ids: torch.Tensor) -> torch.Tensor:
    last = torch.as_tensor([p[-1] for p in prompt_ids])
    return torch.cat([last[:, None], response_ids[:, :-1]], dim=1)  # [B, T]


class FakeEngine:
    def __init__(self, model: Bigram) -> None:
        self.model = Bigram()
        self.model.load_state_dict(model.state_dict())
        self.tokenizer = FakeTokenizer()
        self.versions: list[int] = []

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams) -> GenerationOutput:
        g = torch.Generator().manual_seed(sampling.seed or 0)
        b, t = len(prompt_ids), sampling.max_new_tokens
        prev = torch.as_tensor([p[-1] for p in prompt_ids])
        ids = torch.full((b, t), EOS, dtype=torch.long)
        lp = torch.zeros(b, t)
        done = torch.zeros(b, dtype=torch.bool)
        lengths = torch.zeros(b, dtype=torch.long)
        for i in range(t):
            logp = torch.log_softmax(self.model.logits(prev) / max(sampling.temperature, 1e-6), -1)
            tok = torch.multinomial(logp.exp(), 1, generator=g).squeeze(1)
            ids[:, i] = torch.where(done, EOS, tok)
            lp[:, i] = logp.gather(1, tok[:, None]).squeeze(1)
            lengths += (~done).long()
            done |= tok == EOS
            prev = tok
        texts = [" ".join(str(int(x)) for x in row[:n]) for row, n in zip(ids, lengths)]
        return GenerationOutput(response_ids=ids, response_lengths=lengths, loss_mask=length_mask(lengths, t),
                                rollout_log_probs=lp, truncated=~done, responses=texts)

    def update_weights(self, state_dict: Any, version: int) -> None:
        self.model.load_state_dict(state_dict)
        self.versions.append(version)

    def shutdown(self) -> None:
        pass


class FakeBackend:
    """Trains a :class:`Bigram`; ``nan_steps`` makes those optimizer steps' loss NaN."""

    def __init__(self, model: Bigram, micro_batch_size: int = 2, nan_steps: tuple[int, ...] = ()) -> None:
        self.model = model
        self.ref = Bigram()
        self.ref.load_state_dict(model.state_dict())
        self.opt = torch.optim.AdamW(model.parameters(), weight_decay=0.0)  # the core sets each step's lr
        self.mbs = micro_batch_size
        self.nan_steps = set(nan_steps)
        self.calls = 0
        self.steps = 0

    def setup(self, **kw: Any) -> None:
        self.setup_args = kw

    def _forward(self, model: Bigram, batch: Batch) -> ForwardOutput:
        prev = _prev_tokens(batch.prompt_ids, batch.response_ids)
        logp = torch.log_softmax(model.logits(prev), -1)  # [B, T, V]
        lp = logp.gather(-1, batch.response_ids[..., None]).squeeze(-1)
        ent = -(logp.exp() * logp).sum(-1)
        return ForwardOutput(log_probs=lp, entropy=ent, values=model.value_head[prev])

    def forward(self, batch: Batch, *, role: str = "actor", entropy: bool = False, top_k: bool = False) -> ForwardOutput:
        with torch.no_grad():
            return self._forward(self.ref if role == "ref" else self.model, batch)

    def accumulate_gradients(self, batch: Batch, loss_fn: Any, *, role: str = "actor") -> Gradients:
        self.calls += 1
        self.opt.zero_grad()
        total = 0.0
        for lo in range(0, batch.size, self.mbs):
            mb = batch.slice(lo, min(batch.size, lo + self.mbs))
            loss, _ = loss_fn(mb, self._forward(self.model, mb))
            if self.calls in self.nan_steps:
                loss = loss * math.nan
            loss.backward()
            total += float(loss.detach())
        return Gradients(sums={"loss": total}, nonfinite=frozenset() if math.isfinite(total) else {"loss"},
                         micro_batches=-(-batch.size // self.mbs))

    def grad_norm(self, role: str = "actor") -> float:
        return float(torch.nn.utils.get_total_norm([p.grad for p in self.model.parameters() if p.grad is not None]))

    def apply_gradients(self, role: str = "actor", *, lr: float, grad_scale: float = 1.0) -> None:
        step_torch_optimizer(self.opt, lr=lr, grad_scale=grad_scale)
        self.steps += 1

    def zero_grad(self, role: str = "actor") -> None:
        self.opt.zero_grad(set_to_none=True)

    def optimizer_steps(self, role: str = "actor") -> int:
        return self.steps

    def engine_state_dict(self) -> Any:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def save_checkpoint(self, path: str, include_optimizer: bool = True) -> None:
        from safetensors.torch import save_file

        Path(path).mkdir(parents=True)
        save_file({k: v.contiguous() for k, v in self.model.state_dict().items()}, f"{path}/model.safetensors")
        if include_optimizer:
            torch.save(self.opt.state_dict(), f"{path}/optim.pt")
        Path(f"{path}/steps.json").write_text(json.dumps(self.steps))

    def load_checkpoint(self, path: str) -> None:
        from safetensors.torch import load_file

        self.model.load_state_dict(load_file(f"{path}/model.safetensors"))
        if Path(f"{path}/optim.pt").is_file():
            self.opt.load_state_dict(torch.load(f"{path}/optim.pt", weights_only=True))
        self.steps = json.loads(Path(f"{path}/steps.json").read_text())

    def save_hf(self, path: str) -> None:
        from safetensors.torch import save_file

        Path(path).mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.model.state_dict().items()}, f"{path}/model.safetensors")


def count_sevens(responses: list[str], labels: list[Any], metadata: list[dict],
                 prompts: list[str]) -> tuple[list[float | None], dict]:
    out: list[float | None] = []
    for r in responses:
        toks = r.split()
        out.append(sum(t == "7" for t in toks) / len(toks) if toks else 0.0)
    return out, {"rollout/reward_errors": 0.0}


@dataclass
class Fakes:
    model: Bigram
    engine: FakeEngine
    backend: FakeBackend


def make_fakes(seed: int = 0, **backend_kw: Any) -> Fakes:
    model = Bigram(seed)
    return Fakes(model, FakeEngine(model), FakeBackend(model, **backend_kw))
