"""`relax train` with the default layout (--shared-prefix, and --packing with a token budget)
and with --no-shared-prefix --no-packing (tiny model, float32, 3 steps): the same metrics.jsonl
within float32 rounding (issue 24 items 1 and 2)."""

import math

import pytest
from conftest import run_train, tiny_args

from relax_core.reporting.metrics import read_metrics

TIMING = ("time", "perf/", "throughput", "_s", "rss", "tokens_per_s")


@pytest.mark.parametrize("extra", [(), pytest.param(("--estimator", "gspo", "--max-tokens-per-micro-batch", "60"),
                                                    marks=pytest.mark.slow)])
def test_run_with_shared_prefix_equals_plain(tiny_model_dir, prompts_file, tmp_path, extra, monkeypatch):
    import relax_torch.backend as backend

    layouts = {False: [], True: []}  # per run: whether each micro-batch forward used the shared layout
    forward_mb = backend.TorchBackend._forward_mb

    def spy(self, mb, inputs, *a, **k):
        layouts[self.shared_prefix].append(inputs[5] is not None)
        return forward_mb(self, mb, inputs, *a, **k)

    monkeypatch.setattr(backend.TorchBackend, "_forward_mb", spy)
    recs = {}
    for on in (False, True):
        args = tiny_args(tiny_model_dir, prompts_file, tmp_path, *extra, "--num-rollout", "3", "--no-save-hf",
                         *(() if on else ("--no-shared-prefix", "--no-packing")))
        args[args.index("--run-name") + 1] = f"run-{on}"
        code, out = run_train(args)
        assert code == 0, out
        recs[on] = read_metrics(tmp_path / f"run-{on}")
    assert layouts[True] and all(layouts[True]) and layouts[False] and not any(layouts[False])
    assert [r["step"] for r in recs[True]] == [r["step"] for r in recs[False]] == [1, 2, 3]
    for on in (False, True):  # the training forward's padding, reported by the torch backend
        assert all(0.0 <= r["perf/padding_fraction"] < 1.0 for r in recs[on])
    if "--max-tokens-per-micro-batch" in extra:  # packed rows: no padding
        assert all(r["perf/padding_fraction"] == 0.0 for r in recs[True])
    compared = 0
    for a, b in zip(recs[False], recs[True]):
        for k, v in a.items():
            if not isinstance(v, float) or any(t in k for t in TIMING) or not math.isfinite(v):
                continue
            assert b[k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
            compared += 1
    assert compared > 20
