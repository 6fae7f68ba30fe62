"""The run configuration: one frozen object, built from flags and an optional YAML file.

Every field is documented (``help`` metadata) and has a CLI flag (``--field-name`` with
dashes, or the ``flag`` metadata; Relax's flag names where one exists).  Plugin
parameters (each component's schema, e.g. ``--m2po-kl2-budget``) live in
``RunConfig.plugin_params``: component name -> its parameter dataclass instance.

Precedence: defaults < ``--config run.yaml`` < command-line flags.  An unknown YAML key
or flag is an error that suggests the closest valid key.

This module imports nothing heavy.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import re
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Mapping

DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_DATA = "rg:chain_sum?size=2000&seed=42&min_terms=2&max_terms=2&min_digits=1&max_digits=2"
#: The default task's evaluation prompts (``--eval-data auto`` with the default ``--data``):
#: the same generator with a far seed (reasoning-gym seeds item i with seed + i, so nearby
#: seeds share problems); the training rows with one of these prompts are left out
#: (``--exclude-eval-prompts``), so the evaluation is held out.  300 prompts: the standard
#: error of a greedy pass@1 near 40 % is 2.8 points.
DEFAULT_EVAL_DATA = "rg:chain_sum?size=300&seed=100000&min_terms=2&max_terms=2&min_digits=1&max_digits=2"
#: Earlier default tasks -> their evaluation prompts, so that ``--eval-data auto`` of a run
#: started with one (its saved ``config.json``) keeps its evaluation and its left-out training
#: rows on ``--resume`` and in ``relax eval`` (the default until 4 December 2026).
EARLIER_DEFAULT_EVAL_DATA = {
    "rg:chain_sum?size=2000&seed=42&min_terms=2&max_terms=2&min_digits=1&max_digits=1":
        "rg:chain_sum?size=64&seed=7&min_terms=2&max_terms=2&min_digits=1&max_digits=1"}
REDUCTIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
KL_TYPES = ("k1", "k2", "k3", "low_var_kl")


def opt(default: Any, help: str, *, flag: str | None = None, aliases: tuple[str, ...] = (),
        ge: float | None = None, gt: float | None = None, le: float | None = None,
        choices: tuple[Any, ...] | None = None, repeat: bool = False, group: str = "general") -> Any:
    """A :class:`RunConfig` field with its help text, flag and bounds."""
    meta = {"help": help, "flag": flag, "aliases": aliases, "ge": ge, "gt": gt, "le": le,
            "choices": choices, "repeat": repeat, "group": group}
    if isinstance(default, (list, dict)):
        raise TypeError("use tuples for sequence defaults")
    return field(default=default, metadata=meta)


_SET_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def named_source(value: str) -> tuple[str | None, str]:
    """An ``--eval-data`` value as ``(name or None, source)``: ``NAME=SOURCE`` when the text
    before the first ``=`` is a plain name (letters, digits, ``_.-``), else the whole value
    is the source (``rg:chain_sum?size=64`` has ``=`` in it) and the name is the dataset's."""
    name, sep, source = value.partition("=")
    return (name, source) if sep and _SET_NAME.match(name) and source else (None, value)


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Resolved configuration of one run.  Documented field by field."""

    # ---- components
    advantage_estimator: str = opt("grpo", "Advantage estimator (plugin name).", aliases=("--estimator",), group="components")
    correction: tuple[str, ...] = opt((), "Train/inference mismatch correction (repeatable), applied in each correction's declared order.", repeat=True, group="components")
    reward: tuple[str, ...] = opt(("auto",), "Reward scorer (plugin name); 'auto' takes the scorer the data source suggests. Repeatable: the reward is the --reward-weights sum of the scorers', each logged as rollout/reward/<name>.", repeat=True, group="components")
    reward_processor: tuple[str, ...] = opt((), "Reward post-processor (repeatable), applied in the order given.", repeat=True, group="components")
    rollout_engine: str = opt("hf", "Rollout engine (plugin name).", group="components")
    train_backend: str = opt("torch", "Training backend (plugin name).", group="components")
    sampler: str = opt("uniform", "Prompt sampler (plugin name): which training rows each step's prompts are (docs/guide/sampling.md).", group="components")
    environment: str = opt("single_turn", "Environment driving each sample's episode (plugin name): single_turn (prompt → one completion), retry, tools, ...", group="components")
    custom_rm_path: str | None = opt(None, "Custom scorer 'pkg.module:fn' (runs with your rights; lighter than a plugin).", group="components")

    # ---- model and data
    model: str = opt(DEFAULT_MODEL, "Model: 'smollm2-135m-instruct' (embedded, offline), a local Hugging Face directory, or a hub name.", group="model")
    data: str = opt(DEFAULT_DATA, "Training data: 'rg:<dataset>[?size=N&seed=S&...]' (reasoning-gym), a JSONL/JSON/Parquet file, or 'gsm8k:<path>'.", group="data")
    prompt_key: str = opt("prompt", "Field holding the prompt in file data.", group="data")
    label_key: str = opt("label", "Field holding the label in file data.", group="data")
    metadata_key: str | None = opt(None, "Field holding per-sample metadata in file data.", group="data")
    skip_bad_rows: bool = opt(False, "Skip (and count) malformed data rows instead of failing.", group="data")
    apply_chat_template: bool = opt(True, "Apply the tokenizer's chat template to prompts.", group="data")
    system_prompt: str | None = opt(None, "Optional system prompt.", group="data")
    prompt_suffix: str | None = opt(None, "Text appended to each prompt (default: the instruction the data source declares: 'Give only the final number.' for numeric rg: tasks, nothing for files).", group="data")
    eval_data: str | None = opt("auto", "Evaluation data, [NAME=]SOURCE (SOURCE: the formats of --data; NAME: the set's name in eval/NAME/..., default the dataset's); 'auto': the default task's 300 evaluation prompts (another seed) when --data is the default, else none; 'none': no evaluation. Training rows with an evaluation prompt are left out (--exclude-eval-prompts).", group="eval")
    eval_interval: int = opt(10, "Evaluate before the first step, every N steps and after the last (0 = never).", ge=0, group="eval")
    n_samples_per_eval_prompt: int = opt(1, "Samples per evaluation prompt (more than 1 needs --eval-temperature above 0).", ge=1, group="eval")
    eval_max_prompts: int = opt(300, "At most this many evaluation prompts.", ge=1, group="eval")
    eval_temperature: float | None = opt(0.0, "Evaluation sampling temperature (0 = greedy pass@1, the default; null in a --config file = --rollout-temperature).", ge=0, group="eval")
    eval_top_p: float | None = opt(None, "Evaluation nucleus sampling p (default --rollout-top-p).", gt=0, le=1, group="eval")
    eval_max_response_len: int | None = opt(None, "Max new tokens per evaluation response (default --rollout-max-response-len).", ge=1, group="eval")
    exclude_eval_prompts: bool = opt(True, "Drop the training rows whose prompt is one of the evaluation prompts, so that evaluation is on prompts the run never trains on (--no-exclude-eval-prompts keeps them).", group="eval")

    # ---- batch shape and schedule
    rollout_batch_size: int = opt(4, "Prompts per rollout.", ge=1, group="batch")
    n_samples_per_prompt: int = opt(8, "Samples (group size) per prompt.", ge=1, group="batch")
    global_batch_size: int | None = opt(None, "Samples per optimizer step (default: rollout_batch_size × n_samples_per_prompt / num_steps_per_rollout).", ge=1, group="batch")
    num_steps_per_rollout: int = opt(1, "Optimizer steps per rollout.", ge=1, group="batch")
    num_rollout: int = opt(20, "Number of rollouts (training steps of the loop).", ge=1, group="batch")
    micro_batch_size: int | None = opt(None, "Samples per micro-batch (gradient accumulation).", ge=1, group="batch")
    max_tokens_per_micro_batch: int | None = opt(None, "Pack micro-batches up to this many tokens.", ge=1, group="batch")

    # ---- loss
    calculate_per_token_loss: bool = opt(False, "Token-mean over all valid tokens of the global batch (else --loss-reduction).", group="loss")
    loss_reduction: str = opt("seq-mean-token-mean", "Loss reduction when not per-token.", choices=REDUCTIONS, group="loss")
    loss_norm_constant: float | None = opt(None, "Constant for seq-mean-token-sum-norm (default: --rollout-max-response-len).", gt=0, group="loss")
    normalize_advantages: bool = opt(False, "Whiten advantages over the valid tokens of the global batch (sample variance, × N/(N−1)); REINFORCE++ estimators use their own.", group="loss")
    disable_rewards_normalization: bool = opt(False, "Skip the estimator's reward normalisation.", group="loss")
    entropy_coef: float = opt(0.0, "Entropy bonus coefficient.", ge=0, group="loss")
    kl_coef: float = opt(0.0, "Reward-side KL coefficient (only for estimators that use it).", ge=0, group="loss")
    use_kl_loss: bool = opt(False, "Add kl_loss_coef × KL(π_θ‖π_ref) to the loss.", group="loss")
    kl_loss_coef: float = opt(0.0, "KL loss coefficient.", ge=0, group="loss")
    kl_loss_type: str = opt("k1", "KL estimator: k1, k2, k3 or low_var_kl.", choices=KL_TYPES, group="loss")
    ref_load: str | None = opt(None, "Reference model (default: the initial weights of --model).", group="loss")
    teacher_model: str | None = opt(None, "Teacher model for on-policy distillation: 'smollm2-135m-instruct' (embedded), a local Hugging Face directory or a hub name, loaded frozen beside the actor; its log-probs of the sampled tokens are the batch field teacher_log_probs, read by --correction opd (docs/guide/distillation.md). Must share --model's tokenizer.", group="loss")
    use_rollout_logprobs: bool = opt(False, "Use the engine's log-probs as the old policy.", group="loss")
    compile_loss: bool = opt(False, "Fuse the actor loss (policy loss, corrections, reduction, metrics) with torch.compile (dynamic shapes; compiled once per run, eager fallback with a warning if compilation fails).", group="loss")

    # ---- optimizer
    lr: float = opt(1e-5, "Learning rate (AdamW; constant after --lr-warmup-steps).", gt=0, group="optim")
    weight_decay: float = opt(0.0, "AdamW weight decay.", ge=0, group="optim")
    lr_warmup_steps: int = opt(0, "Linear warm-up steps.", ge=0, group="optim")
    clip_grad: float = opt(1.0, "Gradient norm clip (0 = off).", ge=0, group="optim")
    bf16: bool | None = opt(None, "bfloat16 autocast in the training forward and backward (float32 master weights and optimizer state); the hf engine's --hf-dtype auto follows it. Default: auto, on where the training device computes bfloat16 natively (a CUDA GPU, a CPU with AMX-BF16 units) and float32 elsewhere, decided at start-up and kept on resume (relax_core.run.precision; docs/guide/performance.md). --no-bf16 keeps float32.", group="optim")
    gradient_checkpointing: bool = opt(False, "Recompute activations in backward.", group="optim")
    max_skipped_steps: int = opt(3, "Stop after this many consecutive non-finite steps.", ge=1, group="optim")

    # ---- LoRA adapters (relax_core.run.lora; Hu et al. 2021, arXiv 2106.09685)
    lora_rank: int = opt(0, "LoRA rank r: train low-rank adapters W + (α/r)·B·A on --lora-target-modules instead of every weight (0 = full fine-tuning).", ge=0, group="lora")
    lora_alpha: float = opt(16.0, "LoRA α: the adapter's output is scaled by α/r.", gt=0, group="lora")
    lora_dropout: float = opt(0.0, "Dropout on the adapter's input, in the training forward only (the old-log-prob and rollout forwards have none).", ge=0, group="lora")
    lora_engine_adapter: bool = opt(True, "Push the adapter alone to a rollout engine that takes LoRA adapters (its `LoRA adapters` capability: vllm), which applies it to its base weights; off, or with any other engine, the merged weights W + (α/r)·B·A are pushed.", group="lora")
    lora_target_modules: tuple[str, ...] = opt((), "Module name to adapt (repeatable; the last part of the name, e.g. q_proj). Default: the training backend's, per architecture (`relax plugins show torch`: attention and MLP projections for Llama/SmolLM2 and Qwen3, attention projections for Qwen3-MoE).", repeat=True, group="lora")

    # ---- rollout
    rollout_temperature: float = opt(0.7, "Sampling temperature.", ge=0, group="rollout")
    rollout_top_p: float = opt(1.0, "Nucleus sampling p.", gt=0, le=1, group="rollout")
    rollout_top_k: int = opt(-1, "Top-k sampling (-1 = off).", ge=-1, group="rollout")
    rollout_max_response_len: int = opt(32, "Max new tokens per response.", ge=1, group="rollout")
    rollout_repetition_penalty: float = opt(1.0, "Repetition penalty (1 = off).", gt=0, group="rollout")
    rollout_stop: tuple[str, ...] = opt((), "Stop string (repeatable).", repeat=True, group="rollout")
    max_turns: int = opt(4, "Most model turns per episode (multi-turn environments; each turn at most --rollout-max-response-len tokens).", ge=1, group="rollout")
    max_episode_tokens: int | None = opt(None, "Most tokens per episode after the prompt, model and environment tokens together (default: no limit beyond --max-turns).", ge=1, group="rollout")
    env_timeout: float = opt(60.0, "Seconds one environment call (an episode's start or one step, or the environment's prompt for a row) may take; past them the episode ends, counted in rollout/env_timeouts and unscored (no task advantage); a prompt past them stops the run (exit 7).", gt=0, group="rollout")
    env_num_workers: int = opt(4, "Environment calls run at once (threads or worker processes, --env-isolation), each under --env-timeout; 1 = one at a time, in order.", ge=1, group="rollout")
    env_isolation: str = opt("thread", "Where environment calls run: thread (in the rollout process; a hung call is abandoned, a crash ends the run) or process (spawned workers: a hung call's worker is killed, a crashed one replaced; rows, turns and replies must pickle).", choices=("thread", "process"), group="rollout")

    # ---- rewards
    reward_timeout: float = opt(10.0, "Seconds before a scorer call counts as timed out.", gt=0, group="reward")
    reward_num_workers: int = opt(2, "Concurrent scorer workers.", ge=1, group="reward")
    rm_url: str | None = opt(None, "URL of a remote reward model (remote scorer).", group="reward")
    reward_weights: tuple[float, ...] = opt((), "Weights of the --reward scorers, comma-separated, in their order (default: 1 each), e.g. 1,0.5.", group="reward")
    max_oversampling_rounds: int = opt(2, "Extra sampling rounds for filters that drop groups.", ge=0, group="reward")

    # ---- parallelism and launch
    context_parallel_size: int = opt(1, "Context-parallel ranks per sequence.", ge=1, group="parallel")
    tensor_parallel_size: int = opt(1, "Tensor-parallel ranks.", ge=1, group="parallel")
    pipeline_parallel_size: int = opt(1, "Pipeline-parallel stages.", ge=1, group="parallel")
    launcher: str = opt("local", "local (one process) or ray.", choices=("local", "ray"), group="parallel")
    ray_address: str | None = opt(None, "Ray cluster to join ('auto' or an address); default: start a local one.", group="parallel")
    actor_num_nodes: int = opt(1, "Training nodes.", ge=1, group="parallel")
    actor_num_gpus_per_node: int = opt(1, "Training workers per node (GPUs, or CPU workers on CPU).", ge=1, group="parallel")
    rollout_num_engines: int = opt(1, "Rollout engine actors.", ge=1, group="parallel")
    rollout_num_gpus_per_engine: int = opt(1, "Devices per rollout engine.", ge=1, group="parallel")
    colocate: bool = opt(False, "Share devices between rollout and training (offloading).", group="parallel")
    fully_async: bool = opt(False, "Rollout runs ahead of training.", group="parallel")
    max_staleness: int = opt(0, "Max trainer steps between the weights that generated a sample and the step training on it.", ge=0, group="parallel")
    update_weights_interval: int = opt(1, "Push weights to engines every N steps.", ge=1, group="parallel")
    device: str = opt("auto", "auto, cpu or cuda.", choices=("auto", "cpu", "cuda"), group="parallel")

    # ---- output and checkpoints
    output_dir: str = opt("runs", "Directory in which each run gets its own folder.", group="output")
    run_name: str | None = opt(None, "Run folder name (default: <estimator>-<timestamp>).", group="output")
    seed: int = opt(1234, "Random seed.", ge=0, group="output")
    save: str | None = opt(None, "Checkpoint directory (default: <run dir>/checkpoints).", group="output")
    save_interval: int = opt(0, "Checkpoint every N steps (0 = only at the end and on SIGINT).", ge=0, group="output")
    keep_checkpoints: int = opt(2, "Keep the newest N complete checkpoints (older ones are removed once their successor is complete).", ge=1, group="output")
    resume: bool = opt(False, "Resume from the newest complete checkpoint of the run directory, with its saved config.json as the base (flags given now override it).", group="output")
    resume_allow_data_change: bool = opt(False, "With --resume: accept training data whose rows differ from the checkpoint's (same row count: the data position carries over; another row count: the new data are read from their start).", group="output")
    force: bool = opt(False, "Start a fresh run in a run directory that already holds one, deleting its checkpoints, metrics, samples and final model.", group="output")
    save_hf: bool = opt(True, "Save the final model in Hugging Face format.", group="output")
    save_hf_dtype: str = opt("train", "dtype of the final model: 'train' (the training dtype) or 'bfloat16' (half the size of float32).", choices=("train", "bfloat16"), group="output")
    save_hf_merged: bool = opt(False, "With --lora-rank: also write the merged model (base + adapter) to final/merged/.", group="output")
    save_debug_rollout_data: str | None = opt(None, "Store every step's rollout batch in DIR.", group="output")
    load_debug_rollout_data: str | None = opt(None, "Train on stored rollout batches from DIR (no generation).", group="output")
    wandb_project: str | None = opt(None, "Log to this Weights & Biases project.", group="output")
    wandb_mode: str = opt("online", "online, offline or disabled.", choices=("online", "offline", "disabled"), group="output")
    quiet: bool = opt(False, "Plain log lines instead of the live display.", group="output")
    log_samples_per_step: int = opt(4, "Rollouts per step written to samples.jsonl.", ge=0, group="output")

    # ---- plugin parameters (component name -> params dataclass instance); not a flag
    plugin_params: Mapping[str, Any] = field(default_factory=dict, metadata={"internal": True})

    # ------------------------------------------------------------------ derived values
    @property
    def effective_global_batch_size(self) -> int:
        if self.global_batch_size is not None:
            return self.global_batch_size
        return self.rollout_batch_size * self.n_samples_per_prompt // self.num_steps_per_rollout

    @property
    def effective_loss_reduction(self) -> str:
        return "token-mean" if self.calculate_per_token_loss else self.loss_reduction

    @property
    def eval_source(self) -> str | None:
        """The evaluation data this run uses: ``--eval-data``, or for ``auto`` the default
        task's evaluation prompts when ``--data`` is the default (or an earlier default,
        :data:`EARLIER_DEFAULT_EVAL_DATA`); ``None`` for no
        evaluation (also when ``--eval-interval`` is 0)."""
        if not self.eval_interval or self.eval_data in (None, "none"):
            return None
        if self.eval_data == "auto":
            return DEFAULT_EVAL_DATA if self.data == DEFAULT_DATA else EARLIER_DEFAULT_EVAL_DATA.get(self.data)
        return named_source(self.eval_data)[1]

    @property
    def eval_name(self) -> str | None:
        """The evaluation set's name when ``--eval-data`` is ``NAME=SOURCE``, else ``None``
        (the dataset's own name)."""
        return named_source(self.eval_data)[0] if self.eval_source else None

    @property
    def is_async(self) -> bool:
        return self.fully_async

    @property
    def needs_reference_model(self) -> bool:
        return self.use_kl_loss or self.kl_coef != 0

    @property
    def training_workers(self) -> int:
        """Training processes: ``--actor-num-nodes × --actor-num-gpus-per-node`` with
        ``--launcher ray``, else 1."""
        return self.actor_num_nodes * self.actor_num_gpus_per_node if self.launcher == "ray" else 1

    @property
    def model_parallel_size(self) -> int:
        """Ranks holding one model replica: tensor × context × pipeline parallel size."""
        return self.tensor_parallel_size * self.context_parallel_size * self.pipeline_parallel_size

    @property
    def data_parallel_size(self) -> int:
        """Model replicas, each training on its own share of the batch: training workers /
        model-parallel size (floor; validation refuses a worker count that is not a multiple)."""
        return max(1, self.training_workers // self.model_parallel_size)

    def params_for(self, component: str) -> Any:
        return self.plugin_params.get(component)


# --------------------------------------------------------------------------- fields and flags


def resolve_device(device: str) -> str:
    """The device ``--device`` names: ``auto`` is ``cuda`` when this process sees a CUDA GPU,
    else ``cpu``; ``cpu`` and ``cuda`` are themselves.  The one rule for ``auto`` (the
    backends, the engines, start-up checks and the precision decision all call it); it
    imports torch only for ``auto``.

    Example: ``resolve_device("auto")`` is ``"cpu"`` on a machine without a GPU."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def config_fields() -> list[dataclasses.Field]:
    return [f for f in fields(RunConfig) if not f.metadata.get("internal")]


def flag_of(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def param_flag(component: str, f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f"{component}_{f.name}".replace("_", "-")


def flag_collisions(param_schemas: Mapping[str, type]) -> list[str]:
    """Plugin parameter flags that collide with a core option's flag or alias."""
    core = {flag_of(f) for f in config_fields()} | {a for f in config_fields() for a in f.metadata["aliases"]}
    core |= {"--config", "--dry-run", "--help", "-h"}
    return [f"{param_flag(comp, pf)} of plugin parameter {comp}.{pf.name} collides with the core option "
            f"{param_flag(comp, pf)}: the plugin must declare another flag"
            for comp, schema in sorted(param_schemas.items()) for pf in fields(schema)
            if param_flag(comp, pf) in core]


class ConfigError(ValueError):
    """A problem in the configuration given by the user (unknown key, bad value)."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


#: Option names people bring from other trainers -> (Relax's option, where the name is from).
#: Used only to suggest the right flag or YAML key; dotted verl keys match on their last one
#: or two parts (``actor_rollout_ref.rollout.n`` -> ``rollout_n``).
KNOWN_NAMES: dict[str, tuple[str, str]] = {
    "learning_rate": ("lr", "TRL"), "actor_lr": ("lr", "verl"),
    "num_steps": ("num_rollout", "TRL"), "max_steps": ("num_rollout", "TRL"),
    "total_training_steps": ("num_rollout", "verl"), "num_train_steps": ("num_rollout", "TRL"),
    "num_generations": ("n_samples_per_prompt", "TRL"), "rollout_n": ("n_samples_per_prompt", "verl"),
    "n_samples": ("n_samples_per_prompt", "verl"), "group_size": ("n_samples_per_prompt", "GRPO papers"),
    "beta": ("kl_loss_coef", "TRL"), "kl_beta": ("kl_loss_coef", "TRL"),
    "kl_penalty": ("kl_loss_type", "verl"), "kl_loss_type": ("kl_loss_type", "verl"),
    "use_kl_loss": ("use_kl_loss", "verl"), "entropy_coeff": ("entropy_coef", "verl"),
    "epsilon": ("eps_clip", "TRL"), "cliprange": ("eps_clip", "TRL"), "clip_ratio": ("eps_clip", "verl"),
    "clip_ratio_low": ("eps_clip", "verl"), "epsilon_high": ("eps_clip_high", "TRL"),
    "clip_ratio_high": ("eps_clip_high", "verl"), "clip_ratio_c": ("eps_clip_c", "verl"),
    "temperature": ("rollout_temperature", "TRL/verl"), "top_p": ("rollout_top_p", "TRL/verl"),
    "top_k": ("rollout_top_k", "TRL/verl"), "repetition_penalty": ("rollout_repetition_penalty", "TRL"),
    "max_completion_length": ("rollout_max_response_len", "TRL"), "max_new_tokens": ("rollout_max_response_len", "transformers"),
    "max_response_length": ("rollout_max_response_len", "verl"), "response_length": ("rollout_max_response_len", "verl"),
    "max_grad_norm": ("clip_grad", "TRL"), "grad_clip": ("clip_grad", "verl"),
    "warmup_steps": ("lr_warmup_steps", "TRL"), "lr_warmup_steps_ratio": ("lr_warmup_steps", "verl"),
    "per_device_train_batch_size": ("micro_batch_size", "TRL"),
    "ppo_micro_batch_size_per_gpu": ("micro_batch_size", "verl"), "ppo_mini_batch_size": ("global_batch_size", "verl"),
    "train_batch_size": ("rollout_batch_size", "verl"), "num_iterations": ("num_steps_per_rollout", "TRL"),
    "ppo_epochs": ("num_steps_per_rollout", "verl"), "adv_estimator": ("advantage_estimator", "verl"),
    "loss_type": ("loss_reduction", "TRL"), "loss_agg_mode": ("loss_reduction", "verl"),
    "scale_rewards": ("disable_rewards_normalization", "TRL"), "norm_adv_by_std_in_grpo": ("disable_rewards_normalization", "verl"),
    "model_name_or_path": ("model", "TRL"), "model_path": ("model", "verl"), "hf_checkpoint": ("model", "slime"),
    "model_name": ("model", "TRL"), "dataset": ("data", "TRL"), "dataset_name": ("data", "TRL"),
    "train_files": ("data", "verl"), "prompt_data": ("data", "slime"), "val_files": ("eval_data", "verl"),
    "eval_dataset": ("eval_data", "TRL"), "eval_prompt_data": ("eval_data", "slime"),
    "input_key": ("prompt_key", "slime"), "prompt_column": ("prompt_key", "TRL"),
    "save_steps": ("save_interval", "TRL"), "save_freq": ("save_interval", "verl"),
    "eval_steps": ("eval_interval", "TRL"), "test_freq": ("eval_interval", "verl"),
    "load": ("resume", "slime"), "resume_from_checkpoint": ("resume", "TRL"),
    "rm_type": ("reward", "slime"), "reward_funcs": ("reward", "TRL"), "reward_manager": ("reward", "verl"),
    "project_name": ("wandb_project", "verl"), "experiment_name": ("run_name", "verl"),
}


def _norm(name: str) -> str:
    return name.strip().lstrip("-").split("=", 1)[0].replace("-", "_").lower()


def suggestion(key: str, valid: Iterable[str]) -> tuple[str, str] | None:
    """The valid option closest to ``key``, in the form ``valid`` uses (``--lr`` or ``lr``),
    and why: first the :data:`KNOWN_NAMES` of TRL, verl and slime, then spelling
    similarity.  ``None`` when nothing is close."""
    by_norm = {_norm(v): v for v in valid}
    parts = _norm(key).split(".")
    for cand in ("_".join(parts[-2:]), parts[-1]) if len(parts) > 1 else (parts[0],):
        if cand in KNOWN_NAMES and KNOWN_NAMES[cand][0] in by_norm:
            target, origin = KNOWN_NAMES[cand]
            return by_norm[target], f"{origin} calls it {cand}"
    close = difflib.get_close_matches(parts[-1], list(by_norm), n=1, cutoff=0.75)
    return (by_norm[close[0]], "") if close else None


def _suggest(key: str, valid: Iterable[str]) -> str:
    found = suggestion(key, valid)
    if found is None:
        return ""
    target, why = found
    return f" (did you mean '{target}'?{' ' + why if why else ''})"


def _field_type(f: dataclasses.Field) -> str:
    """The field's type as a compact string (``"float"``, ``"int|None"``, ``"tuple[str,...]"``),
    whether annotations are strings (``from __future__ import annotations``) or objects
    (``Optional[float]``, ``float | None``, ``Literal[...]``)."""
    return _type_name(f.type).replace(" ", "")


def _type_name(t: Any) -> str:
    if isinstance(t, str):
        return t
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin in (typing.Union, types.UnionType):
        return "|".join(_type_name(a) for a in args)
    if origin is typing.Literal:
        kinds = {type(a).__name__ for a in args}
        return kinds.pop() if len(kinds) == 1 else "str"
    if origin is tuple:
        return str(t)
    return "None" if t is type(None) else getattr(t, "__name__", str(t))


def _coerce(value: Any, f: dataclasses.Field, where: str) -> Any:
    """Coerce a YAML/CLI value to the field's declared type; raises ValueError."""
    t = _field_type(f)
    if value is None:
        if "None" in t:
            return None
        raise ValueError(f"{where}: null is not allowed")
    base = t.replace("|None", "")
    if base.startswith("tuple[float"):  # a comma-separated list (CLI) or a YAML list
        items = value.split(",") if isinstance(value, str) else value if isinstance(value, (list, tuple)) else [value]
        try:
            return tuple(float(v) for v in items)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: expected comma-separated numbers, got {value!r}") from None
    if base.startswith("tuple"):
        if isinstance(value, str):
            value = [value]
        return tuple(str(v) for v in value)
    if base == "bool":
        if isinstance(value, bool):
            return value
        if value == "auto" and "None" in t:  # a switch whose default is decided at start-up (--bf16)
            return None
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
            return value.lower() in ("true", "1", "yes", "on")
        raise ValueError(f"{where}: expected true/false, got {value!r}")
    if base == "int":
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError(f"{where}: expected an integer, got {value!r}")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: expected an integer, got {value!r}") from None
    if base == "float":
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: expected a number, got {value!r}") from None
    if base == "str":
        return str(value)
    return value


def check_bounds(value: Any, meta: Mapping[str, Any], where: str) -> list[str]:
    """Range checks of one value against ``ge/gt/le/lt/choices`` metadata."""
    problems = []
    if value is None:
        return problems
    if isinstance(value, float) and not math.isfinite(value):
        return [f"{where} must be finite, got {value}"]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        for key, ok, word in (("ge", lambda v, b: v >= b, ">="), ("gt", lambda v, b: v > b, ">"),
                              ("le", lambda v, b: v <= b, "<="), ("lt", lambda v, b: v < b, "<")):
            bound = meta.get(key)
            if bound is not None and not ok(value, bound):
                problems.append(f"{where} must be {word} {bound}, got {value}")
    choices = meta.get("choices")
    if choices is not None:
        vals = value if isinstance(value, tuple) else (value,)
        for v in vals:
            if v not in choices:
                problems.append(f"{where} must be one of {', '.join(map(str, choices))}, got {v!r}{_suggest(str(v), map(str, choices))}")
    return problems


# --------------------------------------------------------------------------- building


def load_yaml(path: str | Path) -> dict[str, Any]:
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError([f"--config {path}: file not found"])
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError([f"--config {path}: invalid YAML: {e}"]) from None
    if not isinstance(data, dict):
        raise ConfigError([f"--config {path}: top level must be a mapping of option: value"])
    return data


def build_config(
    *,
    cli: Mapping[str, Any] | None = None,
    yaml_values: Mapping[str, Any] | None = None,
    param_schemas: Mapping[str, type] | None = None,
    yaml_source: str = "config",
) -> RunConfig:
    """Build the :class:`RunConfig` from YAML values and CLI values (CLI wins).

    Args:
        cli: ``{dest: value}`` for flags given on the command line (field names for core
            options, ``"<component>.<param>"`` for plugin parameters).
        yaml_values: the YAML mapping.  Keys are field names (dashes or underscores) or
            plugin parameter names in their flag form (``m2po_kl2_budget``) or nested as
            ``{m2po: {kl2_budget: ...}}``.
        param_schemas: component name -> parameter dataclass (from the registry).

    Raises:
        ConfigError: listing every unknown key (with the closest valid key) and every
            value of the wrong type or out of range.
    """
    cli = dict(cli or {})
    yaml_values = dict(yaml_values or {})
    param_schemas = dict(param_schemas or {})
    problems: list[str] = flag_collisions(param_schemas)
    core = {f.name: f for f in config_fields()}
    # flat param keys: "m2po_kl2_budget" -> ("m2po", "kl2_budget") ; explicit flags too
    flat_params: dict[str, list[tuple[str, str]]] = {}
    for comp, schema in param_schemas.items():
        for pf in fields(schema):
            key = param_flag(comp, pf)[2:].replace("-", "_")
            flat_params.setdefault(key, []).append((comp, pf.name))
    valid_keys = list(core) + list(flat_params) + list(param_schemas)

    values: dict[str, Any] = {}
    pvalues: dict[str, dict[str, Any]] = {c: {} for c in param_schemas}

    def set_param(comp: str, name: str, raw: Any, where: str) -> None:
        pf = {x.name: x for x in fields(param_schemas[comp])}[name]
        try:
            v = _coerce(raw, pf, where)
        except ValueError as e:
            problems.append(str(e))
            return
        pvalues[comp][name] = v

    for source, mapping in (("yaml", yaml_values), ("cli", cli)):
        for key, raw in mapping.items():
            norm = key.replace("-", "_").lstrip("_")
            where = f"{yaml_source}: '{key}'" if source == "yaml" else "--" + norm.replace("_", "-")
            if "." in norm and source == "cli":
                comp, name = norm.split(".", 1)
                set_param(comp, name, raw, where)
                continue
            if norm in core:
                try:
                    values[norm] = _coerce(raw, core[norm], where)
                except ValueError as e:
                    problems.append(str(e))
            elif norm in flat_params:
                for comp, name in flat_params[norm]:
                    set_param(comp, name, raw, where)
            elif norm in param_schemas and isinstance(raw, dict):
                names = {x.name for x in fields(param_schemas[norm])}
                for sub, subraw in raw.items():
                    subn = sub.replace("-", "_")
                    if subn in names:
                        set_param(norm, subn, subraw, f"{where}.{sub}")
                    else:
                        problems.append(f"{where}: unknown parameter '{sub}' of {norm}{_suggest(subn, names)}")
            else:
                problems.append(f"{where}: unknown option{_suggest(norm, valid_keys)}")

    plugin_params = {}
    for comp, schema in param_schemas.items():
        try:
            plugin_params[comp] = schema(**pvalues[comp])
        except TypeError as e:  # pragma: no cover - schema bug
            problems.append(f"{comp} parameters: {e}")
    if problems:
        raise ConfigError(problems)
    return RunConfig(**values, plugin_params=plugin_params)


def value_problems(cfg: RunConfig) -> list[str]:
    """Range problems of every core option and every plugin parameter; a problem of a flag
    that several components share (a parameter block, e.g. ``--eps-clip``) is reported once,
    naming them all."""
    problems = []
    for f in config_fields():
        problems += check_bounds(getattr(cfg, f.name), f.metadata, flag_of(f))
    shared: dict[str, list[str]] = {}
    for comp, params in cfg.plugin_params.items():
        if params is None:
            continue
        for pf in fields(params):
            for p in check_bounds(getattr(params, pf.name), pf.metadata, param_flag(comp, pf)):
                shared.setdefault(p, []).append(comp)
    return problems + [f"{', '.join(sorted(comps))}: {p}" for p, comps in shared.items()]


def config_to_dict(cfg: RunConfig) -> dict[str, Any]:
    """JSON-able view: core options plus ``plugin_params`` nested by component."""
    out = {f.name: (list(v) if isinstance(v := getattr(cfg, f.name), tuple) else v) for f in config_fields()}
    out["plugin_params"] = {c: dataclasses.asdict(p) for c, p in cfg.plugin_params.items() if p is not None}
    return out


# --------------------------------------------------------------------------- argparse


def show_default(value: Any) -> str | None:
    """A default as ``--help`` and the docs print it (``None`` when there is nothing to show):
    ``on``/``off`` for switches, quoted text as typed (no escaping), numbers as Python writes them."""
    if value is None or value == ():
        return None
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ", ".join(map(str, value))
    if isinstance(value, str):
        return f"'{value}'"
    return repr(value)


def _help(text: str, default: Any) -> str:
    """Help text plus its default, once (not when the text already says it); ``%`` escaped."""
    shown = show_default(default)
    if shown is not None and not any(q in text.lower() for q in ("(default", "default:")):
        text = f"{text} (default: {shown})"
    return text.replace("%", "%%")


def _metavar(t: str, choices: Iterable[Any] | None) -> str:
    return "{" + ",".join(map(str, choices)) + "}" if choices else t.upper()


def add_config_arguments(parser: argparse.ArgumentParser, param_schemas: Mapping[str, type],
                         choices: Mapping[str, Iterable[str]] | None = None) -> None:
    """Add one flag per core option and per plugin parameter.  Destinations are field
    names (core) and ``component.param`` (plugins); defaults are ``SUPPRESS`` so that
    only flags actually given reach :func:`build_config`.  ``choices`` (field name ->
    installed component names) and the fields' own ``choices`` are listed in the help;
    they are checked by validation, not by argparse, so that every problem is reported."""
    choices = dict(choices or {})
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in config_fields():
        g = groups.setdefault(f.metadata["group"], parser.add_argument_group(f.metadata["group"]))
        names = [flag_of(f), *f.metadata.get("aliases", ())]
        t = _field_type(f).replace("|None", "")
        valid = f.metadata.get("choices") or choices.get(f.name)
        if t == "bool" and f.default is not False:  # True, or None (auto): --flag / --no-flag
            g.add_argument(*names, dest=f.name, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                           help=_help(f.metadata["help"], f.default))
        elif t == "bool":
            g.add_argument(*names, dest=f.name, action="store_true", default=argparse.SUPPRESS,
                           help=_help(f.metadata["help"], False))
        elif f.metadata.get("repeat"):
            g.add_argument(*names, dest=f.name, action="append", default=argparse.SUPPRESS,
                           metavar=_metavar("name", valid), help=_help(f.metadata["help"], f.default))
        else:
            g.add_argument(*names, dest=f.name, default=argparse.SUPPRESS, metavar=_metavar(t, valid),
                           help=_help(f.metadata["help"], f.default))
    collisions = flag_collisions(param_schemas)
    if collisions:
        raise ConfigError(collisions)
    seen: dict[str, list[str]] = {}
    for comp, schema in sorted(param_schemas.items()):
        for pf in fields(schema):
            seen.setdefault(param_flag(comp, pf), []).append(f"{comp}.{pf.name}")
    pg = parser.add_argument_group("plugin parameters (each applies when its component is selected)")
    for flag, dests in seen.items():
        comp, name = dests[0].split(".")
        pf = {x.name: x for x in fields(param_schemas[comp])}[name]
        t = _field_type(pf).replace("|None", "")
        owners = ", ".join(d.split(".")[0] for d in dests)
        text = f"[{owners}] {pf.metadata.get('help', '')}"
        if t == "bool" and pf.default is True:
            pg.add_argument(flag, dest="param:" + flag, action=argparse.BooleanOptionalAction,
                            default=argparse.SUPPRESS, help=_help(text, True))
        elif t == "bool":
            pg.add_argument(flag, dest="param:" + flag, action="store_true", default=argparse.SUPPRESS,
                            help=_help(text, False))
        else:
            pg.add_argument(flag, dest="param:" + flag, default=argparse.SUPPRESS,
                            metavar=_metavar(t, pf.metadata.get("choices")), help=_help(text, pf.default))
    parser.set_defaults(_param_flags=seen)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def join_negative_values(args: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """``["--lr", "-1e-5"]`` → ``["--lr=-1e-5"]``: a negative number after an option that takes
    a value is that value (argparse alone reads ``-1e-5`` as an unknown option), so that
    the range check can answer."""
    takes_value = {s for a in parser._actions if a.nargs != 0 for s in a.option_strings}
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a in takes_value and i + 1 < len(args) and args[i + 1].startswith("-") and _is_number(args[i + 1]):
            out.append(f"{a}={args[i + 1]}")
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def parse_cli(args: list[str], param_schemas: Mapping[str, type], prog: str = "relax train",
              choices: Mapping[str, Iterable[str]] | None = None) -> tuple[dict[str, Any], str | None, argparse.Namespace]:
    """Parse ``relax train`` arguments.  Returns ``(cli_values, config_path, namespace)``.

    ``choices``: field name -> the installed component names, listed by ``--help``."""
    parser = make_parser(param_schemas, prog, choices)
    ns = parser.parse_args(join_negative_values(list(args), parser))
    cli: dict[str, Any] = {}
    flags = ns.__dict__.pop("_param_flags", {})
    for k, v in list(vars(ns).items()):
        if k.startswith("param:"):
            for dest in flags[k[6:]]:
                cli[dest] = v
        elif k not in ("config", "dry_run"):
            cli[k] = v
    return cli, getattr(ns, "config", None), ns


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # exit code 2 with a suggestion for unknown flags
        if "unrecognized arguments" in message:
            valid = [s for a in self._actions for s in a.option_strings]
            bad = message.split(":", 1)[1].split()
            hints = [f"{b}{_suggest(b.split('=')[0], valid)}" for b in bad if b.startswith("-")]
            message = "unknown option(s): " + "; ".join(hints or bad)
        self.exit(2, f"{self.prog}: error: {message}\n(`{self.prog} --help` lists every option)\n")


EXAMPLES = """\
Train a language model with RL (--dry-run: check everything, start nothing).

examples:
  relax train                  # the default run: GRPO, SmolLM2-135M, chain_sum
  relax train --data my.jsonl --advantage-estimator rloo \\
      --calculate-per-token-loss
  relax train --config examples/recipes/cispo.yaml --lr 1e-5   # flags win
  relax train --dry-run --advantage-estimator m2po  # check only; 2: problems

Every option is also a key of the --config YAML file (dashes or underscores).
Names from TRL, verl and slime (--learning-rate, --num-generations, --beta...)
are answered with the Relax flag to use.
"""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The description as written; an option with aliases shows its value once
    (``--advantage-estimator, --estimator {grpo,...}``)."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if not action.option_strings or action.nargs == 0:
            return super()._format_action_invocation(action)
        return ", ".join(action.option_strings) + " " + self._format_args(action, action.dest.upper())


def make_parser(param_schemas: Mapping[str, type], prog: str = "relax train",
                choices: Mapping[str, Iterable[str]] | None = None) -> argparse.ArgumentParser:
    """The ``relax train`` parser: a one-line usage and examples first, then the options by
    group with their choices and defaults."""
    parser = _Parser(prog=prog, usage="%(prog)s [OPTIONS]", description=EXAMPLES, allow_abbrev=False,
                     formatter_class=_HelpFormatter)
    parser.add_argument("--config", default=None, metavar="FILE.yaml", help="YAML file of options (flags win).")
    parser.add_argument("--dry-run", action="store_true",
                        help="Check the configuration, the data and the scorer, print the resolved config, and exit.")
    add_config_arguments(parser, param_schemas, choices)
    return parser
