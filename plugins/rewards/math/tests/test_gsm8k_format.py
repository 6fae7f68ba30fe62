"""The ``gsm8k:`` file format and the ``gsm8k`` scorer's claim on numeric labels, through the
core's loader with the installed plugins (as ``relax train --data`` reads them)."""

import json

import pytest

from relax_core.config import RunConfig
from relax_core.data import DataError, load_dataset
from relax_core.host.plugins import default_registry
from relax_core.host.reward_check import what_to_try
from relax_math.gsm8k import gsm8k_label, is_number


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_gsm8k_file_read_by_scheme_and_auto_detected(tmp_path):
    reg = default_registry()
    p = _write(tmp_path / "gsm.jsonl", [{"question": "Tom has 3 apples...", "answer": "3 + 4 = <<3+4=7>>7\n#### 1,007"}])
    for src in (str(p), f"gsm8k:{p}"):
        ds = load_dataset(src, RunConfig(), reg)
        assert ds.rows == [{"prompt": "Tom has 3 apples...", "label": "1007",
                            "metadata": {"source": "gsm8k", "scorer": "gsm8k"}}]
    bad = _write(tmp_path / "bad.jsonl", [{"question": "q", "answer": "7"}])
    with pytest.raises(DataError, match=r"bad.jsonl:1: GSM8K answer has no '#### <number>' line"):
        load_dataset(f"gsm8k:{bad}", RunConfig(), reg)


def test_gsm8k_label_and_numeric_claim():
    assert gsm8k_label("x\n#### -12") == "-12"
    with pytest.raises(ValueError):
        gsm8k_label("no marker")
    assert [is_number(x) for x in ("13", 42, "1,234", "$5", "x = 3", "\\frac{1}{2}", True)] == \
        [True, True, True, True, False, False, False]


def test_numeric_labels_of_a_plain_file_get_the_gsm8k_scorer(tmp_path):
    p = _write(tmp_path / "d.jsonl", [{"prompt": "4 + 9?", "label": "13"}, {"prompt": "half?", "label": "\\frac{1}{2}"}])
    rows = load_dataset(str(p), RunConfig(), default_registry()).rows
    assert [r["metadata"] for r in rows] == [{"scorer": "gsm8k"}, {}]  # the second falls to the default, math


def test_what_to_try_offers_gsm8k_and_the_math_options():
    specs = {n: r.spec for n, r in default_registry().components["reward"].items()}
    math_hint = what_to_try("math", specs)
    assert math_hint.startswith("try: --reward gsm8k (the final number, or the last \\boxed{}) for numeric labels; "
                                "or --math-answer-format anchors")
    assert "--reward gsm8k" not in what_to_try("gsm8k", specs) and "--math-answer-format" not in what_to_try("gsm8k", specs)
