"""Synthesized kernels: templates with compile-time parameters (block sizes, quant types, variants).

``catalogue()`` instantiates a representative set, the one GPU targets are checked against.
"""

from __future__ import annotations

from ..ir import Kernel

__all__ = ["catalogue"]


def catalogue() -> list[Kernel]:
    from ...quant.bodies import BODIES
    from . import attention, gather, linear, movement, norms, rope, sampling

    ks = [
        norms.rms_norm.instantiate(BLOCK=128),
        norms.rms_norm.instantiate(BLOCK=256, UNIT_OFFSET=True),
        norms.layer_norm.instantiate(BLOCK=128),
        norms.softmax.instantiate(BLOCK=256),
        norms.softmax.instantiate(BLOCK=128, SOFTCAP=30.0),
        norms.argmax.instantiate(BLOCK=256),
        linear.gemv_f32.instantiate(BLOCK=128),
        linear.gemm_f32.instantiate(),
        gather.gather_f32.instantiate(BLOCK=128),
        rope.rope.instantiate(ROT=128, NEOX=True, BLOCK=64),
        rope.rope.instantiate(ROT=64, NEOX=False, BLOCK=32),
        attention.attention.instantiate(CAUSAL=True, SPLITS=1, BLOCK=128),
        attention.attention.instantiate(CAUSAL=True, SPLITS=4, BLOCK=128),
        attention.attention_merge.instantiate(SPLITS=4, BLOCK=128),
        sampling.sample_chunks.instantiate(BLOCK=256),
        sampling.sample.instantiate(BLOCK=256),
        movement.copy_strided.instantiate(BLOCK=256),
        movement.copy_words.instantiate(BLOCK=256),
        movement.reduce_rows.instantiate(OP="mean", BLOCK=128),
        movement.reduce_rows.instantiate(OP="max", BLOCK=128),
        movement.cache_write.instantiate(BLOCK=128),
        # KV pools of halves (kv_dtype="f16"): written two halves at a time, widened as read
        movement.cache_write.instantiate(BLOCK=128, PT="f16"),
        rope.rope_kv_cache.instantiate(ROT=128, NEOX=True, BLOCK=64, PT="f16"),
        rope.rope_kv_cache.instantiate(ROT=64, NEOX=False, BLOCK=32, PT="f16"),
        attention.attention.instantiate(CAUSAL=True, SPLITS=4, BLOCK=128, PT="f16"),
        attention.attention_blocks.instantiate(CAUSAL=True, QT=16, KT=16, D=64, PT="f16"),
    ]
    for q in sorted(BODIES):
        bs, bb, _ = BODIES[q]
        ks.append(linear.gemv_packed.instantiate(QTYPE=q, BLOCK=128))
        ks.append(linear.gemv_blocks.instantiate(QTYPE=q, BS=bs, BB=bb, ROWS=4, BLOCK=64))
        ks.append(gather.gather_packed.instantiate(QTYPE=q, BLOCK=128))
    ks.append(linear.gemm_packed.instantiate(QTYPE="q4_k"))
    from .linear_simt import gemm_simt

    ks += [gemm_simt(4096), gemm_simt(4096, 16), gemm_simt(4096, 32, "q4_k", words=False)]
    from .dequant_gpu import dequantize_bf16

    ks += [dequantize_bf16(q, 4096) for q in sorted(BODIES) if BODIES[q][0] > 1]
    return ks
