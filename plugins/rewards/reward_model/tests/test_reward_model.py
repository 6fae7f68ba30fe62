"""relax-reward-model on a tiny randomly initialised classification model (no download):
the contract kit (batched: a sample's score does not depend on its batch), scores equal
to a plain transformers forward, normalisation, truncation, the worker pool, startup
refusals."""

import importlib.metadata as md
import math

import pytest

from relax_authoring.testing import check_contract
from relax_reward_model.plugin import RewardModelParams, relax_register_reward_scorers
from relax_reward_model.testing import tiny_reward_model

SPEC = relax_register_reward_scorers()[0]


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    return tiny_reward_model(tmp_path_factory.mktemp("rm"))


def plain_forward(rm_dir, text):
    """The reference: one text, no padding, through transformers directly."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(rm_dir)
    model = AutoModelForSequenceClassification.from_pretrained(rm_dir).eval()
    with torch.no_grad():
        return float(model(**tok(text, return_tensors="pt")).logits[0, 0])


def test_contract(rm_dir):
    check_contract(SPEC, RewardModelParams(path=rm_dir))


def test_scores_are_the_models_logits_on_prompt_plus_response(rm_dir):
    score = SPEC.build(RewardModelParams(path=rm_dir, batch_size=2))
    got = score(["ab", "a much longer response", "c"], [None] * 3, [{"prompt": "Q: "}, {"prompt": "Q: "}, {}])
    want = [plain_forward(rm_dir, t) for t in ("Q: ab", "Q: a much longer response", "c")]
    assert got == pytest.approx(want, abs=1e-5) and len(set(got)) == 3  # right padding, 2 micro-batches
    sig = SPEC.build(RewardModelParams(path=rm_dir, normalize="sigmoid"))(["ab"], [None], [{"prompt": "Q: "}])
    assert sig == pytest.approx([1 / (1 + math.exp(-want[0]))], abs=1e-6)
    assert score([""], [None], [{}]) == [None]  # nothing to score


def test_a_long_text_keeps_its_end(rm_dir):
    score = SPEC.build(RewardModelParams(path=rm_dir, max_length=8))
    (got,) = score(["x" * 30 + "the end."], [None], [{}])  # one byte per token: the last 8 are "the end."
    assert got == pytest.approx(plain_forward(rm_dir, "the end."), abs=1e-5)


def test_one_call_through_the_reward_workers(rm_dir):
    from relax_core.config import RunConfig
    from relax_core.host.plugins import load_registry
    from relax_core.stages.rewarding import resolve_scorers, score_batch, shutdown_pools
    from relax_reward_model import plugin

    cfg = RunConfig(reward=("reward_model",), plugin_params={"reward_model": RewardModelParams(path=rm_dir)})
    (scorer,) = resolve_scorers(cfg, load_registry([("rm", plugin)], entry_points=False))
    try:
        rewards, stats = score_batch(scorer, ["ab", "c"], [None, None], [{}, {}], prompts=["Q: ", "Q: "],
                                     timeout=60, num_workers=1)
    finally:
        shutdown_pools()
    assert stats == {"reward_errors": 0, "reward_timeouts": 0}
    assert rewards == pytest.approx([plain_forward(rm_dir, "Q: ab"), plain_forward(rm_dir, "Q: c")], abs=1e-5)


def test_refused_at_startup(rm_dir, tmp_path):
    from transformers import AutoConfig

    from relax_core.config import build_config
    from relax_core.host.plugins import default_registry
    from relax_core.host.validation import resolve

    reg = default_registry()
    _, problems = resolve(build_config(cli={"reward": ["reward_model"]}, param_schemas=reg.param_schemas()), reg)
    (p,) = [p for p in problems if p.constraint == "parameters"]
    assert p.component.startswith("reward 'reward_model' (relax-reward-model") and "needs --reward-model-path" in p.message
    assert "holds no config.json" in RewardModelParams(path=str(tmp_path)).problems()[0][0]
    two = tmp_path / "two"
    cfg = AutoConfig.from_pretrained(rm_dir)
    cfg.num_labels = 2
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    AutoModelForSequenceClassification.from_config(cfg).save_pretrained(two)
    AutoTokenizer.from_pretrained(rm_dir).save_pretrained(two)
    with pytest.raises(ValueError, match="has 2 outputs"):
        SPEC.build(RewardModelParams(path=str(two)))


def test_entry_point():
    eps = {ep.name: ep.value for ep in md.entry_points(group="relax.plugins")}
    assert eps.get("reward_model") == "relax_reward_model.plugin"


def test_a_device_it_cannot_use_is_refused_at_startup(rm_dir):
    """--reward-model-device cuda without a CUDA device: the scorer cannot be built, which
    relax train (and --dry-run) report before the policy loads (exit 2)."""
    import torch

    from relax_core.config import RunConfig
    from relax_core.host.plugins import default_registry
    from relax_core.stages.rewarding import RewardSetupError, resolve_scorers

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible here")
    cfg = RunConfig(reward=("reward_model",),
                    plugin_params={"reward_model": RewardModelParams(path=rm_dir, device="cuda")})
    with pytest.raises(RewardSetupError, match="reward_model' cannot be built.*no CUDA device is visible"):
        resolve_scorers(cfg, default_registry())
