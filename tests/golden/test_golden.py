"""The golden runs (see ``golden.py``): each case's ``metrics.jsonl`` equals the one
recorded before the core redesign (``data/``), or on another kind of CPU the one recorded
on that kind (``golden.DATA``: ``data/AuthenticAMD-26/``, an AMD EPYC of family 26, recorded at
35a48c8; ``data/AuthenticAMD/``, an earlier AMD EPYC, recorded at 89f4016;
``data/GenuineIntel-6-167/``, an Intel Xeon with AMX (KVM guest), recorded at 7a96443; on each
the runs of data/ diverge in their sampled tokens).  Local cases within ``REL_TOL`` (bit-equal on the
recording machine), Ray cases within ``RAY_TOL`` (actors run in other processes whose
thread pools may sum in another order).  ``grpo`` and ``tis`` run in the fast suite; the
rest are marked slow."""

from __future__ import annotations

import json

import golden
import pytest

FAST = {"grpo", "tis"}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("golden")


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in FAST else pytest.mark.slow) for n in golden.CASES])
def test_metrics_equal_the_recorded_run(name, work, request):
    if golden.CASES[name][2]:
        request.getfixturevalue("ray_local")
    expected = [json.loads(x) for x in (golden.DATA / f"{name}.jsonl").read_text().splitlines()]
    got = golden.run_case(name, work)
    diff = golden.differences(expected, got, golden.RAY_TOL if golden.CASES[name][2] else golden.REL_TOL)
    assert not diff, "\n".join(diff[:30])


def test_a_changed_value_is_reported():
    rows = [{"step": 1, "train/loss": 0.5, "rollout/reward": 0.25}]
    assert golden.differences(rows, [{"step": 1, "train/loss": 0.5, "rollout/reward": 0.25}]) == []
    assert golden.differences(rows, [{"step": 1, "train/loss": 0.5001, "rollout/reward": 0.25}]) == [
        "step 1: train/loss = 0.5001, expected 0.5"]
    assert golden.differences(rows, [{"step": 1, "train/loss": 0.5}]) == ["step 1: rollout/reward missing"]
    assert golden.differences(rows, []) == ["0 rows, expected 1"]
