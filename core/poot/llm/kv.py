"""Paged KV slots: a pool of fixed-size blocks, block tables per sequence, slots per token, and
prefix sharing of full prompt blocks between sequences (reference counted).

A full block of prompt tokens is identified by the hash of its tokens and of the block before it, so
equal prefixes map to equal chains. A new sequence takes over every leading full block another live
sequence has already computed (its tokens need no prefill) and computes the rest. Shared blocks are
never written again: only full blocks are shared, and the block holding the prompt's last token is
always the sequence's own (its logits are needed). A block returns to the free list when its last
user releases it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import PootError

__all__ = ["BlockPool", "BlockTable", "OutOfBlocks"]


class OutOfBlocks(PootError):
    """The KV pool has no free block left."""


@dataclass
class BlockTable:
    """One sequence's blocks, in order, and how many leading tokens came from shared blocks."""

    blocks: list[int] = field(default_factory=list)
    shared_tokens: int = 0
    hashes: list[bytes] = field(default_factory=list)  # of its full prompt blocks, registered for sharing


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise PootError(f"a KV pool needs at least one block of at least one slot (got {num_blocks} x {block_size})")
        self.num_blocks, self.block_size = num_blocks, block_size
        self._free = list(range(num_blocks - 1, -1, -1))  # pop() hands out low ids first
        self._refs = [0] * num_blocks
        self._by_hash: dict[bytes, int] = {}
        self._hash_of: dict[int, bytes] = {}
        self.shared_hits = 0  # blocks taken over from another sequence, since creation

    # -- accounting -------------------------------------------------------------------------------
    @property
    def free_blocks(self) -> int:
        return len(self._free)

    def refs(self, block: int) -> int:
        return self._refs[block]

    def _take(self) -> int:
        if not self._free:
            raise OutOfBlocks(f"all {self.num_blocks} KV blocks are in use")
        b = self._free.pop()
        self._refs[b] = 1
        return b

    def _drop(self, block: int) -> None:
        self._refs[block] -= 1
        if self._refs[block] == 0:
            h = self._hash_of.pop(block, None)
            if h is not None and self._by_hash.get(h) == block:
                del self._by_hash[h]
            self._free.append(block)

    # -- sequences ----------------------------------------------------------------------------------
    def _chain(self, prompt: Sequence[int]) -> list[bytes]:
        out, prev = [], b""
        bs = self.block_size
        for i in range(len(prompt) // bs):
            prev = hashlib.blake2b(prev + b"|" + ",".join(map(str, prompt[i * bs : (i + 1) * bs])).encode(), digest_size=16).digest()
            out.append(prev)
        return out

    def open(self, prompt: Sequence[int]) -> BlockTable:
        """A table for a new sequence: every leading full block of ``prompt`` that a live sequence
        has computed is shared (not the block of the prompt's last token)."""
        table = BlockTable(hashes=self._chain(prompt))
        usable = (len(prompt) - 1) // self.block_size
        for h in table.hashes[:usable]:
            b = self._by_hash.get(h)
            if b is None:
                break
            self._refs[b] += 1
            table.blocks.append(b)
            self.shared_hits += 1
        table.shared_tokens = len(table.blocks) * self.block_size
        return table

    def ensure(self, table: BlockTable, tokens: int) -> None:
        """Enough blocks for ``tokens`` positions (raises ``OutOfBlocks``, taking none, if not)."""
        need = -(-tokens // self.block_size) - len(table.blocks)
        if need > len(self._free):
            raise OutOfBlocks(f"{need} more KV blocks needed, {len(self._free)} free")
        for _ in range(max(0, need)):
            table.blocks.append(self._take())

    def computed(self, table: BlockTable, tokens: int) -> None:
        """``tokens`` positions of the sequence now hold KV: its full prompt blocks among them become
        shareable."""
        for i in range(min(tokens // self.block_size, len(table.hashes))):
            b = table.blocks[i]
            h = table.hashes[i]
            if h not in self._by_hash and b not in self._hash_of:
                self._by_hash[h] = b
                self._hash_of[b] = h

    def slot(self, table: BlockTable, position: int) -> int:
        return table.blocks[position // self.block_size] * self.block_size + position % self.block_size

    def close(self, table: BlockTable) -> None:
        """Release every block of a finished or cancelled sequence."""
        for b in table.blocks:
            self._drop(b)
        table.blocks = []
