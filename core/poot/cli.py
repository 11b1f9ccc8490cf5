"""The ``poot`` command line."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .errors import ParameterError, PootError

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
    from .runtime import list_devices, null_devices

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
                        "subgroup_ops": caps.subgroup_ops,
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
    nulls = null_devices()
    if nulls:
        print(f"\ncompile-only, for `poot plan MODEL --device NAME --compile`: {', '.join(d.name for d in nulls)}")
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


def _sampling(args: argparse.Namespace, max_tokens: int | None = None) -> Any:
    from .llm import ParameterError, SamplingParams

    schema = None
    if getattr(args, "json_schema", None):
        try:
            schema = json.loads(Path(args.json_schema).read_text())
        except (OSError, ValueError) as e:
            raise ParameterError("--json-schema", f"{args.json_schema}: {e}") from None
        if not isinstance(schema, (dict, bool)):
            raise ParameterError("--json-schema", f"{args.json_schema}: a JSON schema is an object (or true/false), got {type(schema).__name__}")
    bias = {}
    for item in args.logit_bias or []:
        tid, _, val = item.partition("=")
        try:
            bias[int(tid)] = float(val)
        except ValueError:
            raise ParameterError("--logit-bias", f"'{item}' is not TOKEN_ID=BIAS") from None
    return SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        logit_bias=bias,
        seed=args.seed,
        max_tokens=max_tokens or args.max_tokens,
        stop=args.stop or (),
        json_schema=schema,
        regex=args.regex,
    )


def _at_least(low: int, what: str = "") -> Callable[[str], int]:
    """An argparse type: an integer of at least ``low`` (the error names the flag and the bound)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}{f' ({what})' if what else ''}, got {value}")
        return value

    return parse


def _port(text: str) -> int:
    value = _at_least(0)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is 0-65535, got {value}")
    return value


def _load(args: argparse.Namespace, **options: Any) -> Any:
    from .llm import load

    template = getattr(args, "chat_template", None)
    if template is not None and template != "family":
        try:
            template = Path(template).read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise PootError(f"--chat-template {args.chat_template}: cannot read it ({e}); give a Jinja file or 'family'") from None
        if not template.strip():
            raise PootError(f"--chat-template {args.chat_template}: the file is empty; give a Jinja file or 'family'")
    kw = {
        "chat_template": template,
        "kv_memory": args.kv_memory,
        "max_context": args.context,
        "progress": True,
        "matmul_precision": args.matmul_precision,
        "kv_dtype": args.kv_dtype,
        **options,
    }
    return load(args.model, args.device, **{k: v for k, v in kw.items() if v is not None})


def cmd_run(args: argparse.Namespace) -> int:
    import time

    params = _sampling(args)
    m = _load(args, max_seqs=1)
    if m.template is None and m.template_error is None and not args.raw:
        print(f"poot: {args.model} has no chat template: the prompt goes in as plain text", file=sys.stderr)
    ids = m.encode(args.prompt, raw=args.raw)
    t1 = time.perf_counter()
    first: float | None = None
    n = 0
    reason = ""
    error: str | None = None
    for ev in m.generate(ids, params):
        if first is None:
            first = time.perf_counter() - t1
        n += ev.token is not None
        print(ev.text, end="", flush=True)
        reason = ev.finished or reason
        error = ev.error or error
    print()
    total = time.perf_counter() - t1
    decode = n - 1
    print(
        f"poot: {len(ids)} prompt tokens in {first or 0:.2f} s ({len(ids) / max(first or 1e-9, 1e-9):.0f} tok/s), {n} new "
        f"({decode / max(total - (first or 0), 1e-9):.0f} tok/s), finished: {reason}",
        file=sys.stderr,
    )
    m.close()
    if error is not None:
        print(f"poot: error: {error}", file=sys.stderr)
        return 1
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    params = _sampling(args)
    m = _load(args, max_seqs=1)
    if m.template_error is not None:
        raise PootError(f"{args.model}: {m.template_error}; `poot run --raw` still gives plain completion")
    if m.template is None:
        raise PootError(f"{args.model} has no chat template (a base model?): use `poot run` for plain completion")
    messages: list[dict[str, str]] = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    print("poot: chat with the model; an empty line or Ctrl-D ends, /reset starts over, Ctrl-C stops an answer", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            print()
            break
        if not line.strip():
            break
        if line.strip() == "/reset":
            messages = messages[:1] if args.system else []
            continue
        messages.append({"role": "user", "content": line})
        answer = ""
        events = m.generate(messages, params)
        try:
            for ev in events:
                answer += ev.text
                print(ev.text, end="", flush=True)
        except KeyboardInterrupt:  # the answer stops (its sequence cancelled); the chat goes on
            events.close()
            print(" [stopped]", end="", file=sys.stderr)
        except ParameterError as e:  # (the conversation no longer fits the context, say): this turn is dropped, the chat goes on
            messages.pop()
            print(f"poot: {e}; that message was not sent (/reset starts over)", file=sys.stderr)
            continue
        print()
        messages.append({"role": "assistant", "content": answer})
    m.close()
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    import numpy as np

    from .llm.bench import llamacpp_python, measure_engine, measure_llamacpp
    from .load import resolve_model

    batches = sorted(set(args.batch))
    m = _load(args, max_seqs=max(batches), max_step_tokens=max(512, args.prompt_tokens * max(batches)), threads=args.threads)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(100, min(m.vocab, 30000), args.prompt_tokens).tolist() for _ in range(max(batches))]
    threads = getattr(m._executor(False), "threads", None)
    print(
        f"{args.model} on {m.device.name}"
        + (f", {threads} threads" if threads else "")
        + f": {args.prompt_tokens}-token prompts, {args.decode_tokens} new tokens each, greedy, medians of {args.rounds}"
    )
    print(f"{'':12s} {'batch':>5}  {'prefill tok/s':>14}  {'decode tok/s':>13}")
    ours = {}
    for b in batches:
        t = measure_engine(m, prompts[:b], args.decode_tokens, args.rounds)
        ours[b] = t
        print(f"{'poot':12s} {b:5d}  {t.prefill_tok_s:14.1f}  {t.decode_tok_s:13.1f}")
    m.close()
    if args.vs_llamacpp:
        peer = measure_llamacpp(llamacpp_python(args.peer_python), str(resolve_model(args.model)), threads or 1, prompts[0], args.decode_tokens, args.rounds)
        print(f"{'llama.cpp':12s} {1:5d}  {peer['prefill']:14.1f}  {peer['decode']:13.1f}   (llama-cpp-python {peer['version']})")
        if 1 in ours:
            print(f"{'ratio':12s} {1:5d}  {ours[1].prefill_tok_s / peer['prefill']:14.2f}  {ours[1].decode_tok_s / peer['decode']:13.2f}   (poot / llama.cpp)")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from .serve import serve

    serve(
        args.model,
        args.device,
        args.host,
        args.port,
        args.api_key,
        args.max_batch,
        args.max_queue,
        args.kv_memory,
        args.context,
        args.name,
        args.matmul_precision,
        args.kv_dtype,
        args.max_body,
    )
    return 0


PLAN_CONTEXT_MAX = 1 << 20  # positions: past any model's trained context (the step's block table is made)


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
    if args.context > PLAN_CONTEXT_MAX:  # (the step's inputs are made to plan it: a pool of that many positions)
        raise PootError(f"--context {args.context} is past the {PLAN_CONTEXT_MAX} positions `poot plan` describes a step for")
    device = get_device(args.device)
    ck = open_model(args.model)
    fam = family_for(ck.architecture)
    bs = 16
    graph = PassManager(DEFAULT_PASSES).run(fam.trace(fam.parse_config(ck), ck.weights, StepShapes(block_size=bs, cache_dtype=args.kv_dtype)))
    plan = compile_plan(graph, device, args.matmul_precision)
    n, blocks = args.tokens, -(-args.context // bs)
    pos = np.arange(args.context - n, args.context)
    batch = StepBatch(np.zeros(n), pos, np.zeros(n), pos, np.array([args.context]), np.arange(blocks).reshape(1, -1), np.array([n - 1]))
    shapes = {
        name: np.broadcast_to(np.zeros((), v.dtype.numpy), (blocks,) + tuple(d.value for d in v.shape[1:]))  # (a shape, no memory)
        for name, v in graph.inputs().items()
        if name not in batch.as_inputs()
    }
    env = step_env(plan, {**batch.as_inputs(), **shapes})
    print(plan.describe(env))
    sp = plan_storage(plan, env)
    weights = sum(t.info.nbytes for t in ck.weights.tensors.values())
    print(
        f"\nstorage: activation arena {_fmt_bytes(sp.arena_bytes)} (values alive at once at most {_fmt_bytes(sp.live_bytes)}), "
        f"step inputs {_fmt_bytes(sum(sp.nbytes(k, graph.inputs()[nm].dtype) for nm, k in sp.inputs.items()))}, "
        f"KV pools {_fmt_bytes(sum(a.nbytes for a in shapes.values()))} for {args.context} positions, weights {_fmt_bytes(weights)} (bound in place)"
    )
    from .plugins import host

    report = host().hook.poot_plan_report(device=device, plan=plan, env=env, compile=args.compile)
    if report is not None:
        print(f"\n{report}")
    elif args.compile:
        _compile_plan_kernels(plan, device)
    return 0


def _compile_plan_kernels(plan: Any, device: Any) -> None:
    """Compile each distinct kernel of ``plan`` for ``device``'s codegen target (its backend's
    ``poot_codegen_target``) and print how many there are and how large their code is."""
    import time

    from .codegen import compile_kernel
    from .plugins import host
    from .runtime.progress import compile_progress

    tgt = host().hook.poot_codegen_target(device=device)
    if tgt is None:
        raise PootError(f"no installed plugin compiles kernels for {device.name} (target {device.target})")
    kernels = {repr(l.kernel): l.kernel for l in plan.launches}
    t0 = time.perf_counter()
    sizes = [len(compile_kernel(k, tgt).data) for k in compile_progress(kernels.values(), True, len(kernels))]
    print(
        f"compiled {len(sizes)} kernels for {tgt.key} in {time.perf_counter() - t0:.1f} s: {_fmt_bytes(sum(sizes))} of {tgt.artifact}, the largest {_fmt_bytes(max(sizes, default=0))}"
    )


def build_parser() -> argparse.ArgumentParser:
    from .llm.handle import KV_DTYPES
    from .plan.common import MATMUL_PRECISIONS

    def precision_arg(q: argparse.ArgumentParser) -> None:
        q.add_argument(
            "--matmul-precision",
            choices=MATMUL_PRECISIONS,
            default="high",
            help="on tensor cores: 'high' keeps ~16 bits of each activation (two bf16 or int8 terms), 'medium' about 8 "
            "(bf16, or one int8 term a 32-value block with packed weights, as llama.cpp; half the work), 'highest' uses no "
            "tensor cores; on the CPU, 'highest' multiplies "
            "Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q6_K weights in f32 where the others take x as two int8 terms (default: high)",
        )

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
    pn.add_argument("--tokens", type=_at_least(1), default=1, help="tokens in the step (1: a decode step)")
    pn.add_argument("--context", type=_at_least(1), default=512, help="context the step sees, in tokens")
    pn.add_argument(
        "--device", default=None, help="device name (default: POOT_DEVICE or cpu); null:ARCH (`poot devices` lists them) plans without the hardware"
    )
    pn.add_argument("--kv-dtype", choices=KV_DTYPES, default="f16", help="the KV cache's element type (default: f16)")
    pn.add_argument("--compile", action="store_true", help="also compile every kernel of the plan for the device's target, and say how large the code is")
    precision_arg(pn)
    pn.set_defaults(func=cmd_plan)

    def model_args(q: argparse.ArgumentParser) -> None:
        q.add_argument("model", help="a .gguf file, a safetensors model directory, or a catalog model (SmolLM2, gemma3)")
        q.add_argument("--device", default=None, help="device name (default: POOT_DEVICE or cpu)")
        q.add_argument("--context", type=_at_least(16, "one KV block"), default=2048, help="longest sequence, in tokens (16 or more)")
        q.add_argument(
            "--kv-memory", default=None, help="KV cache budget, e.g. 512M or 2G (default: what the sequences need, at most a quarter of free memory)"
        )
        q.add_argument(
            "--kv-dtype",
            choices=KV_DTYPES,
            default="f16",
            help="the KV cache's element type: f16 (the default) holds twice the tokens of f32 in the same memory",
        )
        q.add_argument(
            "--chat-template",
            default=None,
            metavar="FILE|family",
            help="a Jinja chat template file, or 'family' for the model family's built-in one (default: the checkpoint's own; none means plain text)",
        )
        precision_arg(q)

    def sampling_args(q: argparse.ArgumentParser, temperature: float) -> None:
        g = q.add_argument_group("sampling")
        g.add_argument("--max-tokens", type=int, default=256)
        g.add_argument("--temperature", type=float, default=temperature, help=f"0 is greedy (default {temperature})")
        g.add_argument("--top-k", type=int, default=0)
        g.add_argument("--top-p", type=float, default=1.0)
        g.add_argument("--min-p", type=float, default=0.0)
        g.add_argument("--repetition-penalty", type=float, default=1.0)
        g.add_argument("--presence-penalty", type=float, default=0.0)
        g.add_argument("--frequency-penalty", type=float, default=0.0)
        g.add_argument("--logit-bias", action="append", metavar="ID=BIAS", help="add BIAS to token ID's logit (repeatable)")
        g.add_argument("--seed", type=int, default=None, help="the same seed gives the same tokens")
        g.add_argument("--stop", action="append", help="stop string (repeatable)")
        c = g.add_mutually_exclusive_group()
        c.add_argument("--json-schema", metavar="FILE", help="constrain the output to JSON valid under this schema")
        c.add_argument("--regex", help="constrain the output to this regular expression")

    run = sub.add_parser("run", help="generate text from a prompt, streamed (chat template applied unless --raw)")
    model_args(run)
    run.add_argument("prompt")
    run.add_argument("--raw", action="store_true", help="plain completion: no chat template")
    sampling_args(run, 0.0)
    run.set_defaults(func=cmd_run)
    chat = sub.add_parser("chat", help="an interactive chat")
    model_args(chat)
    chat.add_argument("--system", help="a system message")
    sampling_args(chat, 0.7)
    chat.set_defaults(func=cmd_chat)
    srv = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (needs pip install 'poot[serve]')")
    model_args(srv)
    srv.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: loopback only)")
    srv.add_argument("--port", type=_port, default=8000, help="TCP port, 1-65535 (0: any free one)")
    srv.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1 requests")
    srv.add_argument("--max-batch", type=_at_least(1), default=16, help="sequences decoded together")
    srv.add_argument("--max-queue", type=_at_least(1), default=256, help="requests waiting beyond that get 429")
    srv.add_argument("--max-body", default="32M", help="the largest request body taken, e.g. 32M (larger ones get 413)")
    srv.add_argument("--name", default=None, help="the model id clients use (default: MODEL as given)")
    srv.set_defaults(func=cmd_serve)
    bench = sub.add_parser("bench", help="prefill and decode tokens/s for a few batch sizes")
    model_args(bench)
    bench.add_argument("--batch", type=_at_least(1), nargs="+", default=[1, 4, 16])
    bench.add_argument("--prompt-tokens", type=_at_least(1), default=128)
    bench.add_argument("--decode-tokens", type=_at_least(1), default=32)
    bench.add_argument("--rounds", type=_at_least(1), default=3)
    bench.add_argument("--threads", type=_at_least(1), default=None, help="CPU threads (default: POOT_THREADS or every core)")
    bench.add_argument("--vs-llamacpp", action="store_true", help="also run llama.cpp (llama-cpp-python) on the same prompt, batch 1, same threads")
    bench.add_argument("--peer-python", help="an interpreter that has llama_cpp (default: this one, installing llama-cpp-python if needed)")
    bench.set_defaults(func=cmd_bench)
    from .cli_tools import add_tool_commands

    add_tool_commands(sub, model_args)
    return p


def _show_warnings_in_one_line() -> None:
    """poot's own warnings as ``poot: warning: ...`` lines, not Python's file:line: form."""
    import warnings

    from .errors import PootWarning

    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):  # type: ignore[no-untyped-def]
        if issubclass(category, PootWarning):
            print(f"poot: warning: {message}", file=sys.stderr, flush=True)
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    _show_warnings_in_one_line()
    try:
        return args.func(args)
    except BrokenPipeError:  # output piped into head and the like
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps interpreter shutdown quiet
        return 0
    except PootError as e:
        print(f"poot: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\npoot: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
