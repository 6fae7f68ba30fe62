"""Layouts of a training micro-batch other than the plain one: shared prefix (Prefix Grouper,
Liu et al. 2025, arXiv 2506.05433) and packing without padding, built by one function.

The plain layout has one row per sample, ``[left-padded prompt_i | response_i]``.  Here a
micro-batch is cut into *segments*, each a prompt followed by the responses that continue it::

    segment s = [prompt_s | r_1[:t_1] | r_2[:t_2] | ... | r_n[:t_n]]

where ``t_i`` is 1 + the last ``loss_mask`` column of sample ``i`` (later tokens are never
attended to by a trained position in the plain layout either).  With ``share`` a segment is a
prompt group (samples with the same ``group_index``, hence the same prompt: the prompt is
stored and encoded once, Prefix Grouper); without, a segment is one sample.  Segments are
placed one per row, right-padded to the longest (``pack=False``), or concatenated into a
single row without padding (``pack=True``: packing).  A 4-D attention mask lets

- a prompt token attend causally to its segment's prompt,
- a token of response ``i`` attend to its segment's whole prompt and causally to ``r_i`` only,
- a padding token attend causally to the padding (never read by a real token; it only keeps
  every query row non-empty, so no softmax over an empty set produces NaN),

so that segments packed into one row are blocks of a block-diagonal mask; position ids
restart at 0 in each segment and those of ``r_i`` continue from the prompt length
(``P_s, P_s + 1, ...``), as in the plain layout.  Each real token therefore sees exactly the
keys, values and positions it sees in the plain layout: hidden states, log-probs and their
gradients are the same function (a shared prompt's activations receive the sum of their
responses' gradients, through autograd).  Response token ``j`` of sample ``i`` is predicted by
the hidden state of its segment's prompt's last token when ``j = 0``, else by that of token
``j - 1`` of ``r_i``.

Exact where the model's attention takes an arbitrary 4-D mask with explicit position ids:
transformers' ``eager`` and ``sdpa`` attention (a prepared 4-D mask is passed through
unchanged by ``transformers.masking_utils``), no sliding window.  The dense mask costs
``L²`` attention scores per row of ``L`` positions (no variable-length kernel on CPU): packing
trades padding for attention between segments that the mask then discards, which a
``--max-tokens-per-micro-batch`` of a few hundred to a few thousand tokens keeps small next to
the MLPs.  Samples of one group that fall into different micro-batches each carry their own
copy of the prompt (still exact).

Building the layout is vectorised (no loop over tokens); converting ``prompt_ids``, a Python
list of lists, to a tensor touches each sample once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

EXACT_ATTENTION = ("eager", "sdpa")


@dataclass(frozen=True)
class Layout:
    """The inputs of one micro-batch of ``b`` samples in ``S`` segments on ``R`` rows
    (``R = S``, or 1 when packed).

    Attributes:
        input_ids: long ``[R, L]`` (pad id off the segments' tokens).
        attention_mask: ``[R, 1, L, L]``: bool (True = attend) for ``sdpa``, else additive
            float (0 or the dtype's minimum) in ``mask_dtype``.
        position_ids: long ``[R, L]``.
        src_row, src_col: long ``[b, T']``: the ``[R, L]`` hidden state that predicts response
            token ``(i, j)`` (meaningful for ``j < t_i``).
        targets: long ``[b, T']``: the response tokens (out-of-vocabulary ids replaced by pad).
        t_eff: ``T'``, the micro-batch's last ``loss_mask`` column + 1.
        tokens: real (non-padding) positions, ``Σ_s len_s``.
    """

    input_ids: Tensor
    attention_mask: Tensor
    position_ids: Tensor
    src_row: Tensor
    src_col: Tensor
    targets: Tensor
    t_eff: int
    tokens: int


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


def segment_lengths(prompt_lens: Tensor, t_last: Tensor, inv: Tensor) -> Tensor:
    """long ``[S]``: ``P_s + Σ_{i in s} t_i`` of each segment (``prompt_lens``, ``t_last``,
    ``inv``: long ``[b]``, ``inv`` the segment of each sample)."""
    if not len(inv):
        return torch.zeros(0, dtype=torch.long)
    s = int(inv.max()) + 1
    p = torch.zeros(s, dtype=torch.long).scatter_reduce_(0, inv, prompt_lens, "amax")
    return p + torch.zeros(s, dtype=torch.long).index_add_(0, inv, t_last)


def layout_positions(prompt_lens: Tensor, t_last: Tensor, inv: Tensor, *, pack: bool) -> tuple[int, int]:
    """(positions computed ``R × L``, real tokens ``Σ len_s``) of the layout of these samples."""
    lens = segment_lengths(prompt_lens, t_last, inv)
    if not len(lens):
        return 0, 0
    real = int(lens.sum())
    return (real if pack else len(lens) * int(lens.max())), real


def build_layout(prompt_ids: list, group_index: Tensor | None, response_ids: Tensor, loss_mask: Tensor,
                 pad_id: int, vocab: int, *, share: bool = True, pack: bool = False, sdpa: bool,
                 mask_dtype: torch.dtype) -> Layout:
    """The layout of a micro-batch (see the module docstring).

    Args:
        prompt_ids: ``b`` lists of token ids (non-empty; equal within a group if ``share``).
        group_index: long ``[b]`` or None (no sharing).
        response_ids: ``[b, T]`` (anything off ``loss_mask``).
        loss_mask: bool ``[b, T]``.
        pad_id, vocab: pad token id, vocabulary size.
        share: one segment per prompt group (shared prefix), else one per sample.
        pack: all segments in one row (packing), else one row per segment.
        sdpa: build a bool mask (else an additive float mask of ``mask_dtype``).

    Raises:
        ValueError: an empty prompt, samples of one group with different prompts (``share``),
            or response ids outside the vocabulary at ``loss_mask`` positions.
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
    inv, first = group_of(group_index if share else None, b)  # segment of each sample, first sample of each
    if share and not ((plen == plen[first[inv]]).all() and (prompts == prompts[first[inv]]).all()):
        raise ValueError("shared prefix: samples with the same group_index have different prompts")
    s = len(first)
    p_s = plen[first]  # [S]
    tot = torch.zeros(s, dtype=torch.long).index_add_(0, inv, t_last)  # [S] response tokens per segment
    seg_len = p_s + tot
    order = torch.argsort(inv, stable=True)
    t_sorted = t_last[order]
    excl = torch.cumsum(t_sorted, 0) - t_sorted  # exclusive prefix sum in segment order
    start = torch.cumsum(tot, 0) - tot  # [S]
    off = torch.empty_like(t_last)
    off[order] = excl - start[inv[order]]  # [b] offset of r_i after its segment's prompt
    if pack:  # one row, segments end to end
        row_s, base = torch.zeros(s, dtype=torch.long), torch.cumsum(seg_len, 0) - seg_len
        n_rows, length = 1, int(seg_len.sum())
    else:  # one row per segment
        row_s, base = torch.arange(s), torch.zeros(s, dtype=torch.long)
        n_rows, length = s, int(seg_len.max()) if s else 0
    pm = prompts.shape[1]
    ids = torch.full((n_rows, length), pad_id, dtype=torch.long)
    seg = torch.full((n_rows, length), -1, dtype=torch.long)  # segment of each position, -1 padding
    part = torch.full((n_rows, length), -1, dtype=torch.long)  # 0 prompt, i + 1 response i, -1 padding
    pos = torch.zeros((n_rows, length), dtype=torch.long)
    pc = torch.arange(pm)[None, :].expand(s, pm)
    in_p = pc < p_s[:, None]  # [S, Pm]
    pr, pcol = row_s[:, None].expand(s, pm)[in_p], (base[:, None] + pc)[in_p]
    ids[pr, pcol] = prompts[first][in_p]
    seg[pr, pcol] = torch.arange(s)[:, None].expand(s, pm)[in_p]
    part[pr, pcol] = 0
    pos[pr, pcol] = pc[in_p]
    j = torch.arange(t_eff)[None, :]  # [1, T']
    p_i = p_s[inv][:, None]  # [b, 1]
    row = row_s[inv][:, None].expand(b, t_eff)
    first_col = base[inv][:, None] + p_i  # [b, 1] the column after the segment's prompt
    col = first_col + off[:, None] + j  # [b, T']
    real = j < t_last[:, None]  # [b, T']
    rr, rc = row[real], col[real]
    ids[rr, rc] = resp[real]
    seg[rr, rc] = inv[:, None].expand(b, t_eff)[real]
    part[rr, rc] = (torch.arange(b)[:, None] + 1).expand(b, t_eff)[real]
    pos[rr, rc] = (p_i + j).expand(b, t_eff)[real]
    src_col = torch.where(j == 0, first_col - 1, col - 1).clamp(max=max(length - 1, 0))  # [b, T']
    causal = torch.ones(length, length, dtype=torch.bool).tril_()
    allowed = causal & (seg[:, :, None] == seg[:, None, :])
    pq, pk = part[:, :, None], part[:, None, :]
    allowed = (allowed & ((pk == 0) | (pk == pq)))[:, None]  # [R, 1, L, L]
    attn = allowed if sdpa else torch.zeros(allowed.shape, dtype=mask_dtype).masked_fill_(
        ~allowed, torch.finfo(mask_dtype).min)
    return Layout(ids, attn, pos, row.contiguous(), src_col, resp, t_eff, int(seg_len.sum()))
