"""``--bf16``'s default (relax_core.run.precision): on where the device computes bfloat16
natively, decided once; the flag's forms; the hf engine's ``--hf-dtype auto`` follows it."""

from __future__ import annotations

import pytest
import torch

from relax_core.config import RunConfig, build_config, parse_cli
from relax_core.host.plugins import default_registry
from relax_core.run import precision

AMX = "flags\t\t: fpu vme avx512f avx512_bf16 amx_bf16 amx_tile\n"
ZEN4 = "flags\t\t: fpu vme avx512f avx512_bf16\n"


@pytest.mark.parametrize("text, native", [(AMX, True), (ZEN4, False), ("flags\t\t: fpu sse2 avx2\n", False),
                                          ("Features\t: fp asimd bf16\n", False)])
def test_native_bf16_on_the_cpu_reads_the_amx_flag(tmp_path, monkeypatch, text, native):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\n" + text + "\nprocessor\t: 1\n" + text)
    flags = precision.cpu_flags.__wrapped__(str(info))
    monkeypatch.setattr(precision, "cpu_flags", lambda: flags)
    assert (precision.native_bf16("cpu") == "the CPU has AMX-BF16 units") is native
    assert native or precision.native_bf16("cpu") is None


def test_cpu_flags_of_a_system_without_proc_cpuinfo_are_empty(tmp_path):
    assert precision.cpu_flags.__wrapped__(str(tmp_path / "absent")) == frozenset()


def test_native_bf16_on_cuda_asks_torch(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert precision.native_bf16("cuda") == "a CUDA GPU with bfloat16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)  # e.g. a V100
    assert precision.native_bf16("cuda") is None


@pytest.mark.parametrize("native", [True, False])
def test_auto_is_decided_by_the_device_and_said(monkeypatch, native):
    seen = []
    monkeypatch.setattr(precision, "native_bf16", lambda dev: seen.append(dev) or ("why" if native else None))
    cfg, line = precision.resolve_bf16(RunConfig(device="cpu"))
    assert cfg.bf16 is native and seen == ["cpu"]
    assert line == ("precision: bfloat16 autocast (auto: why; --no-bf16 keeps float32)" if native else
                    "precision: float32 (auto: this CPU has no native bfloat16 units; --bf16 uses bfloat16 anyway)")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert precision.resolve_bf16(RunConfig(device="auto"))[0].bf16 is native and seen[-1] == "cuda"


@pytest.mark.parametrize("given", [True, False])
def test_a_given_or_saved_value_is_kept_without_asking_the_device(monkeypatch, given):
    monkeypatch.setattr(precision, "native_bf16", lambda dev: pytest.fail("asked the device"))
    cfg = RunConfig(bf16=given)
    assert precision.resolve_bf16(cfg) == (cfg, None)


@pytest.mark.parametrize("args, value", [([], None), (["--bf16"], True), (["--no-bf16"], False),
                                         (["--no-bf16", "--bf16"], True)])
def test_the_flag_as_typed(args, value):
    schemas = default_registry().param_schemas()
    cli, _, _ = parse_cli(args, schemas)
    assert build_config(cli=cli, param_schemas=schemas).bf16 is value


def test_yaml_takes_true_false_null_and_auto():
    schemas = default_registry().param_schemas()
    for text, value in (("true", True), ("off", False), (None, None), ("auto", None)):
        assert build_config(yaml_values={"bf16": text}, param_schemas=schemas).bf16 is value


@pytest.mark.parametrize("hf_dtype, bf16, dtype", [("auto", True, torch.bfloat16), ("auto", False, torch.float32),
                                                   ("float32", True, torch.float32),
                                                   ("bfloat16", False, torch.bfloat16)])
def test_the_hf_engine_auto_dtype_follows_bf16(tiny_model_dir, hf_dtype, bf16, dtype):
    from relax_hf.engine import build
    from relax_hf.plugin import HFEngineParams

    engine = build(HFEngineParams(dtype=hf_dtype), RunConfig(model=str(tiny_model_dir), device="cpu", bf16=bf16))
    assert next(engine.model.parameters()).dtype == dtype


def test_auto_stays_float32_where_the_backend_does_not_train_in_bf16(monkeypatch):
    monkeypatch.setattr(precision, "native_bf16", lambda dev: "the CPU has AMX-BF16 units")
    cfg, line = precision.resolve_bf16(RunConfig(device="cpu", train_backend="megatron"), frozenset({"cuda"}))
    assert cfg.bf16 is False
    assert line == ("precision: float32 (auto: the CPU has AMX-BF16 units, but --train-backend megatron trains in "
                    "bfloat16 only on cuda)")


@pytest.mark.parametrize("cuda", [True, False])
def test_one_rule_for_device_auto_in_the_checks_the_backend_and_the_engine(monkeypatch, cuda):
    """``--device auto`` means CUDA where this process sees a GPU, else the CPU, and the
    capability check, the precision decision, the torch backend and the hf engine all read
    it from ``resolve_device`` (a GPU that only some of them saw would split a run)."""
    from relax_core.config import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    want = "cuda" if cuda else "cpu"
    assert resolve_device("auto") == want
    assert resolve_device("cpu") == "cpu" and resolve_device("cuda") == "cuda"
    import relax_hf.engine
    import relax_torch.backend
    from relax_core.host import capabilities
    for module in (capabilities, precision, relax_torch.backend, relax_hf.engine):
        assert module.resolve_device is resolve_device, module.__name__
    built = {}
    monkeypatch.setattr(relax_hf.engine, "HFEngine", lambda model, **kw: built.update(kw))
    from relax_hf.plugin import HFEngineParams
    relax_hf.engine.build(HFEngineParams(), RunConfig(device="auto", bf16=False))
    assert built["device"] == want
