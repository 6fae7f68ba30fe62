"""Hook implementations of relax-remote (registration only; nothing heavy imported)."""

from dataclasses import dataclass

from relax_core import RewardScorerSpec, hookimpl, param


@dataclass(frozen=True)
class RemoteParams:
    request_timeout: float = param(5.0, "Seconds one HTTP request to --rm-url may take.",
                                   flag="--rm-request-timeout", unit="s", gt=0)
    max_retries: int = param(3, "Retries after a failed request (connection error, timeout, HTTP 429 or 5xx).",
                             flag="--rm-max-retries", ge=0, le=20)
    backoff: float = param(0.5, "Delay before the first retry; doubles after each retry.",
                           flag="--rm-backoff", unit="s", ge=0)


@hookimpl
def relax_register_reward_scorers():
    return [RewardScorerSpec(
        name="remote",
        summary="POSTs {prompt, response, label, metadata} as JSON to --rm-url; the reply is the reward.",
        source="Remote reward-model protocol of slime/Relax (--rm-url), with bounded retries and back-off",
        factory="relax_remote.remote:build",
        params=RemoteParams,
        self_check=False,  # each call is an HTTP request to --rm-url
    )]
