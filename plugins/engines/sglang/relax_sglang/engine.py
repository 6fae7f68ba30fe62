"""The SGLang rollout engine (:class:`relax_core.contracts.RolloutEngine`), GPU only.

Two modes (``--sglang-mode``):

* ``server``: ``python -m sglang.launch_server`` as a subprocess bound to 127.0.0.1,
  driven over HTTP with timeouts (``urllib``).  Weight updates: the trainer's Hugging Face
  state dict is written as safetensors next to a copy of the model's config, then
  ``/pause_generation`` → ``/update_weights_from_disk`` (flushes the radix cache) →
  ``/continue_generation``.
* ``engine``: an in-process ``sglang.Engine`` (colocated with the trainer); weights are
  pushed as tensors with ``update_weights_from_tensor(..., flush_cache=True)``.

Requests and responses are mapped by :mod:`relax_sglang.protocol` (tested on CPU against
recorded payloads).  This module has not yet been run on a GPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from relax_core.contracts import GenerationOutput, SamplingParams
from relax_sglang import protocol


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _moe_shape(model_path: str) -> tuple[int, int] | None:
    """``(layers, experts per token)`` of an MoE model's config.json, else ``None``."""
    cfg = json.loads((Path(model_path) / "config.json").read_text())
    experts = max(int(cfg.get(k) or 0) for k in ("num_experts", "num_local_experts", "n_routed_experts"))
    if experts <= 1:
        return None
    return int(cfg["num_hidden_layers"]), int(cfg["num_experts_per_tok"])


class _Server:
    """An SGLang HTTP server subprocess (started in its own process group)."""

    def __init__(self, cmd: list[str], port: int, *, startup_timeout: float, request_timeout: float) -> None:
        env = dict(os.environ, SGLANG_RETURN_ORIGINAL_LOGPROB="false")
        self.url = f"http://127.0.0.1:{port}"
        self.timeout = request_timeout
        self.proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        deadline = time.monotonic() + startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"SGLang server exited with code {self.proc.returncode} during startup: {' '.join(cmd)}")
            try:
                with urllib.request.urlopen(self.url + "/health_generate", timeout=10) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(2)
        self.close()
        raise TimeoutError(f"SGLang server not healthy after {startup_timeout:.0f} s: {' '.join(cmd)}")

    def post(self, path: str, body: dict[str, Any]) -> Any:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                data = r.read()
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"SGLang {path} failed with HTTP {e.code}: {e.read()[:500]!r}") from e
        try:
            return json.loads(data)
        except json.JSONDecodeError:
            return data.decode(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


class SGLangEngine:
    """:class:`~relax_core.contracts.RolloutEngine` on SGLang (``server`` or in-process ``engine`` mode)."""

    def __init__(self, model_path: str, tokenizer: Any, *, mode: str = "server", tp: int = 1, seed: int = 0,
                 mem_fraction_static: float = 0.5, port: int = 0, context_length: int = 0,
                 startup_timeout: float = 600.0, request_timeout: float = 600.0) -> None:
        self.model_path = model_path
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.routed_shape = _moe_shape(model_path)
        self.mode = mode
        self.version = 0
        self._weights_dir = Path(tempfile.mkdtemp(prefix="relax-sglang-weights-"))
        if mode == "server":
            port = port or _free_port()
            cmd = protocol.server_command(model_path, port=port, tp=tp, mem_fraction_static=mem_fraction_static,
                                          seed=seed, context_length=context_length,
                                          routed_experts=self.routed_shape is not None, python=sys.executable)
            self._server: _Server | None = _Server(cmd, port, startup_timeout=startup_timeout,
                                                   request_timeout=request_timeout)
            self._engine = None
        elif mode == "engine":
            os.environ["SGLANG_RETURN_ORIGINAL_LOGPROB"] = "false"
            import sglang

            kwargs = {"context_length": context_length} if context_length else {}
            self._engine = sglang.Engine(model_path=model_path, tp_size=tp, mem_fraction_static=mem_fraction_static,
                                         random_seed=seed, skip_server_warmup=True,
                                         enable_return_routed_experts=self.routed_shape is not None, **kwargs)
            self._server = None
        else:
            raise ValueError(f"unknown sglang mode {mode!r} (server or engine)")

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams) -> GenerationOutput:
        """Sample one response per prompt.

        Raises:
            ValueError: top-p/top-k truncation (see :func:`protocol.check_sampling`), routed
                experts asked of a dense model, or a malformed response.
        """
        if sampling.return_routed_experts and self.routed_shape is None:
            raise ValueError(f"routed experts requested, but {self.model_path} is not a mixture-of-experts model")
        body = protocol.generate_payload(prompt_ids, sampling)
        if self._server is not None:
            items = self._server.post("/generate", body)
        else:
            items = self._engine.generate(**body)
        return protocol.decode_generate_response(
            items, [len(p) for p in prompt_ids], pad_id=self.pad_id, top_k=sampling.return_top_k,
            routed_shape=self.routed_shape if sampling.return_routed_experts else None)

    def update_weights(self, state_dict: Any, version: int) -> None:
        """Load new weights (Hugging Face names) in place; generation is paused and the
        radix (prefix) cache flushed around the update."""
        if self._engine is not None:
            self._engine.update_weights_from_tensor(named_tensors=list(state_dict.items()), flush_cache=True)
        else:
            from safetensors.torch import save_file

            d = self._weights_dir
            for name in ("config.json", "generation_config.json"):
                if (Path(self.model_path) / name).is_file():
                    shutil.copy(Path(self.model_path) / name, d / name)
            save_file({k: v.detach().to("cpu").clone() for k, v in state_dict.items()}, str(d / "model.safetensors"))
            self._server.post("/pause_generation", protocol.PAUSE_PAYLOAD)
            try:
                res = self._server.post("/update_weights_from_disk", protocol.update_from_disk_payload(str(d), version))
            finally:
                self._server.post("/continue_generation", {})
            if not (isinstance(res, dict) and res.get("success")):
                raise RuntimeError(f"SGLang refused the weight update: {res}")
        self.version = version

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None
        shutil.rmtree(self._weights_dir, ignore_errors=True)


def build(params: Any, config: Any) -> SGLangEngine:
    """Factory: an SGLang engine for ``config.model``.

    Raises:
        ImportError: the engine's package is not installed (the message gives the install line).
    """
    if importlib.util.find_spec("sglang") is None:
        from relax_sglang.plugin import INSTALL_HINT

        raise ImportError(f"--rollout-engine sglang needs SGLang, which is not installed: {INSTALL_HINT}")
    from relax_core.models import load_tokenizer, resolve_model_path

    return SGLangEngine(resolve_model_path(config.model), load_tokenizer(config.model), mode=params.mode,
                        tp=config.rollout_num_gpus_per_engine, seed=config.seed,
                        mem_fraction_static=params.mem_fraction_static, port=params.port,
                        context_length=params.context_length, startup_timeout=params.startup_timeout,
                        request_timeout=params.request_timeout)
