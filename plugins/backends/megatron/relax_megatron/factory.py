"""Factory of the megatron backend: a clear install hint when megatron-core is missing."""

from __future__ import annotations

import importlib.util
from typing import Any


def build(params: Any, config: Any) -> Any:
    """Build :class:`relax_megatron.backend.MegatronBackend` for ``config``.

    Raises:
        ImportError: megatron-core is not installed (the message gives the install line).
    """
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        from relax_megatron.plugin import INSTALL_HINT

        raise ImportError(f"--train-backend megatron needs megatron-core, which is not installed: {INSTALL_HINT}")
    from relax_megatron.backend import build as _build

    return _build(params, config)
