"""Two gloo ranks on localhost for the context-parallel contract check.

The ranks are plain subprocesses (``python -m relax_authoring.testing.distributed``), started
once per process and reused for every component checked.  They talk to the parent over
an authenticated localhost connection (``multiprocessing.connection``), and to each other
over gloo.  Subprocesses, not ``multiprocessing`` spawn, so that a caller's script is
never re-imported as ``__main__``.  Each job names a function by dotted path, and the
workers build the component themselves from its factory path (as training ranks do:
names and parameters travel, objects are not pickled).  A job that fails or hangs tears
the pool down; the next job starts a fresh one.
"""

from __future__ import annotations

import atexit
import datetime
import os
import pickle
import secrets
import socket
import subprocess
import sys
import threading
import traceback
from multiprocessing.connection import Client, Listener
from typing import Any

WORLD_SIZE = 2
JOB_TIMEOUT_S = 60.0
_AUTHKEY_ENV = "RELAX_CONTRACT_AUTHKEY"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _send(conn: Any, obj: Any) -> None:
    # plain pickle: tensors travel by value (Connection.send would pass shared-memory
    # handles once torch is imported)
    conn.send_bytes(pickle.dumps(obj))


def _recv(conn: Any) -> Any:
    return pickle.loads(conn.recv_bytes())


class _Pool:
    def __init__(self) -> None:
        authkey = secrets.token_bytes(16)
        listener = Listener(("127.0.0.1", 0), authkey=authkey)
        env = dict(os.environ, OMP_NUM_THREADS="1", **{_AUTHKEY_ENV: authkey.hex()},
                   PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        gloo_port, parent_port = _free_port(), listener.address[1]
        self.procs = [subprocess.Popen([sys.executable, "-m", "relax_authoring.testing.distributed", str(r),
                                        str(gloo_port), str(parent_port)], env=env, stdin=subprocess.DEVNULL)
                      for r in range(WORLD_SIZE)]
        self.conns: list[Any] = [None] * WORLD_SIZE
        accepted: list[Any] = []

        def accept() -> None:
            for _ in range(WORLD_SIZE):
                accepted.append(listener.accept())

        waiter = threading.Thread(target=accept, daemon=True)  # accept() has no timeout of its own
        waiter.start()
        waiter.join(JOB_TIMEOUT_S)
        for conn in accepted:
            self.conns[conn.recv()] = conn
        if len(accepted) < WORLD_SIZE:
            self.close()
            raise TimeoutError(f"the {WORLD_SIZE} contract-check ranks did not start within {JOB_TIMEOUT_S:.0f} s")
        listener.close()

    def run(self, fn: str, args: tuple) -> list[Any]:
        for conn in self.conns:
            _send(conn, (fn, args))
        out: list[Any] = [None] * WORLD_SIZE
        for rank, conn in enumerate(self.conns):
            if not conn.poll(JOB_TIMEOUT_S):
                raise TimeoutError(f"rank {rank} did not answer within {JOB_TIMEOUT_S:.0f} s "
                                   "(a collective the other rank never joined?)")
            status, value = _recv(conn)
            if status == "error":  # the other rank may be stuck in a collective: do not wait
                raise RuntimeError(f"rank {rank} failed:\n{value}")
            out[rank] = value
        return out

    def close(self) -> None:
        for conn in self.conns:
            if conn is not None:
                try:
                    _send(conn, None)
                    conn.close()
                except OSError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=2)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)


_POOL: _Pool | None = None


def run_on_two_ranks(fn: str, *args: Any) -> list[Any]:
    """Call ``fn(rank, group, *args)`` on 2 gloo ranks; return the per-rank results.

    ``fn`` is a dotted path ``module:function``; ``args`` must be picklable (tensors,
    dataclasses of importable classes).

    Raises:
        RuntimeError: a rank raised (its traceback is in the message).
        TimeoutError: a rank did not answer (the pool is then restarted on next use).
    """
    global _POOL
    if _POOL is None:
        _POOL = _Pool()
    try:
        return _POOL.run(fn, args)
    except BaseException:
        _POOL.close()
        _POOL = None
        raise


@atexit.register
def _shutdown() -> None:
    global _POOL
    if _POOL is not None:
        _POOL.close()
        _POOL = None


def _worker(rank: int, gloo_port: int, parent_port: int) -> None:
    import torch
    import torch.distributed as dist

    from relax_core.specs import resolve

    torch.set_num_threads(1)
    conn = Client(("127.0.0.1", parent_port), authkey=bytes.fromhex(os.environ.pop(_AUTHKEY_ENV)))
    conn.send(rank)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{gloo_port}", rank=rank,
                            world_size=WORLD_SIZE, timeout=datetime.timedelta(seconds=JOB_TIMEOUT_S))
    group = dist.new_group(list(range(WORLD_SIZE)), backend="gloo")
    try:
        while True:
            try:
                job = _recv(conn)
            except EOFError:
                break
            if job is None:
                break
            fn, args = job
            try:
                _send(conn, ("ok", resolve(fn)(rank, group, *args)))
            except BaseException:  # noqa: BLE001 - reported to the parent, which fails the check
                _send(conn, ("error", traceback.format_exc()))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    _worker(*map(int, sys.argv[1:4]))
