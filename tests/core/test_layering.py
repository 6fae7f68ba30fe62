"""The layers import downwards only: ``relax_core`` (the run) imports neither the CLI, nor the
authoring tools, nor any plugin package, and the authoring tools do not import the CLI."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _imported_top_levels(package: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(str(path.relative_to(ROOT)))
    return found


@pytest.mark.parametrize("package, forbidden", [("relax_core", {"cli", "relax_authoring"}),
                                                ("relax_authoring", {"cli"})])
def test_layers_import_downwards(package, forbidden):
    imported = _imported_top_levels(package)
    assert imported.get("relax_core"), "the scan found no imports at all"  # the scan works
    bad = {name: sorted(imported[name]) for name in forbidden if name in imported}
    assert not bad, f"{package} imports a layer above it: {bad}"


def test_the_core_imports_no_plugin_package():
    """Domain code (answer extraction, file formats, ...) lives in the plugins; the core reaches
    it only through specs (``"module:callable"`` strings resolved at run time)."""
    plugin_packages = {p.name for p in ROOT.glob("plugins/*/*/relax_*") if p.is_dir()}
    assert {"relax_answers", "relax_math", "relax_torch"} <= plugin_packages  # the glob finds them
    imported = _imported_top_levels("relax_core")
    bad = {name: sorted(imported[name]) for name in plugin_packages if name in imported}
    assert not bad, f"relax_core imports plugin packages: {bad}"
