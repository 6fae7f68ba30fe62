"""``docs/capabilities.md`` is generated; it must match the installed plugins."""

from pathlib import Path

from cli.capabilities import matrix_markdown
from relax_core.host.plugins import load_registry

DOC = Path(__file__).resolve().parents[2] / "docs" / "capabilities.md"
REGENERATE = ".venv/bin/relax capabilities --markdown > docs/capabilities.md"


def test_capabilities_doc_is_current():
    expected = matrix_markdown(load_registry())
    current = DOC.read_text() if DOC.is_file() else ""
    assert current == expected, f"docs/capabilities.md is stale; regenerate it with:  {REGENERATE}"
