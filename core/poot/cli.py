"""The ``poot`` command line."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import textwrap
from collections.abc import Sequence

from .errors import PootError

__all__ = ["main"]


def _table(rows: list[list[str]], header: list[str]) -> str:
    width = shutil.get_terminal_size((120, 20)).columns
    cols = list(zip(*([header] + rows))) if rows else [[h] for h in header]
    widths = [max(len(c) for c in col) for col in cols]
    fixed = sum(widths[:-1]) + 2 * (len(widths) - 1)
    last = max(30, width - fixed)
    lines = []
    for r in [header] + rows:
        head = "  ".join(c.ljust(w) for c, w in zip(r[:-1], widths[:-1]))
        wrapped = textwrap.wrap(r[-1], last) or [""]
        lines.append((head + "  " + wrapped[0]).rstrip())
        lines += [(" " * (fixed + 2) + w).rstrip() for w in wrapped[1:]]
    return "\n".join(lines)


def cmd_devices(args: argparse.Namespace) -> int:
    from .runtime import list_devices

    devices = list_devices()
    if args.json:
        out = []
        for d in devices:
            caps = d.capabilities
            out.append(
                {
                    "name": d.name,
                    "kind": d.kind,
                    "plugin": d.plugin,
                    "available": bool(d.available()),
                    "reason": None if d.unavailable is None else {"code": d.unavailable.code, "message": d.unavailable.message},
                    "description": d.description,
                    "target": d.target,
                    "capabilities": None
                    if caps is None
                    else {
                        "dtypes": sorted(caps.dtypes),
                        "compute_units": caps.compute_units,
                        "max_workgroup_size": caps.max_workgroup_size,
                        "shared_memory_bytes": caps.shared_memory_bytes,
                        "subgroup_size": caps.subgroup_size,
                        "memory_bytes": caps.memory_bytes,
                        "vector_bits": caps.vector_bits,
                        "matrix_ops": sorted(caps.matrix_ops),
                        "details": dict(caps.details),
                    },
                }
            )
        print(json.dumps(out, indent=2))
        return 0
    rows = []
    for d in devices:
        ok = d.available()
        detail = d.description
        if ok and d.capabilities is not None:
            detail += " — " + d.capabilities.summary()
        elif not ok:
            detail = str(d.unavailable)
        rows.append([d.name, "available" if ok else "unavailable", d.plugin, d.target or "-", detail])
    print(_table(rows, ["DEVICE", "STATUS", "PLUGIN", "TARGET", "DETAILS"]))
    if not devices:
        print("no devices: install a backend plugin, e.g. `pip install poot-cpu`")
    return 0


def cmd_plugins(args: argparse.Namespace) -> int:
    from .plugins import host

    infos = host().infos
    if args.json:
        print(json.dumps([i.__dict__ for i in infos], indent=2))
        return 0
    rows = [[i.name, i.distribution, i.version, i.status, i.error or i.module] for i in infos]
    print(_table(rows, ["PLUGIN", "DISTRIBUTION", "VERSION", "STATUS", "MODULE / ERROR"]))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="poot", description="Compile and run language models on any installed device.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    d = sub.add_parser("devices", help="list devices, their capabilities, and why any cannot run here")
    d.add_argument("--json", action="store_true", help="machine-readable output")
    d.set_defaults(func=cmd_devices)
    pl = sub.add_parser("plugins", help="list installed plugins and any that failed to load")
    pl.add_argument("--json", action="store_true", help="machine-readable output")
    pl.set_defaults(func=cmd_plugins)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except PootError as e:
        print(f"poot: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
