"""Per-request sampling parameters, checked on construction: a bad value is a ``ParameterError``
naming the parameter."""

from __future__ import annotations

import hashlib
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ParameterError

__all__ = ["SamplingParams", "ParameterError", "MAX_LOGPROBS", "device_seed"]

MAX_LOGPROBS = 20  # top-N log-probabilities per token at most (OpenAI's limit)


@dataclass(frozen=True)
class SamplingParams:
    """How one sequence is sampled and when it ends.

    ``temperature`` 0 is greedy (as is any below 1e-30, where logits / temperature would overflow).
    Penalties read the sequence's history (prompt and generated tokens): ``repetition_penalty``
    divides positive logits of seen tokens and multiplies negative ones;
    ``presence_penalty`` and ``frequency_penalty`` subtract once per seen token and per occurrence.
    ``logit_bias`` adds to logits first. ``seed`` (any integer) makes draws repeatable (the same seed
    gives the same tokens); without one the engine picks a seed per request. ``logprobs``: the sampled token's
    log-probability and the top-N alternatives. Exactly one of ``json_schema``, ``regex``,
    ``grammar`` (Lark) or ``choice`` constrains the output.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    seed: int | None = None
    max_tokens: int = 256
    stop: Sequence[str] = ()
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    json_schema: Mapping[str, Any] | str | bool | None = None
    regex: str | None = None
    grammar: str | None = None
    choice: Sequence[str] | None = None

    def __post_init__(self) -> None:
        def check(ok: bool, name: str, msg: str) -> None:
            if not ok:
                raise ParameterError(name, msg)

        for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            check(isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v), name, f"must be a finite number, got {v!r}")
        if isinstance(self.stop, str):  # one stop string, not its characters
            object.__setattr__(self, "stop", (self.stop,))
        check(self.temperature >= 0, "temperature", f"must be >= 0, got {self.temperature}")
        check(isinstance(self.top_k, int) and self.top_k >= 0, "top_k", f"must be an integer >= 0 (0: off), got {self.top_k!r}")
        check(0 < self.top_p <= 1, "top_p", f"must be in (0, 1], got {self.top_p}")
        check(0 <= self.min_p <= 1, "min_p", f"must be in [0, 1], got {self.min_p}")
        check(self.repetition_penalty > 0, "repetition_penalty", f"must be > 0, got {self.repetition_penalty}")
        check(-2 <= self.presence_penalty <= 2, "presence_penalty", f"must be in [-2, 2], got {self.presence_penalty}")
        check(-2 <= self.frequency_penalty <= 2, "frequency_penalty", f"must be in [-2, 2], got {self.frequency_penalty}")
        check(isinstance(self.max_tokens, int) and self.max_tokens >= 1, "max_tokens", f"must be an integer >= 1, got {self.max_tokens!r}")
        check(
            self.logprobs is None or (isinstance(self.logprobs, int) and 0 <= self.logprobs <= MAX_LOGPROBS),
            "logprobs",
            f"must be an integer in [0, {MAX_LOGPROBS}], got {self.logprobs!r}",
        )
        check(self.seed is None or isinstance(self.seed, int), "seed", f"must be an integer, got {self.seed!r}")
        for k, v in self.logit_bias.items():
            check(isinstance(k, int) and k >= 0, "logit_bias", f"keys are token ids, got {k!r}")
            check(
                isinstance(v, numbers.Real) and not isinstance(v, bool) and -100 <= v <= 100,
                "logit_bias",
                f"values must be numbers in [-100, 100], got {v!r} for token {k}",
            )
        check(
            all(isinstance(t, numbers.Integral) and not isinstance(t, bool) and t >= 0 for t in self.stop_token_ids),
            "stop_token_ids",
            f"must be token ids (integers >= 0), got {list(self.stop_token_ids)[:5]!r}",
        )
        check(all(isinstance(s, str) and s for s in self.stop), "stop", "must be non-empty strings")
        given = [n for n in ("json_schema", "regex", "grammar", "choice") if getattr(self, n) is not None]
        check(len(given) <= 1, given[-1] if given else "json_schema", f"give one constraint, not {', '.join(given)}")

    @property
    def constrained(self) -> bool:
        return any(getattr(self, n) is not None for n in ("json_schema", "regex", "grammar", "choice"))


def device_seed(seed: int) -> int:
    """Any integer seed as the int32 the sampling kernels draw from: one in int32's range as it is,
    another as 32 bits of a hash of the whole integer, so that seeds apart by a multiple of 2**32
    (42 and 2**32 + 42, -1 and 2**32 - 1) draw differently and every integer a client may send is a
    seed."""
    s = int(seed)
    if -(1 << 31) <= s < (1 << 31):
        return s
    raw = s.to_bytes(s.bit_length() // 8 + 1, "little", signed=True)  # (no decimal digits: Python caps their count)
    digest = hashlib.blake2b(raw, digest_size=4, person=b"poot-seed").digest()
    return int.from_bytes(digest, "little", signed=True)
