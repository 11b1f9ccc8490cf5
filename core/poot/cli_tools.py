"""The tooling commands of ``poot``: ``profile`` (one step, launch by launch) and ``check`` (the
hardware smoke check)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["add_tool_commands"]


def cmd_profile(args: argparse.Namespace) -> int:
    from .cli import _load
    from .profile import format_profile, plot_roofline, profile_step, write_trace

    step_tokens = args.batch * args.tokens if args.tokens > 1 else args.batch
    m = _load(args, max_seqs=max(args.batch, 1), max_step_tokens=max(512, step_tokens), threads=args.threads)
    try:
        print(f"poot: profiling on {m.device.name}", file=sys.stderr, flush=True)
        p = profile_step(m, tokens=args.tokens, batch=args.batch, prompt=args.prompt, repeat=args.repeat)
    finally:
        m.close()
    print(format_profile(p, args.top))
    if args.trace:
        print(f"trace: {write_trace(p, args.trace)} (open it in ui.perfetto.dev or chrome://tracing)")
    if args.plot:
        print(f"roofline: {plot_roofline(p, args.plot)}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from .check import run_check

    return run_check(args.device, model=args.model, parts=args.only, out=args.out, quick=args.quick)


def add_tool_commands(sub: Any, model_args: Callable[[argparse.ArgumentParser], None]) -> None:
    from .cli import _at_least

    pr = sub.add_parser("profile", help="one step, launch by launch: time, bytes, bandwidth and FLOP rate against the device's peak")
    model_args(pr)
    pr.add_argument("--tokens", type=_at_least(1), default=1, help="tokens each sequence brings to the step: 1 profiles decode, more a prefill")
    pr.add_argument("--batch", type=_at_least(1), default=1, help="sequences in the step")
    pr.add_argument("--prompt", type=_at_least(1), default=128, help="for decode: the prompt tokens already in each sequence's cache")
    pr.add_argument("--repeat", type=_at_least(1), default=5, help="timed runs; medians are shown")
    pr.add_argument("--threads", type=_at_least(1), default=None, help="CPU threads (default: POOT_THREADS or every core)")
    pr.add_argument("--top", type=_at_least(1), default=None, help="list only the N longest launches (the families cover all)")
    pr.add_argument("--trace", metavar="FILE", help="write a Chrome/Perfetto trace of the launches (JSON)")
    pr.add_argument("--plot", metavar="FILE", help="draw the launches on a roofline (PNG; needs pip install 'poot[plot]')")
    pr.set_defaults(func=cmd_profile)

    ck = sub.add_parser("check", help="does poot work on this device: kernels, models and a real checkpoint against the CPU, and a short benchmark")
    ck.add_argument("--device", default=None, help="device to check (default: POOT_DEVICE or cpu)")
    ck.add_argument(
        "--model", default=None, help="the real checkpoint whose greedy tokens must equal the CPU device's (default: the first catalog model installed)"
    )
    ck.add_argument("--only", nargs="+", choices=("kernels", "models", "checkpoint", "bench"), default=None, help="run only these parts (default: all four)")
    ck.add_argument("--out", metavar="DIR", default=None, help="also write the results as DIR/check.json")
    ck.add_argument("--quick", action="store_true", help="fewer kernel shapes and tokens: a first look in under a minute")
    ck.set_defaults(func=cmd_check)
