"""The documentation site: the generated pages are fresh, every flag and repository path
the hand-written pages mention exists, and `mkdocs build --strict` (warnings are errors:
broken links and anchors, pages missing from the nav) succeeds."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
REGEN = "python -m relax_authoring.docgen docs"
#: Generated pages (docgen, `relax capabilities --markdown`): checked for freshness instead.
GENERATED = ("components", "reference")
#: Flags the pages mention that are not relax's: pip's, `ray start`'s, and the example
#: plugin's of the plugin guide.
OTHER_FLAGS = {"--no-deps", "--target", "--head", "--address", "--port", "--num-gpus", "--myalgo-beta",
               # bubblewrap's, in the python tool's threat model (guide/environments.md)
               "--clearenv", "--disable-userns", "--new-session", "--die-with-parent",
               # benchmarks/judge_agreement.py's (guide/rewards.md)
               "--judge-model"}
#: Files the docs link to that other issues commit: the Ray guide (issue 8), the default
#: run's figure (issue 7).  See test_site_builds_strict.
PENDING = ("guide/ray.md", "images/default-run.png")


def test_generated_pages_are_fresh():
    from relax_authoring.docgen import pages
    from relax_core.host.plugins import default_registry

    expected = {rel: text if text.endswith("\n") else text + "\n" for rel, text in pages(default_registry()).items()}
    stale = [rel for rel, text in expected.items() if not (DOCS / rel).is_file() or (DOCS / rel).read_text() != text]
    extra = sorted(rel for p in (DOCS / "components").rglob("*.md")
                   if (rel := p.relative_to(DOCS).as_posix()) not in expected)
    assert not stale and not extra, (
        f"generated docs are stale (changed or missing: {stale}; no longer generated: {extra}); "
        f"regenerate with `{REGEN}` and commit docs/reference and docs/components")


def _relax_flags() -> set[str]:
    """Every flag of `relax train --help` (core and installed plugins) and of the other commands."""
    import typer
    from typer.testing import CliRunner

    from cli.main import app

    res = CliRunner().invoke(app, ["train", "--help"])
    flags = set(re.findall(r"--[a-z0-9][a-z0-9-]*", res.output))
    stack = [typer.main.get_command(app)]
    while stack:
        cmd = stack.pop()
        flags.update(o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--"))
        stack.extend(getattr(cmd, "commands", {}).values())  # sub-commands of a group
    return flags


def _gpu_check_flags() -> set[str]:
    """The flags of ``benchmarks/gpu/check.py`` (shown in the GPU guide)."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
    import check

    return {o for a in check.parser()._actions for o in a.option_strings if o.startswith("--")}


def test_every_flag_mentioned_exists():
    known = _relax_flags() | _gpu_check_flags() | OTHER_FLAGS
    assert "--advantage-estimator" in known and "--m2po-kl2-budget" in known and "--kind" in known
    unknown = {}
    for page in sorted(DOCS.rglob("*.md")):
        rel = page.relative_to(DOCS)
        if rel.parts[0] in GENERATED or rel.as_posix() == "capabilities.md":
            continue
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", page.read_text()):
            if flag not in known:
                unknown.setdefault(flag, set()).add(rel.as_posix())
    assert not unknown, f"the docs mention flags that do not exist: {unknown}"


#: Repository paths the pages mention that are not in this repository: the layout of a
#: scaffolded package in the plugin guide.
NOT_REPO_PATHS = {"tests/test_myalgo.py"}


def test_every_repository_path_mentioned_exists():
    pattern = re.compile(r"(?<![\w/.<-])((?:\.ci|examples|plugins|relax_core|benchmarks|tests|cli)/[\w./-]*[\w/])")
    missing = {}
    for page in sorted(DOCS.rglob("*.md")):
        rel = page.relative_to(DOCS)
        if rel.parts[0] in GENERATED:
            continue
        for path in pattern.findall(page.read_text()):
            if path not in NOT_REPO_PATHS and not (ROOT / path).exists():
                missing.setdefault(path, set()).add(rel.as_posix())
    assert not missing, f"the docs name repository paths that do not exist: {missing}"


@pytest.mark.skipif(shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is None,
                    reason="mkdocs is not installed (pip install -e '.[test]')")
def test_site_builds_strict(tmp_path):
    """`mkdocs build --strict`.  While a page another issue owes is not committed yet
    (PENDING), the build runs without --strict and only the warnings naming that file are
    tolerated; any other warning fails."""
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    missing = [rel for rel in PENDING if not (DOCS / rel).exists()]
    res = subprocess.run([mkdocs, "build", "--no-strict" if missing else "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-6000:]
    warnings = [line for line in res.stderr.splitlines() if line.startswith("WARNING")
                and not any(rel in line or Path(rel).name in line for rel in missing)]
    assert not warnings, "\n".join(warnings)
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "guide" / "algorithms" / "index.html").is_file()
