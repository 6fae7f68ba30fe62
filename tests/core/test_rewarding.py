"""The reward stage: safe scoring in worker processes, scorer resolution, processors."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import rewarding_toy_scorers as toys

from relax_core import RewardScorerSpec
from relax_core.config import RunConfig
from relax_core.host.plugins import load_registry
from relax_core.stages.rewarding import (
    RewardSetupError,
    Scorer,
    ScoringPool,
    _pool_for,
    load_custom_scorer,
    resolve_scorers,
    score_batch,
    shutdown_pools,
)
from relax_core_test_toys import make_plugin

# a bug in the pool would hang rather than fail: bound every test
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _no_leftover_pools():
    yield
    shutdown_pools()


def _toy_registry():
    specs = [RewardScorerSpec(name=n, summary=n, source="test", factory=f"rewarding_toy_scorers:{f}")
             for n, f in (("math", "build_exact"), ("exact", "build_exact"), ("boom", "build_always_raise"),
                          ("needs_url", "build_needs_url"))]
    return load_registry([("toys", make_plugin(*specs))], entry_points=False)


def _score(fn, responses, labels=None, metadata=None, *, timeout=5.0, workers=2):
    n = len(responses)
    return score_batch(fn, responses, labels if labels is not None else ["1"] * n,
                       metadata if metadata is not None else [{}] * n, timeout=timeout, num_workers=workers)


def test_rewards_in_input_order_whatever_the_completion_order():
    # the first samples sleep longest, so they complete last
    responses = ["1", "0", "1", "1", "0", "1"]
    meta = [{"sleep": s} for s in (0.3, 0.2, 0.1, 0.0, 0.0, 0.0)]
    rewards, stats = _score(toys.exact, responses, metadata=meta)
    assert rewards == [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    assert stats == {"reward_errors": 0, "reward_timeouts": 0}


def test_a_scorer_that_always_raises_gives_none_and_counts_errors(caplog):
    t0 = time.monotonic()
    rewards, stats = _score(toys.always_raise, ["a"] * 16)
    assert rewards == [None] * 16
    assert stats == {"reward_errors": 16, "reward_timeouts": 0}
    assert time.monotonic() - t0 < 10
    assert "this scorer always fails" in caplog.text


def test_a_scorer_sleeping_past_the_timeout_is_stopped_and_counted():
    t0 = time.monotonic()
    rewards, stats = _score(toys.sleep_past_timeout, ["a"] * 4, timeout=0.5, workers=2)
    elapsed = time.monotonic() - t0
    assert rewards == [None] * 4
    assert stats == {"reward_errors": 0, "reward_timeouts": 4}
    # two rounds of 0.5 s on two workers, plus process start-ups; never the scorer's hour
    assert elapsed < 10, elapsed


def test_a_hung_call_does_not_hold_the_others():
    responses = ["ok", "hang", "ok", "ok", "hang", "ok"]
    t0 = time.monotonic()
    rewards, stats = _score(toys.hang_on_request, responses, timeout=0.5)
    assert rewards == [1.0, None, 1.0, 1.0, None, 1.0]
    assert stats == {"reward_errors": 0, "reward_timeouts": 2}
    assert time.monotonic() - t0 < 10


def test_worker_death_and_bad_values_are_errors_and_the_pool_recovers():
    with ScoringPool(toys.exit_worker, 2) as pool:
        rewards, stats = pool.score(["a", "b", "c"], ["1"] * 3, [{}] * 3, timeout=5)
        assert rewards == [None] * 3 and stats["reward_errors"] == 3
    with ScoringPool(toys.bad_value, 1) as pool:
        rewards, stats = pool.score(["nan", "str", "bool"], ["1"] * 3, [{}] * 3, timeout=5)
        assert rewards == [None] * 3 and stats == {"reward_errors": 3, "reward_timeouts": 0}
    rewards, stats = _score(toys.none_scorer, ["a", "b"])
    assert rewards == [None, None] and stats == {"reward_errors": 0, "reward_timeouts": 0}  # None = unscored, no error


def test_pool_is_reused_across_batches_and_replaces_killed_workers():
    first, _ = _score(toys.pid, ["a"] * 8, workers=2)
    pool = _pool_for(toys.pid, 2)
    pids = {float(w.process.pid) for w in pool._workers}
    second, _ = _score(toys.pid, ["a"] * 8, workers=2)
    assert _pool_for(toys.pid, 2) is pool and len(pids) == 2
    assert set(first) | set(second) <= pids
    with ScoringPool(toys.hang_on_request, 1) as pool:
        r1, s1 = pool.score(["hang", "ok"], ["1"] * 2, [{}] * 2, timeout=0.3)
        assert r1 == [None, 1.0] and s1["reward_timeouts"] == 1


def test_a_worker_killed_by_sigint_while_starting_is_started_again(tmp_path):
    """A Ctrl-C reaching a reward worker before it ignores SIGINT (a pool started or a worker
    replaced off the main thread, by a fully-async rollout) kills it while it starts (exit
    -SIGINT); the pool starts it again instead of ending the run."""
    marker = tmp_path / "interrupt-next-start"
    marker.write_text("")
    with ScoringPool(toys.InterruptedWhileStarting(str(marker)), 1) as pool:
        rewards, stats = pool.score(["a", "b"], ["1"] * 2, [{}] * 2, timeout=5.0)
        assert not marker.exists()  # the first start was interrupted
        assert rewards == [1.0, 1.0] and stats["reward_errors"] == 0
        marker.write_text("")
        pool._replace(pool._workers[0])  # a replacement (after a timeout or a crash) interrupted the same way
        assert pool.score(["c"], ["1"], [{}], timeout=5.0)[0] == [1.0] and not marker.exists()


def test_a_worker_killed_by_sigint_at_every_start_is_a_setup_error(tmp_path):
    marker = tmp_path / "interrupt-every-start"
    marker.write_text("")
    pool = ScoringPool(toys.InterruptedWhileStarting(str(marker), every_time=True), 1)
    with pytest.raises(RewardSetupError, match="killed by SIGINT while starting, 3 times"):
        pool.score(["a"], ["1"], [{}], timeout=5.0)
    assert pool.closed


def test_empty_batch_and_length_mismatch():
    assert _score(toys.exact, []) == ([], {"reward_errors": 0, "reward_timeouts": 0})
    with pytest.raises(ValueError, match="differ in length"):
        score_batch(toys.exact, ["a", "b"], ["1"], [{}, {}], timeout=1, num_workers=1)


def test_unpicklable_scorer_is_a_setup_error():
    with pytest.raises(RewardSetupError, match="module-level function"):
        _score(lambda r, l, m: 1.0, ["a"])


def test_scorer_auto_uses_the_rows_scorer_else_math():
    reg = _toy_registry()
    (scorer,) = resolve_scorers(RunConfig(), reg)
    assert [scorer.name_for(m) for m in ({"scorer": "boom"}, {}, None)] == ["boom", "math", "math"]
    rewards, stats = score_batch(scorer, ["1", "1", "0"], ["1", "1", "1"], [{"scorer": "exact"}, {"scorer": "boom"}, {}],
                                 timeout=5, num_workers=2)
    assert rewards == [1.0, None, 0.0] and stats["reward_errors"] == 1
    with pytest.raises(RewardSetupError, match="no reward scorer named 'nope'.*installed: boom, exact, math"):
        score_batch(scorer, ["1"], ["1"], [{"scorer": "nope"}], timeout=5, num_workers=1)


def test_scorer_fixed_name_and_custom_path():
    reg = _toy_registry()
    (fixed,) = resolve_scorers(RunConfig(reward=("boom",)), reg)
    assert fixed.name_for({"scorer": "exact"}) == "boom"
    (custom,) = resolve_scorers(RunConfig(custom_rm_path="rewarding_toy_scorers:exact"), reg)
    assert custom.name_for({"scorer": "boom"}) == "custom"
    assert score_batch(custom, ["1", "2"], ["1", "1"], [{"scorer": "boom"}, {}], timeout=5, num_workers=1)[0] == [1.0, 0.0]
    with pytest.raises(RewardSetupError, match="give only one"):
        resolve_scorers(RunConfig(reward=("exact",), custom_rm_path="rewarding_toy_scorers:exact"), reg)


@pytest.mark.parametrize("path, match", [
    ("rewarding_toy_scorers.exact", "must be 'pkg.module:function'"),
    ("no_such_module_xyz:fn", "ModuleNotFoundError"),
    ("rewarding_toy_scorers:missing", "AttributeError"),
    ("rewarding_toy_scorers:__doc__", "is not callable"),
])
def test_bad_custom_paths(path, match):
    with pytest.raises(RewardSetupError, match=match):
        load_custom_scorer(path)
    with pytest.raises(RewardSetupError, match=match):
        resolve_scorers(RunConfig(custom_rm_path=path), _toy_registry())


def test_setup_errors_surface_at_resolution():
    reg = _toy_registry()
    with pytest.raises(RewardSetupError, match="'needs_url' cannot be built: ValueError: needs --rm-url"):
        resolve_scorers(RunConfig(reward=("needs_url",)), reg)
    assert resolve_scorers(RunConfig(reward=("needs_url",), rm_url="http://127.0.0.1:1/"), reg)[0].reward == "needs_url"
    with pytest.raises(RewardSetupError, match="no reward scorer named 'nope'"):
        resolve_scorers(RunConfig(reward=("nope",)), reg)
    # a scorer named only by the data is built (checked) before any sample is scored
    (auto,) = resolve_scorers(RunConfig(), reg)
    with pytest.raises(RewardSetupError, match="'needs_url' cannot be built"):
        auto.check([{}, {"scorer": "needs_url"}])
    with pytest.raises(RewardSetupError, match="'needs_url' cannot be built"):
        score_batch(auto, ["1"], ["1"], [{"scorer": "needs_url"}], timeout=5, num_workers=1)


def test_scorer_build_time_does_not_count_against_the_timeout():
    spec = RewardScorerSpec(name="slow", summary="s", source="t", factory="rewarding_toy_scorers:slow_factory")
    scorer = Scorer({"slow": spec}, reward="slow")
    rewards, stats = score_batch(scorer, ["1", "0"], ["1", "1"], [{}, {}], timeout=0.5, num_workers=1)
    assert rewards == [1.0, 0.0] and stats == {"reward_errors": 0, "reward_timeouts": 0}


def test_scorer_pickles_without_built_functions():
    import pickle

    (scorer,) = resolve_scorers(RunConfig(reward=("exact",)), _toy_registry())
    assert scorer._built  # built once at resolution
    clone = pickle.loads(pickle.dumps(scorer))
    assert clone._built == {} and clone("1", "1", {}) == 1.0 and "exact" in clone._built


def _batched_registry():
    specs = [RewardScorerSpec(name=n, summary=n, source="test", factory=f"rewarding_toy_scorers:{f}", batched=b)
             for n, f, b in (("math", "build_exact", False), ("exact", "build_exact", False),
                             ("batchy", "build_batch_len", True), ("short", "build_batch_wrong_length", True),
                             ("sleepy", "build_batch_sleep", True))]
    return load_registry([("toys", make_plugin(*specs))], entry_points=False)


def test_a_batched_scorer_gets_its_samples_in_one_call_beside_per_sample_ones():
    (scorer,) = resolve_scorers(RunConfig(), _batched_registry())  # auto: each row names its scorer
    meta = [{"scorer": "batchy"}, {"scorer": "exact"}, {"scorer": "batchy"}, {"scorer": "batchy"}, {"scorer": "exact"}]
    rewards, stats = score_batch(scorer, ["a", "1", "bbb", "nan", "2"], ["1"] * 5, meta, timeout=5, num_workers=2)
    # one call of the 3 batchy samples: 300 + length; the NaN is that sample's error only; exact per sample
    assert rewards == [301.0, 1.0, 303.0, None, 0.0] and stats == {"reward_errors": 1, "reward_timeouts": 0}


@pytest.mark.parametrize("name, kind", [("short", "reward_errors"), ("sleepy", "reward_timeouts")])
def test_a_failed_batched_call_fails_each_of_its_samples(name, kind):
    (scorer,) = resolve_scorers(RunConfig(reward=(name,)), _batched_registry())
    rewards, stats = score_batch(scorer, ["a", "b", "c"], ["1"] * 3, [{}] * 3, timeout=1, num_workers=1)
    assert rewards == [None, None, None] and stats[kind] == 3 and sum(stats.values()) == 3
    (ok,) = resolve_scorers(RunConfig(reward=("batchy",)), _batched_registry())  # the pool goes on
    assert score_batch(ok, ["a", "bad"], ["1"] * 2, [{}] * 2, timeout=5, num_workers=1) == \
        ([201.0, None], {"reward_errors": 1, "reward_timeouts": 0})


def test_real_scorers_through_the_pool():
    relax_math = pytest.importorskip("relax_math.plugin")
    reg = load_registry([("math", relax_math)], entry_points=False)
    (scorer,) = resolve_scorers(RunConfig(), reg)
    responses = ["\\boxed{\\frac{1}{2}}", "\\boxed{0.5}", "so $18 a day", "\\boxed{\\frac{1}{2}", "\\boxed{3}"]
    labels = ["0.5", "\\frac{1}{2}", "#### 18", "\\frac{1}{2}", "see figure"]
    meta = [{}, {"scorer": "math"}, {"scorer": "gsm8k"}, {}, {}]
    rewards, stats = score_batch(scorer, responses, labels, meta, timeout=10, num_workers=2)
    assert rewards == [1.0, 1.0, 1.0, 0.0, None]
    assert stats == {"reward_errors": 0, "reward_timeouts": 0}


def test_prompts_reach_the_scorer_as_metadata():
    rewards, _ = score_batch(toys.echo_prompt, ["r", "r"], ["p0", "x"], [{"a": 1}, None], prompts=["p0", "p1"],
                             timeout=5, num_workers=1)
    assert rewards == [1.0, 0.0]


def test_an_unpicklable_sample_is_an_error_not_a_crash():
    rewards, stats = score_batch(toys.exact, ["1", "1"], ["1", "1"], [{"x": lambda: 0}, {}], timeout=5, num_workers=1)
    assert rewards == [None, 1.0] and stats == {"reward_errors": 1, "reward_timeouts": 0}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return not any(line.startswith("State:") and "Z" in line for line in f)
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc to watch the worker")
def test_a_hung_worker_does_not_outlive_a_killed_trainer(tmp_path):
    script = tmp_path / "trainer.py"
    script.write_text(textwrap.dedent(f"""
        import sys, threading, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import rewarding_toy_scorers as toys
        from relax_core.stages.rewarding import ScoringPool
        if __name__ == "__main__":
            pool = ScoringPool(toys.hang_on_request, 1)
            threading.Thread(target=pool.score, args=(["hang"], ["1"], [{{}}], 600), daemon=True).start()
            while not pool._workers[0].started:
                time.sleep(0.05)
            print(pool._workers[0].process.pid, flush=True)
            time.sleep(600)
    """))
    trainer = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(trainer.stdout.readline())
        assert _alive(worker)
    finally:
        trainer.kill()
        trainer.wait()
    deadline = time.monotonic() + 20
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(worker)


def test_ctrl_c_to_the_process_group_does_not_kill_the_reward_workers(tmp_path):
    """A terminal's Ctrl-C reaches the whole foreground process group: the workers ignore
    it, every sample of the batch in flight is scored, and the parent sees the SIGINT once
    (issue 18 item 7; before the fix two samples came back unscored: 'worker process died')."""
    script = tmp_path / "trainer.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, sys, threading
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import rewarding_toy_scorers as toys
        from relax_core.stages.rewarding import ScoringPool
        if __name__ == "__main__":
            got = []
            signal.signal(signal.SIGINT, lambda *a: got.append(1))
            pool = ScoringPool(toys.exact, 2)
            # Ctrl-C while the workers start, and again while they score
            threading.Timer(0.05, os.killpg, (os.getpgrp(), signal.SIGINT)).start()
            first = pool.score(["1"] * 4, ["1"] * 4, [{{"sleep": 0.3}}] * 4, 30)
            threading.Timer(0.2, os.killpg, (os.getpgrp(), signal.SIGINT)).start()
            second = pool.score(["1"] * 4, ["1"] * 4, [{{"sleep": 0.3}}] * 4, 30)
            pool.close()
            print(first, second, len(got), flush=True)
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         start_new_session=True)  # its own process group: the SIGINT stays there
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == ("([1.0, 1.0, 1.0, 1.0], {'reward_errors': 0, 'reward_timeouts': 0}) "
                                          "([1.0, 1.0, 1.0, 1.0], {'reward_errors': 0, 'reward_timeouts': 0}) 2")
    assert "KeyboardInterrupt" not in out.stderr
