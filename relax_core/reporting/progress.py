"""What a run shows in the terminal while it runs: the start-up phase, then one line per step.

In a terminal (and without ``--quiet``) a rich live line that fits the width: at 80 columns
``step n/N``, a bar, elapsed and ETA, the reward and one or two more numbers; more columns
show more numbers (the order of :data:`DISPLAY`) and a longer bar.  Before the first step
it names the phase (``loading the model``, ``starting the reward workers``, …) with the
elapsed time.  When stdout is not a terminal (``relax train … | tee log``) or with
``--quiet``, one plain line per step on stdout and one line per phase on stderr.

A run has one display (:func:`start`, :func:`current`): :mod:`relax_core.run.launch` opens it
before anything loads, and :class:`relax_core.reporting.metrics.MetricsLogger` reports steps to it.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text

#: Numbers shown after the reward, most important first: (metric, label, format).
DISPLAY = (
    ("rollout/raw_reward", "reward", "{:.3f}"),
    ("rollout/response_len/mean", "len", "{:.0f}"),
    ("perf/step_time", "step s", "{:.1f}"),
    ("train/grad_norm", "grad", "{:.2f}"),
    ("train/kl_loss", "kl", "{:.1e}"),
    ("train/pg_clipfrac", "clipfrac", "{:.3f}"),
    ("train/ppo_kl", "ppo_kl", "{:.1e}"),
    ("train/entropy", "entropy", "{:.2f}"),
    ("perf/rollout_time", "rollout s", "{:.1f}"),
    ("perf/train_time", "train s", "{:.1f}"),
    ("perf/rollout_tokens_per_s", "tok/s", "{:.0f}"),
    ("perf/peak_rss_gib", "peak GiB", "{:.2f}"),
)
SEP = " │ "
BAR_MIN, BAR_MAX = 10, 40


def clock(seconds: float) -> str:
    """``75`` → ``"1:15"``, ``3725`` → ``"1:02:05"``."""
    s = int(max(seconds, 0))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def metric_parts(metrics: dict[str, Any]) -> list[str]:
    """``"reward 0.188"``, ``"len 19"``, … for the logged numbers of :data:`DISPLAY`, the
    held-out pass@1 right after the reward, and skipped steps when there were any."""
    parts = []
    for key, label, fmt in DISPLAY:
        v = metrics.get(key)
        if isinstance(v, (int, float)):
            parts.append(f"{label} {fmt.format(v)}")
    held_out = [v for k, v in sorted(metrics.items()) if k.startswith("eval/") and k.endswith("/pass@1")]
    if held_out:
        parts.insert(1 if parts else 0, f"held-out {held_out[0]:.0%}")
    if metrics.get("train/skipped_steps"):
        parts.append(f"skipped {int(metrics['train/skipped_steps'])}")
    return parts


class RunDisplay:
    """The terminal view of one run (see the module docstring).

    Args:
        live: a live line (``True``) or plain lines (``False``); default: live when the
            console is a terminal.
        console: where to draw (default: stdout).
    """

    def __init__(self, *, live: bool | None = None, console: Console | None = None) -> None:
        self.console = console or Console(highlight=False)
        self.live_mode = self.console.is_terminal if live is None else live
        self.t0 = time.monotonic()
        self.total = 0
        self.first_step = 0
        self.t_steps: float | None = None
        self.step_no: int | None = None
        self.metrics: dict[str, Any] = {}
        self.phase_text = "starting"
        self._live = None
        if self.live_mode:
            from rich.live import Live

            self._live = Live(self, console=self.console, refresh_per_second=2, transient=False)
            self._live.start()

    # ---------------------------------------------------------------- what the loop calls
    def phase(self, text: str) -> None:
        """The start-up phase now under way (shown until the first step is logged)."""
        self.phase_text = text
        if not self.live_mode:
            print(f"[relax] {text} ({clock(time.monotonic() - self.t0)})", file=sys.stderr, flush=True)

    def begin(self, total: int, start_step: int = 0) -> None:
        """The step loop starts: ``total`` steps, ``start_step`` already done (resume)."""
        self.total, self.first_step = total, start_step
        self.t_steps = time.monotonic()

    def step(self, step: int, metrics: dict[str, Any]) -> None:
        """Step ``step`` (1-based) finished with these metrics."""
        self.step_no, self.metrics = step, metrics
        if not self.live_mode:
            head = f"step {step}/{self.total}"
            print("[relax] " + " | ".join([head, self._times()] + metric_parts(metrics)), flush=True)

    def message(self, text: str) -> None:
        """A line for the user, above the live line (or on stderr)."""
        if self.live_mode:
            self.console.print(text, markup=False, highlight=False)
        else:
            print(f"[relax] {text}", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Draw the last line and stop the live display."""
        if self._live is not None:
            self._live.stop()
            self._live = None

    # ---------------------------------------------------------------- rendering
    def _eta(self) -> str:
        done = (self.step_no or 0) - self.first_step
        if not done or self.t_steps is None:
            return "eta ?"
        per_step = (time.monotonic() - self.t_steps) / done
        return f"eta {clock(per_step * max(self.total - self.step_no, 0))}"

    def _times(self) -> str:
        return f"{clock(time.monotonic() - self.t0)} {self._eta()}"

    def line(self, width: int) -> Text:
        """The live line at ``width`` columns: never wider, the most important items first."""
        elapsed = clock(time.monotonic() - self.t0)
        if self.step_no is None:  # a phase too long for the width is cut, not the elapsed time
            room = max(width - len(f"relax: … {elapsed}"), 0)
            return Text(f"relax: {self.phase_text[:room]}… {elapsed}"[:width])
        head, times = f"step {self.step_no}/{self.total}", self._times()
        fixed = len(head) + 1 + len(times)
        bar_want = max(BAR_MIN, min(BAR_MAX, width // 5))
        shown: list[str] = []
        for p in metric_parts(self.metrics):  # the numbers that fit beside a bar of bar_want cells
            if fixed + bar_want + 1 + sum(len(SEP) + len(x) for x in [*shown, p]) > width:
                break
            shown.append(p)
        tail = "".join(SEP + p for p in shown)
        room = min(BAR_MAX, width - fixed - len(tail) - 1)
        text = Text(head + " ")
        if room >= BAR_MIN:
            filled = round(room * min(self.step_no, self.total) / max(self.total, 1))
            text.append("━" * filled, style="bar.complete")
            text.append("─" * (room - filled), style="bar.back")
            text.append(" ")
        text.append(times + tail)
        text.truncate(width)
        return text

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.line(options.max_width)


_CURRENT: RunDisplay | None = None


def start(cfg: Any) -> RunDisplay:
    """Open the run's display (plain lines with ``--quiet`` or when stdout is no terminal)."""
    global _CURRENT
    close()
    _CURRENT = RunDisplay(live=False if getattr(cfg, "quiet", False) else None)
    return _CURRENT


def current() -> RunDisplay | None:
    """The display :func:`start` opened, if it is still open."""
    return _CURRENT


def close() -> None:
    """Close the run's display (idempotent)."""
    global _CURRENT
    if _CURRENT is not None:
        _CURRENT.close()
        _CURRENT = None
