"""Megatron backend vs transformers (same weights): logits, log-probs, entropy, top-k
log-probs, one training step; TP = 2 equals TP = 1; weight conversion both ways."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).parent))
import mp_workers  # noqa: E402
from mp_workers import free_port, needs_megatron  # noqa: E402

from relax_megatron.backend import pack_sequences  # noqa: E402


def _run(world: int, kind: str, tmp_path: Path) -> dict:
    out = tmp_path / f"tp{world}_{kind}.pt"
    torch.multiprocessing.spawn(mp_workers.worker, args=(world, free_port(), kind, str(out)), nprocs=world, join=True)
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="module")
def tp1(tmp_path_factory):
    return _run(1, "qwen2", tmp_path_factory.mktemp("tp1"))


@pytest.fixture(scope="module")
def tp2(tmp_path_factory):
    return _run(2, "qwen2", tmp_path_factory.mktemp("tp2"))


@pytest.fixture(scope="module")
def qwen3_tp(tmp_path_factory):
    """TP = 1 and TP = 2 on Qwen3 (q/k RMSNorm over TP-sharded heads, tied embeddings)."""
    return {w: _run(w, "qwen3", tmp_path_factory.mktemp(f"qwen3_tp{w}")) for w in (1, 2)}


def test_pack_sequences_positions():
    ids, pos, at = pack_sequences([[5, 6], [7, 8, 9]], torch.tensor([[1, 2, 3], [4, 0, 0]]))
    assert ids.tolist() == [[5, 6, 1, 2, 3, 0], [7, 8, 9, 4, 0, 0]]
    assert at.tolist() == [[1, 2, 3], [2, 3, 4]]  # logits at P+t-1 predict response token t
    assert pos.tolist() == [list(range(6))] * 2
    with pytest.raises(ValueError, match="non-empty prompt"):
        pack_sequences([[], [1]], torch.zeros(2, 2, dtype=torch.long))


def test_convert_roundtrip_and_tp_shards():
    from relax_megatron import convert

    hf = mp_workers.tiny_hf("qwen2")
    a = convert.arch_from_hf_config(hf.config)
    sd = hf.state_dict()
    for tp in (1, 2):
        shards = [convert.hf_to_megatron(sd, a, tp, r) for r in range(tp)]
        back = convert.megatron_to_hf(shards, a)
        assert set(back) == set(sd)
        assert all(torch.equal(back[k], sd[k]) for k in sd)
    # Megatron's qkv row order: per KV group [q heads of the group; k; v]
    q, k = sd["model.layers.0.self_attn.q_proj.weight"], sd["model.layers.0.self_attn.k_proj.weight"]
    qkv = convert.hf_to_megatron(sd, a)["decoder.layers.0.self_attention.linear_qkv.weight"]
    d = a.head_dim
    assert torch.equal(qkv[:2 * d], q[:2 * d]) and torch.equal(qkv[2 * d:3 * d], k[:d])
    assert torch.equal(qkv[4 * d:6 * d], q[2 * d:4 * d])  # group 1 starts after q0,q1,k0,v0


def test_unsupported_configs_refused():
    from transformers import LlamaConfig

    from relax_megatron import convert

    c = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                    num_attention_heads=4, num_key_value_heads=2, hidden_act="gelu")
    with pytest.raises(ValueError, match="SwiGLU"):
        convert.arch_from_hf_config(c)
    a = convert.arch_from_hf_config(LlamaConfig(vocab_size=255, hidden_size=64, intermediate_size=128,
                                                num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2))
    with pytest.raises(ValueError, match="vocab_size = 255 is not divisible"):
        convert.check_tp(a, 2)


@needs_megatron
@pytest.mark.slow
def test_logits_equal_transformers(tp1):
    for kind, diff in tp1["logits_diff"].items():
        assert diff < 1e-4, (kind, diff)


@needs_megatron
@pytest.mark.slow
def test_token_stats_and_train_step_equal_transformers(tp1):
    m = mp_workers.tiny_batch().loss_mask
    ref = tp1["hf"]
    for key in ("log_probs", "entropy"):
        assert (tp1[key] - ref[key])[m].abs().max() < 1e-5, key
    assert (tp1["top_k"] - ref["top_k"])[m].abs().max() < 1e-5
    # the NaN loss step was skipped and left the weights untouched
    assert tp1["skipped"]["skipped"] and tp1["skipped"]["nonfinite"] == ("loss",) and tp1["unchanged"] == 0.0
    assert tp1["stepped"]["skipped"] is False and tp1["step"] == 1 and tp1["stepped"]["micro_batches"] == 2
    assert tp1["stepped"]["sums"]["loss"] == pytest.approx(ref["loss"], abs=1e-6)
    assert abs(tp1["stepped"]["grad_norm"] - ref["grad_norm"]) < 1e-5 * ref["grad_norm"]
    # the reference keeps the initial weights; the actor moved; off-mask values are 0
    assert (tp1["ref_log_probs"] - ref["log_probs"])[m].abs().max() < 1e-5
    assert (tp1["actor_after"] - tp1["ref_log_probs"])[m].abs().max() > 1e-4
    assert (tp1["log_probs"][~m] == 0).all() and (tp1["entropy"][~m] == 0).all()
    # one AdamW step (lr 1e-3, update ≈ lr·sign(g)) lands on the same weights as transformers'
    after = tp1["after"]
    moved = max((after[k] - tp1["before"][k]).abs().max().item() for k in after)
    assert moved > 5e-4
    worst = max((after[k] - ref["after"][k]).abs().max().item() for k in after)
    assert worst < 2e-5, worst


@needs_megatron
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_tp2_equals_tp1(kind, request):
    tp1, tp2 = (request.getfixturevalue("tp1"), request.getfixturevalue("tp2")) if kind == "qwen2" else \
        (request.getfixturevalue("qwen3_tp")[1], request.getfixturevalue("qwen3_tp")[2])
    assert tp2["spread"] == 0.0  # the replicated norm weights (q/k norms included) stay equal over TP ranks
    m = mp_workers.tiny_batch().loss_mask
    for key in ("log_probs", "entropy"):
        assert (tp2[key] - tp1[key])[m].abs().max() < 1e-5, key
    assert (tp2["top_k"] - tp1["top_k"])[m].abs().max() < 1e-5
    assert abs(tp2["stepped"]["grad_norm"] - tp1["stepped"]["grad_norm"]) < 1e-5
    for res in (tp1, tp2):  # a checkpoint restores the weights and the step after another step moved them
        moved_again, restored, step = res["ckpt"]
        assert moved_again > 1e-4 and restored == 0.0 and step == 1
    assert all(torch.equal(tp2["before"][k], tp1["before"][k]) for k in tp1["before"])
    worst = max((tp2["after"][k] - tp1["after"][k]).abs().max().item() for k in tp1["after"])
    assert worst < 2e-5, worst


def test_contract():
    from relax_authoring.testing import check_contract
    from relax_megatron.plugin import relax_register_train_backends

    check_contract(relax_register_train_backends()[0])


@pytest.mark.cuda
@needs_megatron
def test_cuda_megatron_equals_torch_backend(tiny_bytes_model_dir, tmp_path):
    """On CUDA at TP = 1, the megatron-core backend and the torch backend on the same random
    weights give the same log-probs and entropies (functions of the full logits at the
    sampling temperature), float32, to 1e-3 (1e-4 against transformers on CPU)."""
    out = tmp_path / "cuda.pt"
    torch.multiprocessing.spawn(mp_workers.cuda_vs_torch_worker, args=(free_port(), str(tiny_bytes_model_dir), str(out)),
                                nprocs=1, join=True)
    r = torch.load(out, weights_only=False)
    m = r["mask"]
    assert r["torch"]["log_probs"][m].std() > 0.2  # a model whose log-probs differ between tokens
    for key in ("log_probs", "entropy"):
        diff = (r["megatron"][key] - r["torch"][key])[m].abs().max()
        assert diff < 1e-3, (key, diff)
