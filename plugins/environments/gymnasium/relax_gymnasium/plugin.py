"""Hook implementations of relax-gymnasium (registration only; gymnasium is imported by the
startup check and the factory, not here)."""

from dataclasses import dataclass

from relax_core import EnvironmentCapabilities, EnvironmentSpec, hookimpl, param


@dataclass(frozen=True)
class GymnasiumParams:
    env_id: str = param("FrozenLake-v1", "The Gymnasium environment id (gymnasium.make); it must have a Discrete "
                                         "action space and should render as text (render_mode='ansi').")
    kwargs: str = param('{"is_slippery": false}', "Keyword arguments of gymnasium.make, as a JSON object.")
    actions: str = param("left,down,right,up", "Comma-separated names of the actions 0, 1, ... (the model answers "
                                               "with a name or a number).")

    def problems(self) -> list[tuple[str, str]]:
        """An unknown id, bad JSON, a non-Discrete action space or a count of action names
        that differs from it, checked at startup (makes the environment once)."""
        from relax_gymnasium.adapter import check

        return check(self)


@hookimpl
def relax_register_environments():
    return [EnvironmentSpec(
        name="gymnasium",
        summary="A Gymnasium environment as a multi-turn episode: the text rendering as the observation, the "
                "model's answer parsed as a Discrete action, the step rewards as per-turn rewards.",
        source="Gymnasium's episode API, reset(seed) / step(action) -> (obs, reward, terminated, truncated, info) "
               "(Towers et al. 2024, 'Gymnasium: A Standard Interface for Reinforcement Learning Environments')",
        factory="relax_gymnasium.adapter:build",
        params=GymnasiumParams,
        capabilities=EnvironmentCapabilities(multi_turn=True, turn_rewards=True),
    )]
