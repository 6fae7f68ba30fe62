"""The python tool's sandbox: each escape is tried inside the sandbox (it must be contained and
reported as text) and, as the control that makes the test able to fail, outside it with the
same interpreter (where it must succeed).  No model; ~0.1 s per sandboxed call."""

import os
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from relax_tools import plugin, sandbox
from relax_tools.sandbox import Limits, describe, run, seccomp_filter
from relax_tools.tools import run_call

LIMITS = Limits(timeout=2.0, memory=512, output=2048)

pytestmark = pytest.mark.skipif(sandbox.problem() is not None, reason=f"no sandbox here: {sandbox.problem()}")


def _unsandboxed(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=30)


def _tool(code: str, limits: Limits = LIMITS) -> str:
    return describe(run(code, limits), limits)


def _leftover_sandboxes(grace: float = 1.0) -> list[int]:
    """Processes still running the sandbox's bootstrap (its argv holds '<tool call>') after
    ``grace`` seconds (SIGKILLed processes take the kernel a moment to tear down)."""
    deadline = time.monotonic() + grace
    while True:
        out = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"<tool call>" in f.read() and int(pid) != os.getpid():
                        out.append(int(pid))
            except OSError:
                pass
        if not out or time.monotonic() > deadline:
            return out
        time.sleep(0.05)


def test_runs_code_and_reports_failures_as_text():
    assert _tool("print(sum(range(101)))") == "5050\n"
    assert _tool("") == "(no output)"
    assert _tool("raise SystemExit(3)") == "error: the program exited with status 3"
    assert _tool("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)") == "error: the program was killed by SIGSEGV"
    assert _tool("import os, signal; os.kill(os.getpid(), signal.SIGXCPU)") == \
        "error: the program was killed by SIGXCPU (past its 2 s CPU-time limit)"
    msg = _tool("1/0")
    assert "ZeroDivisionError: division by zero" in msg and msg.endswith("error: the program exited with status 1")
    # its own directory is writable within one call (the positive control of the next test)
    assert _tool("open('notes.txt', 'w').write('hi'); print(open('notes.txt').read(), __import__('os').getcwd())") \
        == "hi /sandbox\n"


def test_cannot_write_outside_its_directory(tmp_path):
    target = tmp_path / "escaped.txt"
    code = f"open({str(target)!r}, 'w').write('x')"
    assert _unsandboxed(code).returncode == 0 and target.exists()  # control: possible outside
    target.unlink()
    for path in (str(target), os.path.join(sys.prefix, "escaped.txt"), "/usr/escaped.txt"):
        msg = _tool(f"open({path!r}, 'w').write('x')")
        assert ("FileNotFoundError" in msg or "Read-only file system" in msg) and "status 1" in msg, msg
        assert not os.path.exists(path)
    # files written in the sandbox's directory do not persist to the next call
    _tool("open('kept.txt', 'w').write('x')")
    assert "FileNotFoundError" in _tool("open('kept.txt')")


def test_cannot_read_the_users_files(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2-" + os.urandom(4).hex())
    code = f"print(open({str(secret)!r}).read())"
    assert secret.read_text() in _unsandboxed(code).stdout  # control
    msg = _tool(code)
    assert secret.read_text() not in msg and "FileNotFoundError" in msg
    assert "FileNotFoundError" in _tool("print(open('/etc/passwd').read())")


def test_no_network_even_to_localhost():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted = []

    def serve():
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not stop.is_set():
            try:
                conn, _ = server.accept()
            except socket.timeout:
                continue
            accepted.append(conn.recv(64))
            conn.close()

    stop = threading.Event()
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    code = f"import socket; s = socket.create_connection(('127.0.0.1', {port}), timeout=1); s.sendall(b'leak')"
    try:
        assert _unsandboxed(code).returncode == 0  # control: the server is reachable from the host
        time.sleep(0.3)
        assert accepted == [b"leak"]
        msg = _tool(code)
        time.sleep(0.3)
        assert accepted == [b"leak"], "the sandbox reached the host's localhost"
        assert "ConnectionRefusedError" in msg or "OSError" in msg, msg
    finally:
        stop.set()
        t.join()
        server.close()


def test_fork_bomb_is_contained():
    start = time.monotonic()
    msg = _tool("import os\nwhile True:\n    os.fork()")
    assert "BlockingIOError" in msg and "status 1" in msg
    assert time.monotonic() - start < LIMITS.timeout  # refused at once, not stopped by the clock
    assert "BlockingIOError" in _tool("import subprocess; subprocess.run(['/bin/true'])")
    # threads are allowed (and bounded by the address-space limit)
    assert _tool("import threading; t = threading.Thread(target=print, args=('t',)); t.start(); t.join()") == "t\n"
    # the control: the same fork succeeds outside the sandbox
    assert _unsandboxed("import os\npid = os.fork()\nif pid == 0: os._exit(0)\nos.waitpid(pid, 0); print('ok')").stdout \
        == "ok\n"


def test_infinite_output_is_truncated_and_stopped():
    start = time.monotonic()
    msg = _tool("while True:\n    print('y' * 50)")
    assert time.monotonic() - start < LIMITS.timeout
    body, err = msg.rsplit("\n", 1)
    assert len(body) <= LIMITS.output and body.startswith("y" * 50)
    assert err == f"error: the output is longer than {LIMITS.output} characters; the program was stopped"
    assert not _leftover_sandboxes()


def test_a_hang_is_stopped_at_the_wall_timeout():
    limits = Limits(timeout=1.0, memory=512, output=256)
    start = time.monotonic()
    msg = _tool("import time\nprint('started', flush=True)\ntime.sleep(60)", limits)
    elapsed = time.monotonic() - start
    assert msg == "started\nerror: timed out after 1 s; the program was stopped"
    assert 1.0 <= elapsed < 3.0
    assert not _leftover_sandboxes()  # the whole sandbox is gone, not only bwrap
    # a program that closes its output first is still stopped at the deadline
    start = time.monotonic()
    assert _tool("import os, time\nos.close(1)\nos.close(2)\ntime.sleep(60)", limits) == \
        "error: timed out after 1 s; the program was stopped"
    assert time.monotonic() - start < 3.0
    assert not _leftover_sandboxes()


def test_a_killed_environment_worker_takes_its_sandbox_with_it():
    """--env-isolation process: a python call past --env-timeout (its own timeout is longer)
    gets the environment worker SIGKILLed; the sandbox it started (a new session, so no
    process-group kill reaches it) dies with it (bwrap --die-with-parent), not at its own
    60 s timeout."""
    from relax_core.config import RunConfig
    from relax_core.environments import Turn
    from relax_core.stages.env_host import ENV_TIMEOUT, ProcessHost

    params = plugin.relax_register_environments()[0].params(use="python", python_timeout=60.0)
    host = ProcessHost("relax_tools.tools:build", params, RunConfig(), timeout=3.0, workers=1)
    seen = []
    try:
        (fault, handle), = host.start([{"prompt": "", "label": None, "metadata": {}}])
        assert fault is None
        call = '<tool_call>{"name": "python", "arguments": {"code": "import time; time.sleep(60)"}}</tool_call>'
        probe = threading.Timer(1.5, lambda: seen.append(_leftover_sandboxes(grace=0.0)))
        probe.start()
        (fault, text), = host.step([handle], [Turn(text=call, index=0)])
        probe.join()
        assert fault == ENV_TIMEOUT and host.restarts == 1
        assert seen[0], "the sandbox was not running during the call (the control)"
        assert not _leftover_sandboxes(grace=3.0)
    finally:
        host.close()


def test_memory_limit():
    msg = _tool("x = bytearray(2 ** 31)")  # 2 GiB > 512 MiB
    assert "MemoryError" in msg


def test_through_the_tools_environment_the_episode_goes_on():
    spec = plugin.relax_register_environments()[0]
    env = spec.build(spec.params(use="calculator,python", python_timeout=1.0))
    body = '{"name": "python", "arguments": {"code": "import time; time.sleep(30)"}}'
    assert run_call(body, env.tools) == "error: timed out after 1 s; the program was stopped"
    assert run_call('{"name": "python", "arguments": {"code": "print(2**100)"}}', env.tools) == \
        f"{2**100}\n"
    assert "You may call these tools" in env.prompt("Q")


def test_seccomp_program_layout():
    prog = seccomp_filter("x86_64")
    ins = [struct.unpack("=HBBI", prog[i:i + 8]) for i in range(0, len(prog), 8)]
    assert ins[0] == (0x20, 0, 0, 4) and ins[1][3] == 0xC000003E  # load arch, check x86-64
    assert ins[-1] == (0x06, 0, 0, 0x80000000)  # another arch: kill
    # every jump lands inside the program
    jumps = [(i, jt, jf) for i, (code, jt, jf, _) in enumerate(ins) if code & 0x07 == 0x05]
    assert len(jumps) >= 6 and all(i + 1 + max(jt, jf) < len(ins) for i, jt, jf in jumps)
    with pytest.raises(ValueError, match="no seccomp table"):
        seccomp_filter("mips")
