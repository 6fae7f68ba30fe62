"""The batch schema: every per-sample and per-token field of a training step, declared once.

A :class:`Field` says what one field is: per sample (``[B]``), per token (``[B, T, *trailing]``)
or a Python object per sample (prompt ids, texts, labels), its dtype, the value that pads a
shorter sample, which stage of the step produces it, and what it means.  Everything that
moves samples around is derived from the declarations, never from a hand-written list:

- :class:`Batch` (the samples of a step) selects, slices, concatenates (right-padding token
  fields with their pad value), moves to a device, and writes/reads replay files and plain
  dicts for Ray transport;
- :class:`Fields` views (:class:`~relax_core.contracts.GenerationOutput`, the estimator's and
  the corrections' inputs) give read-only attribute access to any declared field, ``None``
  when absent, so a component that needs a new field reads ``inp.<name>``: nothing else is
  threaded through.

Plugins declare new fields in their spec (``ComponentSpec.fields``); the plugin loader
registers them (:func:`declare`).  A plugin field is then provided by the component that
produces it (an engine passes it to ``GenerationOutput``) and read by the one that needs it.

Shapes: ``B`` samples, ``T`` padded response length.  Values of token fields at masked
positions (``loss_mask`` False) are garbage by contract.

This module imports torch only where tensors are built, so it is safe to import anywhere.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor

#: the pad value of a token field padded with the tokenizer's pad id
PAD_TOKEN = "pad_token"
STAGES = ("rollout", "reward", "loop", "advantage", "train")


@dataclass(frozen=True, kw_only=True)
class Field:
    """One declared field of the batch.

    Attributes:
        name: the field's name (the attribute of batches and views).
        per: ``"sample"`` (tensor ``[B]``), ``"token"`` (tensor ``[B, T, *trailing]``,
            right-padded) or ``"object"`` (a Python list with one entry per sample).
        dtype: ``"long"``, ``"float32"`` or ``"bool"`` (``None`` for objects).
        pad: the value right-padding a token field beyond a sample's length
            (:data:`PAD_TOKEN`: the tokenizer's pad id).
        trailing: names of the trailing dimensions of a token field (``[B, T, k]``) or a
            sample field (``[B, J]``), e.g. ``("k",)``.
        stage: which stage produces it: ``rollout`` (engine), ``reward`` (scorer and
            post-processors), ``loop`` (the core's bookkeeping), ``advantage`` (the
            backend's no-grad forwards and the estimator), ``train`` (the backend's forward
            of one micro-batch, with grad).
        doc: what it holds, with units.
        declared_by: ``"relax_core"`` or the distribution of the plugin that declared it.
    """

    name: str
    per: Literal["sample", "token", "object"]
    dtype: str | None
    stage: str
    doc: str
    pad: Any = 0
    trailing: tuple[str, ...] = ()
    declared_by: str = "relax_core"

    def __post_init__(self) -> None:
        if self.per not in ("sample", "token", "object"):
            raise ValueError(f"field {self.name!r}: per must be 'sample', 'token' or 'object', got {self.per!r}")
        if (self.per == "object") != (self.dtype is None) or self.dtype not in (None, "long", "float32", "bool"):
            raise ValueError(f"field {self.name!r}: dtype must be long, float32 or bool for tensors, None for objects")
        if self.stage not in STAGES:
            raise ValueError(f"field {self.name!r}: stage must be one of {', '.join(STAGES)}, got {self.stage!r}")


def _f(name: str, per: str, dtype: str | None, stage: str, doc: str, **kw: Any) -> Field:
    return Field(name=name, per=per, dtype=dtype, stage=stage, doc=doc, **kw)  # type: ignore[arg-type]


#: The fields the core declares, in the order a step produces them.
CORE_FIELDS: tuple[Field, ...] = (
    # rollout: the engine (or the rollout side) owns the tokens and the mask
    _f("prompt_ids", "object", None, "rollout", "prompt token ids, one list per sample"),
    _f("response_ids", "token", "long", "rollout", "the sampled tokens, exactly as the engine sampled them",
       pad=PAD_TOKEN),
    _f("loss_mask", "token", "bool", "rollout", "positions that carry loss (model-sampled tokens); holes allowed",
       pad=False),
    _f("response_lengths", "sample", "long", "rollout",
       "tokens of each response (0 = empty); of an episode: its model and environment tokens "
       "(the model's alone: loss_mask.sum(-1))"),
    _f("truncated", "sample", "bool", "rollout",
       "stopped by the length limit, not by EOS or a stop string (an episode: its last model turn, "
       "or --max-episode-tokens)"),
    _f("rollout_log_probs", "token", "float32", "rollout",
       "log q(y_t) under the engine's sampling distribution (temperature, top-p, top-k applied), nats"),
    _f("top_k_ids", "token", "long", "rollout", "the engine's top-k token ids", trailing=("k",)),
    _f("top_k_log_probs", "token", "float32", "rollout",
       "the engine's log q at top_k_ids, normalised over the full vocabulary at the sampling temperature",
       trailing=("k",)),
    _f("routed_experts", "token", "long", "rollout",
       "MoE expert ids per layer of the input position that predicts token t (-1 = padding)",
       pad=-1, trailing=("L", "E")),
    _f("prompts", "object", None, "rollout", "the prompt texts as the engine saw them"),
    _f("responses", "object", None, "rollout",
       "the decoded responses (of an episode: its last model turn, the text the scorer scores)"),
    # rollout: the episode runner's bookkeeping (relax_core.stages.episodes), in every run
    _f("env_mask", "token", "bool", "rollout",
       "positions holding environment tokens (rendered replies, tool results; loss_mask 0)", pad=False),
    _f("turn_index", "token", "long", "rollout",
       "the model turn each token belongs to or answers, from 0 (-1 = padding)", pad=-1),
    _f("turn_rewards", "token", "float32", "rollout",
       "the environment's reward of each model turn, on the turn's last model token (0 elsewhere)", pad=0.0),
    _f("num_turns", "sample", "long", "rollout", "model turns in the episode"),
    _f("episode_end", "sample", "long", "rollout",
       "why the episode ended: an index into relax_core.environments.EPISODE_ENDS"),
    _f("env_rewards", "sample", "float32", "rollout",
       "the environment's episode reward (sum of its turn rewards); NaN = none, the scorer scores responses"),
    _f("transcripts", "object", None, "rollout", "the episode's text: each model turn's (as the engine decoded it) and each rendered reply"),
    # loop bookkeeping
    _f("group_index", "sample", "long", "loop", "the prompt group of each sample (groups by index, never position)"),
    _f("prompt_index", "sample", "long", "loop", "the prompt's row in the dataset (exactly-once accounting)"),
    _f("weight_version", "sample", "long", "loop", "the trainer step whose weights generated the sample"),
    _f("labels", "object", None, "loop", "the dataset's label of each sample"),
    _f("metadata", "object", None, "loop", "the dataset's metadata of each sample"),
    # reward
    _f("rewards", "sample", "float32", "reward", "scalar reward after the post-processors; NaN = unscored"),
    _f("reward_parts", "sample", "float32", "reward",
       "each --reward scorer's raw reward, in --reward order (NaN = that scorer did not score the sample); "
       "in runs with several --reward", trailing=("J",)),
    # advantage: no-grad forwards of the backend, then the estimator
    _f("old_log_probs", "token", "float32", "advantage", "log π_old (recomputed, or the rollout log-probs)"),
    _f("ref_log_probs", "token", "float32", "advantage", "log π_ref of the reference model"),
    _f("teacher_log_probs", "token", "float32", "advantage",
       "log π_teacher(y_t) of the --teacher-model on the sampled tokens, at the rollout temperature, nats"),
    _f("values", "token", "float32", "advantage", "critic values V(s_t) when the rollout was scored"),
    _f("advantages", "token", "float32", "advantage", "token advantages (0 at masked positions)"),
    _f("returns", "token", "float32", "advantage", "returns (critic targets; else the pre-normalisation signal)"),
    # train: the backend's forward of one micro-batch (with grad)
    _f("log_probs", "token", "float32", "train", "log π_θ of the sampled tokens (requires grad)"),
    _f("entropy", "token", "float32", "train", "token entropy of π_θ, nats"),
    _f("train_top_k_log_probs", "token", "float32", "train", "log π_θ at top_k_ids (full-vocabulary softmax)",
       trailing=("k",)),
)

FIELDS: dict[str, Field] = {f.name: f for f in CORE_FIELDS}

#: The fields of the episode runner (:mod:`relax_core.stages.episodes`), which every run's rollout has.
EPISODE_FIELDS = frozenset({"env_mask", "turn_index", "turn_rewards", "num_turns", "episode_end", "env_rewards",
                            "transcripts"})

#: The fields of a composite reward: the reward stage gives them when the run has several
#: ``--reward`` scorers, and only then.
REWARD_PARTS_FIELDS = frozenset({"reward_parts"})

#: The fields of a teacher (``--teacher-model``): a backend that declares them in
#: ``provides_fields`` computes them when the run has a teacher, and only then.
TEACHER_FIELDS = frozenset({"teacher_log_probs"})

#: The fields every run has: the loop's, the reward's and the advantage stage's, what every
#: engine returns and what every backend's forward gives.  The others (engine log-probs,
#: top-k heads, routed experts, top-k log-probs of the trainer, plugin fields) exist when
#: the selected engine or backend declares them (``provides_fields``); the teacher's, when a
#: backend declares them and ``--teacher-model`` is set; the reward parts, with several
#: ``--reward``.
ALWAYS_PROVIDED = frozenset(
    {f.name for f in CORE_FIELDS if f.stage in ("loop", "reward", "advantage")
     and f.name not in TEACHER_FIELDS | REWARD_PARTS_FIELDS}
    | {"prompt_ids", "response_ids", "loss_mask", "response_lengths", "truncated", "prompts", "responses",
       "log_probs", "entropy"} | EPISODE_FIELDS)

#: The engine's top-k head (:class:`~relax_core.contracts.SamplingParams` ``top_k_width``):
#: asking for either field asks for both.
TOP_K_HEAD = frozenset({"top_k_ids", "top_k_log_probs"})


def declare(field: Field) -> None:
    """Add a plugin's field to the schema (the plugin loader calls it for ``spec.fields``).

    Raises:
        ValueError: another declaration of the same name that differs (naming both
            declarers)."""
    old = FIELDS.get(field.name)
    if old is not None and old != field:
        raise ValueError(f"batch field {field.name!r} is declared by {old.declared_by} and differently by "
                         f"{field.declared_by}")
    FIELDS[field.name] = field


def field(name: str) -> Field:
    """The declaration of ``name``.  Raises ``KeyError`` naming the known fields."""
    try:
        return FIELDS[name]
    except KeyError:
        raise KeyError(f"no batch field {name!r} is declared; known: {', '.join(sorted(FIELDS))}") from None


# --------------------------------------------------------------------------- views


class Fields:
    """A read-only view of declared fields: ``view.<name>`` is the value, ``None`` when the
    field is declared but absent; an undeclared name raises.  Subclasses may allow a few
    non-field names (``extra``), such as ``process_group``.

    Raises:
        TypeError: a keyword that is neither a declared field nor one of ``extra``.
    """

    __slots__ = ("_values",)
    extra: ClassVar[frozenset[str]] = frozenset()
    #: the stages whose fields this view holds (``None``: every stage)
    stages: ClassVar[frozenset[str] | None] = None

    @classmethod
    def _allowed(cls, name: str) -> bool:
        if name in cls.extra:
            return True
        f = FIELDS.get(name)
        return f is not None and (cls.stages is None or f.stage in cls.stages)

    def __init__(self, **values: Any) -> None:
        unknown = [k for k in values if not self._allowed(k)]
        if unknown:
            raise TypeError(f"{type(self).__name__}: {', '.join(map(repr, unknown))} is not a declared batch field"
                            + (f" of the {'/'.join(sorted(self.stages))} stage" if self.stages else "")
                            + " (declare a new field in a plugin spec's fields)")
        object.__setattr__(self, "_values", values)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_values":
            raise AttributeError(name)
        values = self._values
        if name in values:
            return values[name]
        if self._allowed(name):
            return None
        raise AttributeError(f"{type(self).__name__} has no field {name!r}"
                             + (f" (its fields are those of the {'/'.join(sorted(self.stages))} stage)"
                                if self.stages else " (not a declared batch field)"))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only (use .replace({name}=...))")

    def __contains__(self, name: str) -> bool:
        return self._values.get(name) is not None

    def get(self, name: str, default: Any = None) -> Any:
        v = self._values.get(name)
        return default if v is None else v

    def names(self) -> list[str]:
        """The fields present (not ``None``), in the order given."""
        return [k for k, v in self._values.items() if v is not None]

    def items(self) -> dict[str, Any]:
        """The present fields and extras as a new dict."""
        return {k: v for k, v in self._values.items() if v is not None}

    def replace(self, **changes: Any) -> Any:
        """A copy with ``changes`` (a value ``None`` removes a field)."""
        return type(self)(**{**self._values, **changes})

    def __repr__(self) -> str:
        def show(v: Any) -> str:
            shape = getattr(v, "shape", None)
            return f"[{', '.join(map(str, shape))}]" if shape is not None else f"<{len(v)} items>" if isinstance(v, list) else repr(v)

        return f"{type(self).__name__}({', '.join(f'{k}={show(v)}' for k, v in self.items().items())})"

    def __reduce__(self) -> Any:  # pickling (Ray, multiprocessing): by value
        return (_rebuild, (type(self), self.items()))


def _rebuild(cls: type, values: dict) -> Any:
    return cls(**values)


def _dtype(name: str) -> Any:
    import torch

    return {"long": torch.long, "float32": torch.float32, "bool": torch.bool}[name]


def _pad_value(f: Field, pad_token_id: int) -> Any:
    return pad_token_id if f.pad == PAD_TOKEN else f.pad


def pad_tokens(x: "Tensor", t: int, value: Any) -> "Tensor":
    """Right-pad dim 1 of ``x [B, T', ...]`` to ``t`` with ``value``."""
    import torch

    if x.shape[1] >= t:
        return x
    pad = torch.full((x.shape[0], t - x.shape[1], *x.shape[2:]), value, dtype=x.dtype, device=x.device)
    return torch.cat([x, pad], dim=1)


def concat_values(parts: list[dict[str, Any]], pad_token_id: int = 0) -> dict[str, Any]:
    """Concatenate field dicts along samples: tensors with ``torch.cat`` (token fields
    right-padded to the widest with their declared pad), objects as lists.  A field must be
    present in every part or in none.

    Raises:
        ValueError: a field present in some parts only.
        KeyError: an undeclared field."""
    import torch

    if len(parts) == 1:
        return dict(parts[0])
    out: dict[str, Any] = {}
    names = [k for k, v in parts[0].items() if v is not None]
    for p in parts[1:]:
        if {k for k, v in p.items() if v is not None} != set(names):
            raise ValueError(f"cannot concatenate batches with different fields: {sorted(names)} vs "
                             f"{sorted(k for k, v in p.items() if v is not None)}")
    for name in names:
        f = field(name)
        vals = [p[name] for p in parts]
        if f.per == "object":
            out[name] = [x for v in vals for x in v]
        elif f.per == "token":
            t = max(v.shape[1] for v in vals)
            out[name] = torch.cat([pad_tokens(v, t, _pad_value(f, pad_token_id)) for v in vals])
        else:
            out[name] = torch.cat(vals)
    return out


class Batch(Fields):
    """The samples of one step (or one micro-batch): any declared fields, all with the same
    number of samples ``B``.  Selection, slicing, concatenation, device moves, replay files
    and plain-dict transport follow the fields' declarations.

    ``size`` is ``B``; ``pad_token_id`` pads ``response_ids`` when batches of different
    widths are concatenated.
    """

    __slots__ = ()

    @property
    def size(self) -> int:
        for name in ("group_index", "response_ids", "loss_mask", "prompt_ids"):
            v = self._values.get(name)
            if v is not None:
                return len(v)
        v = next((v for v in self._values.values() if v is not None), None)
        return 0 if v is None else len(v)

    def select(self, idx: list[int] | "Tensor") -> "Batch":
        """The samples ``idx`` (in that order)."""
        import torch

        ix = torch.as_tensor(idx, dtype=torch.long)
        items = ix.tolist()
        out = {}
        for name, v in self.items().items():
            f = FIELDS[name]
            out[name] = [v[i] for i in items] if f.per == "object" else v[ix]
        return Batch(**out)

    def slice(self, lo: int, hi: int) -> "Batch":
        """Samples ``[lo, hi)`` (views of the tensors)."""
        if lo == 0 and hi == self.size:
            return self
        return Batch(**{k: v[lo:hi] for k, v in self.items().items()})

    @staticmethod
    def concat(batches: list["Batch"], pad_token_id: int = 0) -> "Batch":
        """Concatenate along samples (:func:`concat_values`)."""
        if len(batches) == 1:
            return batches[0]
        return Batch(**concat_values([b.items() for b in batches], pad_token_id))

    def to(self, device: Any) -> "Batch":
        """The tensors on ``device`` (the same object when they already are)."""
        tensors = {k: v for k, v in self.items().items() if hasattr(v, "to")}
        if all(v.device == device for v in tensors.values()):
            return self
        return self.replace(**{k: v.to(device) for k, v in tensors.items()})

    # ------------------------------------------------------------------ transport and files

    def to_dict(self) -> dict[str, Any]:
        """Plain data (tensors and lists) for Ray transport; :meth:`from_dict` inverts it."""
        return self.items()

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Batch":
        return Batch(**d)

    def save(self, base: Path) -> None:
        """Write ``base.safetensors`` (the tensor fields) and ``base.json`` (the objects)."""
        from safetensors.torch import save_file

        base = Path(base)
        base.parent.mkdir(parents=True, exist_ok=True)
        items = self.items()
        save_file({k: v.contiguous() for k, v in items.items() if FIELDS[k].per != "object"},
                  str(base.with_suffix(".safetensors")))
        base.with_suffix(".json").write_text(json.dumps({k: v for k, v in items.items() if FIELDS[k].per == "object"},
                                                        default=str))

    @staticmethod
    def load(base: Path) -> "Batch":
        """Read what :meth:`save` wrote.

        Raises:
            FileNotFoundError: no ``base.safetensors``.
            TypeError: the files hold a field this installation does not declare."""
        from safetensors.torch import load_file

        base = Path(base)
        tensors = load_file(str(base.with_suffix(".safetensors")))
        return Batch(**tensors, **json.loads(base.with_suffix(".json").read_text()))


def length_mask(lengths: "Tensor", width: int) -> "Tensor":
    """bool ``[B, width]``: ``t < lengths[b]``, the ``loss_mask`` of single-completion
    responses (every generated token carries loss).  ``lengths``: long ``[B]``."""
    import torch

    return torch.arange(width, device=lengths.device)[None, :] < lengths.long()[:, None]
