"""The ``rg:`` data source and the ``reasoning_gym`` scorer.

Data: ``rg:<dataset>[?size=N&seed=S&<key>=<value>...]`` generates ``size`` problems of the
reasoning-gym dataset offline (default size: the dataset's own; default seed: ``--seed``).
Other keys are the dataset's config fields, converted to the field's type: integers,
floats, booleans (``true``/``false``), strings, and lists as comma-separated values
(``operators=+,-``).  Values are percent-decoded but ``+`` stays a plus sign (it is an
operator here, not a space).  Each row is::

    {"prompt": question, "label": answer,
     "metadata": {"scorer": "reasoning_gym", "rg_dataset": name, "rg_entry": entry}}

where ``entry`` is reasoning-gym's ``{"question", "answer", "metadata"}`` item exactly as
generated (its ``score_answer(answer, entry)`` may compare tuples, so it is not converted).

A task whose answer is a number declares the prompt suffix " Give only the final number."
(used unless ``--prompt-suffix`` is given).

Curriculum data: ``rgc:<dataset>[?size=N&seed=S&levels=L]`` (:func:`load_curriculum_rows`)
generates ``N`` problems at each of the first ``L`` global levels of the dataset's own
reasoning-gym curriculum; its rows are ``rg:`` rows whose metadata also holds
``rg_level`` (read by the ``curriculum`` sampler).

Scorer: extracts the model's final answer (the last ``\\boxed{}``, else the last
``<answer>...</answer>``, else, when the expected answer is a number, the last number in the
response, otherwise its last non-empty line: small models ramble and rarely box), then
returns the dataset's own ``score_answer`` (in [0, 1]; some tasks give partial credit).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from typing import Any
from urllib.parse import unquote

from relax_answers import answer_tag, last_boxed, last_number, parse_number

_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")
#: The instruction the source declares for tasks whose answer is a number (the scorer then
#: reads the last number: a small model answers in a word or two instead of rambling).
NUMBER_SUFFIX = " Give only the final number."


def _datasets() -> dict:
    from reasoning_gym.factory import DATASETS

    return DATASETS


def _coerce(raw: str, tp: Any, key: str) -> Any:
    """Convert one query-string value to the config field type ``tp``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if raw.lower() == "none" and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(raw, inner[0], key) if len(inner) == 1 else raw
    if origin in (list, tuple, typing.Sequence) or tp in (list, tuple):
        item = args[0] if args else str
        return tuple(_coerce(v, item, key) for v in raw.split(",") if v != "")
    if origin is typing.Literal:
        if raw not in [str(a) for a in args]:
            raise ValueError(f"{key}={raw}: must be one of {', '.join(map(str, args))}")
        return next(a for a in args if str(a) == raw)
    if tp is bool:
        if raw.lower() not in _TRUE + _FALSE:
            raise ValueError(f"{key}={raw}: expected true or false")
        return raw.lower() in _TRUE
    if tp in (int, float):
        try:
            return tp(raw)
        except ValueError:
            raise ValueError(f"{key}={raw}: expected {'an integer' if tp is int else 'a number'}") from None
    if tp is str:
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def parse_spec(spec: str, default_seed: int) -> tuple[str, dict[str, Any]]:
    """``"basic_arithmetic?size=20&operators=+"`` → ``("basic_arithmetic", {"size": 20,
    "seed": default_seed, "operators": ("+",)})``.

    Raises:
        ValueError: unknown dataset (with the closest names), unknown config key (with the
            valid keys), or a value of the wrong type.
    """
    name, _, query = spec.partition("?")
    datasets = _datasets()
    if name not in datasets:
        close = difflib.get_close_matches(name, list(datasets), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ValueError(f"unknown reasoning-gym dataset '{name}'{hint}")
    config_cls = datasets[name][1]
    hints = typing.get_type_hints(config_cls)
    fields = {f.name for f in dataclasses.fields(config_cls)}
    kwargs: dict[str, Any] = {"seed": default_seed}
    for part in filter(None, query.split("&")):
        key, eq, raw = part.partition("=")
        key = unquote(key)
        if not eq:
            raise ValueError(f"'{part}': expected key=value")
        if key not in fields:
            raise ValueError(f"'{key}' is not a config key of {name} (valid: {', '.join(sorted(fields))})")
        kwargs[key] = _coerce(unquote(raw), hints.get(key, str), key)
    return name, kwargs


def load_rows(spec: str, config: Any = None) -> list[dict]:
    """Rows of ``rg:<spec>`` (``spec`` without the ``rg:`` prefix); see the module docstring.

    Raises:
        ValueError: a bad spec, or a configuration reasoning-gym refuses.
    """
    import reasoning_gym

    name, kwargs = parse_spec(spec, default_seed=getattr(config, "seed", 0) if config is not None else 0)
    try:
        dataset = reasoning_gym.create_dataset(name, **kwargs)
    except (AssertionError, TypeError, ValueError) as e:
        raise ValueError(f"reasoning-gym refused {name} with {kwargs}: {e or type(e).__name__}") from None
    rows = []
    for entry in dataset:  # kept as generated: a JSON round trip (tuples -> lists) breaks some score_answer
        numeric = parse_number(str(entry["answer"])) is not None
        rows.append({"prompt": entry["question"], "label": entry["answer"],
                     "prompt_suffix": NUMBER_SUFFIX if numeric else "",
                     "metadata": {"scorer": "reasoning_gym", "rg_dataset": name, "rg_entry": entry}})
    return rows


def build_source(params: Any, config: Any):
    return load_rows


def load_curriculum_rows(spec: str, config: Any = None) -> list[dict]:
    """Rows of ``rgc:<dataset>[?size=N&seed=S&levels=L]``: ``N`` problems (default 100) at
    each of the first ``L`` global levels (default: all) of the dataset's reasoning-gym
    curriculum, level-major.  Level ``l``'s problems come from the dataset config of
    ``curriculum.set_global_level(l)`` (reasoning-gym's own: every attribute at level
    ``min(l, its last)``, ranges inclusive of the lower levels), with seed ``S + l``.  Each
    row is an ``rg:`` row whose metadata also holds ``rg_level: l`` (what the ``curriculum``
    sampler reads).

    Raises:
        ValueError: unknown dataset, a dataset without a curriculum, a key other than size,
            seed and levels, or a bad value.
    """
    import reasoning_gym
    from reasoning_gym.factory import create_curriculum, has_curriculum

    name, _, query = spec.partition("?")
    if name not in _datasets():
        parse_spec(name, 0)  # raises with the closest names
    if not has_curriculum(name):
        raise ValueError(f"reasoning-gym dataset '{name}' has no curriculum; use rg:{name} (fixed difficulty) or a "
                         "dataset with one (reasoning_gym.factory.CURRICULA)")
    opts = {"size": 100, "seed": getattr(config, "seed", 0) if config is not None else 0, "levels": None}
    for part in filter(None, query.split("&")):
        key, eq, raw = part.partition("=")
        if key not in opts or not eq:
            raise ValueError(f"rgc:{name}: '{part}': the keys are size=N, seed=S and levels=L")
        try:
            opts[key] = int(raw)
        except ValueError:
            raise ValueError(f"rgc:{name}: {key}={raw}: expected an integer") from None
    curriculum = create_curriculum(name)
    top = max(len(a.levels) for a in curriculum.attributes.values())
    levels = top if opts["levels"] is None else opts["levels"]
    if not 1 <= levels <= top or opts["size"] < 1:
        raise ValueError(f"rgc:{name}: levels must be in [1, {top}] (its curriculum has {top}) and size >= 1")
    rows = []
    for level in range(levels):
        curriculum.set_global_level(level)
        cfg = curriculum.generate_configuration({"seed": opts["seed"] + level, "size": opts["size"]})
        for entry in reasoning_gym.create_dataset(name, **{f.name: getattr(cfg, f.name)
                                                           for f in dataclasses.fields(cfg)}):
            numeric = parse_number(str(entry["answer"])) is not None
            rows.append({"prompt": entry["question"], "label": entry["answer"],
                         "prompt_suffix": NUMBER_SUFFIX if numeric else "",
                         "metadata": {"scorer": "reasoning_gym", "rg_dataset": name, "rg_entry": entry,
                                      "rg_level": level}})
    return rows


def build_curriculum_source(params: Any, config: Any):
    return load_curriculum_rows


# --------------------------------------------------------------------------- scorer


def extract_answer(response: str, expected: Any) -> str | None:
    """The model's final answer: last box, else last ``<answer>`` tag, else (numeric
    ``expected``) the last number, else the last non-empty line; ``None`` if empty."""
    for found in (last_boxed(response), answer_tag(response)):
        if found is not None:
            return found
    if parse_number(str(expected)) is not None:
        return last_number(response)
    lines = [ln.strip() for ln in response.splitlines() if ln.strip()]
    return lines[-1] if lines else None


_SCORE_FNS: dict[str, Any] = {}


def _score_fn(name: str):
    fn = _SCORE_FNS.get(name)
    if fn is None:
        import reasoning_gym

        fn = _SCORE_FNS[name] = reasoning_gym.get_score_answer_fn(name)
    return fn


def rg_score(response: str, label: Any, metadata: dict | None) -> float | None:
    """The ``reasoning_gym`` scorer: ``None`` (cannot be scored) for a sample whose metadata
    has no ``rg_dataset`` / ``rg_entry``, i.e. one that did not come from the ``rg:`` source."""
    metadata = metadata or {}
    name, entry = metadata.get("rg_dataset"), metadata.get("rg_entry")
    if not name or not isinstance(entry, dict):
        return None
    answer = extract_answer(response, entry.get("answer", label))
    return float(_score_fn(name)(answer, entry))


rg_score.extract_answer = lambda response, label, metadata: extract_answer(  # for messages
    response, ((metadata or {}).get("rg_entry") or {}).get("answer", label))


def build_scorer(params: Any, config: Any):
    # Import reasoning-gym here, in the worker's untimed build, not in the first timed call:
    # its import takes seconds on a busy CPU and would time out every call of a fresh worker.
    import reasoning_gym  # noqa: F401

    return rg_score
