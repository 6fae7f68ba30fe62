"""--env-isolation process: environment calls in spawned workers that are killed past
--env-timeout and replaced when they die, with the episodes lost with them reported as
errors; episode state lives across calls; results equal the thread host's where nothing
fails; a worker that cannot build the environment stops the run at once."""

import math
import multiprocessing as mp
import os
import time

import pytest
import torch
from test_episodes import EOS, ScriptedEngine

from relax_core.config import RunConfig
from relax_core.contracts import SamplingParams
from relax_core.environments import EPISODE_ENDS, Reply, SingleTurn, Turn
from relax_core.stages.env_host import ENV_ERROR, ENV_TIMEOUT, ProcessHost, ThreadHost

FACTORY = "env_host_toys:build"


def _rows(*modes):
    return [{"prompt": m, "label": None, "metadata": {}} for m in modes]


def _turns(n, k):
    return [Turn(text="t", index=k)] * n


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from relax_core.models import load_tokenizer

    return load_tokenizer(str(tiny_model_dir))


@pytest.fixture
def host():
    h = ProcessHost(FACTORY, None, RunConfig(), timeout=1.5, workers=2)
    yield h
    h.close()


def test_faults_end_their_episodes_and_workers_are_replaced(host):
    # episode i lives in worker i mod 2: worker 0 holds ok, hang, ok, start; worker 1 raise, segv, junk, ok
    rows = _rows("ok", "raise", "hang", "segv", "ok", "junk", "start", "ok")
    started = host.start(rows)
    assert [f for f, _ in started] == [None] * 6 + [ENV_ERROR, None]
    assert started[6][1] == "RuntimeError: no such game"
    live = [0, 1, 2, 3, 4, 5, 7]
    first = host.step(live, _turns(7, 0))
    assert all(f is None and isinstance(r, Reply) for f, r in first)
    pids = {int(r.messages[0]["content"].split()[2]) for _, r in first}
    assert len(pids) == 2  # two workers
    t0 = time.monotonic()
    second = dict(zip(live, host.step(live, _turns(7, 1))))
    assert time.monotonic() - t0 < 10  # the 60 s hang cost one --env-timeout and a restart
    assert second[0][0] is None and second[0][1].messages[0]["content"].startswith("ok 2 ")  # state across calls
    assert second[0][1].reward == 2.0
    assert second[2] == (ENV_TIMEOUT, "a call ran past --env-timeout 1.5 s; its worker was killed")
    assert second[1] == (ENV_ERROR, "KeyError: 'boom'")
    assert second[3][0] == ENV_ERROR and second[3][1] == "its environment worker died (exit code -11)"
    lost = "the episode was lost with its environment worker"
    assert all(second[i][0] == ENV_ERROR and second[i][1].startswith(lost) for i in (4, 5, 7))
    assert host.restarts == 2
    # episode 0 lived in worker 0, killed after its call: lost as well
    (third,) = host.step([0], _turns(1, 2))
    assert third[0] == ENV_ERROR and third[1].startswith(lost)
    assert len([p for p in mp.active_children() if p.name == "relax-env-worker"]) == 2  # no leftover hung worker
    # a new call of episodes starts afresh on the replaced workers
    again = host.start(_rows("ok", "ok"))
    assert again == [(None, 0), (None, 1)]  # the handles
    replies = host.step([0, 1], _turns(2, 0))
    assert {int(r.messages[0]["content"].split()[2]) for _, r in replies}.isdisjoint(pids)


def test_bad_replies_are_errors_without_restarts(host):
    host.start(_rows("junk", "unpicklable", "ok"))
    host.step([0, 1, 2], _turns(3, 0))
    junk, unpicklable, ok = host.step([0, 1, 2], _turns(3, 1))
    assert junk == (ENV_ERROR, "TypeError: step returned str, not a relax_core.environments.Reply")
    assert unpicklable[0] == ENV_ERROR and "pickle" in unpicklable[1].lower()
    assert ok[0] is None and ok[1].messages[0]["content"].startswith("ok 2 ")
    assert host.restarts == 0
    host.start(_rows("unreadable", "ok"))
    host.step([0, 1], _turns(2, 0))
    unreadable, ok = host.step([0, 1], _turns(2, 1))  # the worker sent it; the parent cannot read it
    assert unreadable[0] == ENV_ERROR and unreadable[1].startswith("TypeError:") and ok[0] is None
    assert host.restarts == 0


def test_a_worker_found_dead_between_calls_is_replaced(host):
    host.start(_rows("ok", "ok"))
    host.step([0, 1], _turns(2, 0))
    host._workers[0].process.kill()  # the OOM killer, while the worker waits for its next call
    host._workers[0].process.join(5)
    lost, ok = host.step([0, 1], _turns(2, 1))
    assert lost[0] == ENV_ERROR and lost[1].startswith("the episode was lost with its environment worker")
    assert ok[0] is None and ok[1].messages[0]["content"].startswith("ok 2 ")
    assert host.restarts == 1
    host._workers[1].process.kill()  # dead before the next step's starts: they go to its replacement
    host._workers[1].process.join(5)
    assert host.start(_rows("ok", "ok")) == [(None, 0), (None, 1)] and host.restarts == 2
    assert all(f is None for f, _ in host.step([0, 1], _turns(2, 0)))


def test_an_answer_waiting_at_the_deadline_is_not_a_timeout():
    """A replacement (spawn + build) blocks the host; a worker that answered meanwhile must not
    be killed as timed out when the host looks again after its deadline."""
    host = ProcessHost(FACTORY, None, RunConfig(), timeout=0.3, workers=2)
    try:
        host.start(_rows("segv", "slow"))  # the crash is read first, the slow answer during the replacement
        host.step([0, 1], _turns(2, 0))
        slow_spawn = host._spawn

        def spawn():  # a replacement that takes past the other worker's deadline
            time.sleep(0.6)
            return slow_spawn()

        host._spawn = spawn
        died, ok = host.step([0, 1], _turns(2, 1))
        assert died[0] == ENV_ERROR and "died" in died[1]
        assert ok[0] is None and ok[1].messages[0]["content"].startswith("slow 2 "), ok
        assert host.restarts == 1
    finally:
        host.close()


def test_process_and_thread_hosts_agree_when_nothing_fails():
    from env_host_toys import Counting

    rows = _rows("ok", "a", "b")
    proc = ProcessHost(FACTORY, None, RunConfig(), timeout=5.0, workers=2)
    seen = []
    try:
        for h in (proc, ThreadHost(Counting(), 5.0, 2)):
            started = h.start(rows)
            assert [f for f, _ in started] == [None] * 3
            handles = [v for _, v in started]
            steps = [h.step(handles, _turns(3, k)) for k in range(2)]
            seen.append([[(r.messages[0]["content"].rsplit(" ", 1)[0], r.reward) for _, r in s] for s in steps])
    finally:
        proc.close()
    assert seen[0] == seen[1] == [[("ok 1", 1.0), ("a 1", 1.0), ("b 1", 1.0)], [("ok 2", 2.0), ("a 2", 2.0), ("b 2", 2.0)]]


@pytest.mark.parametrize("timeout", [3e6, 1e9, math.inf])
def test_timeouts_longer_than_a_wait_can_take(timeout):
    """An --env-timeout past what select/poll (milliseconds in a C int, about 2.1e6 s) or a
    thread join accept is waited in pieces: calls answer as usual (it raised OverflowError)."""
    from env_host_toys import Counting

    proc = ProcessHost(FACTORY, None, RunConfig(), timeout=timeout, workers=1)
    try:
        for h in (proc, ThreadHost(Counting(), timeout, 1)):
            started = h.start(_rows("ok"))
            assert started[0][0] is None
            (fault, reply), = h.step([started[0][1]], _turns(1, 0))
            assert fault is None and reply.reward == 1.0
    finally:
        proc.close()


def test_a_worker_killed_by_sigint_while_starting_is_started_again(tmp_path):
    """A Ctrl-C reaching a worker before it ignores SIGINT (spawned off the main thread: a
    fully-async rollout replacing a worker) kills it while it starts (exit -SIGINT); the host
    starts it again instead of ending the run."""
    marker = tmp_path / "interrupt-next-start"
    marker.write_text("")
    host = ProcessHost("env_host_toys:interrupted_once", str(marker), RunConfig(), timeout=5.0, workers=1)
    try:
        assert not marker.exists()  # the first start was interrupted
        (fault, handle), = host.start(_rows("ok"))
        assert fault is None and host.step([handle], _turns(1, 0))[0][1].reward == 1.0
        marker.write_text("")
        host._replace(0)  # a replacement (after a timeout or a crash) interrupted the same way
        assert not marker.exists() and host.restarts == 1
        (fault, handle), = host.start(_rows("ok"))
        assert fault is None
    finally:
        host.close()


def test_prompts_are_computed_where_the_environment_calls_run(host):
    """An environment's ``prompt(text)`` runs in the workers with --env-isolation process (in
    this process with threads), text i in worker i mod n, under --env-timeout."""
    from env_host_toys import Counting

    results = host.prompts(["a", "b", "c"])
    assert [f for f, _ in results] == [None] * 3
    pids = [int(v.split()[1]) for _, v in results]
    assert [v.split()[0] for _, v in results] == ["a", "b", "c"]
    assert os.getpid() not in pids and pids[0] == pids[2] != pids[1]
    assert ThreadHost(Counting(), 1.5, 2).prompts(["a"]) == [(None, f"a {os.getpid()}")]
    assert ThreadHost(SingleTurn(), 1.5, 2).prompts(["a", "b"]) == [(None, "a"), (None, "b")]  # no prompt()
    (f1, _), (f2, text), (f3, _) = host.prompts(["prompt-hang", "ok", "prompt-raise"])
    assert (f1, f2, f3) == (ENV_TIMEOUT, None, ENV_ERROR) and text.startswith("ok ")


def test_the_runner_stops_on_a_failed_prompt_and_builds_no_environment_here(tmp_path):
    """With --env-isolation process the trainer's process never builds the environment (the
    toy factory refuses to run in it); a prompt() that fails stops the run with the prompt
    named (EnvironmentPromptError, exit 7 from relax train)."""
    from relax_core import EnvironmentSpec
    from relax_core.host.plugins import load_registry
    from relax_core.stages.episodes import EnvironmentPromptError, build_runner
    from relax_core_test_toys import make_plugin

    spec = EnvironmentSpec(name="workers_only", summary="toy", source="tests", factory="env_host_toys:workers_only")
    reg = load_registry([("toys", make_plugin(spec))], entry_points=False)
    engine = type("Engine", (), {"tokenizer": type("Tok", (), {"pad_token_id": 0})()})()
    cfg = RunConfig(environment="workers_only", env_isolation="process", env_num_workers=1, env_timeout=1.0)
    runner = build_runner(cfg, reg, engine, score=None)
    try:
        assert runner.prompts(["x"])[0].split()[0] == "x"
        with pytest.raises(EnvironmentPromptError, match="environment 'workers_only': prompt\\(\\) failed on the "
                                                         "prompt 'prompt-raise': ValueError: no prompt for this row"):
            runner.prompts(["ok", "prompt-raise"])
        with pytest.raises(EnvironmentPromptError, match="prompt\\(\\) ran past --env-timeout"):
            runner.prompts(["prompt-hang"])
    finally:
        runner.close()


def test_a_worker_that_cannot_build_the_environment_stops_at_once():
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="(?s)could not build the environment:.*ValueError: cannot build"):
        ProcessHost("env_host_toys:broken", None, RunConfig(), timeout=1.0, workers=2)
    assert time.monotonic() - t0 < 30
    assert not [p for p in mp.active_children() if p.name == "relax-env-worker"]


def test_the_runner_through_worker_processes(tokenizer):
    """The episode runner on the process host: a hanging and a crashing episode end as
    env_timeout / env_error, their workers replaced (rollout/env_restarts), the rest go on."""

    from relax_core.stages.episodes import EpisodeRunner, ReplyRenderer

    modes = ["ok", "hang", "ok", "segv"]  # worker 0: ok, ok (episodes 0, 2); worker 1: hang, segv
    scripts = {100 + i: [[1010 + i, EOS], [1020 + i, EOS], [1030 + i, EOS]] for i in range(4)}
    engine = ScriptedEngine(tokenizer, scripts)
    host = ProcessHost(FACTORY, None, RunConfig(), timeout=1.5, workers=2)
    try:
        runner = EpisodeRunner(engine, ReplyRenderer(tokenizer, True), max_turns=3, max_episode_tokens=None,
                               score=None, pad_token_id=EOS, host=host)
        out = runner.generate(_rows(*modes), [""] * 4, [[p, 51] for p in scripts], SamplingParams(max_new_tokens=4))
    finally:
        host.close()
    ends = [EPISODE_ENDS[int(e)] for e in out.episode_end]
    # worker 1 was killed at episode 1's hang; episode 3 (also in it) was lost with it
    assert ends == ["max_turns", "env_timeout", "max_turns", "env_error"]
    assert runner.metrics == {"rollout/env_timeouts": 1.0, "rollout/env_errors": 1.0, "rollout/env_restarts": 1.0}
    assert out.num_turns.tolist() == [3, 2, 3, 2]
    torch.testing.assert_close(out.env_rewards[[0, 2]], torch.tensor([6.0, 6.0]))  # 1 + 2 + 3 from the episode state
    assert all(math.isnan(x) for x in out.env_rewards[[1, 3]].tolist())
