"""Tokenizers on the ``tokenizers`` library, built from GGUF metadata or from an HF ``tokenizer.json``.

From GGUF (llama.cpp's ``tokenizer.ggml.*`` keys):

- ``gpt2``: byte-level BPE with the file's merges; the pre-tokenizer split follows
  ``tokenizer.ggml.pre`` (the regexes the model families bring) or GPT-2's own;
- ``llama``: SentencePiece-style BPE with byte fallback (``<0xNN>`` tokens); merges come from the
  file or are rebuilt from the vocabulary ranked by score. ``sentencepiece_spaces`` says how the
  vocabulary spells spaces: ``metaspace`` (the default: ``▁`` with a prefix space) or ``plain``
  (runs of spaces kept as spaces, merges ranked by file order, no prefix space), which a model
  family asks for through ``ModelFamily.tokenizer_options``.

Tokens the file marks CONTROL become special tokens and USER_DEFINED ones added tokens, so both are
matched whole in text. BOS/EOS follow ``add_bos_token`` / ``add_eos_token``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
from tokenizers import Tokenizer as Backend
from tokenizers.models import BPE

from ..errors import PootError

__all__ = ["Tokenizer", "TokenizerError", "byte_level_alphabet"]

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"


class TokenizerError(PootError):
    """A tokenizer cannot be built from what the checkpoint provides, or a text given it is no
    Unicode text (a lone surrogate, which JSON's escapes can carry)."""


def byte_level_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (bytes that print stay themselves)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


@dataclass(frozen=True)
class _Spec:
    kind: str  # "byte-level" | "sentencepiece" | "hf"
    bos_id: int | None
    eos_id: int | None
    add_bos: bool
    add_eos: bool
    unk_id: int | None = None
    pad_id: int | None = None


class Tokenizer:
    """Text <-> token ids, plus what generation needs: token bytes, special ids, stop ids."""

    def __init__(self, backend: Backend, spec: _Spec, token_types: Sequence[int] | None = None, eot_ids: Iterable[int] = ()) -> None:
        self.backend, self._spec = backend, spec
        self._types = list(token_types) if token_types is not None else None
        self.eot_ids = tuple(eot_ids)

    # -- construction ------------------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, metadata: Mapping[str, Any], sentencepiece_spaces: str = "metaspace", pre_splits: Mapping[str, str] | None = None) -> "Tokenizer":
        """The tokenizer a GGUF carries. A byte-level vocabulary is split before its merges by the
        regex ``pre_splits`` holds for its ``tokenizer.ggml.pre`` name (the model families'
        ``pre_tokenizers``), else as GPT-2 splits; ``sentencepiece_spaces`` says how a
        SentencePiece vocabulary spells spaces."""
        if sentencepiece_spaces not in ("metaspace", "plain"):
            raise TokenizerError(f"sentencepiece_spaces must be 'metaspace' or 'plain', got {sentencepiece_spaces!r}")
        model = metadata.get("tokenizer.ggml.model")
        tokens = metadata.get("tokenizer.ggml.tokens")
        if not isinstance(tokens, list) or not tokens:
            raise TokenizerError("the GGUF has no tokenizer.ggml.tokens: it carries no tokenizer")
        types = metadata.get("tokenizer.ggml.token_type")
        types = [int(t) for t in types] if types is not None else [NORMAL] * len(tokens)
        if len(types) != len(tokens):
            raise TokenizerError(f"tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
        if model not in ("gpt2", "llama"):
            raise TokenizerError(f"tokenizer.ggml.model {model!r} is not supported (supported: gpt2, llama)")
        try:
            if model == "gpt2":
                backend = _byte_level(tokens, metadata, pre_splits or {})
                kind, default_bos = "byte-level", False
            else:
                backend = _sentencepiece(tokens, metadata, plain_spaces=sentencepiece_spaces == "plain")
                kind, default_bos = "sentencepiece", True
            _add_special(backend, tokens, types, byte_level=kind == "byte-level")
        except TokenizerError:
            raise
        except Exception as e:  # noqa: BLE001 - tokenizers raises plain Exceptions for a vocabulary it cannot build
            raise TokenizerError(f"the GGUF's tokenizer (tokenizer.ggml.tokens, merges, scores) does not build: {e}") from None

        def tid(key: str) -> int | None:
            v = metadata.get(key)
            return int(v) if v is not None and 0 <= int(v) < len(tokens) else None

        spec = _Spec(
            kind,
            tid("tokenizer.ggml.bos_token_id"),
            tid("tokenizer.ggml.eos_token_id"),
            bool(metadata.get("tokenizer.ggml.add_bos_token", default_bos)),
            bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
            tid("tokenizer.ggml.unknown_token_id"),
            tid("tokenizer.ggml.padding_token_id"),
        )
        eots = [i for i, t in enumerate(tokens) if types[i] == CONTROL and t in _END_OF_TURN]
        eot = tid("tokenizer.ggml.eot_token_id")
        return cls(backend, spec, types, sorted(set(eots + ([eot] if eot is not None else []))))

    @classmethod
    def from_hf(cls, directory: str | Path) -> "Tokenizer":
        """From ``tokenizer.json`` (and ``tokenizer_config.json`` for BOS/EOS) in a model directory."""
        d = Path(directory)
        try:
            backend = Backend.from_file(str(d / "tokenizer.json"))
        except Exception as e:  # noqa: BLE001 - tokenizers raises plain Exceptions
            raise TokenizerError(f"{d / 'tokenizer.json'}: cannot load: {e}") from None
        cfg: dict[str, Any] = {}
        if (d / "tokenizer_config.json").exists():
            try:
                cfg = json.loads((d / "tokenizer_config.json").read_text())
            except (OSError, json.JSONDecodeError) as e:
                raise TokenizerError(f"{d / 'tokenizer_config.json'}: {e}") from None

        def tok_id(name: str) -> int | None:
            t = cfg.get(name)
            if isinstance(t, dict):
                t = t.get("content")
            return backend.token_to_id(t) if isinstance(t, str) else None

        # a tokenizer.json post-processor already adds BOS where the model wants it
        spec = _Spec("hf", tok_id("bos_token"), tok_id("eos_token"), False, False, tok_id("unk_token"), tok_id("pad_token"))
        eots = [backend.token_to_id(t) for t in _END_OF_TURN if backend.token_to_id(t) is not None]
        return cls(backend, spec, None, eots)

    # -- the basics ---------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def bos_id(self) -> int | None:
        return self._spec.bos_id

    @property
    def eos_id(self) -> int | None:
        return self._spec.eos_id

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Ids that end generation: EOS and end-of-turn tokens."""
        return tuple(sorted({i for i in (self.eos_id, *self.eot_ids) if i is not None}))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # through encode_batch, which lets go of the GIL while it works (encode holds it): a server's
        # other threads go on while a long prompt is tokenized
        try:
            ids = self.backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        except TypeError:  # (what the backend says of a str that is no Unicode text: lone surrogates)
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:
                raise TokenizerError(f"the text is not valid Unicode: {e.reason} at character {e.start} ({text[e.start]!r})") from None
            raise
        if add_special_tokens:
            if self._spec.add_bos and self.bos_id is not None:
                ids = [self.bos_id] + ids
            if self._spec.add_eos and self.eos_id is not None:
                ids = ids + [self.eos_id]
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        t = self.backend.id_to_token(token_id)
        if t is None:
            raise IndexError(f"token id {token_id} is outside the vocabulary of {self.vocab_size}")
        return t

    @property
    def special_tokens(self) -> dict[str, str | None]:
        """bos_token / eos_token / unk_token / pad_token texts, as chat templates expect them."""

        def text(i: int | None) -> str | None:
            return None if i is None else self.token_text(i)

        return {"bos_token": text(self.bos_id), "eos_token": text(self.eos_id), "unk_token": text(self._spec.unk_id), "pad_token": text(self._spec.pad_id)}

    def is_special(self, token_id: int) -> bool:
        return token_id in self.special_ids

    @cached_property
    def special_ids(self) -> frozenset[int]:
        return frozenset(i for i, t in self.backend.get_added_tokens_decoder().items() if t.special)

    @cached_property
    def byte_token_ids(self) -> frozenset[int]:
        """Byte-fallback tokens (``<0xNN>``): a run of them decodes as one group, so its text is not
        final until a token of another kind follows."""
        if self._spec.kind == "byte-level":
            return frozenset()
        vocab = self.backend.get_vocab(with_added_tokens=False)
        return frozenset(i for t, i in vocab.items() if len(t) == 6 and t.startswith("<0x") and t.endswith(">"))

    @cached_property
    def token_bytes(self) -> list[bytes]:
        """The bytes each token stands for (what it adds to the text), for streaming and constraints."""
        n = self.vocab_size
        out = [b""] * n
        added = self.backend.get_added_tokens_decoder()
        if self._spec.kind == "byte-level" or (self._spec.kind == "hf" and isinstance(self.backend.decoder, decoders.ByteLevel)):
            back = {c: b for b, c in byte_level_alphabet().items()}
            for i in range(n):
                t = self.backend.id_to_token(i) or ""
                if i in added:
                    out[i] = added[i].content.encode()
                else:
                    out[i] = bytes(back[c] for c in t) if all(c in back for c in t) else t.encode()
            return out
        for i in range(n):
            t = self.backend.id_to_token(i) or ""
            if i in added:
                out[i] = added[i].content.encode()
            elif len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
                out[i] = bytes([int(t[3:5], 16)])
            else:
                out[i] = t.replace(SPACE, " ").encode()
        return out


# end-of-turn tokens of the chat formats poot knows (they stop generation like EOS)
_END_OF_TURN = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>", "<|endoftext|>", "<|end_of_text|>", "</s>")


def _byte_level(tokens: list[str], md: Mapping[str, Any], pre_splits: Mapping[str, str]) -> Backend:
    merges = md.get("tokenizer.ggml.merges")
    if not isinstance(merges, list):
        raise TokenizerError("a gpt2 (byte-level BPE) tokenizer needs tokenizer.ggml.merges")
    alphabet = set(byte_level_alphabet().values())
    spell = byte_level_alphabet()
    # a few files store some tokens as raw text rather than in the byte alphabet: respell them
    vocab = {}
    for i, t in enumerate(tokens):
        key = t if set(t) <= alphabet else "".join(spell[b] for b in t.encode("utf-8"))
        vocab.setdefault(key, i)
    pairs = []
    for m in merges:
        a, sep, b = m.partition(" ")
        if not sep:
            raise TokenizerError(f"merge {m!r} is not two tokens separated by a space")
        pairs.append((a, b))
    backend = Backend(BPE(vocab=vocab, merges=pairs, dropout=None, fuse_unk=False))
    split = pre_splits.get(str(md.get("tokenizer.ggml.pre", "")))
    if split is None:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(split), behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
    backend.decoder = decoders.ByteLevel()
    return backend


def _sentencepiece(tokens: list[str], md: Mapping[str, Any], plain_spaces: bool) -> Backend:
    if plain_spaces:  # runs of spaces stored as spaces; the merges and normalizer expect ▁
        tokens = [SPACE * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    merges = md.get("tokenizer.ggml.merges")
    if isinstance(merges, list):
        pairs = [tuple(m.split(" ", 1)) for m in merges]
    else:
        if plain_spaces:  # file order is the merge order (the scores are not)
            rank = {t: -i for i, t in enumerate(tokens)}
        else:
            scores = md.get("tokenizer.ggml.scores")
            if scores is None:
                raise TokenizerError("a llama (SentencePiece) tokenizer needs tokenizer.ggml.scores or merges")
            rank = dict(zip(tokens, (float(s) for s in scores)))
        pairs = _merges_from_ranks(vocab, rank)
    unk = md.get("tokenizer.ggml.unknown_token_id")
    unk_token = tokens[int(unk)] if unk is not None and 0 <= int(unk) < len(tokens) else None
    backend = Backend(BPE(vocab=vocab, merges=pairs, unk_token=unk_token, fuse_unk=True, byte_fallback=True, dropout=None))
    if plain_spaces:
        backend.normalizer = normalizers.Replace(" ", SPACE)
        backend.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
        backend.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    else:
        prefix = bool(md.get("tokenizer.ggml.add_space_prefix", True))
        backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="first" if prefix else "never", split=False)
        steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
        if prefix:
            steps.append(decoders.Strip(content=" ", left=1))
        backend.decoder = decoders.Sequence(steps)
    return backend


def _merges_from_ranks(vocab: Mapping[str, int], rank: Mapping[str, float]) -> list[tuple[str, str]]:
    """Merges implied by a vocabulary: every split of a token into two vocabulary pieces, best-ranked
    tokens first (ties: shorter-left-piece order as SentencePiece converters do), pieces by id."""
    found: list[tuple[float, int, int, str, str]] = []
    for token, score in rank.items():
        local = [(token[:k], token[k:]) for k in range(1, len(token)) if token[:k] in vocab and token[k:] in vocab]
        local.sort(key=lambda p: (vocab[p[0]], vocab[p[1]]))
        found.extend((score, len(a), len(b), a, b) for a, b in local)
    # best score first; then longer pieces first; stable otherwise
    found.sort(key=lambda m: (m[0], m[1], m[2]), reverse=True)
    return [(a, b) for _, _, _, a, b in found]


def _add_special(backend: Backend, tokens: list[str], types: list[int], byte_level: bool) -> None:
    alphabet = set(byte_level_alphabet().values()) if byte_level else None
    control = [AddedToken(t, normalized=False, special=True) for t, ty in zip(tokens, types) if ty == CONTROL and (alphabet is None or set(t) <= alphabet)]
    if control:
        backend.add_special_tokens(control)
    vocab = backend.get_vocab(with_added_tokens=False)
    user = [AddedToken(t, normalized=False, special=False) for t, ty in zip(tokens, types) if ty == USER_DEFINED and t in vocab]
    if user:
        backend.add_tokens(user)
