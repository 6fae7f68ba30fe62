"""Shared builders for the torch backend tests."""

import torch

from relax_core.batch import Batch
from relax_core.config import RunConfig
from relax_core.stages.optimizer import OptimizerSettings, optimizer_step
from relax_torch.backend import TorchBackend
from relax_torch.plugin import TorchBackendParams


def make_backend(model_dir, dtype="float64", layout=True, selective=True, **cfg):
    """``layout=False``: the plain padded layout (``--no-shared-prefix --no-packing``);
    ``selective=False``: ``--no-selective-checkpointing``."""
    cfg.setdefault("lr", 1e-3)
    cfg.setdefault("rollout_temperature", 1.0)  # independent of the run default
    params = TorchBackendParams(dtype=dtype, logits_chunk_size=7, shared_prefix=layout, packing=layout,
                                selective_checkpointing=selective)
    return TorchBackend(params, RunConfig(model=str(model_dir), **cfg))


def grads(model):
    """Parameter name -> a copy of its gradient (parameters that have one)."""
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_equal_grads(a, b):
    """The gradients of modules ``a`` and ``b`` are equal bit for bit (and there are some)."""
    ga, gb = grads(a), grads(b)
    assert ga and ga.keys() == gb.keys()
    for n in ga:
        assert torch.equal(ga[n], gb[n]), (n, float((ga[n] - gb[n]).abs().max()))


def random_value_head(be, seed=0):
    """Give ``be``'s critic a random value head (the default zero head makes every value 0
    and sends no gradient into the backbone)."""
    head = be.models["critic"].value_head
    with torch.no_grad():
        head.weight.copy_(torch.randn(head.weight.shape, generator=torch.Generator().manual_seed(seed),
                                      dtype=head.weight.dtype))


def train_step(be, batch, loss_fn, role="actor", critic_settings=None):
    """The core's optimizer step on ``be`` with the options of its run config."""
    return optimizer_step(be, batch, loss_fn, role=role, settings=OptimizerSettings.from_config(be.cfg, critic_settings))


def make_batch(seed=0, b=5, t=6, vocab=49152, k=3):
    """Variable prompt and response lengths; garbage (1e9 ids, NaN floats) off the mask;
    one sample with an empty response (all-masked)."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 1000, (int(n),), generator=g).tolist()
               for n in torch.randint(1, 9, (b,), generator=g)]
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    lengths[min(2, b - 1)] = 0
    lengths[0] = t
    mask = torch.arange(t)[None, :] < lengths[:, None]
    resp = torch.randint(3, 1000, (b, t), generator=g)
    resp = torch.where(mask, resp, 10**9)
    adv = torch.where(mask, torch.randn(b, t, generator=g, dtype=torch.float64), float("nan"))
    top = torch.randint(0, vocab, (b, t, k), generator=g)
    return Batch(prompt_ids=prompts, response_ids=resp, loss_mask=mask, advantages=adv, top_k_ids=top,
                 returns=adv * 0.5)


def grouped_batch(seed=0, sizes=(1, 4, 3, 1), t=24, k=3, vocab=49152):
    """Groups of the given sizes, interleaved (group_index not contiguous), prompts of 1 to 12
    tokens, responses of 0 to ``t`` tokens, masks with holes, garbage off the mask."""
    g = torch.Generator().manual_seed(seed)
    gi = torch.cat([torch.full((n,), i) for i, n in enumerate(sizes)])
    gi = gi[torch.randperm(len(gi), generator=g)]
    prompts_g = [torch.randint(3, 1000, (int(n),), generator=g).tolist()
                 for n in torch.randint(1, 13, (len(sizes),), generator=g)]
    b = len(gi)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    lengths[0], lengths[1] = t, 1
    if b > 3:
        lengths[3] = 0
    mask = torch.arange(t)[None, :] < lengths[:, None]
    holes = torch.rand(b, t, generator=g) < 0.2
    mask = mask & ~holes
    resp = torch.randint(3, 1000, (b, t), generator=g)
    resp = torch.where(mask | (torch.rand(b, t, generator=g) < 0.5), resp, 10**9)  # holes hold real tokens or garbage
    adv = torch.where(mask, torch.randn(b, t, generator=g, dtype=torch.float64), float("nan"))
    return Batch(prompt_ids=[prompts_g[int(i)] for i in gi], response_ids=resp, loss_mask=mask, advantages=adv,
                 top_k_ids=torch.randint(0, vocab, (b, t, k), generator=g), returns=adv * 0.5,
                 group_index=gi, rewards=torch.randn(b, generator=g).double(), response_lengths=lengths)


class PGLoss:
    """-(A · log π) token-mean over the global batch, - 0.01 · entropy, + 0.1 · Σ top-k log-probs."""

    needs_entropy = True
    needs_top_k = True

    def __init__(self, num_tokens):
        self.n = num_tokens

    def __call__(self, mb, out):
        m = mb.loss_mask
        adv = torch.where(m, mb.advantages, 0.0)
        per_tok = -adv * out.log_probs - 0.01 * out.entropy + 0.1 * out.top_k_log_probs.sum(-1)
        loss = torch.where(m, per_tok, 0.0).sum() / self.n
        return loss, {"loss": float(loss.detach()), "tokens": float(m.sum())}


def reference_outputs(model, batch, temperature=1.0):
    """Per sample alone (no padding): full-model logits -> log_softmax(z/τ) at the response,
    entropy and top-k log-probs; [b, T] lists of tensors with grad."""
    lps, ents, tops = [], [], []
    for i, p in enumerate(batch.prompt_ids):
        n = int(batch.loss_mask[i].sum())
        r = batch.response_ids[i, :n].tolist()
        logits = model(input_ids=torch.tensor([p + r])).logits[0]
        z = logits[len(p) - 1: len(p) - 1 + n] / temperature
        ls = z.log_softmax(-1)
        lps.append(ls.gather(1, torch.tensor(r, dtype=torch.long)[:, None]).squeeze(1))
        ents.append(-(ls.exp() * ls).sum(-1))
        tops.append(ls.gather(1, batch.top_k_ids[i, :n]))
    return lps, ents, tops
