"""`relax plugins new` end to end, as a plugin author would use it: scaffold one plugin of
every kind into a temp dir, pip-install them there (``--target``, not into the shared
environment), run each package's own tests unchanged, see them in `relax plugins --json`
and `relax capabilities --json`, and validate a `relax train --dry-run` selecting each."""

from __future__ import annotations

import json

import pytest

from relax_authoring.scaffold import KINDS, write_plugin
from relax_core import API_VERSION

NAMES = {kind: f"my_{kind}" for kind in KINDS}
SELECT = {"estimator": "--advantage-estimator", "correction": "--correction", "reward": "--reward",
          "reward_processor": "--reward-processor", "engine": "--rollout-engine", "backend": "--train-backend",
          "sampler": "--sampler", "environment": "--environment"}


@pytest.fixture(scope="module")
def scaffolded(make_site, tmp_path_factory):
    """(site, {kind: package dir}): every kind scaffolded and installed into one site."""
    src = tmp_path_factory.mktemp("src")
    pkgs = {kind: write_plugin(kind, name, src) for kind, name in NAMES.items()}
    site = make_site("site")
    site.install(*pkgs.values())
    return site, pkgs


@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.slow) if k == "estimator" else k for k in KINDS])
def test_its_own_tests_pass_unchanged(scaffolded, kind):
    site, pkgs = scaffolded
    res = site.run("-m", "pytest", "-q", "tests", cwd=pkgs[kind])
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert " passed" in res.stdout and "skipped" not in res.stdout


def test_listed_by_plugins_and_capabilities(scaffolded):
    site, _ = scaffolded
    res = site.relax("plugins", "--json")
    assert res.returncode == 0, res.stderr
    plugins = {p["name"]: p for p in json.loads(res.stdout)["plugins"]}
    caps = json.loads(site.relax("capabilities", "--json").stdout)
    for kind, name in NAMES.items():
        p = plugins[name]
        assert p["status"] == "ok", p
        assert p["distribution"] == f"relax-{name.replace('_', '-')}" and p["version"] == "0.1.0"
        assert p["path"].startswith(str(site.path)), p  # the --target install, not the shared venv
        assert [c["name"] for c in p["components"]] == [name]
        assert name in caps[kind]["components"], (kind, sorted(caps[kind]["components"]))


@pytest.mark.parametrize("kind", KINDS)
def test_dry_run_selects_it(scaffolded, kind):
    site, _ = scaffolded
    name = NAMES[kind]
    res = site.relax("train", "--dry-run", SELECT[kind], name)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["valid"] is True
    origin = f"relax-{name.replace('_', '-')} 0.1.0"
    if kind in ("estimator", "engine", "backend", "sampler", "environment"):
        assert out["components"][kind] == {"name": name, "origin": origin}
    elif kind == "correction":
        assert out["corrections"] == [{"name": name, "origin": origin}]
    elif kind == "reward_processor":
        assert out["reward_processors"] == [{"name": name, "origin": origin}]
    else:
        assert out["config"]["reward"] == [name]
        assert out["components"]["reward"] == [{"name": name, "origin": origin}]
    if kind == "estimator":
        assert out["config"]["plugin_params"][name] == {"baseline_scale": 1.0}


def test_not_installed_is_refused(make_site):
    """Control: without the site on the path the same selection is an unknown component."""
    res = make_site("empty").relax("train", "--dry-run", "--advantage-estimator", NAMES["estimator"])
    assert res.returncode == 2
    assert f"unknown estimator '{NAMES['estimator']}'" in res.stderr


def test_unsupported_api_version_is_refused_with_the_distribution(make_site, tmp_path):
    pkg = write_plugin("estimator", "future_algo", tmp_path)
    plugin_py = pkg / "relax_future_algo" / "plugin.py"
    future = API_VERSION + 1
    plugin_py.write_text(plugin_py.read_text().replace('name="future_algo",', f'name="future_algo", api_version={future},'))
    site = make_site("future-site")
    site.install(pkg)
    listed = {p["name"]: p for p in json.loads(site.relax("plugins", "--json").stdout)["plugins"]}["future_algo"]
    assert listed["status"] == "error" and f"declares api_version {future}" in listed["error"], listed
    res = site.relax("train", "--dry-run", "--advantage-estimator", "future_algo")
    assert res.returncode == 2
    assert f"api_version {future}" in res.stderr and "relax-future-algo" in res.stderr, res.stderr


def test_summary_with_quotes_and_backslashes_is_quoted(tmp_path):
    import ast
    import tomllib

    summary = 'Says "hi" \\ o/ "quoted"'
    for kind in KINDS:
        pkg = write_plugin(kind, f"q_{kind}", tmp_path, summary=summary)
        assert tomllib.loads((pkg / "pyproject.toml").read_text())["project"]["description"] == summary
        plugin_py = pkg / f"relax_q_{kind}" / "plugin.py"
        for py in pkg.rglob("*.py"):
            ast.parse(py.read_text(), str(py))
        call = next(n for n in ast.walk(ast.parse(plugin_py.read_text())) if isinstance(n, ast.keyword) and n.arg == "summary")
        assert ast.literal_eval(call.value) == summary
        init = ast.parse((pkg / f"relax_q_{kind}" / "__init__.py").read_text())
        assert ast.get_docstring(init) == f"relax-q-{kind.replace('_', '-')}: {summary}"


@pytest.mark.parametrize("kind,name,summary,error", [
    ("estimator", "Bad-Name", None, ValueError),
    ("optimizer", "ok", None, ValueError),
    ("estimator", "ok", "two\nlines", ValueError),
])
def test_bad_arguments_are_refused(tmp_path, kind, name, summary, error):
    with pytest.raises(error):
        write_plugin(kind, name, tmp_path, summary=summary)
    assert not any(tmp_path.iterdir())  # nothing written


def test_existing_non_empty_directory_is_refused(tmp_path):
    write_plugin("reward", "taken", tmp_path)
    with pytest.raises(FileExistsError):
        write_plugin("reward", "taken", tmp_path)
