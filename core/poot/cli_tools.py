"""The tooling commands of ``poot``: ``profile`` (one step, launch by launch), ``check`` (the hardware
smoke check) and ``pod run`` (either of them, or any command, as a Ray job on a cluster)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import PootError

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


def cmd_pod(args: argparse.Namespace) -> int:
    from .pod import pod_run

    rest = list(args.args)
    if rest and rest[0] == "--":
        rest = rest[1:]
    if not rest:
        raise PootError("poot pod run needs a command after '--', e.g. poot pod run --address ADDR -- check --device cuda:0")
    bad = [kv for kv in args.env or [] if "=" not in kv]
    if bad:
        raise PootError(f"--env {bad[0]}: give NAME=VALUE")
    return pod_run(
        args.address,
        rest,
        gpus=args.gpus,
        cpus=args.cpus,
        tree=None if args.installed else Path(args.tree),
        results=Path(args.results) if args.results else None,
        timeout=args.timeout,
        env=dict(kv.split("=", 1) for kv in args.env or []),
        python=args.python,
    )


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

    pod = sub.add_parser("pod", help="run poot as a Ray job on a cluster (needs pip install 'poot[pod]')")
    podsub = pod.add_subparsers(dest="pod_command", metavar="COMMAND", required=True)
    pr_run = podsub.add_parser("run", help="ship this tree (or use the installed poot), run a poot command there, stream its logs, bring its results home")
    pr_run.add_argument("--address", required=True, help="the Ray cluster's job server, e.g. http://head:8265 (RAY_ADDRESS's form)")
    pr_run.add_argument("--gpus", type=float, default=0, help="GPUs the job asks for (default 0)")
    pr_run.add_argument("--cpus", type=float, default=1, help="CPUs the job asks for (default 1)")
    pr_run.add_argument("--tree", default=".", help="the poot source tree to ship (default: the current directory)")
    pr_run.add_argument("--installed", action="store_true", help="ship nothing: run the poot installed on the cluster")
    pr_run.add_argument("--results", metavar="DIR", default=None, help="where the job's result files land (default: pod-results/JOB_ID)")
    pr_run.add_argument("--timeout", type=float, default=3600, help="seconds to wait for the job before stopping it (default 3600)")
    pr_run.add_argument("--python", default="python", help="the interpreter that runs poot on the cluster (default: python)")
    pr_run.add_argument("--env", action="append", metavar="NAME=VALUE", help="an environment variable for the job (repeatable)")
    pr_run.add_argument("args", nargs=argparse.REMAINDER, help="-- then the poot command to run there: check ..., bench MODEL ..., profile MODEL ...")
    pr_run.set_defaults(func=cmd_pod)
