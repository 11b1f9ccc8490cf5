"""The ``poot`` command line."""

from __future__ import annotations

import argparse
import json
import os
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


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _fmt_value(v: object) -> str:
    import numpy as np

    if isinstance(v, (list, np.ndarray)):
        head = ", ".join(repr(x) if isinstance(x, str) else str(x) for x in list(v[:3]))
        return f"[{len(v)} items: {head}{', ...' if len(v) > 3 else ''}]"
    s = repr(v) if isinstance(v, str) else str(v)
    return s if len(s) <= 100 else s[:97] + "..."


def cmd_inspect(args: argparse.Namespace) -> int:
    from .load import open_model

    ck = open_model(args.model)
    wm = ck.weights
    print(f"model        {ck.path}")
    print(f"format       {ck.format} ({len(ck.files)} file{'s' if len(ck.files) != 1 else ''})")
    print(f"architecture {ck.architecture}")
    print(f"tokenizer    {'yes' if ck.has_tokenizer else 'no'}")
    print(f"chat template {'yes' if ck.chat_template else 'no'}")
    print(f"layers       {wm.n_layers}{' (output tied to token embedding)' if wm.tied_output else ''}")
    if not args.no_metadata:
        print("\nmetadata")
        for k, v in ck.metadata.items():
            if k == "tokenizer.chat_template" or k == "tokenizer_config":
                continue
            print(f"  {k:40s} {_fmt_value(v)}")
    roles = {n: r for r, n in wm.names.items()}
    rows, totals = [], {}
    for name, t in ck.tensors.items():
        r = roles.get(name)
        rows.append([name, str(r.name) if r else "UNKNOWN", t.storage, "x".join(map(str, t.shape)), _fmt_bytes(t.info.nbytes)])
        n, b = totals.get(t.storage, (0, 0))
        totals[t.storage] = (n + 1, b + t.info.nbytes)
    if not args.no_tensors:
        print()
        print(_table(rows, ["TENSOR", "ROLE", "TYPE", "SHAPE", "BYTES"]))
    print("\ntotals")
    for st, (n, b) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
        print(f"  {st:8s} {n:5d} tensors  {_fmt_bytes(b)}")
    print(f"  {'all':8s} {len(ck.tensors):5d} tensors  {_fmt_bytes(sum(b for _, b in totals.values()))}")
    if wm.unknown:
        print(f"\nunknown tensors (no role): {', '.join(wm.unknown)}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    import time

    from .llm import SimpleGenerator

    t0 = time.perf_counter()
    print(f"poot: loading {args.model} and compiling its step for {args.device or 'the default device'} ...", file=sys.stderr, flush=True)
    gen = SimpleGenerator(args.model, args.device, max_context=args.context)
    ids = gen.prompt(args.prompt, raw=args.raw)
    print(f"poot: ready in {time.perf_counter() - t0:.1f} s on {gen.device.name}; prompt of {len(ids)} tokens", file=sys.stderr, flush=True)
    t1, n = time.perf_counter(), 0
    for piece in gen.generate(ids, args.max_tokens):
        n += 1
        print(piece, end="", flush=True)
    print()
    st = gen.stats
    print(f"poot: {time.perf_counter() - t1:.1f} s of generation (greedy): prompt {st['prompt_tokens']} tokens at "
          f"{st['prompt_tokens'] / max(st['prefill_s'], 1e-9):.0f} tok/s, {st['new_tokens']} new at {st['new_tokens'] / max(st['decode_s'], 1e-9):.0f} tok/s",
          file=sys.stderr)
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    import numpy as np

    from .graph.passes import DEFAULT_PASSES, PassManager
    from .load import open_model
    from .models import StepShapes, family_for
    from .models.decoder import StepBatch
    from .plan import compile_plan, plan_storage
    from .runtime import get_device
    from .runtime.executor import step_env

    if args.tokens < 1 or args.context < args.tokens:
        raise PootError(f"--tokens must be at least 1 and at most --context ({args.tokens}, {args.context})")
    device = get_device(args.device)
    ck = open_model(args.model)
    fam = family_for(ck.architecture)
    bs = 16
    graph = PassManager(DEFAULT_PASSES).run(fam.trace(fam.parse_config(ck), ck.weights, StepShapes(block_size=bs)))
    plan = compile_plan(graph, device)
    n, blocks = args.tokens, -(-args.context // bs)
    pos = np.arange(args.context - n, args.context)
    batch = StepBatch(np.zeros(n), pos, np.zeros(n), pos, np.array([args.context]), np.arange(blocks).reshape(1, -1), np.array([n - 1]))
    shapes = {name: np.empty((blocks,) + tuple(d.value for d in v.shape[1:]), np.float32) for name, v in graph.inputs().items() if name not in batch.as_inputs()}
    env = step_env(plan, {**batch.as_inputs(), **shapes})
    print(plan.describe(env))
    sp = plan_storage(plan, env)
    weights = sum(t.info.nbytes for t in ck.weights.tensors.values())
    print(f"\nstorage: activation arena {_fmt_bytes(sp.arena_bytes)} (values alive at once at most {_fmt_bytes(sp.live_bytes)}), "
          f"step inputs {_fmt_bytes(sum(sp.nbytes(k, graph.inputs()[nm].dtype) for nm, k in sp.inputs.items()))}, "
          f"KV pools {_fmt_bytes(sum(a.nbytes for a in shapes.values()))} for {args.context} positions, weights {_fmt_bytes(weights)} (bound in place)")
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
    ins = sub.add_parser("inspect", help="metadata, architecture and tensor table of a checkpoint")
    ins.add_argument("model", help="a .gguf file, a safetensors model directory, or a catalog model (SmolLM2, gemma3)")
    ins.add_argument("--no-tensors", action="store_true", help="leave out the tensor table")
    ins.add_argument("--no-metadata", action="store_true", help="leave out the metadata")
    ins.set_defaults(func=cmd_inspect)
    pn = sub.add_parser("plan", help="the compiled plan of one step: launches, kernels, grids, storage")
    pn.add_argument("model", help="a .gguf file, a safetensors model directory, or a catalog model (SmolLM2, gemma3)")
    pn.add_argument("--tokens", type=int, default=1, help="tokens in the step (1: a decode step)")
    pn.add_argument("--context", type=int, default=512, help="context the step sees, in tokens")
    pn.add_argument("--device", default=None, help="device name (default: POOT_DEVICE or cpu)")
    pn.set_defaults(func=cmd_plan)
    run = sub.add_parser("run", help="generate text from a prompt (greedy; chat template applied unless --raw)")
    run.add_argument("model", help="a .gguf file, a safetensors model directory, or a catalog model (SmolLM2, gemma3)")
    run.add_argument("prompt")
    run.add_argument("--device", default=None, help="device name (default: POOT_DEVICE or cpu)")
    run.add_argument("--max-tokens", type=int, default=32)
    run.add_argument("--context", type=int, default=512, help="KV cache size in tokens")
    run.add_argument("--raw", action="store_true", help="plain completion: no chat template")
    run.set_defaults(func=cmd_run)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except BrokenPipeError:  # output piped into head and the like
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps interpreter shutdown quiet
        return 0
    except PootError as e:
        print(f"poot: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
