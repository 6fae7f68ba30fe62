"""The run's terminal display (issue 19 §2): what the screen shows at 80 and 120 columns,
one plain line per step when stdout is not a terminal, and the start-up phase."""

import io
import re
import subprocess
import sys

from rich.console import Console

from relax_core.config import RunConfig
from relax_core.reporting import progress
from relax_core.reporting.metrics import MetricsLogger

METRICS = {"rollout/raw_reward": 0.1875, "rollout/response_len/mean": 19.4, "perf/step_time": 9.3,
           "train/grad_norm": 0.52, "train/pg_clipfrac": 0.0, "train/ppo_kl": 0.0, "train/entropy": 1.37,
           "perf/rollout_time": 1.2, "perf/train_time": 8.0, "perf/rollout_tokens_per_s": 210.0,
           "eval/chain_sum/pass@1": 0.54}


def _screen(width: int, step: int | None = 3, total: int = 20) -> str:
    """The live line as a terminal of ``width`` columns shows it."""
    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=True, color_system=None, legacy_windows=False)
    d = progress.RunDisplay(live=False, console=console)
    d.begin(total)
    if step is not None:
        d.metrics, d.step_no = METRICS, step
    console.print(d)
    return out.getvalue()


def test_80_columns_show_step_bar_elapsed_eta_reward_and_more():
    screen = _screen(80)
    (line,) = screen.splitlines()
    assert len(line) <= 80
    assert line.startswith("step 3/20 ")
    assert re.search(r"━", line), line  # the bar
    assert re.search(r"\d+:\d\d eta \d+:\d\d", line), line
    assert "reward 0.188" in line and "held-out 54%" in line and "len 19" in line, line


def test_120_columns_show_more_numbers_and_a_longer_bar():
    narrow, wide = _screen(80).strip(), _screen(120).strip()
    assert len(wide) <= 120 and len(wide) > len(narrow)
    assert wide.count("│") > narrow.count("│")
    assert "step s 9.3" in wide
    assert wide.count("━") >= narrow.count("━")


def test_before_the_first_step_the_line_names_the_phase():
    out = io.StringIO()
    console = Console(file=out, width=80, force_terminal=True, color_system=None)
    d = progress.RunDisplay(live=False, console=console)
    d.phase("loading the model smollm2-135m-instruct")
    console.print(d)
    assert out.getvalue().startswith("relax: loading the model smollm2-135m-instruct… 0:00")
    out.seek(0), out.truncate()
    d.phase("loading the model smollm2-135m-instruct into the training backend (torch)")  # 73 characters
    console.print(d)
    # 80 columns: the phase is cut to 67 characters, the elapsed time stays (it lost it before)
    assert out.getvalue() == "relax: loading the model smollm2-135m-instruct into the training backend (… 0:00\n"


def test_not_a_terminal_prints_one_plain_line_per_step(tmp_path):
    """`relax train … | tee log`: stdout is a pipe, so each step is one plain line."""
    code = ("import sys; from relax_core.reporting.metrics import MetricsLogger; from relax_core.config import RunConfig\n"
            f"log = MetricsLogger({str(tmp_path)!r}, RunConfig(num_rollout=3), {{}})\n"
            "for s in (1, 2, 3): log.log(s, {'rollout/raw_reward': s / 4, 'rollout/response_len/mean': 10.0})\n"
            "log.close()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    lines = out.stdout.splitlines()
    assert len(lines) == 3, out
    assert re.fullmatch(r"\[relax\] step 1/3 \| \d+:\d\d eta \d+:\d\d \| reward 0\.250 \| len 10", lines[0]), lines[0]
    assert lines[2].startswith("[relax] step 3/3 | ")
    assert "step 1" in out.stderr  # the phase, on stderr


def test_quiet_is_plain_lines_even_on_a_terminal(tmp_path, capsys):
    log = MetricsLogger(tmp_path, RunConfig(quiet=True, num_rollout=2), {})
    log.log(1, {"rollout/raw_reward": 0.25, "train/skipped_steps": 1.0})
    log.message("hello")
    log.close()
    cap = capsys.readouterr()
    assert cap.out.startswith("[relax] step 1/2 | ") and cap.out.rstrip().endswith("reward 0.250 | skipped 1")
    assert "[relax] hello" in cap.err
    assert progress.current() is None


def test_eta_counts_from_the_first_step_not_from_the_evaluation_before_it(tmp_path, monkeypatch):
    clock = {"t": 1000.0}
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock["t"])
    log = MetricsLogger(tmp_path, RunConfig(quiet=True, num_rollout=11, eval_interval=10), {})
    clock["t"] += 600  # a slow evaluation before step 1
    log.log(0, {"eval/chain_sum/pass@1": 0.2})
    clock["t"] += 10  # step 1 takes 10 s
    log.log(1, {"rollout/raw_reward": 0.5})
    assert log.display._eta() == "eta 1:40"  # 10 more steps of 10 s, not of 610 s
    log.close()
