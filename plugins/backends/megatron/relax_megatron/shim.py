"""Make megatron-core 0.16.1 run on CPU (gloo), for tests and small runs.

Megatron-core asks CUDA for two things even when nothing else in a forward/backward needs
it: the current device (``torch.cuda.current_device()`` as the ``device=`` of buffers it
allocates) and the tensor-parallel RNG tracker (``CudaRNGStatesTracker`` keeps CUDA
generator states to fork dropout randomness per TP rank).  :func:`install_cpu_shim`
answers the first with the CPU device and replaces the tracker with one that keeps CPU
generator states.  It is applied only when CUDA is not available, once per process, and
changes nothing else: Megatron's own optimizer stays CUDA-only (the backend drives
training with ``torch.optim`` on CPU).

Two more CUDA assumptions sit on the pipeline-parallel path: megatron-core 0.16.1's
schedules (``forward_backward_pipelining_without_interleaving``,
``forward_backward_no_pipelining``) allocate their token counter with a hard-wired
``torch.zeros([], device="cuda")``, and with tied embeddings ``GPTModel`` moves the
embedding copy to ``.cuda()`` before all-reducing it between the first and last stage; on
CPU both raise ``AssertionError: Torch not compiled with CUDA enabled``.
:func:`cuda_on_cpu` runs such code with those calls kept on the CPU.  The point-to-point
sends and receives work on gloo once ``batch_p2p_comm`` is off (its ``batch_p2p_sync``
calls ``torch.cuda.synchronize``).
"""

from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode

_INSTALLED = False


def install_cpu_shim() -> None:
    """Patch ``torch.cuda.current_device`` and Megatron's RNG tracker for CPU (idempotent).

    Raises:
        RuntimeError: if CUDA is available (the shim must not hide a real GPU).
    """
    global _INSTALLED
    if _INSTALLED:
        return
    if torch.cuda.is_available():
        raise RuntimeError("install_cpu_shim() is for CPU-only machines; CUDA is available here")
    from megatron.core.tensor_parallel import random as mrandom

    class CPURNGStatesTracker(mrandom.CudaRNGStatesTracker):
        """``CudaRNGStatesTracker`` with CPU generator states (same names, same forking)."""

        def add(self, name: str, seed: int) -> None:
            self._is_initialized = True
            if seed in self.seeds_:
                raise ValueError(f"seed {seed} already exists")
            if name in self.states_:
                raise ValueError(f"rng state {name} already exists")
            self.seeds_.add(seed)
            self.states_[name] = torch.Generator().manual_seed(seed).get_state()

        @contextlib.contextmanager
        def fork(self, name: str = mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME):
            if name not in self.states_:
                raise KeyError(f"rng state {name} is not added")
            orig = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(orig)

    torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment]
    mrandom._CUDA_RNG_STATE_TRACKER = CPURNGStatesTracker()
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    _INSTALLED = True


def seed_tracker(seed: int, tp_rank: int) -> None:
    """Register the model-parallel and data-parallel RNG streams (Megatron's offsets)."""
    from megatron.core.tensor_parallel import random as mrandom

    tracker = mrandom.get_cuda_rng_tracker()
    tracker.reset()
    tracker.add(mrandom._DATA_PARALLEL_RNG_TRACKER_NAME, seed)
    tracker.add(mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME, seed + 2718 + tp_rank)
    tracker.add(mrandom._EXPERT_PARALLEL_RNG_TRACKER_NAME, seed + 1024 + 100 * tp_rank)


class _CudaOnCPU(TorchFunctionMode):
    """Rewrites ``device=cuda…`` keyword arguments of torch calls to ``device=cpu`` and makes
    ``Tensor.cuda()`` the identity."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0]
        dev = kwargs.get("device")
        if dev is not None and torch.device(dev).type == "cuda":
            kwargs = {**kwargs, "device": "cpu"}
        return func(*args, **kwargs)


@contextlib.contextmanager
def cuda_on_cpu():
    """Inside the block, torch calls given ``device="cuda"`` allocate on the CPU and
    ``Tensor.cuda()`` leaves a tensor where it is (a ``TorchFunctionMode``; scoped, nothing
    stays patched).

    Raises:
        RuntimeError: if CUDA is available (it must not hide a real GPU).
    """
    if torch.cuda.is_available():
        raise RuntimeError("cuda_on_cpu() is for CPU-only machines; CUDA is available here")
    with _CudaOnCPU():
        yield
