"""Hook implementations of relax-tools (registration only; nothing heavy imported)."""

from dataclasses import dataclass

from relax_core import EnvironmentCapabilities, EnvironmentSpec, hookimpl, param


@dataclass(frozen=True)
class ToolsParams:
    use: str = param("calculator", "Comma-separated tools the model may call (calculator, python).")
    instructions: bool = param(True, "Append the tool descriptions and the call format to every prompt.")
    python_timeout: float = param(10.0, "python tool: seconds of wall time (and of CPU time) per call.", gt=0)
    python_memory: int = param(1024, "python tool: MiB of address space per call (RLIMIT_AS).", ge=64)
    python_output: int = param(4096, "python tool: characters of output kept per call; past them the "
                                     "program is stopped.", ge=16)
    max_calls: int = param(4, "Tool calls run per model turn; the calls after them get an error result.", ge=1)

    def problems(self) -> list[tuple[str, str]]:
        """Unknown tool names, and ``python`` where no sandbox can be set up (a probe call in
        bubblewrap), checked at startup."""
        from relax_tools import sandbox
        from relax_tools.tools import TOOLS

        unknown = [n for n in self.names() if n not in TOOLS]
        if unknown:
            return [(f"unknown tool(s) {', '.join(unknown)} in --tools-use", f"choose from {', '.join(TOOLS)}")]
        if not self.names():
            return [("--tools-use names no tool", f"choose from {', '.join(TOOLS)}")]
        if "python" in self.names() and (why := sandbox.problem()) is not None:
            return [(f"--tools-use python: {why[0]}", why[1])]
        return []

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
        capabilities=_capabilities,
    )]


def _capabilities(p: ToolsParams) -> EnvironmentCapabilities:
    """A turn's calls run one after another, so a step takes up to ``max_calls`` python calls
    of ``python_timeout`` seconds each (the sandbox's start-up aside); the calculator is instant."""
    slow = "python" in p.names()
    return EnvironmentCapabilities(multi_turn=True, tool_format="hermes",
                                   max_step_seconds=p.max_calls * p.python_timeout if slow else None)
