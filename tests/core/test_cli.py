"""The `relax` CLI: exit code 2 listing every problem, plugins/capabilities/version output,
and no torch import for `--help`, `plugins` and `capabilities`."""

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import relax_core.host.plugins as plugins_mod
from cli.main import app
from relax_core_test_toys import BASE_CAPS, estimator, make_plugin

runner = CliRunner()


@pytest.fixture
def cli_registry(registry_with, monkeypatch):
    reg = registry_with(("toy", make_plugin(estimator(caps=BASE_CAPS)), "relax-toy", "1.2.3"),
                        ("bare", make_plugin(estimator("bare")), "relax-bare", "0.0.1"),
                        ("broken", "relax_core_test_no_such_module", "relax-broken", "0.3.1"))
    monkeypatch.setattr(plugins_mod, "_DEFAULT", reg)
    return reg


def test_train_dry_run_exits_2_listing_every_problem(cli_registry):
    r = runner.invoke(app, ["train", "--dry-run", "--estimator", "bare", "--entropy-coef", "-1",
                            "--context-parallel-size", "2", "--bare-beta", "3", "--num-steps-per-rollout", "3"])
    assert r.exit_code == 2
    err = r.stderr
    assert "problem(s) with this configuration (nothing was started)" in err
    for text in ("config [value range]: --entropy-coef must be >= 0, got -1.0",
                 "config [value range]: bare: --bare-beta must be <= 1, got 3.0",
                 "config [batch shape]: rollout_batch_size × n_samples_per_prompt = 4×8 = 32 samples per rollout "
                 "is not divisible by --num-steps-per-rollout 3",
                 "estimator 'bare' (relax-bare 0.0.1) [supports_context_parallel]: bare does not support context "
                 "parallelism, but --context-parallel-size is 2",
                 "estimator 'bare' (relax-bare 0.0.1) [sync_only]: bare is sync-only"):
        assert text in err, text
    n = int(err.split("relax: ")[1].split(" problem")[0])
    assert all(f"\n{i}. " in err for i in range(1, n + 1)) and n >= 6


def test_train_unknown_yaml_key_exits_2(cli_registry, tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("entropy_cof: 0.1\n")
    r = runner.invoke(app, ["train", "--dry-run", "--config", str(cfg)])
    assert r.exit_code == 2
    assert f"config: {cfg}: 'entropy_cof': unknown option (did you mean 'entropy_coef'?)" in r.stderr


def test_train_selecting_broken_plugin_exits_2_with_its_error(cli_registry):
    r = runner.invoke(app, ["train", "--dry-run", "--estimator", "broken"])
    assert r.exit_code == 2
    assert "plugin 'broken' (relax-broken 0.3.1) failed to load: ModuleNotFoundError" in r.stderr


def test_train_dry_run_valid(cli_registry):
    r = runner.invoke(app, ["train", "--dry-run", "--estimator", "toy", "--toy-beta", "0.25"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["components"]["estimator"] == {"name": "toy", "origin": "relax-toy 1.2.3"}
    assert out["components"]["data_source"] == {"name": "rg", "origin": "relax-infra 1.0"}
    assert out["config"]["plugin_params"]["toy"] == {"beta": 0.25, "mode": "a"}


def test_plugins_json_lists_status_and_errors(cli_registry):
    r = runner.invoke(app, ["plugins", "--json"])
    assert r.exit_code == 0
    by_name = {p["name"]: p for p in json.loads(r.stdout)["plugins"]}
    assert by_name["toy"]["status"] == "ok" and by_name["toy"]["version"] == "1.2.3"
    assert by_name["toy"]["components"] == [{"kind": "estimator", "name": "toy"}]
    assert by_name["broken"]["status"] == "error" and "ModuleNotFoundError" in by_name["broken"]["error"]


def test_plugins_show(cli_registry):
    r = runner.invoke(app, ["plugins", "show", "toy"])
    assert r.exit_code == 0
    assert "estimator toy  (relax-toy 1.2.3, plugin 'toy')" in r.stdout
    assert "--toy-beta = 0.5  A toy coefficient.  [ge 0; le 1]" in r.stdout
    assert "--toy-mode = 'a'  A toy mode.  [one of a, b]" in r.stdout
    assert "    supports_fully_async: yes" in r.stdout
    r = runner.invoke(app, ["plugins", "show", "broken"])
    assert r.exit_code == 2 and "failed to load: ModuleNotFoundError" in r.stderr
    assert runner.invoke(app, ["plugins", "show", "nothing"]).exit_code == 2


def test_version_lists_core_and_plugins(cli_registry):
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0
    lines = r.stdout.splitlines()
    assert lines[0] == "relax-core 0.1.0"
    assert "relax-toy 1.2.3 (toy)" in lines and "relax-broken 0.3.1 (broken, error)" in lines


def test_capabilities_json_and_markdown(cli_registry):
    r = runner.invoke(app, ["capabilities", "--kind", "estimator", "--json"])
    comps = json.loads(r.stdout)["estimator"]["components"]
    assert comps["toy"]["supports_fully_async"] is True and comps["bare"]["supports_fully_async"] is False
    md = runner.invoke(app, ["capabilities", "--markdown"]).stdout
    assert "| `bare` | — | yes |" in md  # CP not declared, sync-only by default
    r = runner.invoke(app, ["capabilities", "--kind", "estimators"])
    assert r.exit_code == 2 and "unknown kind 'estimators'" in r.stderr


def _imports_torch(args):
    code = ("import sys\nfrom cli.main import app\n"
            f"sys.argv = ['relax', *{args!r}]\n"
            "try:\n    app()\nexcept SystemExit as e:\n    assert e.code in (0, None), e.code\n"
            "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1] == "TORCH"


def test_import_cli_does_not_import_torch():
    code = "import sys, cli.main, relax_core, relax_core.contracts; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.parametrize("args", [["--help"], ["plugins"], ["plugins", "--json"], ["capabilities"],
                                  ["capabilities", "--markdown"], ["--version"]])
def test_light_commands_do_not_import_torch(args):
    """With the installed plugins: registering them must not import torch either."""
    assert not _imports_torch(args)


def test_strict_mode_fails_commands_with_exit_2(registry_with, monkeypatch):
    monkeypatch.setenv("RELAX_STRICT_PLUGINS", "1")
    monkeypatch.setattr(plugins_mod, "_DEFAULT", None)
    monkeypatch.setattr(plugins_mod, "load_registry",
                        lambda: registry_with(("broken", "relax_core_test_no_such_module", "relax-broken", "0.3.1")))
    for args in (["plugins"], ["train", "--dry-run"], ["capabilities"]):
        r = runner.invoke(app, args)
        assert r.exit_code == 2, args
        assert "plugin 'broken' (relax-broken 0.3.1) failed to load: ModuleNotFoundError" in r.stderr


@pytest.mark.parametrize("flag", ["--partial-rollout", "--use-dynamic-global-batch-size"])
def test_flags_the_loop_never_read_are_gone(flag):
    """Both were parsed and recorded but never read by the loop (issue 18 item 14): a flag
    either works or does not exist."""
    res = CliRunner().invoke(app, ["train", "--dry-run", flag])
    assert res.exit_code == 2 and "unknown option" in res.output
