"""A model loaded onto a device: ``poot.load(model, device=...)``.

Resolves the source, picks the family, traces the step (with sampling as its suffix), compiles the
plan for the device, binds the weights (zero-copy on the CPU), builds the tokenizer and chat
template, and sizes the KV pool from a memory budget. ``generate`` streams one answer;
``engine`` runs many sequences together.
"""

from __future__ import annotations

import numbers
import re
import sys
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import PootError, PootWarning
from ..graph.passes import DEFAULT_PASSES, PassManager
from ..load import open_model
from ..load.finite import check_finite
from ..load.hostmem import huge_page_copy, huge_pages_wanted
from ..models import ConfigError, StepShapes, family_for
from ..plan import compile_plan
from ..plan.attention import POOL_TYPES
from ..plan.common import check_matmul_precision
from ..plan.layouts import lay_out
from ..plugins import host
from ..runtime import NULL_KIND, Device, get_device
from ..runtime.executor import Executor
from ..runtime.progress import prefill_progress
from ..text import TokenizerError
from ..text.chat import ChatTemplate, ChatTemplateError
from .engine import Engine, Event
from .kv import BlockPool
from .params import MAX_LOGPROBS, ParameterError, SamplingParams

KV_DTYPES = POOL_TYPES  # what the KV pools may hold (the kernels' pool types): f16 halves their memory, values rounded as written

__all__ = ["ModelHandle", "Completion", "load", "parse_bytes"]


def parse_bytes(text: str | int, name: str = "kv_memory") -> int:
    """'512M', '2G', '1.5GiB', '1000000' -> bytes (an error names the parameter ``name``)."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMgGtT]?)(i?[bB])?\s*", str(text))
    if not m:
        raise ParameterError(name, f"'{text}' is not a size (examples: 512M, 2G, 1073741824)")
    mult = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}[m.group(2).lower()]
    return int(float(m.group(1)) * mult)


def _available_memory() -> int:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 2**31


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def kv_budget(want: int, per_block: int, device: Device, weight_bytes: int, host_available: int, asked: int | None = None) -> int:
    """Bytes for the KV pool. Without ``asked`` (``kv_memory``): what ``want`` (``max_seqs`` x
    ``max_context``) needs, at most a quarter of the host's free memory (the pools' host arrays), and
    on a device with memory of its own (``Capabilities.memory_bytes``) at most what its weights leave
    there, less a tenth of it (at least 1 GiB) for activations, step scratch and the runtime. A device
    whose weights leave no room for one block is an error that says what to do. ``asked`` is taken as
    given unless it is more than the host has free or the device has beside the weights: an error,
    then, not a pool that fails (or swaps) once filled."""
    caps = device.capabilities
    room: int | None = None
    if device.target != "host" and caps is not None and caps.memory_bytes > 0:
        room = caps.memory_bytes - weight_bytes - max(caps.memory_bytes // 10, 1 << 30)
    if asked is not None:
        if asked > host_available:
            raise ParameterError("kv_memory", f"{_gib(asked)} is more than the {_gib(host_available)} of memory free on this machine: give less")
        if room is not None and asked > room:
            raise ParameterError(
                "kv_memory",
                f"{_gib(asked)} is more than {device.name} has beside the weights ({_gib(max(room, 0))} of {_gib(caps.memory_bytes)}): give less",  # type: ignore[union-attr]
            )
        return asked
    budget = min(want, host_available // 4)
    if room is not None:
        if room < per_block:
            raise ParameterError(
                "kv_memory",
                f"{device.name} has {_gib(caps.memory_bytes)}; the weights take {_gib(weight_bytes)} "  # type: ignore[union-attr]
                f"and leave no room for the KV cache: load a smaller or more quantized model, or give --kv-memory",
            )
        budget = min(budget, room)
    return budget


@dataclass
class Completion:
    text: str
    tokens: list[int]
    finish_reason: str
    prompt_tokens: int
    logprobs: list[tuple[float | None, list[tuple[int, float]] | None]] = field(default_factory=list)


class ModelHandle:
    """A model ready to generate on a device."""

    def __init__(
        self,
        model: str,
        device: str | None = None,
        *,
        kv_memory: str | int | None = None,
        max_seqs: int = 16,
        max_context: int | None = None,
        block_size: int = 16,
        max_step_tokens: int = 512,
        threads: int | None = None,
        progress: bool | None = None,
        matmul_precision: str = "high",
        kv_dtype: str = "f16",
        chat_template: str | None = None,
        check_weights: bool = True,
    ) -> None:
        self.matmul_precision = check_matmul_precision(matmul_precision)  # before anything is loaded
        if kv_dtype not in KV_DTYPES:
            raise ParameterError("kv_dtype", f"'{kv_dtype}' is not a KV cache type; choose one of {', '.join(KV_DTYPES)}")
        self.kv_dtype = kv_dtype
        self.progress = sys.stderr.isatty() if progress is None else progress
        t0 = time.perf_counter()
        self.device = get_device(device)
        factory = host().hook.poot_executor(device=self.device)
        if factory is None:
            if self.device.kind == NULL_KIND:
                raise PootError(
                    f"{self.device.name} is a compile-only device: `poot plan MODEL --device {self.device.name} --compile` plans and compiles for it"
                )
            raise PootError(f"no installed plugin can run plans on {self.device.name}")
        self._say(f"loading {model}")
        ck = open_model(model)
        self.checkpoint = ck
        self.family = family_for(ck.architecture)
        self.config = self.family.parse_config(ck)
        if check_weights:  # a NaN weight makes every answer NaN: refused by name before anything is built on it
            check_finite(ck.weights.tensors.values(), str(ck.path))
        try:
            self.tokenizer = self.family.tokenizer(ck)
        except TokenizerError as e:
            raise TokenizerError(f"{ck.path}: {e}") if ck.format == "gguf" else e from None
        if self.tokenizer.vocab_size > self.config.vocab_size:
            raise ConfigError(
                f"{ck.path}: the tokenizer has {self.tokenizer.vocab_size} tokens but the model's vocabulary (vocab_size) is "
                f"{self.config.vocab_size}: ids from {self.config.vocab_size} on have no embedding"
            )
        # the checkpoint's own template, or the one asked for; never a guess: a family's template on a
        # checkpoint that has none (a base model) makes it answer garbage
        source = self.family.default_chat_template if chat_template == "family" else (chat_template or ck.chat_template)
        if chat_template == "family" and not source:
            raise ParameterError("chat_template", f"the {ck.architecture} family has no built-in chat template")
        self.template: ChatTemplate | None = None
        self.template_error: ChatTemplateError | None = None  # a template that fails to compile stops chat prompts, not raw ones
        if source:
            try:
                self.template = ChatTemplate(
                    source, self.tokenizer.special_tokens, "the checkpoint's chat template" if source == ck.chat_template else "the chat template"
                )
            except ChatTemplateError as e:
                self.template_error = e
        self._say(f"tracing and planning its step for {self.device.name}")
        self._shapes = lambda lp: StepShapes(block_size=block_size, cache_dtype=kv_dtype, sample=True, logprobs=MAX_LOGPROBS if lp else 0)  # noqa: E731
        self._graphs: dict[bool, Any] = {}
        self._plans: dict[bool, Any] = {}
        g = self._graph(False)
        self.vocab = g.outputs["logits"].shape[1].value
        self._factory, self._threads = factory, threads
        self.weights = {t.name: t.raw() for t in ck.weights.tensors.values()}  # as stored: bf16 as its bits
        self.weights = lay_out(self.weights, self._plans[False].layouts)  # in the layouts the plan reads, once (they replace the stored bytes)
        if self.device.kind == "cpu" and huge_pages_wanted():  # read in place, token after token: from huge pages
            self.weights = huge_page_copy(self.weights)
        # KV pool: a memory budget in blocks
        self.block_size = block_size
        if max_context is not None and max_context < block_size:
            raise ParameterError("max_context", f"{max_context} is shorter than one KV block ({block_size} positions)")
        trained = int(self.config.max_context or 0)
        ctx = max_context or min(trained or 4096, 4096)
        if trained and ctx > trained:
            warnings.warn(
                f"a context of {ctx} is past the {trained} positions {model} was trained on: expect poor text beyond position {trained}",
                PootWarning,
                stacklevel=2,
            )
        per_block = 0
        cache_inputs = {n: v for n, v in g.inputs().items() if "_cache." in n}
        for v in cache_inputs.values():
            per_block += int(np.prod([d.value for d in v.shape[1:]])) * v.dtype.itemsize
        want = max_seqs * -(-ctx // block_size)
        weight_bytes = sum(int(a.nbytes) for a in self.weights.values())
        asked = parse_bytes(kv_memory) if kv_memory is not None else None
        budget = kv_budget(want * per_block, per_block, self.device, weight_bytes, _available_memory(), asked)
        blocks = budget // per_block
        if blocks < 1:
            raise ParameterError("kv_memory", f"{budget} bytes hold no KV block (one block is {per_block} bytes)")
        self.num_blocks = int(min(blocks, 1 << 20))
        held = self.num_blocks * block_size
        if held < ctx:  # one sequence could never reach its context
            if max_context is not None:
                need = -(-ctx // block_size) * per_block
                raise ParameterError(
                    "max_context",
                    f"a context of {ctx} needs {_gib(need)} of KV cache for one sequence; the pool holds {held} positions "
                    f"({_gib(self.num_blocks * per_block)}): give a smaller --context{'' if kv_memory is None else ' or a larger --kv-memory'}",
                )
            ctx = held
        self.max_context = ctx
        self.pools = {n: np.zeros((self.num_blocks,) + tuple(d.value for d in v.shape[1:]), v.dtype.numpy) for n, v in cache_inputs.items()}
        self.pools["token_counts"] = np.zeros((max_seqs, self.vocab), np.int32)
        self.pools["last_tokens"] = np.zeros(max_seqs, np.int32)
        self._executors: dict[bool, Executor] = {}
        self._closed = False
        self._user = threading.RLock()  # the thread generating: the engine serves one at a time
        self._executor(False)  # compile now; the log-probability variant when first asked
        self._constraint_compiler: Any = None
        self.engine = Engine(
            self._executor,
            self.pools,
            self.tokenizer,
            self.vocab,
            BlockPool(self.num_blocks, block_size),
            -(-ctx // block_size),
            max_seqs,
            max_step_tokens,
            self._constraints,
            MAX_LOGPROBS,
        )
        self.load_seconds = time.perf_counter() - t0
        self._say(
            f"ready in {self.load_seconds:.1f} s: {self.num_blocks} KV blocks of {block_size} ({self.num_blocks * per_block / 2**20:.0f} MiB, {kv_dtype}), "
            f"context {ctx}, {max_seqs} sequence{'s' if max_seqs != 1 else ''} at once"
        )

    def _say(self, msg: str) -> None:
        if self.progress:
            print(f"poot: {msg}", file=sys.stderr, flush=True)

    def _graph(self, logprobs: bool) -> Any:
        """The step's graph: the log-probability variant is traced when first asked for."""
        if logprobs not in self._graphs:
            traced = self.family.trace(self.config, self.checkpoint.weights, self._shapes(logprobs))
            self._graphs[logprobs] = PassManager(DEFAULT_PASSES).run(traced)
            self._plans[logprobs] = compile_plan(self._graphs[logprobs], self.device, self.matmul_precision)
        return self._graphs[logprobs]

    def _executor(self, logprobs: bool) -> Executor:
        if self._closed:
            raise PootError("this model handle is closed: load the model again (poot.load) to generate")
        if self.device.kind != "cpu":
            logprobs = True  # one executor (its pools are device memory of its own): the variant with log-probabilities
        ex = self._executors.get(logprobs)
        if ex is None:
            self._graph(logprobs)
            kw: dict[str, Any] = {"threads": self._threads}
            try:
                ex = self._factory(self._plans[logprobs], progress=self.progress, **kw)
            except TypeError:  # an executor without the optional arguments
                ex = self._factory(self._plans[logprobs])
            ex.bind(self.weights, {n: self.pools[n] for n in ex.pool_names()})
            self._executors[logprobs] = ex
        return ex

    def _constraints(self) -> Any:
        if self._constraint_compiler is None:
            from ..text.guided import ConstraintCompiler

            self._constraint_compiler = ConstraintCompiler(self.tokenizer)
        return self._constraint_compiler

    # -- prompts ------------------------------------------------------------------------------------
    def encode(self, prompt: str | Sequence[int] | Sequence[Mapping[str, Any]], raw: bool = False) -> list[int]:
        """Token ids for a prompt: ids as given, a string (through the chat template unless ``raw``
        or the model has none), or a list of chat messages."""
        if isinstance(prompt, str):
            if raw or (self.template is None and self.template_error is None):
                return self.tokenizer.encode(prompt)
            prompt = [{"role": "user", "content": prompt}]
        if isinstance(prompt, np.ndarray):  # token ids as an array: one row of integers
            if prompt.ndim != 1 or not np.issubdtype(prompt.dtype, np.integer):
                raise ParameterError("prompt", f"token ids as an array are one row of integers, got {prompt.dtype} of shape {prompt.shape}")
            prompt = prompt.tolist()
        if not isinstance(prompt, Sequence) or isinstance(prompt, (bytes, bytearray)):
            raise ParameterError("prompt", f"a string, token ids or chat messages, got {type(prompt).__name__}")
        prompt = list(prompt)
        if prompt and isinstance(prompt[0], Mapping):
            if not all(isinstance(m, Mapping) for m in prompt):
                raise ParameterError("prompt", "chat messages are dicts, every one of them")
            if self.template_error is not None:
                raise self.template_error
            if self.template is None:
                raise ParameterError("messages", "this model has no chat template: give a plain prompt")
            text = self.template.render(prompt, add_generation_prompt=True)  # type: ignore[arg-type]
            return self.tokenizer.encode(text, add_special_tokens=False)
        bad = next((t for t in prompt if not isinstance(t, numbers.Integral) or isinstance(t, bool)), None)
        if bad is not None:
            raise ParameterError("prompt", f"token ids are integers, got {bad!r} (several strings: call once for each)")
        return [int(t) for t in prompt]  # type: ignore[arg-type]

    # -- generation ---------------------------------------------------------------------------------
    def generate(self, prompt: str | Sequence[int] | Sequence[Mapping[str, Any]], params: SamplingParams | None = None, raw: bool = False) -> Iterator[Event]:
        """Stream one sequence's events (other sequences added to ``engine`` advance alongside).
        ``params``: a ``SamplingParams``, or a mapping of its fields. One thread generates on a handle
        at a time; another that tries meanwhile gets a ``PootError``."""
        self._executor(False)  # (a closed handle refuses here)
        params = _sampling(params)
        ids = self.encode(prompt, raw)
        with self._one_thread():
            yield from self._generate(ids, params)

    @contextmanager
    def _one_thread(self) -> Iterator[None]:
        """Held while a thread generates: another thread that tries meanwhile gets a PootError."""
        if not self._user.acquire(blocking=False):
            raise PootError("this model is generating in another thread: a handle serves one thread at a time (load one a thread, or serve it)")
        try:
            yield
        finally:
            self._user.release()

    def _generate(self, ids: list[int], params: SamplingParams) -> Iterator[Event]:
        sid = self.engine.add(ids, params)
        bar = prefill_progress(len(ids), self.progress)  # a long prompt takes a while before the first token
        reading = True
        try:
            while True:
                for ev in self.engine.step():
                    if ev.seq_id == sid:
                        if reading:
                            bar.close()
                            reading = False
                        yield ev
                        if ev.finished is not None:
                            return
                done = self.engine.prefilled(sid) if reading else None
                if done is not None and done > bar.n:
                    bar.update(done - bar.n)
        finally:
            bar.close()
            self.engine.cancel(sid)

    def complete(
        self,
        prompts: Sequence[str | Sequence[int] | Sequence[Mapping[str, Any]]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        raw: bool = False,
    ) -> list[Completion]:
        """Run several prompts to the end together; one ``Completion`` each, in order (a string alone is
        one prompt). ``params``: one ``SamplingParams`` (or mapping of its fields) for all, or one each."""
        if isinstance(prompts, str):
            prompts = [prompts]
        plist = [_sampling(p) for p in params] if isinstance(params, Sequence) else [_sampling(params)] * len(prompts)
        if len(plist) != len(prompts):
            raise ParameterError("params", f"{len(plist)} parameter sets for {len(prompts)} prompts")
        self._executor(False)  # (a closed handle says so here)
        ids = [self.encode(p, raw) for p in prompts]
        with self._one_thread():
            return self._complete(ids, plist)

    def _complete(self, ids: list[list[int]], plist: list[SamplingParams]) -> list[Completion]:
        sids = [self.engine.add(x, p) for x, p in zip(ids, plist)]
        out = {s: Completion("", [], "", len(x)) for s, x in zip(sids, ids)}
        left = set(sids)
        while left:
            for ev in self.engine.step():
                c = out.get(ev.seq_id)
                if c is None:
                    continue
                if ev.token is not None:
                    c.tokens.append(ev.token)
                    c.logprobs.append((ev.logprob, ev.top_logprobs))
                c.text += ev.text
                if ev.finished is not None:
                    c.finish_reason = ev.finished if ev.error is None else f"error: {ev.error}"
                    left.discard(ev.seq_id)
            if not self.engine.has_work() and left:
                raise PootError(f"sequences {sorted(left)} ended without finishing")
        return [out[s] for s in sids]

    def close(self) -> None:
        """Release the executors (device memory, captured steps); the handle generates no more."""
        self._closed = True
        for ex in self._executors.values():
            ex.close()
        self._executors.clear()

    def __enter__(self) -> ModelHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _sampling(params: SamplingParams | Mapping[str, Any] | None) -> SamplingParams:
    """``params`` as ``SamplingParams``: a mapping's fields checked by its constructor."""
    if params is None:
        return SamplingParams()
    if isinstance(params, SamplingParams):
        return params
    if isinstance(params, Mapping):
        try:
            return SamplingParams(**params)
        except TypeError as e:  # an unknown field
            raise ParameterError("params", f"{e}; the fields are SamplingParams'") from None
    raise ParameterError("params", f"a SamplingParams or a mapping of its fields, got {type(params).__name__}")


def load(model: str, device: str | None = None, **options: Any) -> ModelHandle:
    """Load ``model`` (a .gguf file, a safetensors directory or a catalog name) onto ``device``
    (default: ``POOT_DEVICE`` or the CPU). Options: ``kv_memory`` ('2G'), ``max_seqs``,
    ``max_context``, ``block_size``, ``max_step_tokens``, ``threads``, ``progress``,
    ``matmul_precision`` ("highest", "high" (default) or "medium": how f32 activations meet
    tensor cores, where the device has them, and on the CPU whether they meet Q4_0/Q4_1/Q5_0/Q8_0/
    Q4_K/Q6_K weights as two int8 terms ("highest": in f32); docs/NUMERICS.md), ``kv_dtype`` ("f16" (default) or
    "f32": the KV cache's element type; f16 holds twice the tokens in the same memory, as llama.cpp's
    default cache does), ``chat_template`` (a template's source to use instead of the checkpoint's,
    or "family" for its family's built-in one; without either, a checkpoint with no template takes
    plain prompts only)."""
    return ModelHandle(model, device, **options)
