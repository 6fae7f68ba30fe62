"""relax_core.data: file formats (plugin ones too), scorers claiming labels, bad rows named by
file:line, --skip-bad-rows, missing keys, empty data, prompt building and the resumable cursor."""

from __future__ import annotations

import json
import re

import pytest

from relax_core.config import RunConfig
from relax_core.data import (
    DataCursor,
    DataError,
    data_fingerprint,
    encode_prompts,
    exclude_eval_prompts,
    load_dataset,
    prompt_text,
)


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_jsonl_rows_with_custom_keys_and_metadata(tmp_path):
    p = _write(tmp_path / "d.jsonl", [{"q": "1+1?", "a": 2, "m": {"scorer": "math"}}, {"q": "2+2?", "a": 4, "m": None}])
    ds = load_dataset(str(p), RunConfig(prompt_key="q", label_key="a", metadata_key="m"))
    assert ds.rows == [{"prompt": "1+1?", "label": 2, "metadata": {"scorer": "math"}},
                       {"prompt": "2+2?", "label": 4, "metadata": {}}]  # no registry: no scorer claims labels


def test_a_malformed_line_fails_naming_file_and_line(tmp_path):
    p = _write(tmp_path / "d.jsonl", [{"prompt": "a", "label": 1}, "", '{"prompt": "b", "label": ', {"prompt": "c", "label": 3}])
    with pytest.raises(DataError, match=rf"{p}:3: invalid JSON"):
        load_dataset(str(p), RunConfig())


def test_a_truncated_line_is_named_by_the_column_after_its_end(tmp_path):
    p = _write(tmp_path / "d.jsonl", ['{"prompt": "What is 2 + 2?", "label": 4', {"prompt": "c", "label": 3}])
    with pytest.raises(DataError, match=rf"{p}:1: invalid JSON: Expecting ',' delimiter \(line 1, column 40\)"):
        load_dataset(str(p), RunConfig())  # the line has 39 characters (it said column 1: the newline)


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


def test_a_plugin_file_format_reads_by_scheme_and_by_its_keys(tmp_path, registry_with):
    from relax_core_test_toys import qa_plugin

    reg = registry_with(qa_plugin())
    p = _write(tmp_path / "qa.jsonl", [{"q": "Tom has 3 apples...", "sol": "3 + 4 = 7"}, {"q": "x", "sol": "no answer"}])
    for src in (str(p), f"qa:{p}"):
        with pytest.raises(DataError, match=rf"{re.escape(str(p))}:2: sol has no '= N' \(or pass --skip-bad-rows"):
            load_dataset(src, RunConfig(), reg)
        ds = load_dataset(src, RunConfig(skip_bad_rows=True, prompt_suffix="!"), reg)
        assert (ds.name, ds.skipped) == ("qa", 1)
        assert ds.rows == [{"prompt": "Tom has 3 apples...!", "label": "7", "metadata": {"source": "qa"}}]
    with pytest.raises(DataError, match="2 bad rows skipped; first: .*no prompt key 'prompt'"):  # no format installed
        load_dataset(str(p), RunConfig(skip_bad_rows=True), registry_with())
    with_keys = _write(tmp_path / "k.jsonl", [{"q": "a", "sol": "= 1", "prompt": "p", "label": "1"}])
    assert load_dataset(str(with_keys), RunConfig(), reg).rows[0]["prompt"] == "p"  # its own keys win
    with pytest.raises(DataError, match="unknown data source 'nope:' \\(known: qa, rg\\)"):
        load_dataset("nope:thing", RunConfig(), reg)


def test_a_format_reading_a_missing_key_and_a_broken_claim_are_named(tmp_path, registry_with):
    from relax_core_test_toys import qa_plugin

    p = _write(tmp_path / "qa.jsonl", [{"q": "a", "sol": "= 1"}, {"q": "b"}])
    with pytest.raises(DataError, match=r"qa.jsonl:2: no key 'sol' \(keys: q\) \(or pass --skip-bad-rows"):
        load_dataset(f"qa:{p}", RunConfig(), registry_with(qa_plugin()))
    assert load_dataset(f"qa:{p}", RunConfig(skip_bad_rows=True), registry_with(qa_plugin())).skipped == 1
    broken = registry_with(qa_plugin(auto_labels="relax_core_test_toys:no_such_predicate"))
    with pytest.raises(DataError, match=r"reward scorer 'even' \(relax-qa 1.0\): its auto_labels "
                                        r"'relax_core_test_toys:no_such_predicate' cannot be imported: AttributeError"):
        load_dataset(str(p), RunConfig(), broken)


def test_scorers_claim_the_labels_of_file_rows_that_name_none(tmp_path, registry_with):
    from relax_core_test_toys import qa_plugin

    p = _write(tmp_path / "d.jsonl", [{"prompt": "a", "label": "4"}, {"prompt": "b", "label": "3"},
                                      {"prompt": "c", "label": "8", "metadata": {"scorer": "math"}}])
    rows = load_dataset(str(p), RunConfig(metadata_key="metadata"), registry_with(qa_plugin())).rows
    assert [r["metadata"] for r in rows] == [{"scorer": "even"}, {}, {"scorer": "math"}]  # first claimant by name
    rows = load_dataset(str(p), RunConfig(metadata_key="metadata"), registry_with()).rows
    assert [r["metadata"] for r in rows] == [{}, {}, {"scorer": "math"}]


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


def test_cursor_issue_case_no_duplicate_across_the_epoch_boundary():
    """3 rows, batches of 2, seed 0: the second batch was [0, 0] before the fix (issue 18 item 8)."""
    c = DataCursor(3, seed=0)
    batches = [c.take(2) for _ in range(6)]
    assert all(len(set(b)) == 2 for b in batches), batches


@pytest.mark.parametrize("seed", range(5))
def test_cursor_property_no_duplicates_within_a_batch_every_row_once_per_epoch(seed):
    """Over many dataset sizes, batch sizes (also changing between takes, as a resume with
    another --rollout-batch-size or oversampling rounds do) and seeds: no index twice in a
    batch no larger than the dataset; the stream, cut into epochs of n, is a permutation
    each time; and a cursor restored from any state continues identically."""
    import random

    rng = random.Random(seed)
    for n in range(1, 24):
        for k in range(1, n + 1):
            c = DataCursor(n, seed=rng.randrange(1000))
            sizes = [k if rng.random() < 0.7 else rng.randint(1, n) for _ in range(3 * n // k + 4)]
            stream = []
            for size in sizes:
                if rng.random() < 0.3:  # resume from a checkpoint at this point
                    restored = DataCursor(n, seed=c.seed)
                    restored.load(json.loads(json.dumps(c.state())))
                    c = restored
                batch = c.take(size)
                assert len(set(batch)) == size, (n, size, batch)
                stream += batch
            for e in range(len(stream) // n):
                assert sorted(stream[e * n:(e + 1) * n]) == list(range(n)), (n, k, e)


def test_cursor_order_is_unchanged_when_no_batch_straddles_with_a_repeat():
    """Runs whose batches never repeat a row keep their exact data order (no change to the
    numbers of a normal run)."""
    c = DataCursor(8, seed=3)
    got = [c.take(2) for _ in range(8)]
    ref = DataCursor(8, seed=3)
    want = [ref._order(e)[i:i + 2] for e in (0, 1) for i in range(0, 8, 2)]
    assert got == want


def test_data_fingerprint_changes_with_the_rows_not_the_path(tmp_path):
    from relax_core.data import fingerprint_change

    a = _write(tmp_path / "a.jsonl", [{"prompt": "p1", "label": "1"}, {"prompt": "p2", "label": "2"}])
    b = _write(tmp_path / "b.jsonl", [{"prompt": "p1", "label": "1"}, {"prompt": "p2", "label": "3"}])
    moved = _write(tmp_path / "moved.jsonl", [{"prompt": "p1", "label": "1"}, {"prompt": "p2", "label": "2"}])
    fa, fb, fm = (load_dataset(str(p), RunConfig()).fingerprint for p in (a, b, moved))
    assert fa["rows"] == 2 and fa["source"] == str(a) and len(fa["sha256"]) == 64
    assert fingerprint_change(fa, fm) is None
    assert "same row count (2) but other rows" in fingerprint_change(fa, fb)
    c = _write(tmp_path / "c.jsonl", [{"prompt": "p1", "label": "1"}])
    assert fingerprint_change(fa, load_dataset(str(c), RunConfig()).fingerprint).startswith("2 rows in the checkpoint")


def test_one_reading_of_a_data_value(tmp_path, monkeypatch):
    from relax_core.data import DataRef, parse_data

    monkeypatch.chdir(tmp_path)
    (tmp_path / "ab:c.jsonl").write_text("{}\n")  # an existing file whose name has a colon stays a file
    for value, want in (("rg:chain_sum?size=4", DataRef("source", "rg", "chain_sum?size=4")),
                        ("qa:/d/x.jsonl", DataRef("source", "qa", "/d/x.jsonl")),
                        ("hf:gsm8k", DataRef("unknown", "hf", "gsm8k")),
                        ("C:\\data\\x.jsonl", DataRef("file", "", "C:\\data\\x.jsonl")),
                        ("./runs:1/x.jsonl", DataRef("file", "", "./runs:1/x.jsonl")),
                        ("ab:c.jsonl", DataRef("file", "", "ab:c.jsonl")),
                        ("ab:d.jsonl", DataRef("unknown", "ab", "d.jsonl"))):
        assert parse_data(value, {"rg", "qa"}) == want, value


def test_training_rows_with_an_evaluation_prompt_are_left_out(tmp_path):
    train = load_dataset(str(_write(tmp_path / "t.jsonl", [{"prompt": p, "label": i} for i, p in enumerate("abcad")])), RunConfig())
    ev = load_dataset(str(_write(tmp_path / "e.jsonl", [{"prompt": p, "label": 0} for p in "axc"])), RunConfig())
    kept = exclude_eval_prompts(train, ev)
    assert [(r["prompt"], r["label"]) for r in kept.rows] == [("b", 1), ("d", 4)]  # order kept, both 'a' rows gone
    assert kept.held_out == 3 and len(train) == 5  # the input is not changed
    assert kept.fingerprint == data_fingerprint(str(tmp_path / "t.jsonl"), kept.rows) != train.fingerprint
    with pytest.raises(DataError, match="every training prompt is also an evaluation prompt.*--no-exclude-eval-prompts"):
        exclude_eval_prompts(train, train)


def test_train_eval_data_takes_a_name_as_relax_eval_does(tmp_path):
    """`--eval-data NAME=SOURCE` names the in-training evaluation set (eval/NAME/...), as
    `relax eval --eval-data NAME=SOURCE` does; a source with `=` in it stays whole."""
    from relax_core.config import named_source
    from relax_core.data import run_datasets

    assert named_source("sums=rg:chain_sum?size=8&seed=7") == ("sums", "rg:chain_sum?size=8&seed=7")
    assert named_source("rg:chain_sum?size=8&seed=7") == (None, "rg:chain_sum?size=8&seed=7")
    assert named_source("a b=x.jsonl") == (None, "a b=x.jsonl") and named_source("p=") == (None, "p=")
    train, held = tmp_path / "train.jsonl", tmp_path / "held.jsonl"
    train.write_text("".join(json.dumps({"prompt": f"q{i}", "label": str(i)}) + "\n" for i in range(6)))
    held.write_text("".join(json.dumps({"prompt": f"q{i}", "label": str(i)}) + "\n" for i in (0, 9)))
    cfg = RunConfig(data=str(train), eval_data=f"held_out={held}")
    assert (cfg.eval_name, cfg.eval_source) == ("held_out", str(held))
    rows, evaluation = run_datasets(cfg)
    assert evaluation.name == "held_out" and len(evaluation) == 2
    assert [r["prompt"] for r in rows.rows] == ["q1", "q2", "q3", "q4", "q5"]  # q0 left out: an eval prompt
    unnamed = run_datasets(RunConfig(data=str(train), eval_data=str(held)))[1]
    assert unnamed.name != "held_out"
    assert RunConfig(data=str(train), eval_data=f"held_out={held}", eval_interval=0).eval_name is None
