"""The ``relax`` command line (Typer + rich).

``relax --help``, ``relax plugins`` and ``relax capabilities`` never import torch: plugins
register specs only, and heavy modules are imported inside the commands that need them.
"""

from __future__ import annotations

import sys
from typing import Optional

import typer

from relax_core.run.exits import EXIT_BAD_INPUT, EXIT_ENVIRONMENT_FAILED
from relax_core.specs import KIND, KINDS

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Relax: plugin-based RL post-training for language models.")
plugins_app = typer.Typer(add_completion=False, rich_markup_mode=None,
                          help="List installed plugins, show one, or scaffold a new one.")
app.add_typer(plugins_app, name="plugins")


def _registry():
    from relax_core.host.plugins import PluginError, default_registry

    try:
        return default_registry()
    except PluginError as e:  # strict mode
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT)


def _version_callback(value: bool) -> None:
    if value:
        from relax_core import __version__

        typer.echo(f"relax-core {__version__}")
        for p in _registry().plugins:
            typer.echo(f"{p.dist} {p.version} ({p.name}{', ' + p.status if p.status != 'ok' else ''})")
        raise typer.Exit()


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=_version_callback, is_eager=True,
                                      help="Show core and plugin versions.")) -> None:
    """Relax: plugin-based RL post-training for language models."""


# --------------------------------------------------------------------------- train


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                               "help_option_names": []})
def train(ctx: typer.Context) -> None:
    """Train (or with --dry-run, validate).  `relax train --help` lists every flag."""
    from relax_core.run.launch import BadInput, configure, launch, preflight

    reg = _registry()
    try:
        cfg, resolved, ns = configure(list(ctx.args), reg)
    except BadInput as e:
        _print_problems(e.problems)
        raise typer.Exit(EXIT_BAD_INPUT)
    for w in resolved.warnings:
        typer.echo(f"relax: warning: {w}", err=True)

    if ns.dry_run:
        try:  # everything a real run checks before its first model loads, data included
            checked = preflight(cfg, resolved, reg)
        except BadInput as e:
            _print_problems(e.problems)
            raise typer.Exit(EXIT_BAD_INPUT)
        from relax_core.run.precision import resolve_bf16

        cfg, precision = resolve_bf16(cfg, resolved.context.backend.caps.bf16_devices)  # as the run would
        for line in checked.notes + [f"warning: {w}" for w in checked.warnings] + [precision] * bool(precision):
            typer.echo(f"relax: {line}", err=True)
        _print_dry_run(cfg, resolved, reg)
        return

    raise typer.Exit(launch(cfg, resolved, reg))


def _print_problems(lines: list[str]) -> None:
    from rich.console import Console

    console = Console(stderr=True, highlight=False, soft_wrap=True)
    console.print(f"[bold red]relax: {len(lines)} problem(s) with this configuration[/] (nothing was started):")
    for i, line in enumerate(lines, 1):
        console.print(f"{i}. {line}", markup=False)


def _print_dry_run(cfg, resolved, reg) -> None:
    import json

    from relax_core.config import config_to_dict
    from relax_core.data import data_sources, parse_data

    ctx = resolved.context
    chosen = {k: {"name": v.name, "origin": v.origin}
              for k, v in {"estimator": ctx.estimator, "engine": ctx.engine, "backend": ctx.backend,
                           "sampler": ctx.sampler, "environment": ctx.environment}.items() if v}
    if "auto" not in cfg.reward:
        chosen["reward"] = [{"name": r.spec.name, "origin": r.origin}
                            for r in (reg.get("reward", n) for n in cfg.reward)]
    sources = data_sources(reg)
    data = parse_data(cfg.data, sources)
    if data.kind == "source":
        r = sources[data.scheme]
        chosen["data_source"] = {"name": r.spec.name, "origin": r.origin}
    out = {
        "valid": True,
        "components": chosen,
        "corrections": [{"name": c.name, "origin": c.origin} for c in ctx.corrections],
        "reward_processors": [{"name": c.name, "origin": c.origin} for c in ctx.processors],
        "config": config_to_dict(cfg),
    }
    typer.echo(json.dumps(out, indent=2, default=str))


# --------------------------------------------------------------------------- plugins


@plugins_app.callback(invoke_without_command=True)
def plugins(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """List plugin distributions with version, path, components and load status."""
    if ctx.invoked_subcommand is not None:
        return
    reg = _registry()
    if as_json:
        import json
        typer.echo(json.dumps({"plugins": [p.as_dict() for p in reg.plugins], "problems": reg.problems}, indent=2))
        return
    import os

    from rich.console import Console

    rows = []
    for p in reg.plugins:
        comps = ", ".join(f"{n} ({k})" for k, n in p.components)
        status = p.status if p.status != "error" else f"error: {p.error}"
        path = os.path.relpath(p.path) if p.path and not os.path.relpath(p.path).startswith("..") else (p.path or "")
        rows.append({"plugin": p.name, "version": p.version, "status": status, "components": comps,
                     "distribution": p.dist, "path": path})
    console = Console()
    console.print(plugins_table(rows, console.width))
    for prob in reg.problems:
        console.print(f"problem: {prob}", markup=False)


#: ``relax plugins`` columns, most important first; names are never cut, the last columns are
#: dropped when the terminal is too narrow for them.
PLUGIN_COLUMNS = ("plugin", "status", "components", "version", "distribution", "path")
_NAME_COLUMNS = ("plugin", "distribution", "path")


def plugins_table(rows: list[dict[str, str]], width: int):
    """The ``relax plugins`` table for a terminal of ``width`` columns: names whole,
    components wrapped between words, and ``path``, ``distribution`` then ``version`` left
    out when they do not fit (``--json`` has everything)."""
    from rich.table import Table

    def need(col: str) -> int:
        if col == "components":  # wraps between words: its longest name
            return max([len(w) for r in rows for w in r[col].split()] + [len(col)])
        if col == "status":
            return max([len(r[col]) if r[col] == "ok" else 12 for r in rows] + [len(col)])
        return max([len(r[col]) for r in rows] + [len(col)])

    cols = list(PLUGIN_COLUMNS)
    while len(cols) > 3 and 1 + sum(need(c) + 3 for c in cols) > width:
        cols.pop()
    table = Table(title="relax plugins" + ("" if len(cols) == len(PLUGIN_COLUMNS) else
                                           f" (without {', '.join(PLUGIN_COLUMNS[len(cols):])}: see --json)"))
    for c in cols:
        table.add_column(c, no_wrap=c in _NAME_COLUMNS or c == "version", min_width=need(c))
    for r in rows:
        table.add_row(*(r[c] for c in cols))
    return table


@plugins_app.command("show")
def plugins_show(name: str, kind: Optional[str] = typer.Option(None, help="Disambiguate by kind.")) -> None:
    """Show one component: summary, source, parameters with defaults, capabilities."""
    import dataclasses

    from relax_core.config import param_flag
    from relax_core.host.capabilities import format_value

    reg = _registry()
    found = [r for r in reg.find(name) if kind is None or r.spec.kind == kind]
    if not found:
        broken = [p for p in reg.plugins if p.status == "error" and name in (p.name, p.dist)]
        for p in broken:
            typer.echo(f"error: plugin '{p.name}' ({p.dist} {p.version}) failed to load: {p.error}", err=True)
        if not broken:
            typer.echo(f"error: no component named '{name}' (see `relax plugins`)", err=True)
        raise typer.Exit(EXIT_BAD_INPUT)
    for r in found:
        s = r.spec
        typer.echo(f"{s.kind} {s.name}  ({r.origin}, plugin '{r.plugin.name}')")
        typer.echo(f"  {s.summary}")
        typer.echo(f"  source: {s.source}")
        if s.params is not None:
            fields = dataclasses.fields(s.params)
            rec = any("recommended" in f.metadata for f in fields)
            typer.echo("  parameters" + (" (flag = default; 'recommended' is the value the method's source or "
                                         "recipe suggests, shown for reference: the default is what runs):" if rec else ":"))
            for f in fields:
                m = f.metadata
                extra = [f"{k} {m[k]}" for k in ("ge", "gt", "le", "lt") if m.get(k) is not None]
                if m.get("choices"):
                    extra.append("one of " + ", ".join(map(str, m["choices"])))
                if m.get("unit"):
                    extra.append(f"unit {m['unit']}")
                if "recommended" in m:
                    why = f" (default differs: {m['why_default']})" if m.get("why_default") else ""
                    extra.append(f"recommended {m['recommended']!r}{why}")
                tail = f"  [{'; '.join(extra)}]" if extra else ""
                typer.echo(f"    {param_flag(s.name, f)} = {f.default!r}  {m.get('help', '')}{tail}")
        caps = s.capabilities_for()
        if caps is not None:
            typer.echo("  capabilities (defaults of the parameters):")
            for f in dataclasses.fields(caps):
                typer.echo(f"    {f.name}: {format_value(getattr(caps, f.name))}")


@plugins_app.command("new")
def plugins_new(
    name: str = typer.Argument(..., help="Component name, [a-z][a-z0-9_]* (package relax_<name>)."),
    kind: str = typer.Option(..., "--kind", help=", ".join(k.name for k in KINDS if k.scaffold) + "."),
    dest: Optional[str] = typer.Option(None, "--dir", help="Parent directory (default: current)."),
    summary: Optional[str] = typer.Option(None, "--summary", help="One-line description."),
) -> None:
    """Scaffold an installable plugin package relax-NAME (spec, implementation, tests, README)."""
    from relax_authoring.scaffold import write_plugin

    try:
        root = write_plugin(kind, name, dest, summary)
    except (ValueError, FileExistsError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT)
    typer.echo(f"wrote {root}\nnext: pip install -e {root} && pytest {root}/tests")


# --------------------------------------------------------------------------- capabilities


@app.command()
def capabilities(
    kind: Optional[str] = typer.Option(None, help=", ".join(k.name for k in KINDS) + "."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    markdown: bool = typer.Option(False, "--markdown", help="The docs page (docs/capabilities.md)."),
) -> None:
    """The capability matrix: one row per component and one column per capability when it
    fits the terminal; otherwise one row per capability and one column per component (in
    several tables if needed).  Names are never cut."""
    from cli.capabilities import matrix_json, matrix_markdown, matrix_tables

    if kind is not None and kind not in KIND:
        typer.echo(f"error: unknown kind '{kind}'; one of {', '.join(KIND)}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT)
    reg = _registry()
    if as_json:
        import json
        typer.echo(json.dumps(matrix_json(reg, kind), indent=2))
    elif markdown:
        typer.echo(matrix_markdown(reg, kind), nl=False)
    else:
        from rich.console import Console

        console = Console()
        for table in matrix_tables(reg, kind, width=console.width):
            console.print(table)


# --------------------------------------------------------------------------- eval


@app.command("eval")
def eval_(
    target: str = typer.Argument(..., metavar="MODEL_OR_RUN",
                                 help="A run directory (its final/ model), a checkpoint directory, a Hugging Face "
                                      "model directory or a model name."),
    eval_data: list[str] = typer.Option([], "--eval-data", help="NAME=SOURCE (repeatable): an evaluation set in "
                                        "any --data format; default: the run's evaluation data (or the default "
                                        "task's)."),
    checkpoint: Optional[str] = typer.Option(None, "--checkpoint", help="With a run directory: evaluate step_N "
                                             "of its checkpoints instead of final/."),
    n_samples: int = typer.Option(0, "--n-samples", "--eval-n-samples", min=0,
                                  help="Samples per prompt besides the greedy one (0: greedy pass@1 only)."),
    pass_k: list[int] = typer.Option([], "--pass-k", help="k of pass@k and maj@k (repeatable, <= --n-samples; "
                                     "default: 1 and --n-samples)."),
    temperature: float = typer.Option(1.0, "--eval-temperature", min=0.0, help="Temperature of the --n-samples samples."),
    top_p: float = typer.Option(1.0, "--eval-top-p", max=1.0,
                                help="Nucleus p of the --n-samples samples."),
    max_response_len: Optional[int] = typer.Option(None, "--eval-max-response-len", min=1,
                                                   help="Max new tokens per response (default: the run's "
                                                        "--rollout-max-response-len)."),
    max_prompts: Optional[int] = typer.Option(None, "--max-prompts", min=1, help="At most this many prompts per "
                                              "set, the first ones (default: all)."),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed of the --n-samples samples."),
    reward: Optional[str] = typer.Option(None, "--reward", help="Scorer for every set (default: the run's "
                                         "--reward, else each data source's)."),
    custom_rm_path: Optional[str] = typer.Option(None, "--custom-rm-path", help="pkg.module:function scorer "
                                                 "(runs that code with your rights)."),
    out: Optional[str] = typer.Option(None, "--out", help="Directory of eval.json and eval_samples.jsonl "
                                      "(default: <run>/eval/<final or step_N>, else ./eval-<model>)."),
    bf16: Optional[bool] = typer.Option(None, "--bf16/--no-bf16", help="The rollout engine in bfloat16 (an engine "
                                        "whose dtype is auto, as hf's); default: the run's decision, for a model "
                                        "on where the device computes bfloat16 natively (relax train's --bf16)."),
) -> None:
    """Score a model, checkpoint or run on evaluation sets: greedy pass@1, and with
    --n-samples mean accuracy, pass@k and maj@k, each with a 95% interval over prompts."""
    import os

    from rich.console import Console

    from cli.eval import EvalSettings, prepare, report_table, run_eval
    from relax_core.run.launch import BadInput
    from relax_core.stages.episodes import EnvironmentPromptError

    reg = _registry()
    settings = EvalSettings(n_samples=n_samples, pass_k=tuple(pass_k), temperature=temperature, top_p=top_p,
                            max_response_len=max_response_len, max_prompts=max_prompts, seed=seed)
    try:
        evaluated, sets, scorer, warnings = prepare(target, eval_data=eval_data, checkpoint=checkpoint,
                                                    settings=settings, reward=reward, custom_rm_path=custom_rm_path,
                                                    reg=reg, bf16=bf16)
    except BadInput as e:
        for p in e.problems:
            typer.echo(f"relax eval: error: {p}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT)
    for w in warnings:
        typer.echo(f"relax eval: warning: {w}", err=True)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        report, out_dir = run_eval(evaluated, sets, scorer, settings, reg, out)
    except EnvironmentPromptError as e:
        typer.echo(f"relax eval: error: {e}", err=True)
        raise typer.Exit(EXIT_ENVIRONMENT_FAILED)
    Console(highlight=False).print(report_table(report))
    typer.echo(f"wrote {out_dir / 'eval.json'} and {out_dir / 'eval_samples.jsonl'}")


# --------------------------------------------------------------------------- plot


@app.command()
def plot(
    run_dirs: list[str] = typer.Argument(..., help="Run directories (several are overlaid)."),
    metric: list[str] = typer.Option([], "--metric", help="Metric to plot (repeatable; a key of metrics.jsonl); "
                                     "default: reward (raw and smoothed), held-out evaluation, response length, and "
                                     "those of grad norm, entropy, clipfrac and KL that vary."),
    out: Optional[str] = typer.Option(None, "--out", help="PNG path (default: <run>/metrics.png for one run; "
                                      "plot-<run>_vs_<run>.png next to the first run for several)."),
) -> None:
    """Write a PNG of metrics against step (several runs overlaid) and print its path."""
    from cli.plot import PlotError, plot_runs

    try:
        path = plot_runs(run_dirs, metrics=metric or None, out=out)
    except PlotError as e:
        typer.echo(f"relax plot: error: {e}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT)
    typer.echo(str(path))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
