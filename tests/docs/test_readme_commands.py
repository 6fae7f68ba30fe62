"""The commands of the README and of the quick start (docs/index.md) work as written after
`make run` (issue 19 §5): `relax` is on PATH only after the block's `source .venv/bin/activate`,
and every `relax train` line parses
(checked with --dry-run: exit 0, or 2 listing problems, never an unknown option)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from typer.testing import CliRunner

from cli.main import app

ROOT = Path(__file__).resolve().parents[2]
BLOCKS = [block for page in ("README.md", "docs/index.md")
          for block in re.findall(r"```bash\n(.*?)```", (ROOT / page).read_text(), re.S)]


def _commands(block: str) -> list[str]:
    """The block's commands as a shell reads them: continued lines (``\\``) joined, comments
    dropped, and ``"$NAME"`` replaced by the value of an earlier ``NAME='...'`` line."""
    out, variables = [], {}
    for line in re.sub(r"\\\n\s*", " ", block).splitlines():
        cmd = line.split(" #")[0].strip()
        if not cmd or cmd.startswith("#"):
            continue
        if m := re.fullmatch(r"([A-Z_]+)=(.+)", cmd):
            variables[m[1]] = shlex.split(m[2])[0]
            continue
        for name, value in variables.items():
            cmd = cmd.replace(f'"${name}"', shlex.quote(value))
        out.append(cmd)
    return out


def test_every_bare_relax_command_comes_after_activation():
    for block in BLOCKS:
        cmds = _commands(block)
        first_relax = next((i for i, c in enumerate(cmds) if c.startswith("relax ")), None)
        if first_relax is not None:
            assert any(c == "source .venv/bin/activate" for c in cmds[:first_relax]), block


def test_readme_train_and_plugin_commands_parse():
    runner = CliRunner()
    checked = 0
    for block in BLOCKS:
        for cmd in _commands(block):
            if not cmd.startswith("relax ") or cmd.startswith(("relax plot", "relax plugins new")):
                continue
            argv = shlex.split(cmd)[1:]
            if argv[0] == "train" and "--dry-run" not in argv:
                argv.append("--dry-run")
            r = runner.invoke(app, argv)
            assert r.exit_code in (0, 2), (cmd, r.output)
            assert "unknown option" not in r.output and "Traceback" not in r.output, (cmd, r.output)
            checked += 1
    assert checked >= 5


def test_the_readme_refusal_is_what_the_command_prints():
    """The README's example of a refused configuration, word for word (its line breaks aside)."""
    text = (ROOT / "README.md").read_text()
    block = text.split("A refused configuration looks like this", 1)[1].split("\n\n")[1]
    command, *shown = block.strip().splitlines()
    assert command.startswith("$ relax train --dry-run ")
    r = CliRunner().invoke(app, shlex.split(command[2:])[1:])
    assert r.exit_code == 2
    assert " ".join(" ".join(shown).split()) == " ".join(r.stderr.split())
