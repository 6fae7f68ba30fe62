"""Pipeline parallel (PP = 2 equals PP = 1 on CPU over gloo, through megatron-core's 1F1B
schedule) and the context-parallel data path (chunking, gather, gradient) of the Megatron
backend; CP itself (Transformer Engine's attention) is refused without CUDA + TE."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).parent))
import mp_parallel  # noqa: E402
import mp_workers  # noqa: E402
from mp_workers import free_port, needs_megatron  # noqa: E402

from relax_megatron.parallel import cp_positions, cp_split, local_index, padded_length  # noqa: E402


def _spawn(fn, world: int, args: tuple, out: Path) -> list[dict]:
    torch.multiprocessing.spawn(fn, args=(world, free_port(), *args, str(out)), nprocs=world, join=True)
    return [torch.load(f"{out}.rank{r}", weights_only=False) for r in range(world)]


# ----------------------------------------------------------------------------- context parallel: pure functions


def test_cp_positions_hand_values_and_balance():
    assert cp_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert cp_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    assert cp_positions(12, 3, 1).tolist() == [2, 3, 8, 9]
    assert cp_positions(6, 1, 0).tolist() == list(range(6))
    for s, cp in ((8, 2), (24, 3), (32, 4)):
        parts = [cp_positions(s, cp, r) for r in range(cp)]
        assert sorted(torch.cat(parts).tolist()) == list(range(s))  # a partition of the sequence
        # causal attention cost of position p is p + 1 keys: every rank gets the same total
        assert len({int((p + 1).sum()) for p in parts}) == 1
    with pytest.raises(ValueError, match="not a multiple of 2 × context-parallel size = 4"):
        cp_positions(10, 2, 0)
    with pytest.raises(ValueError, match="rank 2 is not in"):
        cp_positions(8, 2, 2)


def test_cp_split_local_index_and_padding():
    x = torch.arange(2 * 8).view(2, 8)
    assert cp_split(x, 2, 1).tolist() == [[2, 3, 4, 5], [10, 11, 12, 13]]
    assert cp_split(x.T, 2, 0, dim=0).T.tolist() == [[0, 1, 6, 7], [8, 9, 14, 15]]
    at = torch.tensor([[1, 2, 6], [5, 7, 0]])
    index, held = local_index(at, cp_positions(8, 2, 0), 8)  # rank 0 holds [0, 1, 6, 7]
    assert held.tolist() == [[True, False, True], [False, True, True]]
    assert index[held].tolist() == [1, 2, 3, 0]
    assert int(index.min()) >= 0
    assert [padded_length(n, 4) for n in (0, 1, 4, 5, 8)] == [0, 4, 4, 8, 8]


@needs_megatron
@pytest.mark.slow
def test_cp_gather_round_trip_and_gradient_over_gloo(tmp_path):
    """2 gloo ranks: the split equals Megatron's get_batch_on_this_cp_rank, the gathered
    per-token values equal the one-process values on every rank, and a sequence-level loss
    of them gives the one-process gradient once the ranks' gradients are summed."""
    ranks = _spawn(mp_parallel.cp_gather_worker, 2, (), tmp_path / "cp")
    r0 = ranks[0]
    weight = r0["weight"].clone().requires_grad_(True)
    full = (torch.tanh(weight) * r0["w"]).gather(1, r0["at"])
    loss = (full.sum(1) ** 2).mean()
    loss.backward()
    for r, res in enumerate(ranks):
        assert torch.equal(res["split"], res["megatron_split"]), r
        assert torch.equal(res["held"], cp_positions(12, 2, r))
        assert torch.allclose(res["tok"], full.detach(), atol=1e-6, rtol=0), r
        assert res["loss"] == pytest.approx(loss.item(), rel=1e-6)
        assert torch.allclose(res["grad"], weight.grad, atol=1e-6, rtol=0), r
    assert weight.grad.abs().sum() > 0


@needs_megatron
@pytest.mark.slow
def test_backend_context_parallel_path_equals_cp1(tmp_path):
    """CP = 2 vs CP = 1 through the backend (attention emulated by a whole-sequence stand-in,
    see :func:`mp_parallel.cp_backend_worker`): the same statistics, sequence-level loss,
    gradient norm and AdamW step, with sequences padded to 2·CP and a padded micro-batch."""
    one = _spawn(mp_parallel.cp_backend_worker, 1, (), tmp_path / "cp1")[0]
    two = _spawn(mp_parallel.cp_backend_worker, 2, (), tmp_path / "cp2")
    m = mp_workers.tiny_batch().loss_mask
    for res in two:
        for key in ("log_probs", "entropy", "top_k"):
            assert (res[key] - one[key])[m].abs().max() < 1e-5, key
            assert (res[key][~m] == 0).all(), key
        # float32 loss of about 121: one ulp is 7.6e-6, so the tolerance is relative
        assert res["stepped"]["sums"]["loss"] == pytest.approx(one["stepped"]["sums"]["loss"], rel=1e-6)
        assert res["stepped"]["grad_norm"] == pytest.approx(one["stepped"]["grad_norm"], rel=1e-5)
        assert res["metrics"] == pytest.approx(one["metrics"], rel=1e-6)  # the same float32 loss as above
        moved = max((one["after"][k] - one["before"][k]).abs().max().item() for k in one["after"])
        worst = max((res["after"][k] - one["after"][k]).abs().max().item() for k in one["after"])
        assert moved > 5e-4 and worst < 1e-5, (moved, worst)


def test_context_parallel_refused_without_cuda_and_transformer_engine():
    from relax_megatron.backend import context_parallel_problem

    assert context_parallel_problem(1, cuda=False) is None
    msg = context_parallel_problem(2, cuda=False)
    assert "no CUDA device is visible" in msg and "TEDotProductAttention" in msg
    if importlib.util.find_spec("transformer_engine") is None:
        assert "transformer_engine is not installed" in context_parallel_problem(2, cuda=True)


@needs_megatron
def test_backend_refuses_context_parallel_on_cpu():
    if torch.cuda.is_available():
        pytest.skip("CPU check")
    from relax_megatron.backend import MegatronBackend

    hf = mp_workers.tiny_hf("qwen2")
    with pytest.raises(ValueError, match="needs CUDA and Transformer Engine.*fix: use --context-parallel-size 1"):
        MegatronBackend(hf.config, hf.state_dict(), cp=2)


# ----------------------------------------------------------------------------- pipeline parallel


@pytest.fixture(scope="module", params=["qwen2", "qwen3"])  # untied / tied embeddings (+ q/k norm)
def pp_runs(request, tmp_path_factory):
    if importlib.util.find_spec("megatron") is None:
        pytest.skip("megatron-core not installed")
    d = tmp_path_factory.mktemp(f"pp_{request.param}")
    pp1 = _spawn(mp_parallel.pp_worker, 1, (request.param,), d / "pp1")[0]
    pp2 = _spawn(mp_parallel.pp_worker, 2, (request.param,), d / "pp2")
    return pp1, pp2


@pytest.mark.slow
def test_pp2_forward_equals_pp1(pp_runs):
    pp1, pp2 = pp_runs
    m = mp_workers.tiny_batch().loss_mask
    for res in pp2:  # the last stage's statistics reach every stage
        for key in ("log_probs", "entropy", "top_k", "ref_log_probs", "actor_after"):
            assert res[key].shape == pp1[key].shape, key
            assert (res[key] - pp1[key])[m].abs().max() < 1e-5, key
            assert (res[key][~m] == 0).all(), key
    assert (pp1["actor_after"] - pp1["ref_log_probs"])[m].abs().max() > 1e-4  # the actor moved, the reference did not
    for res in pp2:  # --bf16 (autocast; the stages exchange bfloat16 hidden states): PP = 2 equals PP = 1 too
        assert (res["bf16_log_probs"] - pp1["bf16_log_probs"])[m].abs().max() < 1e-5
    assert 1e-4 < (pp1["bf16_log_probs"] - pp1["log_probs"])[m].abs().max() < 0.5  # bf16 differs from fp32


@pytest.mark.slow
def test_pp2_training_step_equals_pp1(pp_runs):
    pp1, pp2 = pp_runs
    for res in pp2:
        assert res["skipped"]["skipped"] and "loss" in res["skipped"]["nonfinite"] and res["unchanged"] == 0.0
        s = res["stepped"]
        assert s["skipped"] is False and s["micro_batches"] == 2  # 4 samples in micro-batches of 3: one padded
        assert s["sums"]["loss"] == pytest.approx(pp1["stepped"]["sums"]["loss"], abs=1e-6)
        assert abs(s["grad_norm"] - pp1["stepped"]["grad_norm"]) < 1e-5 * pp1["stepped"]["grad_norm"]
        assert res["metrics"]["train/tokens"] == float(mp_workers.tiny_batch().loss_mask.sum())  # pads not counted
        assert res["metrics"]["train/toy_loss"] == pytest.approx(pp1["metrics"]["train/toy_loss"], abs=1e-6)
        # every stage returns the whole model's weights (stages merged), before and after the step
        assert set(res["after"]) == set(pp1["after"])
        assert all(torch.equal(res["before"][k], pp1["before"][k]) for k in pp1["before"])
        moved = max((pp1["after"][k] - pp1["before"][k]).abs().max().item() for k in pp1["after"])
        worst = max((res["after"][k] - pp1["after"][k]).abs().max().item() for k in pp1["after"])
        assert moved > 5e-4 and worst < 1e-5, (moved, worst)
        moved_again, restored, step = res["ckpt"]
        assert moved_again > 1e-4 and restored == 0.0 and step == 1


def test_pipeline_needs_layers_divisible():
    from relax_megatron import convert

    a = convert.arch_from_hf_config(mp_workers.tiny_hf("qwen2").config)  # 2 layers
    with pytest.raises(ValueError, match="num_hidden_layers = 2 is not divisible by --pipeline-parallel-size 3"):
        convert.check_pp(a, 3)


def test_convert_round_trip_over_pipeline_stages():
    from relax_megatron import convert

    for kind in ("qwen2", "qwen3"):
        hf = mp_workers.tiny_hf(kind)
        a = convert.arch_from_hf_config(hf.config)
        sd = {k: v for k, v in hf.state_dict().items() if not (a.tie_word_embeddings and k == "lm_head.weight")}
        stages = [convert.hf_to_megatron(sd, a, pp=2, pp_rank=p) for p in range(2)]
        # stage 0: embedding + HF layer 0 as local layer 0; stage 1: HF layer 1 as local 0, norm, head
        assert "embedding.word_embeddings.weight" in stages[0] and "output_layer.weight" not in stages[0]
        assert "decoder.final_layernorm.weight" in stages[1] and "embedding.word_embeddings.weight" not in stages[1]
        assert torch.equal(stages[1]["decoder.layers.0.input_layernorm.weight"],
                           sd["model.layers.1.input_layernorm.weight"])
        head = sd["model.embed_tokens.weight"] if a.tie_word_embeddings else sd["lm_head.weight"]
        assert torch.equal(stages[1]["output_layer.weight"], head)  # tied: the last stage's copy
        for tp in (1, 2):
            shards = [convert.merge_stages([convert.hf_to_megatron(sd, a, tp, r, pp=2, pp_rank=p) for p in range(2)], a)
                      for r in range(tp)]
            back = convert.megatron_to_hf(shards, a)
            assert set(back) == set(sd) and all(torch.equal(back[k], sd[k]) for k in sd), (kind, tp)
