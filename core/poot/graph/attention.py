"""The fused attention op's typing.

One op covers every attention the model families need:

- grouped KV heads (``Hq`` query heads share ``Hkv`` key/value heads, ``Hq % Hkv == 0``);
- a value head narrower than the key head (``Dv != Dk``);
- a key split into a per-head part and a part shared by all heads (MLA: ``k_shared``), the query
  carrying both parts (``Dq = Dk + Dr``);
- causal and sliding-window masks, logit soft-capping, an optional scale;
- keys and values read either from dense per-sequence buffers or in place from paged KV pools
  through block tables.

Query tokens of several sequences are flattened into one ``T`` axis; ``seq_ids[t]`` and
``positions[t]`` say which sequence a token belongs to and where it sits. Sequence ``s`` owns context
positions ``0 .. ctx_lens[s]-1``. A query at position ``p`` sees context position ``j`` iff
``j < ctx_lens[s]``, and (causal) ``j <= p``, and (window ``W``) ``j > p - W``.

Operand shapes (``T`` query tokens, ``B`` sequences, ``S`` dense context, ``NB`` blocks of ``BS``):

==============  ====================  ====================
operand         dense                 paged
==============  ====================  ====================
q               [T, Hq, Dq]           [T, Hq, Dq]
k               [B, S, Hkv, Dk]       [NB, BS, Hkv, Dk]
v               [B, S, Hkv, Dv]       [NB, BS, Hkv, Dv]
k_shared (opt)  [B, S, Dr]            [NB, BS, Dr]
positions       [T] i32               [T] i32
seq_ids         [T] i32               [T] i32
ctx_lens        [B] i32               [B] i32
block_tables    -                     [B, MB] i32
output          [T, Hq, Dv]           [T, Hq, Dv]
==============  ====================  ====================

Paged context position ``j`` of sequence ``s`` lives in block ``block_tables[s, j // BS]`` at
offset ``j % BS``. Values are written into a pool with the ``cache_write`` op through a slot map.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AttentionSpec", "attention_operand_names"]


@dataclass(frozen=True)
class AttentionSpec:
    """Static attributes of one attention op."""

    paged: bool = False
    causal: bool = True
    window: int | None = None
    softcap: float | None = None
    scale: float | None = None
    k_shared: bool = False

    def __post_init__(self) -> None:
        if self.window is not None and self.window < 1:
            raise ValueError(f"attention window must be >= 1, got {self.window}")
        if self.softcap is not None and not self.softcap > 0:
            raise ValueError(f"attention softcap must be > 0, got {self.softcap}")
        if self.scale is not None and not self.scale > 0:
            raise ValueError(f"attention scale must be > 0, got {self.scale}")


def attention_operand_names(spec: AttentionSpec) -> tuple[str, ...]:
    """Operand names in the order the op takes them."""
    names = ["q", "k", "v"]
    if spec.k_shared:
        names.append("k_shared")
    names += ["positions", "seq_ids", "ctx_lens"]
    if spec.paged:
        names.append("block_tables")
    return tuple(names)
