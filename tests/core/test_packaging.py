"""`make install` prints no setuptools deprecation for the licence (issue 19 §2)."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_licence_is_an_spdx_string_and_setuptools_is_new_enough_for_it():
    for path in [ROOT / "pyproject.toml", *ROOT.glob("plugins/*/*/pyproject.toml")]:
        data = tomllib.loads(path.read_text())
        lic = data["project"].get("license")
        assert lic is None or isinstance(lic, str), f"{path}: project.license must be an SPDX string, not a table"
        if isinstance(lic, str):
            assert any(r.replace(" ", "").startswith("setuptools>=") and int(r.split(">=")[1].split(".")[0]) >= 77
                       for r in data["build-system"]["requires"]), f"{path}: SPDX licence strings need setuptools>=77"
