"""The plugin host: loads ``relax.plugins`` entry points, one at a time, into a registry.

A plugin that fails to import (or implements a misspelled hook, or returns a malformed
spec) is recorded with its distribution, version and error and does not break the
others: ``relax --help`` and ``relax plugins`` keep working, and selecting one of its
components fails ``relax train`` with that error.  ``RELAX_STRICT_PLUGINS=1`` makes any
broken plugin fatal.  ``RELAX_LOAD_PLUGINS=a,b`` loads only those plugins and
``RELAX_DISABLE_PLUGINS=a,b`` skips those (entry-point or distribution names).  Two
distributions registering the same component name is an error naming both.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.metadata as md
import os
import re
import traceback
from dataclasses import dataclass, field
from typing import Any, Iterable

import pluggy

from relax_core import hookspecs
from relax_core.batch import declare
from relax_core.specs import SPEC_TYPES, ComponentSpec, api_version_problem

ENTRY_POINT_GROUP = "relax.plugins"
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")


class PluginError(Exception):
    """A plugin problem that stops a run (strict mode, duplicates, unknown component)."""


@dataclass
class PluginInfo:
    """One loaded (or failed) plugin."""

    name: str
    dist: str
    version: str
    path: str | None
    status: str = "ok"  # ok | error | disabled
    error: str | None = None
    components: list[tuple[str, str]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "distribution": self.dist, "version": self.version,
                "path": self.path, "status": self.status, "error": self.error,
                "components": [{"kind": k, "name": n} for k, n in self.components]}


@dataclass(frozen=True)
class Registered:
    """A component with where it came from."""

    spec: ComponentSpec
    plugin: PluginInfo

    @property
    def origin(self) -> str:
        return f"{self.plugin.dist} {self.plugin.version}"


@dataclass
class Registry:
    """Components by kind and name, the plugins they came from, and load problems."""

    components: dict[str, dict[str, Registered]] = field(default_factory=lambda: {k: {} for k in SPEC_TYPES})
    plugins: list[PluginInfo] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def names(self, kind: str) -> list[str]:
        return list(self.components[kind])

    def get(self, kind: str, name: str) -> Registered:
        """The component ``name`` of ``kind``.

        Raises:
            PluginError: unknown name (with the closest valid one and, if a broken plugin
                might provide it, that plugin's error).
        """
        try:
            return self.components[kind][name]
        except KeyError:
            pass
        valid = self.names(kind)
        close = difflib.get_close_matches(name, valid, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        broken = [p for p in self.plugins if p.status == "error"]
        extra = "".join(f"\n  plugin '{p.name}' ({p.dist} {p.version}) failed to load: {p.error}" for p in broken)
        disabled = [p.name for p in self.plugins if p.status == "disabled"]
        if disabled:
            extra += (f"\n  not loaded (RELAX_LOAD_PLUGINS / RELAX_DISABLE_PLUGINS): {', '.join(disabled)}")
        raise PluginError(f"unknown {kind} '{name}'. Available: {', '.join(valid) or '(none)'}.{hint}{extra}")

    def param_schemas(self) -> dict[str, type]:
        out: dict[str, type] = {}
        for kind in self.components.values():
            for name, reg in kind.items():
                if reg.spec.params is not None:
                    out[name] = reg.spec.params
        return out

    def find(self, name: str) -> list[Registered]:
        return [kind[name] for kind in self.components.values() if name in kind]


def _env_list(var: str) -> set[str] | None:
    raw = os.environ.get(var)
    if raw is None:
        return None
    return {x.strip() for x in raw.split(",") if x.strip()}


def _dist_info(ep: md.EntryPoint) -> tuple[str, str, str | None]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return ("(unknown)", "?", None)
    path = None
    try:
        origin = dist.locate_file("")
        path = str(origin)
    except Exception:  # pragma: no cover - exotic installers
        pass
    return dist.metadata["Name"], dist.version, path


def _check_hooks(pm: pluggy.PluginManager, plugin: Any) -> list[str]:
    """Problems with the plugin's ``relax_*`` functions: hook implementations that match
    no hook spec (misspelled), and hook-named functions missing ``@relax_core.hookimpl``."""
    bad = []
    valid = list(hookspecs.HOOK_KINDS)
    for attr in dir(plugin):
        if not attr.startswith("relax_"):
            continue
        marked = pm.parse_hookimpl_opts(plugin, attr) is not None
        if marked and attr not in hookspecs.HOOK_KINDS:
            bad.append(f"unknown hook '{attr}'{_did_you_mean(attr, valid)}")
        elif not marked and attr.startswith("relax_register_") and callable(getattr(plugin, attr, None)):
            bad.append(f"'{attr}' is not marked with @relax_core.hookimpl{_did_you_mean(attr, valid)}")
    return bad


def _did_you_mean(name: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(name, valid, n=1)
    return f" (did you mean '{close[0]}'?)" if close and close[0] != name else ""


def spec_problems(spec: ComponentSpec, kind: str) -> list[str]:
    """Cheap structural checks of one spec, run when a plugin loads and by the contract kit
    (which checks more)."""
    out = []
    if not _NAME_RE.match(spec.name):
        out.append(f"component name {spec.name!r} must match [a-z][a-z0-9_]*")
    if spec.params is not None and not dataclasses.is_dataclass(spec.params):
        out.append(f"{kind} '{spec.name}': params must be a dataclass, got {spec.params!r}")
    caps, want = spec.capabilities, type(spec).capabilities_type
    if want is not None and caps is not None and not isinstance(caps, want) and not callable(caps):
        out.append(f"{kind} '{spec.name}': capabilities must be a {want.__name__} or a callable "
                   f"params -> {want.__name__}, got {type(caps).__name__}")
    if ":" not in spec.factory:
        out.append(f"{kind} '{spec.name}': factory must be 'package.module:callable', got {spec.factory!r}")
    labels = getattr(spec, "auto_labels", None)
    if labels is not None and (not isinstance(labels, str) or ":" not in labels):
        out.append(f"{kind} '{spec.name}': auto_labels must be 'package.module:predicate', got {labels!r}")
    for field_name in ("file_keys", "fixes"):
        values = getattr(spec, field_name, ())
        if not isinstance(values, tuple) or not all(isinstance(v, str) and v for v in values):
            out.append(f"{kind} '{spec.name}': {field_name} must be a tuple of non-empty strings, got {values!r}")
    if not isinstance(getattr(spec, "suggest", ""), str):
        out.append(f"{kind} '{spec.name}': suggest must be a string, got {spec.suggest!r}")
    return out


def _collect(pm: pluggy.PluginManager, plugin: Any, info: PluginInfo) -> list[tuple[str, ComponentSpec]]:
    """Call each registration hook of one plugin and validate what it returns."""
    out: list[tuple[str, ComponentSpec]] = []
    for hook_name, kind in hookspecs.HOOK_KINDS.items():
        impl = getattr(plugin, hook_name, None)
        if impl is None or pm.parse_hookimpl_opts(plugin, hook_name) is None:
            continue
        specs = impl()
        if specs is None:
            continue
        if isinstance(specs, ComponentSpec):
            specs = [specs]
        for spec in specs:
            want = SPEC_TYPES[kind]
            if not isinstance(spec, want):
                raise TypeError(f"{hook_name} returned {type(spec).__name__}, expected {want.__name__}")
            why = api_version_problem(kind, spec.api_version)
            if why:
                raise ValueError(
                    f"{kind} '{spec.name}' declares api_version {spec.api_version}; {why}: upgrade relax-core or "
                    f"install a version of {info.dist} written for it")
            problems = spec_problems(spec, kind)
            if problems:
                raise ValueError("; ".join(problems))
            out.append((kind, spec))
    return out


def load_registry(
    plugins: Iterable[tuple[Any, ...]] = (),
    *,
    entry_points: bool = True,
    strict: bool | None = None,
) -> Registry:
    """Build a registry from the installed entry points and/or given plugin objects.

    Args:
        plugins: extra plugins registered directly, without entry points (tests and
            throwaway plugins): ``(name, obj)`` or ``(name, obj, distribution, version)``,
            where ``obj`` is a module, an object with hook methods, or a module path
            imported here (an import error then marks the plugin broken, as for an
            entry point); the distribution defaults to ``(local)``.
        entry_points: also load the ``relax.plugins`` entry points.
        strict: fail on any broken plugin (default: ``RELAX_STRICT_PLUGINS=1``).

    Plugin selection: ``RELAX_LOAD_PLUGINS`` / ``RELAX_DISABLE_PLUGINS`` (comma lists of
    plugin or distribution names); the rest are listed with status ``disabled``.

    Raises:
        PluginError: in strict mode, on the first broken plugin or on a duplicate name.
    """
    if strict is None:
        strict = os.environ.get("RELAX_STRICT_PLUGINS", "") not in ("", "0")
    only = _env_list("RELAX_LOAD_PLUGINS")
    skip = _env_list("RELAX_DISABLE_PLUGINS") or set()

    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    reg = Registry()

    candidates: list[tuple[PluginInfo, Any]] = []  # (info, loader)
    if entry_points:
        for ep in sorted(md.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            dist, version, path = _dist_info(ep)
            candidates.append((PluginInfo(ep.name, dist, version, path), ep.load))
    for name, obj, *dist in plugins:
        dist_name, version = (list(dist) + ["(local)", "-"][len(dist):])[:2]
        loader = (lambda obj=obj: importlib.import_module(obj)) if isinstance(obj, str) else (lambda obj=obj: obj)
        candidates.append((PluginInfo(name, dist_name, version, getattr(obj, "__file__", None)), loader))

    for info, loader in candidates:
        reg.plugins.append(info)
        if (only is not None and info.name not in only and info.dist not in only) or info.name in skip or info.dist in skip:
            info.status = "disabled"
            continue
        plugin = None
        try:
            plugin = loader()
            bad = _check_hooks(pm, plugin)
            if bad:
                raise ValueError("; ".join(bad))
            pm.register(plugin, name=info.name)  # checks hook signatures against the specs
            specs = _collect(pm, plugin, info)
            for _, spec in specs:  # the plugin's batch fields join the schema
                for f in spec.fields:
                    declare(dataclasses.replace(f, declared_by=info.dist))
            info.path = getattr(plugin, "__file__", None) or info.path
        except Exception as e:  # a broken plugin must not break the others
            if plugin is not None and pm.is_registered(plugin):
                pm.unregister(plugin)
            info.status = "error"
            info.error = f"{type(e).__name__}: {e}"
            if os.environ.get("RELAX_DEBUG_PLUGINS"):
                info.error += "\n" + traceback.format_exc()
            if strict:
                raise PluginError(f"plugin '{info.name}' ({info.dist} {info.version}) failed to load: {info.error}") from e
            continue
        for kind, spec in specs:
            existing = reg.components[kind].get(spec.name)
            if existing is not None:
                msg = (f"{kind} '{spec.name}' is registered by two distributions: "
                       f"{existing.plugin.dist} {existing.plugin.version} (plugin '{existing.plugin.name}') and "
                       f"{info.dist} {info.version} (plugin '{info.name}'). Uninstall one, or disable one with "
                       f"RELAX_DISABLE_PLUGINS={info.name}")
                reg.problems.append(msg)
                continue
            clash = next((r for k, comps in reg.components.items() if k != kind and (r := comps.get(spec.name))
                          and r.spec.params is not None), None)
            if clash is not None and spec.params is not None:
                msg = (f"{kind} '{spec.name}' ({info.dist} {info.version}) and {clash.spec.kind} '{spec.name}' "
                       f"({clash.plugin.dist} {clash.plugin.version}) both take parameters, which flags and YAML "
                       f"address by component name: rename one, or disable one with RELAX_DISABLE_PLUGINS={info.name}")
                reg.problems.append(msg)
                continue
            reg.components[kind][spec.name] = Registered(spec, info)
            info.components.append((kind, spec.name))
    pm.check_pending()  # safety net: _check_hooks already refused unknown hooks
    if strict and reg.problems:
        raise PluginError("\n".join(reg.problems))
    return reg


_DEFAULT: Registry | None = None


def default_registry() -> Registry:
    """The process-wide registry from the installed entry points (loaded once)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = load_registry()
    return _DEFAULT
