"""Factory of the sglang engine: a clear install hint when SGLang is missing."""

from __future__ import annotations

import importlib.util
from typing import Any


def build(params: Any, config: Any) -> Any:
    """Build :class:`relax_sglang.engine.SGLangEngine` for ``config``.

    Raises:
        ImportError: SGLang is not installed (the message gives the install line).
    """
    if importlib.util.find_spec("sglang") is None:
        from relax_sglang.plugin import INSTALL_HINT

        raise ImportError(f"--rollout-engine sglang needs SGLang, which is not installed: {INSTALL_HINT}")
    from relax_sglang.engine import build as _build

    return _build(params, config)
