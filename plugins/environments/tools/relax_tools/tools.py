"""The ``tools`` environment: the model calls tools, reads their results, then answers.

Call format (Hermes function calling, the tool format of the Qwen2.5/Qwen3 and Hermes chat
templates), one or more per model turn::

    <tool_call>{"name": "calculator", "arguments": {"expression": "12*(3+4)"}}</tool_call>

A turn with calls gets one ``tool`` message per call (its result, or ``error: <why>`` for an
unknown tool, bad JSON or missing arguments), rendered by the host through the chat template
(a template with a ``tool`` role renders it its way, e.g. Qwen's ``<tool_response>``).  A turn
without a call is the final answer: the episode ends and the run's scorer scores it.  A
closing ``</tool_call>`` may be missing at the end of a turn (the model stopped at EOS).

Tools (``--tools-use``): ``calculator`` (exact arithmetic, :mod:`relax_tools.calculator`) and
``python`` (code run in a bubblewrap sandbox with resource limits, :mod:`relax_tools.sandbox`;
refused at startup where no sandbox can be set up).

With ``--tools-instructions`` (default on), every prompt gets the tool descriptions and the
call format appended (the documented fallback for chat templates without a tool format,
such as SmolLM2's); the template-native rendering of tool descriptions is not used yet.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable

from relax_core.environments import Reply, Turn
from relax_tools import sandbox
from relax_tools.calculator import SCHEMA as CALCULATOR_SCHEMA
from relax_tools.calculator import calculator

CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


def _python(params: Any) -> Callable[..., str]:
    return sandbox.Python(sandbox.Limits(timeout=params.python_timeout, memory=params.python_memory,
                                         output=params.python_output))


#: tool name -> (the tool built from the environment's parameters, its JSON schema, an example call's arguments)
TOOLS: dict[str, tuple[Callable[[Any], Callable[..., str]], dict, dict]] = {
    "calculator": (lambda params: calculator, CALCULATOR_SCHEMA, {"expression": "12*(3+4)"}),
    "python": (_python, sandbox.SCHEMA, {"code": "print(2**100)"}),
}


def tool_calls(text: str) -> list[str]:
    """The JSON bodies of the ``<tool_call>`` blocks in ``text``, in order."""
    return [m.group(1).strip() for m in CALL.finditer(text)]


def run_call(body: str, tools: dict[str, tuple[Callable[..., str], dict]]) -> str:
    """The result text of one call body (``{"name": ..., "arguments": {...}}``); ``tools``:
    name -> (function, schema)."""
    try:
        call = json.loads(body)
    except json.JSONDecodeError as e:
        return f"error: the tool call is not valid JSON ({e.msg})"
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return 'error: a tool call is {"name": <tool>, "arguments": {...}}'
    if call["name"] not in tools:
        return f"error: unknown tool '{call['name']}' (tools: {', '.join(tools)})"
    fn, schema = tools[call["name"]]
    args = call.get("arguments", {})
    if isinstance(args, str):  # some models send the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            args = None
    want = schema["function"]["parameters"]["properties"]
    if not isinstance(args, dict) or set(args) != set(want):
        return f"error: {call['name']} takes the arguments {', '.join(want)}"
    return fn(**args)


def instructions(names: tuple[str, ...]) -> str:
    """The text appended to prompts: the tools' schemas and the call format (an example call
    of the first tool)."""
    schemas = "\n".join(json.dumps(TOOLS[n][1]) for n in names)
    example = json.dumps({"name": names[0], "arguments": TOOLS[names[0]][2]})
    return ("\n\nYou may call these tools:\n" + schemas + f"\nTo call one, write <tool_call>{example}</tool_call> "
            "and stop; the result comes back in a tool message. Give the final answer without a tool call.")


class Tools:
    def __init__(self, params: Any):
        names = params.names()
        self.tools = {n: (TOOLS[n][0](params), TOOLS[n][1]) for n in names}
        self.suffix = instructions(names) if params.instructions else ""
        self.max_calls = params.max_calls

    def prompt(self, text: str) -> str:
        return text + self.suffix

    def start(self, row: dict) -> "ToolsEpisode":
        return ToolsEpisode(self.tools, self.max_calls)


class ToolsEpisode:
    def __init__(self, tools: dict[str, tuple[Callable[..., str], dict]], max_calls: int):
        self.tools = tools
        self.max_calls = max_calls

    def step(self, turn: Turn) -> Reply:
        """One ``tool`` message per call of the turn: the first ``max_calls`` are run, the rest
        answered with an error (so that a step stays within ``--env-timeout``)."""
        calls = tool_calls(turn.text)
        if not calls:
            return Reply(done=True)
        over = f"error: not run, at most {self.max_calls} tool calls per turn (--tools-max-calls)"
        return Reply(messages=tuple({"role": "tool", "content": run_call(c, self.tools) if i < self.max_calls else over}
                                    for i, c in enumerate(calls)))


def build(params, config) -> Tools:
    """``(ToolsParams, RunConfig) -> Tools`` (unknown tool names, and ``python`` where no sandbox
    can be set up, are refused at startup: ``ToolsParams.problems``).

    Raises:
        RuntimeError: ``python`` is asked for and no sandbox can be set up here."""
    if "python" in params.names() and (why := sandbox.problem()) is not None:
        raise RuntimeError(f"{why[0]}; fix: {why[1]}")
    return Tools(params)
