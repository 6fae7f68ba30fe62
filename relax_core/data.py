"""Training and evaluation data: loading, validation, prompt building, a resumable cursor.

Sources (``--data`` / ``--eval-data``):

- ``<scheme>:<spec>`` for a registered data source (e.g. ``rg:basic_arithmetic?size=500``
  from the reasoning-gym reward plugin); its factory returns the rows.
- ``<scheme>:<path>`` for a registered file format (e.g. ``gsm8k:`` from relax-math): the
  records of the file, converted to rows by the format's plugin.
- a file: ``.jsonl`` (parsed line by line so a bad line is named), ``.json`` or ``.parquet``
  (read with ``datasets``).  Fields: ``--prompt-key``, ``--label-key``, ``--metadata-key``.
  A file whose first record lacks both keys but has all the keys a file format declares
  (``DataSourceSpec.file_keys``: ``question`` and ``answer`` for GSM8K) is read by it.

Every row becomes ``{"prompt": str, "label": Any, "metadata": dict}``, where ``prompt`` is
the user turn as the model gets it: the source's prompt plus ``--prompt-suffix`` when given,
else plus the instruction the data source declares for that row (a source row may carry a
``"prompt_suffix"``: the ``rg:`` source asks numeric tasks for "Give only the final number.");
file prompts are sent unchanged.  Under ``--reward auto`` a file row whose metadata names no
scorer is scored by the first scorer (by name) whose ``RewardScorerSpec.auto_labels`` accepts
its label (relax-math's ``gsm8k`` takes a plain number: the last boxed answer, else the last
number, so that an answer written naturally, "4 + 9 = 13", scores); any other label gets the
default scorer (``math``).  Problems are found
here, before any model loads: a malformed row raises :class:`DataError` naming the file
and line (or, with ``--skip-bad-rows``, is skipped and counted), and so do a label key that
is absent from the data and an empty dataset.

With evaluation data, the training rows whose prompt is one of the evaluation prompts are
dropped (:func:`exclude_eval_prompts`, ``--exclude-eval-prompts``, on by default), so that
evaluation is on prompts the run never trains on.

The :class:`DataCursor` (the default ``--sampler uniform``) walks the rows in a seeded
shuffled order, epoch by epoch; its state (epoch, position) is saved in checkpoints, so a
resumed run repeats no prompt.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from relax_core.sampling import Sampler


class DataError(ValueError):
    """A problem with the data given by the user (bad row, missing key, empty set)."""


@dataclass(frozen=True)
class DataRef:
    """A ``--data`` / ``--eval-data`` value, parsed (:func:`parse_data`).

    Attributes:
        kind: ``source`` (a registered data source or file format), ``file``, or
            ``unknown`` (``scheme:`` of no registered source).
        scheme: the part before the first ``:`` (``""`` for a file).
        target: what follows ``scheme:`` (a source's spec, a file format's path), or the file path.
    """

    kind: str
    scheme: str
    target: str


def data_sources(registry: Any) -> dict[str, Any]:
    """scheme -> the registered data source (``registry.components["data_source"]`` entries)."""
    if registry is None:
        return {}
    return {r.spec.scheme: r for r in registry.components.get("data_source", {}).values()}


def parse_data(value: str, schemes: Any) -> DataRef:
    """The one reading of a ``--data`` value: ``scheme:spec`` when there is a ``:`` whose
    prefix has no ``/`` and more than one character (not a directory, not a drive letter)
    and the whole value is not an existing file; else a file path.

    Args:
        value: the flag's value.
        schemes: the registered data-source schemes (:func:`data_sources`' keys).
    """
    scheme, sep, rest = value.partition(":")
    if not (sep and "/" not in scheme and len(scheme) > 1 and not Path(value).expanduser().exists()):
        return DataRef("file", "", value)
    return DataRef("source" if scheme in schemes else "unknown", scheme, rest)


@dataclass
class Dataset:
    """Validated rows plus where they came from and how many were skipped."""

    name: str
    rows: list[dict]
    skipped: int = 0
    problems: list[str] = field(default_factory=list)
    fingerprint: dict | None = None
    """``{"source", "rows", "sha256"}`` (:func:`data_fingerprint`), set by :func:`load_dataset`;
    stored in checkpoints so that ``--resume`` can refuse other data."""
    held_out: int = 0
    """Rows dropped because their prompt is an evaluation prompt (:func:`exclude_eval_prompts`)."""

    def __len__(self) -> int:
        return len(self.rows)


# --------------------------------------------------------------------------- loading


def _row_from_keys(raw: dict, prompt_key: str, label_key: str, metadata_key: str | None) -> dict:
    if prompt_key not in raw:
        raise ValueError(f"no prompt key '{prompt_key}' (keys: {', '.join(sorted(raw)) or 'none'}; set --prompt-key)")
    if label_key not in raw:
        raise ValueError(f"no label key '{label_key}' (keys: {', '.join(sorted(raw)) or 'none'}; set --label-key)")
    prompt = raw[prompt_key]
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f"prompt '{prompt_key}' must be a non-empty string, got {type(prompt).__name__}")
    meta = raw.get(metadata_key) if metadata_key else None
    if meta is None:
        meta = {}
    if isinstance(meta, str):
        meta = json.loads(meta)
    if not isinstance(meta, dict):
        raise ValueError(f"metadata '{metadata_key}' must be an object, got {type(meta).__name__}")
    return {"prompt": prompt, "label": raw[label_key], "metadata": meta}


def _records(path: Path) -> list[tuple[str, Any]]:
    """``(location, raw record)`` pairs of a file; a JSONL line that is not JSON is kept as
    an ``Exception`` so the caller reports or skips it."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        out: list[tuple[str, Any]] = []
        with path.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    out.append((f"{path}:{lineno}", json.loads(line.rstrip("\r\n"))))  # a column within the line
                except json.JSONDecodeError as e:
                    out.append((f"{path}:{lineno}", ValueError(f"invalid JSON: {e.msg} (line {lineno}, column {e.colno})")))
        return out
    if suffix in (".json", ".parquet"):
        import datasets

        datasets.disable_progress_bars()
        try:
            if suffix == ".parquet":
                ds = datasets.Dataset.from_parquet(str(path))
            else:
                ds = datasets.Dataset.from_json(str(path))
        except Exception as e:  # datasets raises many types for a broken file
            raise DataError(f"{path}: cannot read: {type(e).__name__}: {e}") from None
        return [(f"{path}: row {i}", dict(r)) for i, r in enumerate(ds)]
    raise DataError(f"{path}: unknown data format '{suffix}' (use .jsonl, .json or .parquet, or rg:<dataset>)")


def _file_format(first: Any, cfg: Any, sources: dict[str, Any]) -> Any:
    """The file format that reads a bare file whose first record is ``first``: the first
    (by scheme) whose ``file_keys`` it has, when it has neither the prompt nor the label key."""
    if not isinstance(first, dict) or cfg.prompt_key in first or cfg.label_key in first:
        return None
    return next((r for _, r in sorted(sources.items()) if r.spec.file_keys and set(r.spec.file_keys) <= set(first)),
                None)


def _build(reg: Any, source: str, cfg: Any) -> Any:
    try:
        return reg.spec.build(cfg.params_for(reg.spec.name), cfg)
    except Exception as e:  # a broken plugin: name it rather than a traceback
        raise DataError(f"--data {source}: data source '{reg.spec.name}' ({reg.origin}) cannot be built: "
                        f"{type(e).__name__}: {e}") from None


def _label_scorers(registry: Any) -> list[tuple[str, Any]]:
    """``(name, predicate)`` of the scorers that claim labels under ``--reward auto``
    (``RewardScorerSpec.auto_labels``), by name.

    Raises:
        DataError: a predicate cannot be imported (naming the scorer and its plugin).
    """
    from relax_core.specs import resolve

    out = []
    for name, reg in sorted((registry.components.get("reward", {}) if registry is not None else {}).items()):
        if reg.spec.auto_labels:
            try:
                out.append((name, resolve(reg.spec.auto_labels)))
            except Exception as e:  # a broken plugin: name it rather than a traceback
                raise DataError(f"reward scorer '{name}' ({reg.origin}): its auto_labels {reg.spec.auto_labels!r} "
                                f"cannot be imported: {type(e).__name__}: {e}") from None
    return out


def _from_file(path: Path, cfg: Any, source: str, registry: Any, fmt: Any = None) -> Dataset:
    if not path.is_file():
        raise DataError(f"data file {path} not found")
    records = _records(path)
    fmt = fmt or _file_format(next((r for _, r in records if isinstance(r, dict)), None), cfg, data_sources(registry))
    convert = _build(fmt, source, cfg) if fmt is not None else \
        (lambda raw: _row_from_keys(raw, cfg.prompt_key, cfg.label_key, cfg.metadata_key))
    claims = _label_scorers(registry)
    ds = Dataset(name=path.stem, rows=[])
    for where, raw in records:
        try:
            if isinstance(raw, Exception):
                raise raw
            if not isinstance(raw, dict):
                raise ValueError(f"expected a JSON object, got {type(raw).__name__}")
            try:
                row = convert(raw)
            except KeyError as e:  # a file format's converter reading a key the record lacks
                raise ValueError(f"no key {e} (keys: {', '.join(sorted(raw)) or 'none'})") from None
        except (ValueError, TypeError) as e:
            msg = f"{where}: {e}"
            if not cfg.skip_bad_rows:
                raise DataError(msg + " (or pass --skip-bad-rows to skip such rows)") from None
            ds.skipped += 1
            ds.problems.append(msg)
            continue
        row["prompt"] += cfg.prompt_suffix or ""  # files: only an explicit --prompt-suffix
        if "scorer" not in row["metadata"]:
            name = next((n for n, accepts in claims if accepts(row["label"])), None)
            if name is not None:
                row["metadata"] = {**row["metadata"], "scorer": name}
        ds.rows.append(row)
    return ds


def load_dataset(source: str, cfg: Any, registry: Any = None) -> Dataset:
    """Load and validate ``source`` (a ``--data`` value) into a :class:`Dataset`.

    Args:
        source: ``scheme:spec`` (a data source or a file format) or a file path.
        cfg: the :class:`~relax_core.config.RunConfig` (keys, ``skip_bad_rows``).
        registry: the plugin registry, for ``data_source`` schemes and file formats and the
            scorers' ``auto_labels`` (without it: plain files only).

    Raises:
        DataError: unknown scheme, unreadable file, a bad row (unless skipped), or no rows.
    """
    sources = data_sources(registry)
    ref = parse_data(source, sources)
    if ref.kind == "source" and sources[ref.scheme].spec.file_keys:
        ds = _from_file(Path(ref.target).expanduser(), cfg, source, registry, sources[ref.scheme])
    elif ref.kind == "source":
        reader = _build(sources[ref.scheme], source, cfg)
        try:
            raw_rows = reader(ref.target, cfg)
        except (ValueError, KeyError) as e:
            raise DataError(f"--data {source}: {e}") from None
        ds = Dataset(name=ref.target.split("?")[0] or ref.scheme, rows=[])
        for i, raw in enumerate(raw_rows):
            try:
                row = _row_from_keys(raw, "prompt", "label", "metadata")
            except (ValueError, TypeError) as e:
                raise DataError(f"{source}: row {i}: {e}") from None
            row["prompt"] += (raw.get("prompt_suffix") or "") if cfg.prompt_suffix is None else cfg.prompt_suffix
            ds.rows.append(row)
    elif ref.kind == "unknown":
        raise DataError(f"--data {source}: unknown data source '{ref.scheme}:' (known: {', '.join(sorted(sources))}); "
                        "is the plugin that provides it installed? (`relax plugins`)")
    else:
        ds = _from_file(Path(source).expanduser(), cfg, source, registry)
    if not ds.rows:
        extra = f" ({ds.skipped} bad rows skipped; first: {ds.problems[0]})" if ds.skipped else ""
        raise DataError(f"--data {source}: the dataset is empty{extra}")
    ds.fingerprint = data_fingerprint(source, ds.rows)
    return ds


def exclude_eval_prompts(train: Dataset, eval_data: Dataset) -> Dataset:
    """``train`` without the rows whose prompt (the text the model gets, suffix included)
    is the prompt of any row of ``eval_data``: the evaluation is then held out, also when
    both come from one generator or one file.  The order of the remaining rows is kept, so
    the result is deterministic; its fingerprint covers the remaining rows.

    Raises:
        DataError: every training row's prompt is an evaluation prompt.
    """
    held = {row["prompt"] for row in eval_data.rows}
    rows = [row for row in train.rows if row["prompt"] not in held]
    if not rows:
        raise DataError(f"--data {train.fingerprint['source']}: every training prompt is also an evaluation prompt "
                        f"(--eval-data {eval_data.fingerprint['source']}), so none is left to train on; give other "
                        "--eval-data, or pass --no-exclude-eval-prompts to train on the evaluation prompts too")
    out = replace(train, rows=rows, held_out=len(train.rows) - len(rows))
    out.fingerprint = data_fingerprint(train.fingerprint["source"], rows)
    return out


def run_datasets(cfg: Any, registry: Any = None) -> tuple[Dataset, Dataset | None]:
    """A run's training and evaluation data: ``--data`` and ``--eval-data`` (``None`` when
    the run has none; named ``NAME`` when given as ``NAME=SOURCE``), the training rows less
    the evaluation prompts under ``--exclude-eval-prompts`` (:func:`exclude_eval_prompts`).

    Raises:
        DataError: a source cannot be read, or no training row is left.
    """
    train = load_dataset(cfg.data, cfg, registry)
    eval_data = load_dataset(cfg.eval_source, cfg, registry) if cfg.eval_source else None
    if eval_data is not None and cfg.eval_name:
        eval_data = replace(eval_data, name=cfg.eval_name)
    if eval_data is not None and cfg.exclude_eval_prompts:
        train = exclude_eval_prompts(train, eval_data)
    return train, eval_data


def data_fingerprint(source: str, rows: list[dict]) -> dict:
    """What identifies a dataset across runs: its ``source`` (the ``--data`` value, for
    messages), its row count, and the SHA-256 of its rows (prompt, label and metadata as
    sorted-key JSON, one line per row, in order).  For a generated source (``rg:...``) the
    rows are the generator's output, so the hash covers the generator and its arguments."""
    h = hashlib.sha256()
    for row in rows:
        h.update(json.dumps([row["prompt"], row["label"], row["metadata"]], sort_keys=True, default=str).encode())
        h.update(b"\n")
    return {"source": source, "rows": len(rows), "sha256": h.hexdigest()}


def fingerprint_change(saved: dict, now: dict) -> str | None:
    """How ``now`` differs from the checkpoint's fingerprint ``saved`` (rows and content;
    the source string alone may change, e.g. a moved file), or ``None`` if it does not."""
    if saved["rows"] != now["rows"]:
        return f"{saved['rows']} rows in the checkpoint ({saved['source']}), {now['rows']} now ({now['source']})"
    if saved["sha256"] != now["sha256"]:
        return (f"same row count ({now['rows']}) but other rows: content hash {saved['sha256'][:12]}… in the "
                f"checkpoint ({saved['source']}), {now['sha256'][:12]}… now ({now['source']})")
    return None


# --------------------------------------------------------------------------- prompts


def prompt_messages(prompt: str, cfg: Any) -> list[dict]:
    """Chat messages of one prompt: optional system prompt, then the user turn (the row's
    prompt, which already holds its suffix: see :func:`load_dataset`)."""
    msgs = [{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else []
    return msgs + [{"role": "user", "content": prompt}]


def prompt_text(prompt: str, tokenizer: Any, cfg: Any) -> str:
    """The text fed to the model: the chat template with a generation prompt when
    ``--apply-chat-template`` and the tokenizer has one; else system prompt + prompt +
    suffix as plain text."""
    msgs = prompt_messages(prompt, cfg)
    if cfg.apply_chat_template and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    return "\n\n".join(m["content"] for m in msgs)


def encode_prompts(prompts: list[str], tokenizer: Any, cfg: Any) -> tuple[list[str], list[list[int]]]:
    """Prompt texts and their token ids (the template already holds special tokens)."""
    texts = [prompt_text(p, tokenizer, cfg) for p in prompts]
    templated = cfg.apply_chat_template and getattr(tokenizer, "chat_template", None)
    ids = [tokenizer(t, add_special_tokens=not templated)["input_ids"] for t in texts]
    return texts, ids


# --------------------------------------------------------------------------- cursor


@dataclass
class DataCursor(Sampler):
    """A deterministic walk over ``n`` rows: a fresh seeded shuffle per epoch (the
    ``uniform`` sampler, :mod:`relax_core.sampling`).

    ``take(k)`` returns the next ``k`` dataset indices, wrapping into the next epoch.  Every
    row is handed out once per epoch, and a batch never holds the same index twice when
    ``k <= n``: when a batch straddles an epoch boundary, the rows it already holds from
    the old epoch are moved, in the new epoch's order, after the ones the batch still
    needs (the order is untouched when none of them would repeat).  ``state()``/``load()``
    save and restore (epoch, position and that adjustment): indices handed out before a
    checkpoint are never handed out again after resuming from it within the same epoch.
    """

    n: int
    seed: int
    epoch: int = 0
    position: int = 0
    carry: list[int] = field(default_factory=list)
    """Indices of the straddling batch taken from the previous epoch (empty when the
    epoch began on a batch boundary)."""
    need: int = 0
    """How many indices that batch took from this epoch."""

    def _order(self, epoch: int) -> list[int]:
        order = list(range(self.n))
        random.Random(f"relax-data:{self.seed}:{epoch}").shuffle(order)
        if self.carry:
            held = set(self.carry)
            head = [i for i in order if i not in held][: self.need]
            chosen = set(head)
            order = head + [i for i in order if i not in chosen]
        return order

    def take(self, k: int) -> list[int]:
        out: list[int] = []
        order = self._order(self.epoch)
        while len(out) < k:
            if self.position >= self.n:
                self.epoch += 1
                self.position = 0
                self.carry, self.need = list(out), k - len(out)
                order = self._order(self.epoch)
            out.append(order[self.position])
            self.position += 1
        return out

    def state(self) -> dict:
        return {"n": self.n, "seed": self.seed, "epoch": self.epoch, "position": self.position,
                "carry": list(self.carry), "need": self.need}

    def load(self, state: dict, allow_other_data: bool = False) -> None:
        """Restore :meth:`state`.

        Args:
            allow_other_data: ``--resume-allow-data-change``: a checkpoint for another row
                count leaves the cursor at the start of these data instead of raising.

        Raises:
            DataError: the checkpoint's row count differs (unless allowed) or its seed does.
        """
        if state["seed"] != self.seed or (state["n"] != self.n and not allow_other_data):
            raise DataError(f"checkpoint data cursor is for {state['n']} rows / seed {state['seed']}, "
                            f"but this run has {self.n} rows / seed {self.seed}: resume with the same --data and --seed")
        if state["n"] != self.n:
            return
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self.carry, self.need = [int(i) for i in state.get("carry", [])], int(state.get("need", 0))
