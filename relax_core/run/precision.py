"""``--bf16``'s default: bfloat16 where the training device computes it natively.

``--bf16`` (bfloat16 autocast in the training forward and backward, float32 master weights
and optimizer state; the hf engine's ``--hf-dtype auto`` follows it) is on by default only
where it was measured to win with learning unchanged within noise: a 2-core CPU with
AMX-BF16 ran the default run in 0.53× the wall time with held-out accuracy 51.2 ± 3.2 %
against 51.7 ± 1.5 % in float32 over 3 seeds (BENCHMARKS.md, "bf16").  bfloat16 is
Kalamkar et al. 2019 (arXiv 1905.12322); autocast is PyTorch's mixed precision
(https://pytorch.org/docs/stable/amp.html).

``None`` (the flag not given) is resolved once, by :func:`resolve_bf16`, on the machine
that starts the run, before the run's ``config.json`` is written: a resumed run takes the
saved value, never a new resolution.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

from relax_core.config import resolve_device

#: ``/proc/cpuinfo`` flags of native bfloat16 matrix units that the default is measured on
#: (Intel AMX; Linux names them ``amx_bf16``).  AVX512-BF16 alone (e.g. AMD Zen 4) is not
#: measured yet: such CPUs keep float32 unless ``--bf16`` is given.
CPU_BF16_FLAGS = ("amx_bf16",)


@functools.cache
def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags as Linux lists them (empty where ``path`` does not exist:
    other systems)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return frozenset()
    return frozenset(w for line in text.splitlines() if line.startswith("flags") for w in line.split(":", 1)[1].split())


def native_bf16(device: str) -> str | None:
    """Why ``device`` computes bfloat16 natively (for the start-up line), or ``None``.

    Args:
        device: ``cpu`` or ``cuda`` (a resolved device, not ``auto``).
    """
    if device == "cuda":
        import torch

        return "a CUDA GPU with bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else None
    found = [f for f in CPU_BF16_FLAGS if f in cpu_flags()]
    return f"the CPU has {found[0].upper().replace('_', '-')} units" if found else None


def resolve_bf16(cfg: Any, bf16_devices: frozenset[str] = frozenset({"cpu", "cuda"})) -> tuple[Any, str | None]:
    """``cfg`` with ``bf16`` decided, and a line saying what was decided and why.

    ``--bf16`` / ``--no-bf16`` given (or saved, on resume): kept, no line (an explicit
    ``--bf16`` where the backend cannot is refused earlier, by the capability check of
    ``bf16_devices``).  Not given (``None``): on where the training device (``--device``;
    ``auto`` = CUDA when this process sees a GPU, else the CPU) is one of the backend's
    ``bf16_devices`` and :func:`native_bf16` finds native units on it; off elsewhere.

    Args:
        cfg: the run's :class:`~relax_core.config.RunConfig`.
        bf16_devices: the training backend's ``BackendCapabilities.bf16_devices`` (the
            default: the torch backend's; ``relax eval``, which trains nothing, uses it too).

    Returns:
        ``(cfg, line)``: the configuration with ``bf16`` a bool, and ``None`` or e.g.
        ``"precision: bfloat16 autocast (auto: the CPU has AMX-BF16 units; --no-bf16 keeps
        float32)"``.
    """
    if cfg.bf16 is not None:
        return cfg, None
    device = resolve_device(cfg.device)
    why = native_bf16(device)
    if why and device not in bf16_devices:
        return (dataclasses.replace(cfg, bf16=False),
                f"precision: float32 (auto: {why}, but --train-backend {cfg.train_backend} trains in bfloat16 only on "
                f"{', '.join(sorted(bf16_devices)) or 'no device'})")
    line = (f"precision: bfloat16 autocast (auto: {why}; --no-bf16 keeps float32)" if why else
            f"precision: float32 (auto: this {device.upper()} has no native bfloat16 units; --bf16 uses bfloat16 anyway)")
    return dataclasses.replace(cfg, bf16=why is not None), line
