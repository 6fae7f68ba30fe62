"""relax_core.data: file formats, GSM8K, bad rows named by file:line, --skip-bad-rows,
missing keys, empty data, prompt building and the resumable cursor."""

from __future__ import annotations

import json

import pytest

from relax_core.config import RunConfig
from relax_core.data import DataCursor, DataError, encode_prompts, gsm8k_label, load_dataset, prompt_text


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_jsonl_rows_with_custom_keys_and_metadata(tmp_path):
    p = _write(tmp_path / "d.jsonl", [{"q": "1+1?", "a": 2, "m": {"scorer": "math"}}, {"q": "2+2?", "a": 4, "m": None}])
    ds = load_dataset(str(p), RunConfig(prompt_key="q", label_key="a", metadata_key="m"))
    assert ds.rows == [{"prompt": "1+1?", "label": 2, "metadata": {"scorer": "math"}},
                       {"prompt": "2+2?", "label": 4, "metadata": {"scorer": "gsm8k"}}]  # numeric label: final-number scorer


def test_a_malformed_line_fails_naming_file_and_line(tmp_path):
    p = _write(tmp_path / "d.jsonl", [{"prompt": "a", "label": 1}, "", '{"prompt": "b", "label": ', {"prompt": "c", "label": 3}])
    with pytest.raises(DataError, match=rf"{p}:3: invalid JSON"):
        load_dataset(str(p), RunConfig())


def test_skip_bad_rows_skips_and_counts(tmp_path):
    p = _write(tmp_path / "d.jsonl", [{"prompt": "a", "label": 1}, "not json", {"prompt": "", "label": 2},
                                      {"prompt": "c"}, [1, 2], {"prompt": "d", "label": 4}])
    ds = load_dataset(str(p), RunConfig(skip_bad_rows=True))
    assert [r["prompt"] for r in ds.rows] == ["a", "d"]
    assert ds.skipped == 4
    assert ds.problems[0].startswith(f"{p}:2:")


def test_missing_label_key_is_a_clear_error(tmp_path):
    p = _write(tmp_path / "d.jsonl", [{"prompt": "a", "answer": 1}])
    with pytest.raises(DataError, match=r"d.jsonl:1: no label key 'label' \(keys: answer, prompt; set --label-key\)"):
        load_dataset(str(p), RunConfig())


def test_empty_dataset_is_an_error(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text("\n\n")
    with pytest.raises(DataError, match="empty"):
        load_dataset(str(p), RunConfig())
    p2 = _write(tmp_path / "e.jsonl", ["oops"])
    with pytest.raises(DataError, match="empty.*1 bad rows skipped"):
        load_dataset(str(p2), RunConfig(skip_bad_rows=True))


def test_gsm8k_format_auto_detected_and_by_scheme(tmp_path):
    rows = [{"question": "Tom has 3 apples...", "answer": "3 + 4 = <<3+4=7>>7\n#### 1,007"}]
    p = _write(tmp_path / "gsm.jsonl", rows)
    for src in (str(p), f"gsm8k:{p}"):
        ds = load_dataset(src, RunConfig())
        assert ds.rows[0]["prompt"] == "Tom has 3 apples..." and ds.rows[0]["label"] == "1007"
        assert ds.rows[0]["metadata"]["scorer"] == "gsm8k"
    assert gsm8k_label("x\n#### -12") == "-12"
    with pytest.raises(ValueError):
        gsm8k_label("no marker")


def test_json_and_parquet_through_datasets(tmp_path):
    pytest.importorskip("datasets")
    import datasets

    rows = [{"prompt": "a", "label": "1"}, {"prompt": "b", "label": "2"}]
    (tmp_path / "d.json").write_text(json.dumps(rows))
    assert [r["label"] for r in load_dataset(str(tmp_path / "d.json"), RunConfig()).rows] == ["1", "2"]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "d.parquet"))
    assert [r["prompt"] for r in load_dataset(str(tmp_path / "d.parquet"), RunConfig()).rows] == ["a", "b"]


def test_unknown_scheme_and_missing_file(tmp_path):
    with pytest.raises(DataError, match="unknown data source 'nope:'"):
        load_dataset("nope:thing", RunConfig())
    with pytest.raises(DataError, match="not found"):
        load_dataset(str(tmp_path / "missing.jsonl"), RunConfig())


class _Tok:
    chat_template = "x"

    def apply_chat_template(self, msgs, add_generation_prompt, tokenize):
        assert add_generation_prompt and not tokenize
        return "|".join(f"{m['role']}:{m['content']}" for m in msgs) + "|assistant:"

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [len(text), int(add_special_tokens)]}


def test_prompt_building_with_and_without_chat_template():
    cfg = RunConfig(system_prompt="Be brief.")
    assert prompt_text("2+2? Answer:", _Tok(), cfg) == "system:Be brief.|user:2+2? Answer:|assistant:"
    plain = RunConfig(apply_chat_template=False)
    assert prompt_text("hi!", _Tok(), plain) == "hi!"
    _, ids = encode_prompts(["hi"], _Tok(), cfg)
    assert ids[0][1] == 0  # the template already holds the special tokens


def test_cursor_is_a_seeded_permutation_per_epoch_and_resumes_exactly():
    c = DataCursor(5, seed=3)
    first = c.take(3) + c.take(2)
    assert sorted(first) == list(range(5))
    second = c.take(5)
    assert sorted(second) == list(range(5)) and second != first  # fresh shuffle for epoch 1
    a = DataCursor(5, seed=3)
    a.take(4)
    b = DataCursor(5, seed=3)
    b.load(a.state())
    assert b.take(6) == a.take(6)
    with pytest.raises(DataError, match="same --data and --seed"):
        DataCursor(6, seed=3).load(a.state())
