"""Shared-prefix layout of a micro-batch: the prompt of a group encoded once, its
responses attending to it (Prefix Grouper, Liu et al. 2025, arXiv 2506.05433).

The plain layout has one row per sample, ``[left-padded prompt_i | response_i]``.  The
shared layout has one row per group ``g`` (samples with the same ``group_index``, hence the
same prompt) of the micro-batch::

    row g = [prompt_g | r_1[:t_1] | r_2[:t_2] | ... | r_n[:t_n] | right padding]

where ``t_i`` is 1 + the last ``loss_mask`` column of sample ``i`` (later tokens are never
attended to by a trained position in the plain layout either).  A 4-D attention mask lets

- a prompt token attend causally to the prompt,
- a token of response ``i`` attend to the whole prompt and causally to ``r_i`` only,
- a padding token attend to the prompt and the padding (never read by a real token; it only
  keeps every query row non-empty, so no softmax over an empty set produces NaN),

and position ids of ``r_i`` continue from the prompt length (``P_g, P_g + 1, ...``), as in
the plain layout.  Each real token therefore sees exactly the keys, values and positions it
sees in the plain layout: hidden states, log-probs and their gradients are the same function
(the prompt's activations receive the sum of their responses' gradients, through autograd).
Response token ``j`` of sample ``i`` is predicted by the hidden state at column
``P_g - 1`` (the prompt's last token) when ``j = 0``, else at ``P_g + off_i + j - 1``.

Exact where the model's attention takes an arbitrary 4-D mask with explicit position ids:
transformers' ``eager`` and ``sdpa`` attention (a prepared 4-D mask is passed through
unchanged by ``transformers.masking_utils``), no sliding window.  Samples of one group that
fall into different micro-batches each carry their own copy of the prompt (still exact).

Building the layout is vectorised (no loop over tokens); converting ``prompt_ids``, a Python
list of lists, to a tensor touches each sample once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

EXACT_ATTENTION = ("eager", "sdpa")


@dataclass(frozen=True)
class SharedPrefixLayout:
    """The packed inputs of one micro-batch of ``b`` samples in ``G`` groups.

    Attributes:
        input_ids: long ``[G, L]`` (pad id off the rows' real tokens).
        attention_mask: ``[G, 1, L, L]``: bool (True = attend) for ``sdpa``, else additive
            float (0 or the dtype's minimum) in ``mask_dtype``.
        position_ids: long ``[G, L]``.
        src_row, src_col: long ``[b, T']``: the ``[G, L]`` hidden state that predicts response
            token ``(i, j)`` (meaningful for ``j < t_i``).
        targets: long ``[b, T']``: the response tokens (out-of-vocabulary ids replaced by pad).
        t_eff: ``T'``, the micro-batch's last ``loss_mask`` column + 1.
    """

    input_ids: Tensor
    attention_mask: Tensor
    position_ids: Tensor
    src_row: Tensor
    src_col: Tensor
    targets: Tensor
    t_eff: int


def _prompt_tensor(prompt_ids: list) -> tuple[Tensor, Tensor]:
    """(right-padded long ``[b, P]`` prompts with -1, long ``[b]`` lengths)."""
    lens = torch.tensor([len(x) for x in prompt_ids], dtype=torch.long)
    rows = [torch.as_tensor(x, dtype=torch.long) for x in prompt_ids]
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=-1), lens


def group_of(group_index: Tensor | None, b: int) -> tuple[Tensor, Tensor]:
    """(long ``[b]`` group of each sample in ``0..G-1``, long ``[G]`` first sample of each
    group); without ``group_index`` every sample is its own group."""
    key = torch.arange(b) if group_index is None else torch.as_tensor(group_index).long().cpu()
    _, inv = torch.unique(key, return_inverse=True)
    g = int(inv.max()) + 1 if b else 0
    first = torch.full((g,), b, dtype=torch.long).scatter_reduce_(0, inv, torch.arange(b), "amin")
    return inv, first


def packed_tokens(prompt_lens: Tensor, t_last: Tensor, inv: Tensor) -> int:
    """``G × L``: positions of the packed layout of these samples (``prompt_lens``,
    ``t_last``, ``inv``: long ``[b]``)."""
    if not len(inv):
        return 0
    g = int(inv.max()) + 1
    p = torch.zeros(g, dtype=torch.long).scatter_reduce_(0, inv, prompt_lens, "amax")
    row = p + torch.zeros(g, dtype=torch.long).index_add_(0, inv, t_last)
    return g * int(row.max())


def build_layout(prompt_ids: list, group_index: Tensor | None, response_ids: Tensor, loss_mask: Tensor,
                 pad_id: int, vocab: int, *, sdpa: bool, mask_dtype: torch.dtype) -> SharedPrefixLayout:
    """The shared-prefix layout of a micro-batch (see the module docstring).

    Args:
        prompt_ids: ``b`` lists of token ids (non-empty; equal within a group).
        group_index: long ``[b]`` or None (no sharing).
        response_ids: ``[b, T]`` (anything off ``loss_mask``).
        loss_mask: bool ``[b, T]``.
        pad_id, vocab: pad token id, vocabulary size.
        sdpa: build a bool mask (else an additive float mask of ``mask_dtype``).

    Raises:
        ValueError: an empty prompt, samples of one group with different prompts, or
            response ids outside the vocabulary at ``loss_mask`` positions.
    """
    b = len(prompt_ids)
    mask = loss_mask.bool().cpu()
    cols = torch.arange(1, mask.shape[1] + 1)
    t_last = (mask * cols).amax(1) if mask.shape[1] else torch.zeros(b, dtype=torch.long)  # [b]
    t_eff = int(t_last.max()) if b else 0
    resp = response_ids[:, :t_eff].long().cpu()
    in_range = (resp >= 0) & (resp < vocab)
    if not in_range[mask[:, :t_eff]].all():
        raise ValueError(f"response token ids outside the vocabulary [0, {vocab}) at loss_mask positions")
    resp = torch.where(in_range, resp, pad_id)
    prompts, plen = _prompt_tensor(prompt_ids)  # [b, Pm], [b]
    if (plen == 0).any():
        raise ValueError("empty prompt: every sample needs at least one prompt token")
    inv, first = group_of(group_index, b)
    if not ((plen == plen[first[inv]]).all() and (prompts == prompts[first[inv]]).all()):
        raise ValueError("shared prefix: samples with the same group_index have different prompts")
    g = len(first)
    p_g = plen[first]  # [G]
    tot = torch.zeros(g, dtype=torch.long).index_add_(0, inv, t_last)  # [G] response tokens per row
    order = torch.argsort(inv, stable=True)
    t_sorted = t_last[order]
    excl = torch.cumsum(t_sorted, 0) - t_sorted  # exclusive prefix sum in group order
    start = torch.cumsum(tot, 0) - tot  # [G]
    off = torch.empty_like(t_last)
    off[order] = excl - start[inv[order]]  # [b] offset of r_i after its row's prompt
    length = int((p_g + tot).max())
    pm = prompts.shape[1]
    ids = torch.full((g, length), pad_id, dtype=torch.long)
    seg = torch.full((g, length), -1, dtype=torch.long)  # 0 prompt, i + 1 response i, -1 padding
    pos = torch.zeros((g, length), dtype=torch.long)
    pc = torch.arange(pm)[None, :].expand(g, pm)
    in_p = pc < p_g[:, None]  # [G, Pm]
    ids[:, :pm][in_p] = prompts[first][in_p]
    seg[:, :pm][in_p] = 0
    pos[:, :pm] = torch.where(in_p, pc, 0)
    j = torch.arange(t_eff)[None, :]  # [1, T']
    p_i = p_g[inv][:, None]  # [b, 1]
    row = inv[:, None].expand(b, t_eff)
    col = p_i + off[:, None] + j  # [b, T']
    real = j < t_last[:, None]  # [b, T']
    ids[row[real], col[real]] = resp[real]
    seg[row[real], col[real]] = (torch.arange(b)[:, None] + 1).expand(b, t_eff)[real]
    pos[row[real], col[real]] = (p_i + j).expand(b, t_eff)[real]
    src_col = torch.where(j == 0, p_i - 1, col - 1).clamp(max=length - 1)  # [b, T']
    causal = torch.ones(length, length, dtype=torch.bool).tril_()
    sq, sk = seg[:, :, None], seg[:, None, :]
    allowed = (causal & ((sk == 0) | (sk == sq)))[:, None]  # [G, 1, L, L]
    attn = allowed if sdpa else torch.zeros(allowed.shape, dtype=mask_dtype).masked_fill_(
        ~allowed, torch.finfo(mask_dtype).min)
    return SharedPrefixLayout(ids, attn, pos, row.contiguous(), src_col, resp, t_eff)
