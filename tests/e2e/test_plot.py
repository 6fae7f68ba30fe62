"""relax plot (issue 19 §4): the panels that carry information, integer steps, run names in
the legend, an overlay in its own file named after the runs, and one-line errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.main import app
from cli.plot import PlotError, default_metrics, load_runs, plot_runs, smooth


def _run(path, rewards, **extra):
    path.mkdir(parents=True)
    recs = [{"step": 0, "eval/chain_sum/pass@1": 0.2}]
    recs += [{"step": i + 1, "rollout/raw_reward": r, "rollout/response_len/mean": 10 + i,
              "train/loss": 1e-8 * (-1) ** i, "train/ppo_kl": 0.0, "train/pg_clipfrac": 0.0,
              "train/grad_norm": 0.5 + 0.1 * i, "train/entropy": "nan" if i == 1 else 1.0 - 0.01 * i,
              **extra} for i, r in enumerate(rewards)]
    recs[-1]["eval/chain_sum/pass@1"] = 0.5
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_default_panels_are_the_informative_ones(tmp_path):
    runs = load_runs([_run(tmp_path / "grpo-a", [0.1, 0.2, 0.4, 0.3])])
    assert default_metrics(runs) == ["rollout/raw_reward", "eval/chain_sum/pass@1", "rollout/response_len/mean",
                                     "train/grad_norm", "train/entropy"]  # no loss noise, no all-zero KL/clipfrac


def test_kl_is_shown_when_it_varies(tmp_path):
    a = _run(tmp_path / "a", [0.1, 0.2, 0.3])
    recs = [json.loads(x) for x in (a / "metrics.jsonl").read_text().splitlines()]
    for i, r in enumerate(recs):
        r["train/ppo_kl"] = 0.001 * i
    (a / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert "train/ppo_kl" in default_metrics(load_runs([a]))


def test_smoothing_is_a_centred_moving_average():
    assert smooth([0.0, 3.0, 0.0, 3.0], window=3) == [1.5, 1.0, 2.0, 1.5]


def test_one_run_writes_its_own_png_with_integer_steps_and_run_names(tmp_path, monkeypatch):
    import matplotlib.figure

    seen = {}
    original = matplotlib.figure.Figure.savefig

    def spy(fig, path, **kw):
        seen["axes"] = [ax for ax in fig.axes if ax.get_visible()]
        return original(fig, path, **kw)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    a = _run(tmp_path / "grpo-a", [0.1, 0.2, 0.4, 0.3, 0.5])
    out = plot_runs([a])
    assert out == a / "metrics.png" and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    reward_ax = seen["axes"][0]
    assert reward_ax.get_title() == "rollout/raw_reward"
    assert [t.get_text() for t in reward_ax.get_legend().get_texts()] == ["grpo-a (smoothed)"]
    ticks = [t for t in reward_ax.get_xticks() if 1 <= t <= 5]
    assert ticks and all(float(t).is_integer() for t in ticks)


def test_an_overlay_goes_to_a_new_file_named_after_the_runs(tmp_path):
    a, b = _run(tmp_path / "grpo-a", [0.1, 0.2, 0.4]), _run(tmp_path / "rloo-b", [0.1, 0.3, 0.3])
    (a / "metrics.png").write_bytes(b"mine")
    res = CliRunner().invoke(app, ["plot", str(a), str(b)])
    assert res.exit_code == 0, res.output
    want = tmp_path / "plot-grpo-a_vs_rloo-b.png"
    assert res.stdout.strip() == str(want) and want.is_file()
    assert (a / "metrics.png").read_bytes() == b"mine"  # the first run's own plot is untouched


@pytest.mark.parametrize("argv, message", [
    (["{missing}"], "metrics.jsonl not found"),
    (["{run}", "--metric", "train/nope"], "not logged by this run: train/nope"),
    (["{run}", "--metric", "rollout/raw_rewad"], "did you mean rollout/raw_reward"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, argv, message):
    run = _run(tmp_path / "a", [0.1, 0.2])
    argv = [x.format(run=run, missing=tmp_path / "missing") for x in argv]
    res = CliRunner().invoke(app, ["plot", *argv])
    assert res.exit_code == 2
    assert res.stderr.count("\n") == 1 and message in res.stderr and "Traceback" not in res.output


def test_plot_runs_raises_plot_error(tmp_path):
    with pytest.raises(PlotError):
        plot_runs([])
