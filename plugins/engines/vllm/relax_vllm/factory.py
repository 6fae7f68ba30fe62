"""Factory of the vllm engine: a clear install hint when vLLM is missing."""

from __future__ import annotations

import importlib.util
from typing import Any


def build(params: Any, config: Any) -> Any:
    """Build :class:`relax_vllm.engine.VLLMEngine` for ``config``.

    Raises:
        ImportError: vLLM is not installed (the message gives the install line).
    """
    if importlib.util.find_spec("vllm") is None:
        from relax_vllm.plugin import INSTALL_HINT

        raise ImportError(f"--rollout-engine vllm needs vLLM, which is not installed: {INSTALL_HINT}")
    from relax_vllm.engine import build as _build

    return _build(params, config)
