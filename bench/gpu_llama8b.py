"""A Llama-3-8B-shaped model on an NVIDIA GPU: poot next to transformers' eager generation of the same
bf16 weights and to the device's copy bandwidth, all measured in one run.

    python bench/gpu_llama8b.py [--layers 32] [--dir /tmp/llama8b] [--json results.json]

The model has Llama 3 8B's shapes (4096 wide, 14336 FFN, 32 heads over 8 KV heads, 128256 tokens)
and random bf16 weights: one random layer's tensors written for every layer (each layer is its own
tensor in the files and in device memory, so nothing is shared or cached between layers), random
embeddings and output head. The Q4_K model is that model quantized to Q4_K (norms kept f32), with
poot's quantizer; ``--q4-k-m`` adds it quantized as llama.cpp's Q4_K_M mixes types (the output head,
and v and down in every second layer, at Q6_K), what a downloaded Q4_K_M file holds.
``--vs-llamacpp SRC`` runs llama.cpp's CUDA build on the same GGUF files in the same run
(``llama-bench`` for batch 1 and prefill, ``llama-batched-bench`` for the larger batches). Both
sides decode the same work: ``--decode-tokens`` (128) after prompts of ``--prompt-tokens`` (128)
each, as ``llama-batched-bench``'s ``-npp`` and ``-ntg``; llama-bench's batch 1 decodes from an
empty context. Figures are medians of rounds after a warm-up; the decode roofline is the
weight bytes a token reads divided by the copy bandwidth (bytes read plus bytes written per second
of a large device-to-device copy).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import importlib
import json
import os
import re
import statistics
import struct
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Dims:
    hidden: int = 4096
    ffn: int = 14336
    heads: int = 32
    kv_heads: int = 8
    vocab: int = 128256
    head_dim: int = 128

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """HF tensor name (within a layer) -> shape."""
        h, f, q, kv = self.hidden, self.ffn, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {
            "self_attn.q_proj.weight": (q, h),
            "self_attn.k_proj.weight": (kv, h),
            "self_attn.v_proj.weight": (kv, h),
            "self_attn.o_proj.weight": (h, q),
            "mlp.gate_proj.weight": (f, h),
            "mlp.up_proj.weight": (f, h),
            "mlp.down_proj.weight": (h, f),
            "input_layernorm.weight": (h,),
            "post_attention_layernorm.weight": (h,),
        }


LLAMA3_8B = Dims()
SMALL = Dims(hidden=512, ffn=1024, heads=8, kv_heads=2, vocab=2000, head_dim=64)  # a quick check of the script itself
GGUF_NAMES = {
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}


def say(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)


# -- the model files --------------------------------------------------------------------------------


def _bf16(rng: np.random.Generator, shape: tuple[int, ...], scale: float, offset: float = 0.0) -> np.ndarray:
    x = rng.standard_normal(shape, dtype=np.float32) * np.float32(scale) + np.float32(offset)
    return (x.view(np.uint32) >> 16).astype(np.uint16)  # truncated to bf16: these are the model's values


def random_tensors(dims: Dims, seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    layer = {n: _bf16(rng, s, 0.02) if len(s) == 2 else _bf16(rng, s, 0.05, 1.0) for n, s in dims.shapes().items()}
    return layer, _bf16(rng, (dims.vocab, dims.hidden), 0.02), _bf16(rng, (dims.vocab, dims.hidden), 0.02)


def write_safetensors(path: Path, tensors: list[tuple[str, np.ndarray]]) -> None:
    """Stream tensors (bf16 bits) into one safetensors file without holding a copy per layer."""
    header, off = {}, 0
    for name, a in tensors:
        header[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for _, a in tensors:
            f.write(memoryview(np.ascontiguousarray(a)).cast("B"))


def write_bf16_model(d: Path, dims: Dims, layers: int, layer: dict[str, np.ndarray], embed: np.ndarray, head: np.ndarray) -> None:
    d.mkdir(parents=True, exist_ok=True)
    tensors = [("model.embed_tokens.weight", embed)]
    for i in range(layers):
        tensors += [(f"model.layers.{i}.{n}", a) for n, a in layer.items()]
    tensors += [("model.norm.weight", layer["input_layernorm.weight"]), ("lm_head.weight", head)]
    write_safetensors(d / "model.safetensors", tensors)
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": dims.hidden,
        "intermediate_size": dims.ffn,
        "num_hidden_layers": layers,
        "num_attention_heads": dims.heads,
        "num_key_value_heads": dims.kv_heads,
        "head_dim": dims.head_dim,
        "vocab_size": dims.vocab,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 0,
        "eos_token_id": 1,
        "hidden_act": "silu",
    }
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(dims.vocab)}, unk_token="t2"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": "t0", "eos_token": "t1", "unk_token": "t2"}))


def _quantize_rows(rows: np.ndarray, qtype: str = "q4_k") -> np.ndarray:
    from poot.quant import quantization

    return quantization(qtype).quantize((rows.astype(np.uint32) << 16).view(np.float32))


def quantize_as(a: np.ndarray, pool: ProcessPoolExecutor, qtype: str = "q4_k") -> np.ndarray:
    chunks = np.array_split(a, max(1, a.shape[0] // 512))
    return np.concatenate(list(pool.map(functools.partial(_quantize_rows, qtype=qtype), chunks)))


# the tensors llama.cpp's Q4_K_M keeps at Q6_K (its "more bits" layers: about half of them), here
# in every second layer, and the output head
Q4_K_M_Q6 = ("self_attn.v_proj.weight", "mlp.down_proj.weight")


def q6_layer(i: int) -> bool:
    return i % 2 == 0


def write_q4_k_model(path: Path, dims: Dims, layers: int, layer: dict[str, np.ndarray], embed: np.ndarray, head: np.ndarray, mix: bool = False) -> None:
    """The model quantized to Q4_K; with ``mix`` as llama.cpp's Q4_K_M mixes types (``Q4_K_M_Q6``
    at Q6_K in every second layer, the output head at Q6_K)."""
    from poot.testing.checkpoints import write_gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(os.cpu_count()) as pool:
        q = {n: quantize_as(a, pool) for n, a in layer.items() if a.ndim == 2}
        q6 = {n: quantize_as(layer[n], pool, "q6_k") for n in Q4_K_M_Q6} if mix else {}
        qe, qh = quantize_as(embed, pool), quantize_as(head, pool, "q6_k" if mix else "q4_k")
    f32 = lambda a: (a.astype(np.uint32) << 16).view(np.float32)  # noqa: E731
    tensors = [("token_embd.weight", "q4_k", (dims.vocab, dims.hidden), qe)]
    for i in range(layers):
        for n, a in layer.items():
            if a.ndim != 2:
                tensors.append((f"blk.{i}.{GGUF_NAMES[n]}", "f32", a.shape, f32(a)))
            elif n in q6 and q6_layer(i):
                tensors.append((f"blk.{i}.{GGUF_NAMES[n]}", "q6_k", a.shape, q6[n]))
            else:
                tensors.append((f"blk.{i}.{GGUF_NAMES[n]}", "q4_k", a.shape, q[n]))
    tensors += [
        ("output_norm.weight", "f32", (dims.hidden,), f32(layer["input_layernorm.weight"])),
        ("output.weight", "q6_k" if mix else "q4_k", (dims.vocab, dims.hidden), qh),
    ]
    meta = {
        "llama.block_count": layers,
        "llama.context_length": 8192,
        "llama.embedding_length": dims.hidden,
        "llama.feed_forward_length": dims.ffn,
        "llama.attention.head_count": dims.heads,
        "llama.attention.head_count_kv": dims.kv_heads,
        "llama.rope.freq_base": 500000.0,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.rope.dimension_count": dims.head_dim,
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [f"t{i}" for i in range(dims.vocab)],
        "tokenizer.ggml.scores": [0.0] * dims.vocab,
        "tokenizer.ggml.token_type": [1] * dims.vocab,
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 1,
    }
    write_gguf(path, "llama", meta, tensors)


def mixed_weight_bytes(dims: Dims, layers: int) -> float:
    """Bytes of weights one decode token of the Q4_K_M-mixed model reads."""
    q4, q6 = 144 / 256, 210 / 256
    total = dims.vocab * dims.hidden * q6
    for i in range(layers):
        for n, s in dims.shapes().items():
            if len(s) == 2:
                total += int(np.prod(s)) * (q6 if n in Q4_K_M_Q6 and q6_layer(i) else q4)
    return total


def decode_weight_bytes(dims: Dims, layers: int, bytes_per_value: float) -> float:
    """Bytes of weights one decode token reads: every layer's matrices and the output head."""
    per_layer = sum(int(np.prod(s)) for s in dims.shapes().values() if len(s) == 2)
    return (layers * per_layer + dims.vocab * dims.hidden) * bytes_per_value


# -- measurements -----------------------------------------------------------------------------------


def copy_bandwidth(nbytes: int = 4 << 30, rounds: int = 10) -> float:
    """Bytes read plus bytes written per second by a device-to-device copy (median)."""
    from poot_ptx.device import _check
    from poot_ptx.runtime import CudaContext

    ctx = CudaContext(0)
    drv = ctx.driver
    a, b = ctx.alloc(nbytes), ctx.alloc(nbytes)
    times = []
    for i in range(rounds + 2):
        ctx.synchronize()
        t = time.perf_counter()
        _check(drv, "cuMemcpyDtoD", drv.cuMemcpyDtoD(b, a, nbytes))
        ctx.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - t)
    ctx.free(a), ctx.free(b)
    return 2 * nbytes / statistics.median(times)


def measure_transformers(
    path: Path, vocab: int, batches: list[int], prefill: int, rounds: int, prompt_tokens: int = 128, decode_tokens: int = 128
) -> dict[str, float]:
    import torch
    import transformers

    say("transformers: loading the bf16 model (eager attention)")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16, attn_implementation="eager").to(dev).eval()
    rng = np.random.default_rng(1)
    out: dict[str, float] = {}

    def gen(ids: torch.Tensor, n: int) -> float:
        sync()
        t = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=1)  # noqa: F821 - the closure runs before the del below
        sync()
        return time.perf_counter() - t

    for b in batches:
        ids = torch.tensor(rng.integers(3, vocab, (b, prompt_tokens)), device=dev)
        gen(ids, 4)
        rates = []
        for _ in range(rounds):  # the difference of two lengths: decode alone, prefill cancelled
            rates.append(b * (decode_tokens - 8) / (gen(ids, decode_tokens) - gen(ids, 8)))
        out[f"decode_b{b}"] = statistics.median(rates)
        say(f"transformers: decode batch {b}: {out[f'decode_b{b}']:.1f} tok/s")
    ids = torch.tensor(rng.integers(3, vocab, (1, prefill)), device=dev)
    times = []
    with torch.no_grad():
        for i in range(rounds + 1):
            sync()
            t = time.perf_counter()
            model(ids)
            sync()
            if i:
                times.append(time.perf_counter() - t)
    out[f"prefill_{prefill}"] = prefill / statistics.median(times)
    say(f"transformers: prefill {prefill}: {out[f'prefill_{prefill}']:.0f} tok/s")
    del model
    if dev == "cuda":
        torch.cuda.empty_cache()
    return out


def _profile_steps(m, decode_only: bool = False) -> None:  # type: ignore[no-untyped-def]
    """Time each launch of every step shape the first time it is replayed, and print the largest
    (``decode_only``: only shapes of one token a sequence).

    Profiling replays the step again, and an executor frees a replaced step's replays two launches
    on (``launch``'s contract), so a step the engine first launches while an earlier step of it is
    in flight (queued ahead) is only noted then, with its inputs, and profiled at the start of an
    engine step with nothing in flight, if it was not replaced in between."""
    ex = next(iter(m._executors.values()))
    if not hasattr(ex, "profile"):
        say(f"profile: {type(ex).__name__} has no per-launch timing; not profiled")
        return
    replay, launch, engine_step = ex.replay, ex.launch, m.engine.step
    seen: set[int] = set()
    pending: list[tuple[object, dict[str, np.ndarray]]] = []
    idle = [False]  # nothing in flight: the engine's step has not launched yet, and nothing is queued

    def once(step, inputs):  # type: ignore[no-untyped-def]
        times = ex.profile(step, inputs)
        total: dict[str, float] = {}
        for name, sec in times:
            total[name] = total.get(name, 0.0) + sec
        env = dict(step.storage.env)
        replay(step, inputs)
        walls = []
        for _ in range(5):  # the whole step's graph, host to host: what the engine waits for
            t = time.perf_counter()
            replay(step, inputs)
            walls.append(time.perf_counter() - t)
        say(
            f"profile tokens={env.get('tokens')} batch={env.get('batch')}: {len(times)} launches, {sum(total.values()) * 1e3:.2f} ms on the GPU "
            f"one by one; the step's graph {statistics.median(walls) * 1e3:.2f} ms (median of 5 replays)"
        )
        for name, sec in sorted(total.items(), key=lambda kv: -kv[1])[:8]:
            say(f"    {sec * 1e3:8.3f} ms  {name}")
        if hasattr(ex, "graph_seconds"):  # inside the graph: its time without each of the largest classes of launches
            whole = ex.graph_seconds(step)
            say(f"  the step's launches as one graph, without the inputs' copy: {whole * 1e3:.3f} ms; without each class of launches:")
            for name, _ in sorted(total.items(), key=lambda kv: -kv[1])[:8]:
                saved = whole - ex.graph_seconds(step, lambda n, name=name: n == name)
                say(f"    {saved * 1e3:8.3f} ms  {name} ({sum(n == name for n, _ in times)} launches)")

    def note(step, inputs):  # type: ignore[no-untyped-def]
        if id(step) in seen:
            return
        seen.add(id(step))
        env = step.storage.env
        if decode_only and env.get("tokens") != env.get("batch"):
            return
        if idle[0]:
            once(step, inputs)
        else:
            pending.append((step, {k: np.array(v) for k, v in inputs.items()}))

    def profiled(step, inputs):  # type: ignore[no-untyped-def]
        note(step, inputs)
        return replay(step, inputs)

    def profiled_launch(step, inputs, keep=()):  # type: ignore[no-untyped-def]
        note(step, inputs)  # the engine queues steps through launch on an asynchronous executor
        idle[0] = False
        return launch(step, inputs, keep)

    def stepped():  # type: ignore[no-untyped-def]
        idle[0] = m.engine._queued is None
        if idle[0]:
            while pending:
                step, inputs = pending.pop()
                if not step.retired and step.slots:
                    once(step, inputs)
                else:
                    seen.discard(id(step))  # replaced: its new capture is profiled in its turn
        return engine_step()

    ex.replay, ex.launch, m.engine.step = profiled, profiled_launch, stepped


@contextlib.contextmanager
def planner_setting(setting: str):  # type: ignore[no-untyped-def]
    """Module constants set for the plans made inside (``MODULE.NAME=VALUE``, several joined by
    commas, each value a Python literal, a tuple's commas too), and restored after; a name that is
    not there is an error."""
    saved = []
    try:
        for item in re.split(r",\s*(?=[\w.]+\s*=)", setting):  # (a comma inside a value, a tuple's, stays)
            target, _, value = item.partition("=")
            mod_name, _, name = target.strip().rpartition(".")
            mod = importlib.import_module(mod_name)
            if not hasattr(mod, name):
                raise SystemExit(f"--set {item}: {mod_name} has no {name}")
            saved.append((mod, name, getattr(mod, name)))
            setattr(mod, name, ast.literal_eval(value.strip()))
        yield
    finally:
        for mod, name, old in reversed(saved):
            setattr(mod, name, old)


def measure_poot(
    path: Path,
    vocab: int,
    device: str,
    batches: list[int],
    prefill: int,
    rounds: int,
    profile: str | None = None,
    matmul_precision: str = "high",
    kv_dtype: str = "f16",
    prompt_tokens: int = 128,
    decode_tokens: int = 128,
) -> dict[str, float]:
    import poot
    from poot.llm.bench import measure_engine

    say(f"poot: loading {path.name} on {device} (matmul precision {matmul_precision}, {kv_dtype} KV cache)")
    t = time.perf_counter()
    m = poot.load(
        str(path),
        device,
        max_seqs=max(batches),
        max_step_tokens=max(prefill, 64),
        max_context=max(prefill, prompt_tokens + decode_tokens) + 64,
        progress=True,
        matmul_precision=matmul_precision,
        kv_dtype=kv_dtype,
    )
    say(f"poot: ready in {time.perf_counter() - t:.1f} s")
    if profile:
        _profile_steps(m, decode_only=profile == "decode")
    rng = np.random.default_rng(1)
    out: dict[str, float] = {}
    for b in batches:
        prompts = [rng.integers(3, vocab, prompt_tokens).tolist() for _ in range(b)]
        r = measure_engine(m, prompts, decode_tokens, rounds)
        out[f"decode_b{b}"] = r.decode_tok_s
        say(f"poot: decode batch {b}: {r.decode_tok_s:.1f} tok/s")
    if prefill:
        r = measure_engine(m, [rng.integers(3, vocab, prefill).tolist()], 2, rounds)
        out[f"prefill_{prefill}"] = r.prefill_tok_s
        say(f"poot: prefill {prefill}: {r.prefill_tok_s:.0f} tok/s")
    m.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--small", action="store_true", help="narrow dimensions: a quick check of this script")
    ap.add_argument("--dir", default="/tmp/llama8b")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=128, help="each decoding sequence's prompt (llama-batched-bench's -npp)")
    ap.add_argument("--decode-tokens", type=int, default=128, help="tokens each sequence decodes (llama-batched-bench's -ntg, llama-bench's -n; above 8)")
    ap.add_argument("--no-peer", action="store_true", help="skip transformers")
    ap.add_argument("--only", nargs="+", choices=["bf16", "q4_k", "q4_k_m"], help="measure only these of poot's models")
    ap.add_argument(
        "--q4-k-m", action="store_true", help="also the model quantized as llama.cpp's Q4_K_M mixes types (Q6_K head, v and down in half the layers)"
    )
    ap.add_argument("--json", help="write the figures here too")
    ap.add_argument(
        "--vs-llamacpp",
        metavar="SRC",
        type=Path,
        help="llama.cpp's source (a tarball, its tree, or llama-cpp-python's sdist folder): built once for CUDA (bench/llamacpp_cuda.py) "
        "and run on the same GGUF files (Q4_K, and the Q4_K_M mix with --q4-k-m): one table with both sides",
    )
    ap.add_argument("--llamacpp-dir", type=Path, default=Path("/tmp/llamacpp-cuda"), help="where llama.cpp is built (kept for the next run)")
    ap.add_argument("--llamacpp-arch", default="90a", help="the CUDA architecture llama.cpp is built for")
    ap.add_argument(
        "--matmul-precision",
        nargs="+",
        default=["high"],
        choices=["highest", "high", "medium"],
        help="the models' matmul precision; more than one: each model measured at the others too (batches > 1 and prefill: batch 1 is GEMVs)",
    )
    ap.add_argument(
        "--profile",
        nargs="?",
        const="all",
        choices=["all", "decode"],
        help="time every launch of each step shape once (CUDA events, Vulkan timestamps) and print the largest; on CUDA also what "
        "each of the largest classes of launches costs inside the step's graph (the graph timed without it); 'decode': only the "
        "steps in which every sequence decodes one token",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="MODULE.NAME=VALUE[,...]",
        help="planner settings to measure beside the defaults (module constants, such as "
        "poot_ptx.schedules.IMMA_SUMMED=True): each --set one more pass of every model at the batches above 4, in the same run",
    )
    ap.add_argument("--kv-dtype", default="f16", choices=["f32", "f16"], help="poot's KV cache type (default f16, poot's own; transformers keeps a bf16 one)")
    ap.add_argument(
        "--also",
        nargs="*",
        default=[],
        metavar="DEVICE",
        help="other devices (vulkan:0, wgpu:0) whose batch-1 decode of the same models is measured too, as a ratio to --device's",
    )
    args = ap.parse_args()
    if args.decode_tokens <= 8:
        ap.error(f"--decode-tokens must be above 8 (transformers' rate is the difference of it and 8), got {args.decode_tokens}")

    dims = SMALL if args.small else LLAMA3_8B
    d = Path(args.dir) / f"{'small' if args.small else '8b'}-L{args.layers}"
    bf16_dir, q4k, q4km = d / "bf16", d / "q4_k.gguf", d / "q4_k_m.gguf"
    only = set(args.only or ("bf16", "q4_k", "q4_k_m"))
    want_mix = args.q4_k_m or (args.only is not None and "q4_k_m" in only)
    need_bf16 = not (bf16_dir / "model.safetensors").exists() and ("bf16" in only or not args.no_peer)
    need_q4k = not q4k.exists() and "q4_k" in only
    need_mix = not q4km.exists() and want_mix
    if need_bf16 or need_q4k or need_mix:
        say(f"writing the models under {d}")
        t = time.perf_counter()
        layer, embed, head = random_tensors(dims)
        if need_bf16:
            write_bf16_model(bf16_dir, dims, args.layers, layer, embed, head)
        if need_q4k:
            write_q4_k_model(q4k, dims, args.layers, layer, embed, head)
        if need_mix:
            write_q4_k_model(q4km, dims, args.layers, layer, embed, head, mix=True)
        say(f"models written in {time.perf_counter() - t:.0f} s")
    res: dict[str, object] = {"layers": args.layers, "date": time.strftime("%Y-%m-%d"), "kv_dtype": args.kv_dtype}
    bw = copy_bandwidth() if args.device.startswith("cuda") else None
    res["copy_bytes_per_s"] = bw
    if bw:
        say(f"copy bandwidth {bw / 1e12:.2f} TB/s (read + write)")
    if not args.no_peer:
        res["transformers"] = measure_transformers(bf16_dir, dims.vocab, args.batches, args.prefill, args.rounds, args.prompt_tokens, args.decode_tokens)
    for name, path, bpv in (("bf16", bf16_dir, 2.0), ("q4_k", q4k, 144 / 256), ("q4_k_m", q4km, 0.0)):
        if name not in only or (name == "q4_k_m" and not want_mix):
            continue
        res[f"poot_{name}"] = r = measure_poot(
            path,
            dims.vocab,
            args.device,
            args.batches,
            args.prefill,
            args.rounds,
            args.profile,
            args.matmul_precision[0],
            args.kv_dtype,
            args.prompt_tokens,
            args.decode_tokens,
        )
        if bw and "decode_b1" in r:  # batch 1 is measured only when --batches names it
            roof = bw / (decode_weight_bytes(dims, args.layers, bpv) if bpv else mixed_weight_bytes(dims, args.layers))
            res[f"roofline_{name}"] = roof
            say(f"{name}: batch-1 decode {r['decode_b1']:.1f} tok/s = {r['decode_b1'] / roof:.0%} of the {roof:.0f} tok/s roofline")
    extra = args.matmul_precision[1:]
    for prec in extra:  # every model at the other precisions: only the steps of more than 4 rows differ
        for name, path in (("bf16", bf16_dir), ("q4_k", q4k), ("q4_k_m", q4km)):
            if name not in only or (name == "q4_k_m" and not want_mix):
                continue
            res[f"poot_{name}_{prec}"] = measure_poot(
                path,
                dims.vocab,
                args.device,
                [b for b in args.batches if b > 4] or [1],
                args.prefill,
                args.rounds,
                args.profile,
                prec,
                args.kv_dtype,
                args.prompt_tokens,
                args.decode_tokens,
            )
    models = [(n, p) for n, p in (("bf16", bf16_dir), ("q4_k", q4k), ("q4_k_m", q4km)) if n in only and (n != "q4_k_m" or want_mix)]
    for setting in args.set:  # the batched decode again with other planner settings, against the defaults above
        with planner_setting(setting):
            for name, path in models:
                res[f"poot_{name}+{setting}"] = measure_poot(
                    path,
                    dims.vocab,
                    args.device,
                    [b for b in args.batches if b > 4] or [1],
                    args.prefill,  # (also the step's token budget: prompts prefilled as in the default pass)
                    args.rounds,
                    args.profile,
                    args.matmul_precision[0],
                    args.kv_dtype,
                    args.prompt_tokens,
                    args.decode_tokens,
                )
    for name, path in models:  # the same model's batch-1 decode on the other devices
        for other in args.also:
            try:
                r = measure_poot(path, dims.vocab, other, [1], args.prefill if name == "bf16" else 0, args.rounds, args.profile, kv_dtype=args.kv_dtype)
            except Exception as e:  # a device that cannot run it is reported, not fatal to the run
                say(f"{other}: {type(e).__name__}: {e}")
                res[f"poot_{name}@{other}"] = {"error": f"{type(e).__name__}: {e}"}
                continue
            res[f"poot_{name}@{other}"] = r
            base = res.get(f"poot_{name}", {}).get("decode_b1")  # type: ignore[union-attr]
            if base:
                say(f"{other}: {name} batch-1 decode {r['decode_b1']:.1f} tok/s = {r['decode_b1'] / base:.2f}x {args.device}'s")
    if args.vs_llamacpp:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import llamacpp_cuda as lc

        try:  # (a peer that fails is reported beside poot's figures, which stand)
            bindir = lc.build(args.vs_llamacpp, args.llamacpp_dir, args.llamacpp_arch)
            res["llamacpp_version"] = lc.version(bindir)
            for name, path in (("q4_k", q4k), ("q4_k_m", q4km)):
                if f"poot_{name}" not in res:
                    continue
                say(f"llama.cpp: {name}: llama-bench and llama-batched-bench")
                peer = lc.llama_bench(bindir, path, args.prefill, args.decode_tokens, args.rounds)
                more = [b for b in args.batches if b > 1]
                if more:
                    peer.update({f"decode_b{b}": v for b, v in lc.batched_bench(bindir, path, more, args.prompt_tokens, args.decode_tokens).items()})
                if args.prefill:
                    peer[f"prefill_{args.prefill}"] = peer.pop("prefill")
                res[f"llamacpp_{name}"] = peer
        except (Exception, SystemExit) as e:
            say(f"llama.cpp: {type(e).__name__}: {e}")
            res["llamacpp_error"] = f"{type(e).__name__}: {e}"
    print(json.dumps(res, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    if args.vs_llamacpp:
        print(f"\n| file | measure | poot | llama.cpp CUDA ({res.get('llamacpp_version', res.get('llamacpp_error'))}) | poot / llama.cpp |")
        print("|---|---|---|---|---|")
        for name in ("q4_k", "q4_k_m"):
            ours, peer = res.get(f"poot_{name}", {}), res.get(f"llamacpp_{name}", {})
            for key in [f"decode_b{b}" for b in args.batches] + ([f"prefill_{args.prefill}"] if args.prefill else []):
                a, b = ours.get(key), peer.get(key)  # type: ignore[union-attr]
                if a and b:
                    print(f"| {name} | {key} tok/s | {a:.1f} | {b:.1f} | {a / b:.2f}x |")
                for prec in extra:  # poot at the other precisions against the same llama.cpp figure
                    a = res.get(f"poot_{name}_{prec}", {}).get(key)  # type: ignore[union-attr]
                    if a and b:
                        print(f"| {name} | {key} tok/s, poot at matmul precision {prec} | {a:.1f} | {b:.1f} | {a / b:.2f}x |")
    if args.set:
        print("\n| model | measure | poot, defaults | poot, with the setting | setting | ratio |")
        print("|---|---|---|---|---|---|")
        for setting in args.set:
            for name, _ in models:
                for key in [f"decode_b{b}" for b in args.batches if b > 4]:
                    a, b = res.get(f"poot_{name}", {}).get(key), res.get(f"poot_{name}+{setting}", {}).get(key)  # type: ignore[union-attr]
                    if a and b:
                        print(f"| {name} | {key} tok/s | {a:.1f} | {b:.1f} | `{setting}` | {b / a:.3f} |")
    # the short table
    hf = res.get("transformers", {})
    first = args.matmul_precision[0]
    cols = "".join(f" poot bf16 {p} | / transformers |" for p in extra)
    print(f"\n| measure | poot bf16 ({first}) | poot Q4_K | transformers eager bf16 | poot bf16 / transformers | poot Q4_K / transformers |{cols}")
    print("|---|---|---|---|---|---|" + "---|---|" * len(extra))
    fmt = lambda v: f"{v:.1f}" if v else "-"  # noqa: E731
    ratio = lambda a, b: f"{a / b:.2f}x" if a and b else "-"  # noqa: E731
    for key in [f"decode_b{b}" for b in args.batches] + [f"prefill_{args.prefill}"]:
        ours, q, peer = res.get("poot_bf16", {}).get(key), res.get("poot_q4_k", {}).get(key), hf.get(key)  # type: ignore[union-attr]
        more = "".join(f" {fmt(o)} | {ratio(o, peer)} |" for o in (res.get(f"poot_bf16_{p}", {}).get(key) for p in extra))  # type: ignore[union-attr]
        print(f"| {key} tok/s | {fmt(ours)} | {fmt(q)} | {fmt(peer)} | {ratio(ours, peer)} | {ratio(q, peer)} |{more}")
        qm = res.get("poot_q4_k_m", {}).get(key)  # type: ignore[union-attr]
        if qm:
            print(f"| {key} tok/s, Q4_K_M mix | | {fmt(qm)} | {fmt(peer)} | | {ratio(qm, peer)} |")
    for name in ("bf16", "q4_k", "q4_k_m"):
        if f"roofline_{name}" in res:
            r, roof = res[f"poot_{name}"], res[f"roofline_{name}"]
            print(f"| batch-1 roofline {name} | {r['decode_b1'] / roof:.0%} of {roof:.0f} tok/s | | | |")  # type: ignore[index,operator]
    for name, _ in models:
        for other in args.also:
            r, base = res[f"poot_{name}@{other}"], res.get(f"poot_{name}", {}).get("decode_b1")  # type: ignore[union-attr]
            got = r.get("decode_b1")  # type: ignore[union-attr]
            ratio = f"{got / base:.2f}x {args.device}" if got and base else r.get("error", "-")  # type: ignore[union-attr]
            print(f"| {name} decode_b1 tok/s on {other} | {got:.1f} | | | {ratio} |" if got else f"| {name} decode_b1 tok/s on {other} | - | | | {ratio} |")
            pre, base = r.get(f"prefill_{args.prefill}"), res.get(f"poot_{name}", {}).get(f"prefill_{args.prefill}")  # type: ignore[union-attr]
            if pre:
                print(f"| {name} prefill_{args.prefill} tok/s on {other} | {pre:.1f} | | | {f'{pre / base:.2f}x {args.device}' if base else '-'} |")


if __name__ == "__main__":
    main()
