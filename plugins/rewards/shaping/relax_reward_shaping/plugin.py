"""Hook implementations of relax-reward-shaping (registration only; nothing heavy imported)."""

from dataclasses import dataclass

from relax_core import RewardProcessorCapabilities, RewardProcessorSpec, hookimpl, param

# Processors that change reward values replace the raw signal that strict estimators
# (RLOO's diagnostics, REINFORCE++-baseline's contract) are defined on.
_SHAPES_REWARD = RewardProcessorCapabilities(allowed_with_strict_estimators=False)


@dataclass(frozen=True)
class OverlongParams:
    max_len: int | None = param(None, "L_max in tokens: responses longer than this get the full penalty "
                                "(default: --rollout-max-response-len).", flag="--overlong-max-len", unit="tokens", ge=1)
    buffer_len: int | None = param(None, "L_cache in tokens: the penalty ramps from 0 at L_max - L_cache to its full "
                                   "value at L_max (default: L_max // 5).", flag="--overlong-buffer-len", unit="tokens", ge=1)
    penalty_factor: float = param(1.0, "Full penalty (subtracted from the reward at and beyond L_max).",
                                  flag="--overlong-penalty-factor", ge=0)


@dataclass(frozen=True)
class FormatParams:
    pattern: str = param(r"\\boxed\{.+\}", "Regular expression (Python re.search, DOTALL) the response must match.",
                         flag="--format-pattern")
    bonus: float = param(0.0, "Added to the reward of a response that matches.", flag="--format-bonus")
    penalty: float = param(-0.5, "Added to the reward of a response that does not match (negative = a penalty).",
                           flag="--format-penalty")


@dataclass(frozen=True)
class LengthPenaltyParams:
    coef: float = param(0.001, "Reward subtracted per response token.", flag="--length-penalty-coef",
                        unit="reward/token", ge=0)


@dataclass(frozen=True)
class ClipParams:
    min: float = param(-1.0, "Lower bound of the reward.", flag="--reward-clip-min")
    max: float = param(1.0, "Upper bound of the reward.", flag="--reward-clip-max")


@dataclass(frozen=True)
class ZeroVarianceParams:
    eps: float = param(1e-6, "A group is all-equal when max - min of its rewards is at most this.",
                       flag="--zero-variance-eps", ge=0)


@hookimpl
def relax_register_reward_processors():
    factory = "relax_reward_shaping.processors:"
    return [
        RewardProcessorSpec(
            name="overlong_penalty",
            summary="DAPO soft overlong punishment: 0 up to L_max - L_cache, linear to -1 at L_max, -1 beyond.",
            source="Yu et al. 2025, DAPO, §3.4 eq. (13) (soft overlong punishment)",
            factory=factory + "build_overlong",
            params=OverlongParams,
            capabilities=_SHAPES_REWARD,
        ),
        RewardProcessorSpec(
            name="format",
            summary="Adds --format-bonus to responses matching --format-pattern and --format-penalty to the others.",
            source="Rule-based format reward of DeepSeek-AI 2025, DeepSeek-R1, §2.2.2",
            factory=factory + "build_format",
            params=FormatParams,
            capabilities=_SHAPES_REWARD,
        ),
        RewardProcessorSpec(
            name="length_penalty",
            summary="Subtracts --length-penalty-coef per response token.",
            source="Per-token length cost (e.g. Team Kimi 2025, Kimi k1.5, §2.3.3 length penalty, simplified)",
            factory=factory + "build_length_penalty",
            params=LengthPenaltyParams,
            capabilities=_SHAPES_REWARD,
        ),
        RewardProcessorSpec(
            name="clip",
            summary="Clamps rewards to [--reward-clip-min, --reward-clip-max].",
            source="Reward clipping (Mnih et al. 2015, DQN, Methods: reward clipping)",
            factory=factory + "build_clip",
            params=ClipParams,
            capabilities=_SHAPES_REWARD,
        ),
        RewardProcessorSpec(
            name="zero_variance_filter",
            summary="DAPO dynamic sampling: drops groups whose raw (scorer) rewards are all equal, wherever it "
                    "stands among the processors; the loop samples more prompts.",
            source="Yu et al. 2025, DAPO, §3.2 eq. (11) (dynamic sampling: 0 < |{correct}| < G)",
            factory=factory + "build_zero_variance_filter",
            params=ZeroVarianceParams,
            # it changes no reward value (it only clears `keep` for groups whose
            # group-baseline advantages are 0 anyway), so strict estimators see raw rewards
            capabilities=RewardProcessorCapabilities(allowed_with_strict_estimators=True,
                                                     may_request_more_samples=True),
        ),
    ]
