"""Hook implementations of relax-tools (registration only; nothing heavy imported)."""

from dataclasses import dataclass

from relax_core import EnvironmentCapabilities, EnvironmentSpec, hookimpl, param


@dataclass(frozen=True)
class ToolsParams:
    use: str = param("calculator", "Comma-separated tools the model may call (calculator).")
    instructions: bool = param(True, "Append the tool descriptions and the call format to every prompt.")

    def problems(self) -> list[tuple[str, str]]:
        """Unknown tool names, checked at startup."""
        from relax_tools.tools import TOOLS

        unknown = [n for n in self.names() if n not in TOOLS]
        if not unknown:
            return []
        return [(f"unknown tool(s) {', '.join(unknown)} in --tools-use", f"choose from {', '.join(TOOLS)}")]

    def names(self) -> tuple[str, ...]:
        return tuple(n.strip() for n in self.use.split(",") if n.strip())


@hookimpl
def relax_register_environments():
    return [EnvironmentSpec(
        name="tools",
        summary="Function calling: the model calls tools with <tool_call>{json}</tool_call>, reads their results, "
                "and answers without a call.",
        source="Hermes function-calling format (NousResearch, Hermes 2 Pro; the tool format of the Qwen2.5/Qwen3 "
               "chat templates); ReAct-style tool use (Yao et al. 2023)",
        factory="relax_tools.tools:build",
        params=ToolsParams,
        capabilities=EnvironmentCapabilities(multi_turn=True, tool_format="hermes"),
    )]
