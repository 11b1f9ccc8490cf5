"""The plugin host: a pluggy PluginManager over the ``poot`` entry-point group.

Plugins load once per process, on first use. ``POOT_PLUGINS`` (comma-separated entry-point or
distribution names) restricts which load. A plugin that fails to import or to register is recorded
with its error and skipped; the others still load. The plugin manager is the only process-wide state.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from importlib.metadata import EntryPoint, entry_points

import pluggy

from . import hookspecs

__all__ = ["PluginInfo", "PluginHost", "host", "ENTRY_POINT_GROUP"]

ENTRY_POINT_GROUP = "poot"
CORE_PLUGIN = "poot.core"


@dataclass(frozen=True)
class PluginInfo:
    """One plugin as found: its entry point, where it comes from, and whether it loaded."""

    name: str
    distribution: str
    version: str
    module: str
    status: str  # "loaded" | "failed" | "filtered"
    error: str = ""


class PluginHost:
    """Loads and holds the plugins; ``hook`` calls them."""

    def __init__(self, only: str | None = None) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.infos: list[PluginInfo] = []
        self._register_core()
        wanted = {w.strip().lower() for w in only.split(",") if w.strip()} if only else None
        for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            self._load(ep, wanted)

    def _register_core(self) -> None:
        from .quant import builtin

        self.pm.register(builtin, name=CORE_PLUGIN)
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("poot")
        except PackageNotFoundError:  # running from a source tree
            v = "dev"
        self.infos.append(PluginInfo(CORE_PLUGIN, "poot", v, builtin.__name__, "loaded"))

    def _load(self, ep: EntryPoint, wanted: set[str] | None) -> None:
        dist = ep.dist.name if ep.dist is not None else "?"
        ver = ep.dist.version if ep.dist is not None else "?"
        if wanted is not None and ep.name.lower() not in wanted and dist.lower() not in wanted:
            self.infos.append(PluginInfo(ep.name, dist, ver, ep.value, "filtered", "not in POOT_PLUGINS"))
            return
        if self.pm.has_plugin(ep.name):
            self.infos.append(PluginInfo(ep.name, dist, ver, ep.value, "failed", f"plugin name '{ep.name}' is taken"))
            return
        try:
            obj = ep.load()
            self.pm.register(obj, name=ep.name)
        except Exception as e:  # noqa: BLE001 - a broken plugin must not take the others down
            last = traceback.extract_tb(e.__traceback__)[-1:] if e.__traceback__ else []
            where = f" ({last[0].filename}:{last[0].lineno})" if last else ""
            msg = f"{type(e).__name__}: {e}{where}"
            self.infos.append(PluginInfo(ep.name, dist, ver, ep.value, "failed", msg))
            return
        unknown = self._unknown_hooks(obj)
        if unknown:  # a misspelled hook would otherwise register and never be called
            self.pm.unregister(obj)
            self.infos.append(PluginInfo(ep.name, dist, ver, ep.value, "failed", "; ".join(unknown)))
            return
        self.pm.check_pending()
        self.infos.append(PluginInfo(ep.name, dist, ver, ep.value, "loaded"))

    def _unknown_hooks(self, plugin: object) -> list[str]:
        """What pluggy's ``check_pending`` reports, for one plugin and in words: each implementation
        of a hook that no specification declares (and that is not marked optional), with the
        nearest real hook name."""
        import difflib

        known = sorted(name for name in dir(hookspecs) if name.startswith("poot_"))
        out = []
        for caller in self.pm.get_hookcallers(plugin) or []:
            if caller.has_spec():
                continue
            for impl in caller.get_hookimpls():
                if impl.plugin is plugin and not impl.optionalhook:
                    near = difflib.get_close_matches(caller.name, known, n=1)
                    out.append(f"it implements '{caller.name}', which is no poot hook" + (f" (did it mean '{near[0]}'?)" if near else ""))
        return out

    @property
    def hook(self) -> pluggy.HookRelay:
        return self.pm.hook

    def plugin_name(self, impl_plugin: object) -> str:
        return self.pm.get_name(impl_plugin) or repr(impl_plugin)

    def call_each(self, hook_name: str) -> list[tuple[str, object]]:
        """Call ``hook_name`` on each plugin separately: [(plugin name, result)], and a raising plugin
        yields a PluginError result instead of stopping the others."""
        return list(self.iter_each(hook_name))

    def iter_each(self, hook_name: str) -> Iterator[tuple[str, object]]:
        """``call_each`` one plugin at a time, each called only when the one before has been taken
        (a caller that finds what it wants early spares the other plugins' probes)."""
        from .errors import PluginError

        caller = getattr(self.pm.hook, hook_name)
        for impl in caller.get_hookimpls():
            name = impl.plugin_name
            try:
                res = impl.function()
            except Exception as e:  # noqa: BLE001
                res = PluginError(f"plugin '{name}' failed in {hook_name}: {type(e).__name__}: {e}")
            yield name, res


@lru_cache(maxsize=None)
def _host(only: str | None) -> PluginHost:
    return PluginHost(only)


def host() -> PluginHost:
    """The process's plugin host, honouring ``POOT_PLUGINS`` (read when first called for a value)."""
    return _host(os.environ.get("POOT_PLUGINS") or None)
