"""The saved config.json of a run as the base of ``--resume`` (relax_core.run.resume.saved_values)."""

from relax_core import DualClipParams
from relax_core.config import build_config
from relax_core.run.resume import saved_values


def test_an_option_saved_before_it_became_a_parameter_block_is_kept():
    """Checkpoints written before plugin API 4 hold --eps-clip as a core option; resuming one
    gives it to every estimator composing the PPO-clip block instead of dropping it."""
    schemas = {"grpo": DualClipParams, "ppo": DualClipParams}
    values, dropped = saved_values({"eps_clip": 0.3, "eps_clip_c": None, "lr": 1e-5, "gone_option": 1,
                                    "plugin_params": {"grpo": {"eps_clip_high": 0.28, "gone": 2}}}, schemas)
    assert dropped == ["gone_option", "grpo.gone"]
    cfg = build_config(yaml_values=values, param_schemas=schemas)
    assert cfg.params_for("grpo") == DualClipParams(eps_clip=0.3, eps_clip_high=0.28)
    assert cfg.params_for("ppo") == DualClipParams(eps_clip=0.3) and cfg.lr == 1e-5
