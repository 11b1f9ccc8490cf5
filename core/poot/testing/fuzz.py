"""Fuzzing checkpoints: mutations of real headers, and what every mutated file must keep to.

A seed is a real checkpoint's header (its metadata, tokenizer arrays cut short so a case parses in
milliseconds, and its whole tensor table) over a sparse hole the size of its data. A case applies a
few mutations (bytes, 32- and 64-bit values from a list of boundary numbers, cuts, insertions) to
the header and runs everything a load does before it touches weights: open the file, view every
tensor, map roles, parse the family's config, build the tokenizer, compile the chat template.

The property (``check_checkpoint``): only poot's typed errors (``PootError``) come out, nothing
takes more than ``time_limit`` seconds, and Python's allocations peak below the file's size plus
``memory_slack`` (a length field of 2^40 must be refused, not allocated). The suite draws cases with
hypothesis; ``bench/fuzz_checkpoints.py`` draws ten thousand with ``random_ops``.
"""

from __future__ import annotations

import json
import random
import signal
import struct
import threading
import time
import traceback
import tracemalloc
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import PootError

__all__ = [
    "INTERESTING",
    "Op",
    "mutate",
    "random_ops",
    "Seed",
    "gguf_seed",
    "safetensors_seed",
    "Outcome",
    "CaseFailed",
    "check_checkpoint",
]

# boundary values for length and count fields: around the small, the signed and the unsigned limits
INTERESTING = [0, 1, 2, 3, 31, 32, 255, 2**16, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**63 - 1, 2**63, 2**64 - 1]
KINDS = ("byte", "u32", "u64", "cut", "insert")

Op = tuple[str, int, int]  # (kind, position, value)


def mutate(data: bytes, ops: Sequence[Op], limit: int) -> bytes:
    """``data`` with ``ops`` applied in order; positions are taken modulo ``limit`` (the header's
    length, so mutations land where a reader parses)."""
    d = bytearray(data)
    for kind, pos, val in ops:
        if not d:
            break
        pos %= max(1, min(limit, len(d)))
        if kind == "byte":
            d[pos] = val & 0xFF
        elif kind == "u32":
            d[pos : pos + 4] = (val % 2**32).to_bytes(4, "little")
        elif kind == "u64":
            d[pos : pos + 8] = (val % 2**64).to_bytes(8, "little")
        elif kind == "cut":
            del d[pos:]
        elif kind == "insert":
            d[pos:pos] = bytes(range(1, min(val, 64) + 1))
        else:
            raise ValueError(f"unknown mutation {kind!r}")
    return bytes(d)


def random_ops(rng: random.Random, most: int = 4) -> list[Op]:
    """One to ``most`` mutations drawn from ``rng``, as the suite's hypothesis strategy draws them."""
    ops: list[Op] = []
    for _ in range(rng.randint(1, most)):
        kind = rng.choice(KINDS)
        pos = rng.randrange(2**20)
        val = {"byte": rng.randrange(256), "u32": rng.choice(INTERESTING), "u64": rng.choice(INTERESTING), "cut": 0, "insert": rng.randint(1, 16)}[kind]
        ops.append((kind, pos, val))
    return ops


@dataclass(frozen=True)
class Seed:
    """A real header to mutate: its bytes, the file's whole size, and the file name's suffix."""

    name: str
    header: bytes
    total: int
    suffix: str

    def write(self, data: bytes, directory: Path) -> Path:
        """``data`` (a mutated header) followed by a sparse hole as long as the seed's data region."""
        p = directory / f"fuzz{self.suffix}"
        with open(p, "wb") as f:
            f.write(data)
            f.truncate(len(data) + self.total - len(self.header))
        return p

    def __repr__(self) -> str:  # hypothesis prints its arguments; the header bytes are not worth it
        return f"<seed {self.name}: {len(self.header)}-byte header>"


def gguf_seed(src: str | Path, directory: Path, name: str | None = None) -> Seed:
    """A seed from a real GGUF: its header copied (``copy_gguf_header``), checked to load cleanly
    itself, so that mutations explore paths past the first check."""
    from ..load import open_checkpoint
    from .checkpoints import copy_gguf_header

    dst = copy_gguf_header(src, directory / (Path(src).stem + ".hdr.gguf"))
    outcome = check_checkpoint(dst)
    if outcome.refused is not None:
        raise AssertionError(f"the unmutated header of {src} is refused: {outcome.refused}")
    ck = open_checkpoint(dst)
    hdr_len = min(t.info.offset for t in ck.tensors.values())
    data = dst.read_bytes()
    return Seed(name or Path(src).stem, data[:hdr_len], len(data), ".gguf")


def safetensors_seed(seed: int) -> Seed:
    """A small safetensors file with four tensors of the plain types, random bytes as their data."""
    rng = random.Random(seed)
    tensors: dict[str, object] = {}
    blobs, off = [], 0
    for i, (dt, size) in enumerate([("F32", 4), ("F16", 2), ("BF16", 2), ("I32", 4)]):
        shape = [rng.randint(1, 4), rng.randint(1, 4)]
        n = shape[0] * shape[1] * size
        tensors[f"model.layers.{i}.mlp.up_proj.weight"] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        blobs.append(rng.randbytes(n))
        off += n
    tensors["__metadata__"] = {"format": "pt"}
    h = json.dumps(tensors).encode()
    header = struct.pack("<Q", len(h)) + h
    return Seed(f"safetensors-{seed}", header + b"".join(blobs), len(header) + off, ".safetensors")


@dataclass
class Outcome:
    """How a case went: ``refused`` is the typed error's class and message (None: it loaded)."""

    refused: str | None
    seconds: float
    peak_bytes: int


class CaseFailed(AssertionError):
    """A case broke the property: an untyped exception, too long, or too much memory."""


class _Timeout(BaseException):  # not an Exception: the code under test must not swallow it
    pass


def _load_as_far_as_weights(path: Path) -> None:
    from ..load import open_checkpoint
    from ..models import family_for
    from ..text.chat import ChatTemplate

    ck = open_checkpoint(path)
    size = path.stat().st_size
    for t in ck.tensors.values():  # a file that opens must give readable, in-bounds views
        raw = t.raw()
        if raw.nbytes != t.info.nbytes or t.info.offset + t.info.nbytes > size:
            raise CaseFailed(f"{t.name}: a view of {raw.nbytes} bytes at {t.info.offset} for {t.info.nbytes} in a {size}-byte file")
    ck.weights.n_layers  # noqa: B018 - mapping roles must not raise either
    family = family_for(ck.architecture)
    family.parse_config(ck)
    tok = family.tokenizer(ck)
    if ck.chat_template:
        ChatTemplate(ck.chat_template, tok.special_tokens, "the checkpoint's chat template")


def check_checkpoint(path: Path, time_limit: float = 10.0, memory_slack: int = 64 << 20) -> Outcome:
    """Load ``path`` as far as its weights; raise ``CaseFailed`` if the property does not hold."""
    path = Path(path)
    budget = path.stat().st_size + memory_slack
    alarm = threading.current_thread() is threading.main_thread()
    if alarm:

        def expire(signum, frame):  # type: ignore[no-untyped-def]
            raise _Timeout

        old = signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, time_limit)
    tracing = not tracemalloc.is_tracing()
    if tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    t0 = time.perf_counter()
    refused: str | None = None
    try:
        _load_as_far_as_weights(path)
    except PootError as e:
        refused = f"{type(e).__name__}: {e}"
    except _Timeout:
        raise CaseFailed(f"{path}: still loading after {time_limit} s") from None
    except CaseFailed:
        raise
    except Exception as e:  # noqa: BLE001 - anything untyped is what the fuzzing looks for
        raise CaseFailed(f"{path}: {type(e).__name__} escaped:\n{traceback.format_exc()}") from e
    finally:
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        peak = tracemalloc.get_traced_memory()[1]
        if tracing:
            tracemalloc.stop()
    seconds = time.perf_counter() - t0
    if seconds > time_limit:
        raise CaseFailed(f"{path}: took {seconds:.1f} s (the limit is {time_limit} s)")
    if peak > budget:
        raise CaseFailed(f"{path}: Python allocations peaked at {peak} bytes for a {path.stat().st_size}-byte file")
    return Outcome(refused, seconds, peak)
