"""The ``tools`` environment: the model calls tools, reads their results, then answers.

Call format (Hermes function calling, the tool format of the Qwen2.5/Qwen3 and Hermes chat
templates), one or more per model turn::

    <tool_call>{"name": "calculator", "arguments": {"expression": "12*(3+4)"}}</tool_call>

A turn with calls gets one ``tool`` message per call (its result, or ``error: <why>`` for an
unknown tool, bad JSON or missing arguments), rendered by the host through the chat template
(a template with a ``tool`` role renders it its way, e.g. Qwen's ``<tool_response>``).  A turn
without a call is the final answer: the episode ends and the run's scorer scores it.  A
closing ``</tool_call>`` may be missing at the end of a turn (the model stopped at EOS).

With ``--tools-instructions`` (default on), every prompt gets the tool descriptions and the
call format appended (the documented fallback for chat templates without a tool format,
such as SmolLM2's); the template-native rendering of tool descriptions is not used yet.
"""

from __future__ import annotations

import json
import re
from typing import Callable

from relax_core.environments import Reply, Turn
from relax_tools.calculator import SCHEMA as CALCULATOR_SCHEMA, calculator

CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
#: tool name -> (function of the keyword arguments, JSON schema)
TOOLS: dict[str, tuple[Callable[..., str], dict]] = {"calculator": (calculator, CALCULATOR_SCHEMA)}


def tool_calls(text: str) -> list[str]:
    """The JSON bodies of the ``<tool_call>`` blocks in ``text``, in order."""
    return [m.group(1).strip() for m in CALL.finditer(text)]


def run_call(body: str, tools: dict[str, tuple[Callable[..., str], dict]]) -> str:
    """The result text of one call body (``{"name": ..., "arguments": {...}}``)."""
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


def instructions(tools: dict[str, tuple[Callable[..., str], dict]]) -> str:
    """The text appended to prompts: the tools' schemas and the call format."""
    schemas = "\n".join(json.dumps(schema) for _, schema in tools.values())
    return ("\n\nYou may call these tools:\n" + schemas + "\nTo call one, write "
            '<tool_call>{"name": "calculator", "arguments": {"expression": "12*(3+4)"}}</tool_call> and stop; '
            "the result comes back in a tool message. Give the final answer without a tool call.")


class Tools:
    def __init__(self, names: tuple[str, ...], with_instructions: bool):
        self.tools = {n: TOOLS[n] for n in names}
        self.suffix = instructions(self.tools) if with_instructions else ""

    def prompt(self, text: str) -> str:
        return text + self.suffix

    def start(self, row: dict) -> "ToolsEpisode":
        return ToolsEpisode(self.tools)


class ToolsEpisode:
    def __init__(self, tools: dict[str, tuple[Callable[..., str], dict]]):
        self.tools = tools

    def step(self, turn: Turn) -> Reply:
        calls = tool_calls(turn.text)
        if not calls:
            return Reply(done=True)
        return Reply(messages=tuple({"role": "tool", "content": run_call(c, self.tools)} for c in calls))


def build(params, config) -> Tools:
    """``(ToolsParams, RunConfig) -> Tools`` (unknown tool names are refused at startup:
    ``ToolsParams.problems``)."""
    return Tools(params.names(), params.instructions)
