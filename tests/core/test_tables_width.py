"""`relax plugins` and `relax capabilities` never cut a name, at 80 and 100 columns
(issue 19 §5): narrow terminals drop less important columns or split the table instead."""

import re

import pytest
from typer.testing import CliRunner

from cli.main import app
from relax_core.host.plugins import default_registry

runner = CliRunner()


@pytest.mark.parametrize("width", [80, 100])
def test_plugins_table_shows_every_name_whole(width):
    r = runner.invoke(app, ["plugins"], env={"COLUMNS": str(width)})
    assert r.exit_code == 0
    lines = r.stdout.splitlines()
    assert max(map(len, lines)) <= width
    assert "…" not in r.stdout
    first_column = {line.split("│")[1].strip() for line in lines if line.startswith("│")}
    assert {p.name for p in default_registry().plugins} <= first_column
    words = set(re.findall(r"[\w.-]+", r.stdout))
    for p in default_registry().plugins:
        assert {n for _, n in p.components} <= words, p.name


@pytest.mark.parametrize("width", [80, 100])
def test_capabilities_tables_show_every_component_whole(width):
    r = runner.invoke(app, ["capabilities"], env={"COLUMNS": str(width)})
    assert r.exit_code == 0
    assert max(map(len, r.stdout.splitlines())) <= width
    assert "…" not in r.stdout
    headers = set(re.findall(r"[┃│] ([\w-]+)", r.stdout))
    reg = default_registry()
    for kind in ("estimator", "correction", "engine", "backend"):
        assert set(reg.components[kind]) <= headers, kind


def test_capabilities_help_says_how_the_table_is_laid_out():
    r = runner.invoke(app, ["capabilities", "--help"])
    text = " ".join(r.stdout.split())
    assert "one row per component and one column per capability when it fits" in text
    assert "otherwise one row per capability and one column per component" in text
