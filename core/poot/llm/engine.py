"""The driver: one ``step()`` advances every running sequence, with prefill chunks and decode tokens
mixed in one batch, and returns what each produced.

Per step: decode tokens first (one per running sequence), then prefill chunks within the token budget;
a sequence whose known tokens are all in after this step gets a logit row and a sampled token. The
batch is padded to a few bucketed shapes (tokens, sequences, rows, block-table width), so the
executor captures each shape once and replays it; padding tokens write no KV and count no history.
Only the sampled ids (and log-probabilities when asked) come back from the device. On an asynchronous
executor each step is queued before the one before is read, its unknown tokens taken on the device.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import PootError
from ..models.decoder import StepBatch
from ..plan.plan import WANT_LOGPROBS
from ..runtime.executor import Executor, step_env
from ..text.detok import StreamingDetokenizer
from ..text.guided import Constraint, ConstraintCompiler
from ..text.stop import StopMatcher
from ..text.tokenizer import Tokenizer
from .kv import BlockPool, BlockTable, OutOfBlocks
from .params import ParameterError, SamplingParams, device_seed

__all__ = ["Engine", "Event", "SequenceState", "StepInputs"]

BIAS_WIDTHS = (1, 8, 64, 512)


def _bucket_tokens(n: int) -> int:
    """The step's token count padded to its bucket: a power of two up to 16 (decode batches of 9-16
    sequences run 16 rows, not 32: products of few rows cost about their row count), then a
    multiple of 32."""
    if n <= 16:
        return 1 << max(0, (n - 1).bit_length())
    return -(-n // 32) * 32


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


# temperatures below this sample greedily (their limit): logits divided by them would leave f32's range
GREEDY_BELOW = 1e-30
_F32_MAX = float(np.finfo(np.float32).max)
_F32_TINY = float(np.finfo(np.float32).tiny)  # the least top_p: a smaller one is 0 in f32, and keeps no token
REPETITION_MIN = 1e-30  # the least repetition penalty: seen tokens' logits divided by it stay finite in f32


@dataclass
class Event:
    """What a sequence produced in a step: a token (``None`` when it only finished), the text that
    became final, and why it finished, if it did ("stop", "length", "cancelled", "error", or
    "shutdown": a server that stops ended it)."""

    seq_id: int
    token: int | None
    text: str
    finished: str | None = None
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None
    error: str | None = None
    # the sampling parameter to blame for an error, where the request is ("json_schema", "regex",
    # "grammar", "choice": a constraint its grammar engine could not follow); None: the server
    error_param: str | None = None


@dataclass
class SequenceState:
    id: int
    prompt: list[int]
    params: SamplingParams
    seed: int
    table: BlockTable | None = None
    count_row: int = -1
    tokens: list[int] = field(default_factory=list)
    computed: int = 0  # positions whose KV is written
    generated: list[int] = field(default_factory=list)
    constraint: Constraint | None = None
    detok: StreamingDetokenizer | None = None
    stop: StopMatcher | None = None
    finished: str | None = None
    awaiting: int = 0  # tokens of it that steps in flight are sampling
    passed: int = 0  # sequences admitted ahead of it while it waited first in line (``Engine._admit``)
    failure: str | None = None  # why its constraint gave no mask for the step in flight (it ends on that step's token)

    @property
    def pending(self) -> int:
        return len(self.tokens) - self.computed


@dataclass
class StepInputs:
    """A step built for the executor: its symbol values, its inputs (padded to the bucket), the
    outputs a launch keeps, its real and padded token counts, and the sequences that get a token."""

    executor: Executor
    env: dict[str, int]
    inputs: dict[str, np.ndarray]
    keep: tuple[str, ...]
    tokens: int
    padded_tokens: int
    rows: list[SequenceState]


@dataclass
class _Queued:
    """A step handed to the executor: the sequences in it and those that get a token from it."""

    ex: Executor
    handle: Any
    seqs: list[SequenceState]
    rows: list[SequenceState]
    want_lp: bool


class Engine:
    """Sequences over one compiled step. ``executors(logprobs)`` gives the executor of the plan with
    (or without) the log-probability suffix; ``pools`` are the KV pools, the token-count pool and
    each sequence's latest token (``last_tokens``), bound to both. ``lookahead``: queue each step
    before reading the one before (None: where the executor is ``asynchronous``)."""

    def __init__(
        self,
        executors: Callable[[bool], Executor],
        pools: dict[str, np.ndarray],
        tokenizer: Tokenizer,
        vocab: int,
        block_pool: BlockPool,
        max_blocks_per_seq: int,
        max_seqs: int,
        max_step_tokens: int = 512,
        constraints: Callable[[], ConstraintCompiler] | None = None,
        logprobs_n: int = 20,
        lookahead: bool | None = None,
    ) -> None:
        self._executors, self.pools, self.tok, self.vocab = executors, pools, tokenizer, vocab
        self.blocks, self.max_blocks, self.max_seqs, self.max_step_tokens = block_pool, max_blocks_per_seq, max_seqs, max_step_tokens
        self._constraints, self.logprobs_n = constraints, logprobs_n
        self._words = -(-vocab // 32)
        self._free_rows = list(range(max_seqs - 1, -1, -1))
        self.waiting: list[SequenceState] = []
        self.running: list[SequenceState] = []
        self._next_id = 0
        self._envs: dict[tuple[Any, ...], dict[str, int]] = {}  # the step inputs' shapes -> their symbol values
        self._queued: _Queued | None = None  # the step queued ahead of the one being read
        # queue each step before reading the one before (None: where the executor runs steps asynchronously)
        self.lookahead = lookahead
        self.stats = {"steps": 0, "prefill_tokens": 0, "decode_tokens": 0, "padded_tokens": 0}

    # -- requests -----------------------------------------------------------------------------------
    def add(self, prompt: Sequence[int], params: SamplingParams | None = None, constraint: Constraint | None = None) -> int:
        """Queue a sequence; its id. ``constraint``: its output's constraint compiled already
        (``constraints``), else compiled here from ``params``."""
        params = params or SamplingParams()
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise ParameterError("prompt", "needs at least one token")
        bad = [t for t in prompt if not 0 <= t < self.vocab]
        if bad:
            raise ParameterError("prompt", f"token ids {bad[:5]} are outside the vocabulary of {self.vocab}")
        cap = self.max_blocks * self.blocks.block_size
        if len(prompt) >= cap:  # the prompt alone: max_tokens (maybe its default) is not to blame
            raise ParameterError("prompt", f"the prompt has {len(prompt)} tokens; the context holds {cap} positions (raise --context, or shorten the prompt)")
        if len(prompt) + params.max_tokens > cap:
            raise ParameterError("max_tokens", f"prompt of {len(prompt)} tokens + max_tokens {params.max_tokens} exceed the context of {cap} positions")
        need = -(-(len(prompt) + params.max_tokens) // self.blocks.block_size)
        if need > self.blocks.num_blocks:
            raise ParameterError("max_tokens", f"the sequence would need {need} KV blocks; the pool has {self.blocks.num_blocks} (raise --kv-memory)")
        bad_bias = [t for t in params.logit_bias if t >= self.vocab]
        if bad_bias:
            raise ParameterError("logit_bias", f"token ids {bad_bias[:5]} are outside the vocabulary of {self.vocab}")
        if constraint is None:
            constraint = self._constraint(params)
        seed = device_seed(params.seed) if params.seed is not None else int.from_bytes(os.urandom(4), "little", signed=True)
        s = SequenceState(self._next_id, prompt, params, seed, constraint=constraint)
        s.detok = StreamingDetokenizer(self.tok, skip_special_tokens=True)
        s.stop = StopMatcher(list(params.stop))
        self._next_id += 1
        self.waiting.append(s)
        return s.id

    def constraints(self, params: Sequence[SamplingParams]) -> list[Constraint | None]:
        """The output constraints of sequences about to be added (``add``'s ``constraint``), each
        distinct one compiled once and copied for the others that share it: a caller compiles them
        off the thread that steps the engine (a large grammar takes a second or more)."""
        out: list[Constraint | None] = []
        made: dict[tuple, Constraint] = {}
        for p in params:
            key = (repr(p.json_schema), p.regex, p.grammar, repr(p.choice))
            if not p.constrained:
                out.append(None)
            elif key in made:
                out.append(made[key].copy())
            else:
                c = made[key] = self._constraint(p)  # type: ignore[assignment]
                out.append(c)
        return out

    def _constraint(self, p: SamplingParams) -> Constraint | None:
        if not p.constrained:
            return None
        if self._constraints is None:
            raise ParameterError("json_schema", "guided decoding is not available for this model")
        cc = self._constraints()
        if p.json_schema is not None:
            return cc.json_schema(p.json_schema)
        if p.regex is not None:
            return cc.regex(p.regex)
        if p.grammar is not None:
            return cc.grammar(p.grammar)
        return cc.choice(list(p.choice or ()))

    def cancel(self, seq_id: int) -> bool:
        for lst in (self.waiting, self.running):
            for s in lst:
                if s.id == seq_id:
                    lst.remove(s)
                    self._release(s, "cancelled")
                    return True
        return False

    def prefilled(self, seq_id: int) -> int | None:
        """How many of a sequence's prompt tokens are in its KV cache (or on their way, in a step in
        flight); None once it has finished or if there is no such sequence."""
        for lst in (self.running, self.waiting):
            for s in lst:
                if s.id == seq_id:
                    return min(s.computed, len(s.prompt))
        return None

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _release(self, s: SequenceState, why: str) -> None:
        s.finished = s.finished or why
        if s.table is not None:
            self.blocks.close(s.table)
        if s.count_row >= 0:
            self._free_rows.append(s.count_row)
            s.count_row = -1

    def _admit(self) -> None:
        """Admit waiting sequences in arrival order while rows and KV blocks (each sequence's whole
        reservation, prompt and ``max_tokens``) are free. When the first in line does not fit yet,
        later ones that fit are admitted past it (a short request need not wait for the blocks of a
        long one), but at most ``max_seqs`` of them: then nothing more until it fits, so a long
        request is never starved by a stream of short ones. Past the first, the next ``max_seqs``
        in line are looked at, each only where its reservation could fit the free blocks even if
        every whole block of its prompt were shared (a step's admission stays a few table lookups
        under a long queue)."""
        i, bs = 0, self.blocks.block_size
        while i < len(self.waiting) and self._free_rows:
            if i and (self.waiting[0].passed >= self.max_seqs or i > self.max_seqs):
                return  # the first in line has been passed enough (or the look ahead ends): it goes next
            s = self.waiting[i]
            need = -(-(len(s.prompt) + s.params.max_tokens) // bs) - (len(s.prompt) - 1) // bs
            if i and need > self.blocks.free_blocks:
                i += 1  # cannot fit now, however much of its prompt is shared
                continue
            table = self.blocks.open(s.prompt)
            try:
                self.blocks.ensure(table, len(s.prompt) + s.params.max_tokens)
            except OutOfBlocks:
                self.blocks.close(table)
                if not self.running and i == 0:
                    raise PootError("the KV pool cannot hold even one waiting sequence") from None
                i += 1  # the next in line, if it fits
                continue
            self.waiting.pop(i)
            if i:
                self.waiting[0].passed += 1
            s.table = table
            s.tokens = list(s.prompt)
            s.computed = table.shared_tokens
            s.count_row = self._free_rows.pop()
            row = np.zeros(self.vocab, np.int32)
            if s.computed:  # tokens taken over from a shared prefix still count as history
                np.add.at(row, np.array(s.prompt[: s.computed]), 1)
            self._executors(False).write_pool("token_counts", s.count_row, row)
            self.running.append(s)

    # -- the step -----------------------------------------------------------------------------------
    def step(self) -> list[Event]:
        """Advance every running sequence by one step; returns their events (may be empty).

        Where the executor runs a step while the host goes on (``asynchronous``), the step after is
        queued before this one's tokens are read: its decode tokens are queued as -1, which the
        device replaces with what this step samples for their sequences (``feed_tokens``), so the
        device never waits for the host between steps. A sequence whose next step depends on its
        token on the host (guided decoding), or whose token may be its last by length, waits for it
        instead; one that ends on this token had its queued row computed for nothing (its results
        are dropped)."""
        self._admit()
        cur, self._queued = self._queued, None
        if cur is None:
            plan = self._schedule()
            if not plan:
                return []
            cur = self._launch(plan)
        if cur.ex.asynchronous if self.lookahead is None else self.lookahead:
            plan = self._schedule(ahead=True)
            if plan:
                self._queued = self._launch(plan)
        events = self._finish(cur)
        self.running = [s for s in self.running if s.finished is None]
        if self._queued is not None and all(s.finished is not None for s in self._queued.seqs):
            self._queued = None  # everything it computes is for sequences that have ended: nobody reads it
        return events

    def _schedule(self, ahead: bool = False) -> list[tuple[SequenceState, int]]:
        """The next step's (sequence, tokens): decode tokens first, then prefill chunks within the
        token budget. ``ahead``: queued before the step in flight is read, so a sequence awaiting
        its token from that step decodes it from the device, or (guided, or at its length limit)
        sits this step out."""
        budget = self.max_step_tokens
        plan: list[tuple[SequenceState, int]] = []  # (sequence, tokens this step)
        decoding = []
        for s in self.running:
            if s.finished is not None:
                continue
            if s.awaiting:
                if ahead and s.constraint is None and len(s.generated) + 1 < s.params.max_tokens:
                    decoding.append(s)
            elif s.pending == 1 and s.computed >= len(s.prompt):
                decoding.append(s)
        for s in decoding:
            plan.append((s, 1))
            budget -= 1
        for s in self.running:
            if budget <= 0:
                break
            if s.finished is None and not s.awaiting and s not in decoding and s.pending > 0:
                n = min(s.pending, budget)
                plan.append((s, n))
                budget -= n
        plan.sort(key=lambda x: x[0].id)
        return plan

    def next_step(self) -> StepInputs:
        """The step ``step()`` would queue next (sequences admitted first), built but not queued:
        nothing advances. What ``poot profile`` times: the engine's own shapes and padding."""
        self._admit()
        plan = self._schedule()
        if not plan:
            raise PootError("no sequence has work for a step: add one first")
        return self._inputs(plan)

    def _inputs(self, plan: list[tuple[SequenceState, int]]) -> StepInputs:
        """The inputs of a step of ``plan`` (a token not known yet: -1), padded to its bucket."""
        toks, pos, sid, slots = [], [], [], []
        ctx, tables, rows, row_seqs = [], [], [], []
        for b, (s, n) in enumerate(plan):
            for p in range(s.computed, s.computed + n):
                toks.append(s.tokens[p] if p < len(s.tokens) else -1)  # -1: the token the step in flight samples
                pos.append(p)
                sid.append(b)
                slots.append(self.blocks.slot(s.table, p))  # type: ignore[arg-type]
            ctx.append(s.computed + n)
            tables.append(s.table.blocks)  # type: ignore[union-attr]
            if s.computed + n >= len(s.tokens):
                rows.append(len(toks) - 1)
                row_seqs.append(s)
        T, B, R = len(toks), len(plan), len(rows)
        Tb, Rb = _bucket_tokens(T), _pow2(max(R, 1))
        pad = Tb > T or Rb > R
        Bb = _pow2(B + (1 if pad else 0))
        tok_a = np.zeros(Tb, np.int32)
        tok_a[:T] = toks
        pos_a = np.zeros(Tb, np.int32)
        pos_a[:T] = pos
        sid_a = np.full(Tb, B, np.int32)  # padding tokens belong to an empty batch entry
        sid_a[:T] = sid
        slot_a = np.full(Tb, -1, np.int32)
        slot_a[:T] = slots
        ctx_a = np.zeros(Bb, np.int32)
        ctx_a[:B] = ctx
        # the block tables as wide as this step's longest context needs, in powers of two: a step's
        # captured shape (and the attention schedule chosen for it) follows the context, not the
        # longest one the model was loaded for
        bs = self.blocks.block_size
        mb = min(self.max_blocks, _pow2(max(-(-c // bs) for c in ctx)))
        bt = np.zeros((Bb, mb), np.int32)
        for b, t in enumerate(tables):
            bt[b, : min(len(t), mb)] = t[:mb]
        row_a = np.zeros(Rb, np.int32)
        row_a[:R] = rows
        batch = StepBatch(tok_a, pos_a, sid_a, slot_a, ctx_a, bt, row_a).as_inputs()
        count_rows = np.full(Bb, -1, np.int32)
        count_rows[:B] = [s.count_row for s, _ in plan]
        want_lp = any(s.params.logprobs is not None for s in row_seqs)
        sampling = self._sampling_inputs(row_seqs, Rb)
        sampling["count_rows"] = count_rows
        ex = self._executors(want_lp)
        inputs = {**batch, **sampling}
        # the symbol values follow from the shapes alone: worked out once a shape (a dictionary
        # lookup a step after that, where a pass over every input costs tens of microseconds)
        shapes = (want_lp, *(a.shape for a in inputs.values()))
        env = self._envs.get(shapes)
        if env is None:
            env = self._envs[shapes] = {**step_env(ex.plan, {**inputs, **self.pools}), WANT_LOGPROBS: int(want_lp)}
        keep = ("tokens", "logprob", "top_ids", "top_logprobs") if want_lp else ("tokens",)
        return StepInputs(ex, env, inputs, keep, T, Tb, row_seqs)

    def _launch(self, plan: list[tuple[SequenceState, int]]) -> _Queued:
        """Queue the step of ``plan`` and advance each sequence's computed positions; the sequences
        that get a token wait for it (``awaiting``)."""
        si = self._inputs(plan)
        ex, row_seqs, want_lp = si.executor, si.rows, "logprob" in si.keep
        handle = ex.launch(ex.capture(si.env), si.inputs, si.keep)
        self.stats["steps"] += 1
        self.stats["padded_tokens"] += si.padded_tokens - si.tokens
        for s, n in plan:
            if s.computed < len(s.prompt):
                self.stats["prefill_tokens"] += n
            else:
                self.stats["decode_tokens"] += n
            s.computed += n
            self.blocks.computed(s.table, s.computed)  # type: ignore[arg-type]
        for s in row_seqs:
            s.awaiting += 1
        return _Queued(ex, handle, [s for s, _ in plan], row_seqs, want_lp)

    def _finish(self, q: _Queued) -> list[Event]:
        """Wait for a queued step, and turn its tokens into events (none for a sequence that ended
        before them)."""
        ex = q.ex
        ex.finish(q.handle)
        out_tokens = ex.fetch(q.handle, "tokens")
        lp = (ex.fetch(q.handle, "logprob"), ex.fetch(q.handle, "top_ids"), ex.fetch(q.handle, "top_logprobs")) if q.want_lp else None
        events = []
        for r, s in enumerate(q.rows):
            s.awaiting -= 1
            if s.finished is None:
                events.append(self._accept(s, int(out_tokens[r]), None if lp is None else (r, lp)))
        return events

    def _sampling_inputs(self, seqs: list[SequenceState], rows: int) -> dict[str, np.ndarray]:
        f = lambda: np.zeros(rows, np.float32)  # noqa: E731
        i = lambda: np.zeros(rows, np.int32)  # noqa: E731
        d: dict[str, Any] = {
            "temperature": f(),
            "top_k": i(),
            "top_p": np.ones(rows, np.float32),
            "min_p": f(),
            "repetition": np.ones(rows, np.float32),
            "presence": f(),
            "frequency": f(),
            "seeds": i(),
            "steps": i(),
            "row_count_rows": np.full(rows, -1, np.int32),
            "mask": np.full((rows, self._words), -1, np.int32),
        }
        most = max((len(s.params.logit_bias) for s in seqs), default=0)
        # a few widths, so that a step's captured shapes (each kept by the executor) stay few: past
        # the last, powers of two (any bias a request may give is one of a dozen more)
        width = next((w for w in BIAS_WIDTHS if w >= most), None) or 1 << (most - 1).bit_length()
        bias_ids = np.full((rows, width), -1, np.int32)
        bias_vals = np.zeros((rows, width), np.float32)
        for r, s in enumerate(seqs):
            p = s.params
            d["temperature"][r] = min(p.temperature, _F32_MAX) if p.temperature >= GREEDY_BELOW else 0.0
            d["top_k"][r] = min(p.top_k, self.vocab)  # (any k past the vocabulary keeps every token)
            d["top_p"][r] = max(p.top_p, _F32_TINY)  # (the smallest keeps the likeliest token, as any top_p > 0)
            d["min_p"][r] = p.min_p
            # (from below too: a penalty that is 0 in f32 turns seen tokens' logits infinite)
            d["repetition"][r] = min(max(p.repetition_penalty, REPETITION_MIN), _F32_MAX)
            d["presence"][r] = p.presence_penalty
            d["frequency"][r] = p.frequency_penalty
            d["seeds"][r] = s.seed
            d["steps"][r] = len(s.generated) + s.awaiting  # (the tokens awaited from steps in flight are generated by then)
            d["row_count_rows"][r] = s.count_row
            for j, (tid, val) in enumerate(p.logit_bias.items()):
                bias_ids[r, j] = tid
                bias_vals[r, j] = val
            if s.constraint is not None:
                s.failure = None
                try:
                    m = s.constraint.bitmask()
                except Exception as e:  # (llguidance's own too) this sequence ends on the step's token; the others in the step go on
                    s.failure = f"the output constraint failed: {e}"
                    continue
                d["mask"][r] = 0
                d["mask"][r, : min(len(m), self._words)] = m[: self._words]
        d["bias_ids"], d["bias_vals"] = bias_ids, bias_vals
        return d

    @staticmethod
    def _constraint_param(p: SamplingParams) -> str | None:
        """The parameter that set a sequence's output constraint (what a failure of it blames)."""
        return next((n for n in ("json_schema", "regex", "grammar", "choice") if getattr(p, n) is not None), None)

    def _accept(self, s: SequenceState, token: int, lp: tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray]] | None) -> Event:
        p = s.params
        if not 0 <= token < self.vocab:  # (no sampling input should draw one; never fed back as the next input)
            ev = Event(s.id, None, "", "error", error=f"the sampler drew token {token}, outside the vocabulary of {self.vocab}")
            self._release(s, "error")
            return ev
        if s.failure is not None:
            ev = Event(s.id, None, "", "error", error=s.failure, error_param=self._constraint_param(p))
            self._release(s, "error")
            return ev
        ev = Event(s.id, token, "")
        if lp is not None and p.logprobs is not None:
            r, (chosen, ids, vals) = lp
            ev.logprob = float(chosen[r])
            ev.top_logprobs = [(int(ids[r, j]), float(vals[r, j])) for j in range(p.logprobs)]
        s.generated.append(token)
        s.tokens.append(token)
        if s.constraint is not None:
            try:
                s.constraint.advance(token)
            except PootError as e:
                ev.finished, ev.error = "error", f"the output constraint failed: {e}"
                ev.error_param = self._constraint_param(p)
                self._release(s, "error")
                return ev
        end = (token in self.tok.stop_ids and not p.ignore_eos) or token in p.stop_token_ids or (s.constraint is not None and s.constraint.is_finished())
        if not end:
            res = s.stop.feed(s.detok.push(token))  # type: ignore[union-attr]
            ev.text = res.text
            if res.stopped:
                ev.finished = "stop"
        else:
            ev.finished = "stop"
        if ev.finished is None and len(s.generated) >= p.max_tokens:
            ev.finished = "length"
        if ev.finished is not None:
            if ev.finished == "length" or (end and not s.stop.done):  # type: ignore[union-attr]
                ev.text += s.stop.feed(s.detok.finish()).text + s.stop.flush()  # type: ignore[union-attr]
            self._release(s, ev.finished)
        return ev
