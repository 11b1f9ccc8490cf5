"""A small paged-KV bookkeeper for tests: sequences get shuffled physical blocks, so that anything
that relies on blocks being contiguous or in order fails."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..eval.model import StepBatch

__all__ = ["PagedSequences"]


class PagedSequences:
    def __init__(self, num_blocks: int, block_size: int, rng: np.random.Generator) -> None:
        self.block_size = block_size
        self.free = [int(b) for b in rng.permutation(num_blocks)]
        self.tables: list[list[int]] = []
        self.lengths: list[int] = []

    def add(self) -> int:
        self.tables.append([])
        self.lengths.append(0)
        return len(self.tables) - 1

    def _slot(self, seq: int, pos: int) -> int:
        blk, off = divmod(pos, self.block_size)
        while len(self.tables[seq]) <= blk:
            if not self.free:
                raise RuntimeError("out of KV blocks")
            self.tables[seq].append(self.free.pop())
        return self.tables[seq][blk] * self.block_size + off

    def step(self, new_tokens: Sequence[Sequence[int]], all_logits: bool = False, width: int | None = None) -> StepBatch:
        """Append ``new_tokens[s]`` to sequence ``s`` (empty: not in this step); logits for every new
        token, or for each sequence's last one. ``width`` fixes the block tables' width (as a captured
        step needs); by default it is one more than the longest table."""
        tokens, positions, seq_ids, slots, rows = [], [], [], [], []
        for s, toks in enumerate(new_tokens):
            for t in toks:
                p = self.lengths[s]
                tokens.append(t)
                positions.append(p)
                seq_ids.append(s)
                slots.append(self._slot(s, p))
                self.lengths[s] += 1
                if all_logits:
                    rows.append(len(tokens) - 1)
            if toks and not all_logits:
                rows.append(len(tokens) - 1)
        width = width or max(len(t) for t in self.tables) + 1
        tables = np.full((len(self.tables), width), -1, np.int32)
        for s, t in enumerate(self.tables):
            tables[s, : len(t)] = t
        tables[tables < 0] = 0  # unused entries must still be valid block ids
        return StepBatch(np.array(tokens), np.array(positions), np.array(seq_ids), np.array(slots), np.array(self.lengths), tables, np.array(rows))
