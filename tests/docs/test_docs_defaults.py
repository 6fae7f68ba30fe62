"""Every default the docs and the README quote comes from the config schema (issue 19 §7).

A default is quoted in one of these forms, and each one found is compared with the schema
(core options and plugin parameters):

- ``--flag`` followed within a few words by ``(default X)`` / ``(default: X)`` / ``default `X```;
- ``--flag X`` (default) / (the default);
- a table whose header has ``flag`` and ``default`` columns.

Values that are not literals (another flag, a formula, "none", ...) are skipped.  The test
fails when a quoted default differs, and when fewer quotes are found than the docs hold
today (so that a changed form does not silently escape the check).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from relax_core.config import config_fields, flag_of, param_flag

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(p for p in (ROOT / "docs").rglob("*.md")
                                      if not p.relative_to(ROOT / "docs").parts[0] in ("components", "reference"))])

_AFTER = re.compile(r"`(--[a-z0-9-]+)`[^`()\n|]{0,60}?\(default:? `?([^`),;]+?)`?[),;]")
_INLINE = re.compile(r"`(--[a-z0-9-]+) ([^`]+)` \((?:the )?default\)")
_ROW = re.compile(r"^\|\s*`(--[a-z0-9-]+)`(?: / `--[a-z0-9-]+`)?\s*\|\s*([^|]+?)\s*\|")


def schema_defaults() -> dict[str, object]:
    """flag -> default, for core options (and their aliases) and plugin parameters."""
    from relax_core.host.plugins import default_registry

    out: dict[str, object] = {}
    for f in config_fields():
        for name in (flag_of(f), *f.metadata.get("aliases", ())):
            out[name] = f.default
    for comp, schema in default_registry().param_schemas().items():
        for pf in dataclasses.fields(schema):
            out.setdefault(param_flag(comp, pf), pf.default)
    return out


def quoted_defaults() -> list[tuple[str, str, str]]:
    """``(where, flag, value as written)`` for every default quoted in the pages."""
    found = []
    for page in PAGES:
        text = page.read_text()
        rel = page.relative_to(ROOT).as_posix()
        for m in _AFTER.finditer(text):
            found.append((rel, m.group(1), m.group(2).strip()))
        for m in _INLINE.finditer(text):
            found.append((rel, m.group(1), m.group(2).strip()))
        in_table = False
        for line in text.splitlines():
            if line.startswith("|") and re.search(r"\|\s*flag\s*\|\s*default\s*\|", line):
                in_table = True
                continue
            if not line.startswith("|"):
                in_table = False
            elif in_table and (m := _ROW.match(line)):
                found.append((rel, m.group(1), m.group(2).strip().strip("`")))
    return found


def _literal(text: str) -> bool:
    return not text.startswith("--") and not re.search(r"[=×/<>]|\bor\b|none|—|a copy|\(", text, re.I)


def _same(written: str, default: object) -> bool:
    written = written.strip().strip("'\"")
    if isinstance(default, bool):
        return written.lower() in (("on", "true", "yes") if default else ("off", "false", "no"))
    if isinstance(default, (int, float)):  # a number, maybe with its unit ("5 s", "32 tokens")
        m = re.fullmatch(r"(-?[0-9.]+(?:e-?[0-9]+)?)(?: [a-z]+)?", written)
        return m is not None and float(m.group(1)) == float(default)
    if default is None:
        return False
    if isinstance(default, tuple):  # a repeatable flag (--reward auto): its values, comma-separated
        return written == ", ".join(map(str, default))
    return written == str(default) or written.strip('"') == str(default).strip()


def test_quoted_defaults_match_the_schema():
    schema = schema_defaults()
    wrong = [f"{where}: {flag} default quoted as {value!r}, but the schema's is {schema[flag]!r}"
             for where, flag, value in quoted_defaults()
             if flag in schema and _literal(value) and not _same(value, schema[flag])]
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_the_quotes():
    quotes = [q for q in quoted_defaults() if _literal(q[2])]
    assert len(quotes) >= 25, quotes
    pages = {where for where, _, _ in quotes}
    assert {"docs/index.md", "docs/guide/training.md", "docs/guide/data.md"} <= pages, pages


@pytest.mark.parametrize("written, default, same", [("40", 20, False), ("20", 20, True), ("1", 1.0, True),
                                                    ("`seq-mean-token-mean`", "seq-mean-token-mean", False),
                                                    ("seq-mean-token-mean", "seq-mean-token-mean", True),
                                                    ("off", False, True), ("on", False, False)])
def test_comparison(written, default, same):
    assert _same(written, default) is same


def test_no_citation_of_files_outside_the_repository():
    """Modules and pages cite papers and the docs, not the development notes
    (``shared/seeds/…``, ``shared/reference/…``, ``DESIGN.md``), which are not in the repository."""
    pattern = re.compile(r"shared/(?:seeds|reference)/|DESIGN\.md|slime-notes|peers-notes")
    files = [p for p in ROOT.rglob("*") if p.suffix in (".py", ".md", ".toml", ".yaml")
             and not any(part.startswith(".") or part in ("site", "runs") for part in p.relative_to(ROOT).parts)
             and p != Path(__file__)]
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in files for i, line in enumerate(p.read_text().splitlines(), 1)
            if pattern.search(line)]
    assert not hits, hits
