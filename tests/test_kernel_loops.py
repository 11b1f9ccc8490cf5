"""Grid to loops (``poot.kernel.loops``): a kernel's workgroups and threads as loops in one thread
of work. The looped form of kernels with barriers, workgroup memory, locals that live across
barriers and loop variables that share a local's name gives exactly what the kernel gives on the
host's own workgroup lowering; a range of workgroups runs just those; a barrier under a
thread-dependent condition, and a matrix tile, are refused by name. (Every kernel-suite case runs
in the looped form on ``null:xdna2``: plugins/poot-npu/tests/test_kernel_suites_looped.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from poot.backend import HostKernel, compile_kernel, host_target
from poot.errors import Refusal
from poot.graph import dtypes as dt
from poot.kernel import ir as K
from poot.kernel.library import attention as attn_lib
from poot.kernel.library.norms import rms_norm, softmax
from poot.kernel.loops import GROUPS, grid_to_loops, group_range
from poot.testing.kernels import poisoned


def _run(k, grid, bufs, sc):  # type: ignore[no-untyped-def]
    HostKernel(k, compile_kernel(k, host_target())).run(grid, bufs, sc)


@pytest.mark.parametrize("kernel", ["rms_norm", "softmax"])
def test_looped_norms_equal_the_kernel(rng, kernel):
    k = rms_norm.instantiate(BLOCK=128) if kernel == "rms_norm" else softmax.instantiate(BLOCK=64)
    rows, cols = 5, 300
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    bufs = {"x": x, "y": poisoned((rows, cols))}
    sc: dict = {"cols": cols, "scale": 0.5}
    if kernel == "rms_norm":
        bufs["w"] = rng.standard_normal(cols).astype(np.float32)
        sc = {"cols": cols, "eps": 1e-5}
    want = {n: a.copy() for n, a in bufs.items()}
    _run(k, (rows,), want, sc)
    looped = grid_to_loops(k)
    assert looped.workgroup == (1, 1, 1) and [p.name for p in looped.params][-5:] == list(GROUPS)
    _run(looped, (1,), bufs, {**sc, **group_range((rows,))})
    assert np.isfinite(bufs["y"]).all() and np.array_equal(bufs["y"], want["y"])


def test_looped_block_attention_equals_the_kernel(rng):
    """128 threads, 13 workgroup arrays, locals set before a barrier and read after it (per-thread
    arrays), uniform loops holding barriers, and loop variables named like locals elsewhere."""
    hq, hkv, d, bs = 6, 2, 16, 4
    ctx = np.array([37, 9, 61])
    new = np.array([5, 3, 4])
    seq_ids = np.concatenate([np.full(n, s) for s, n in enumerate(new)]).astype(np.int32)
    positions = np.concatenate([np.arange(c - n, c) for c, n in zip(ctx, new)]).astype(np.int32)
    perm = rng.permutation(len(seq_ids))
    nblk = -(-ctx // bs)
    tables = np.zeros((3, nblk.max() + 1), np.int32)
    order, at = rng.permutation(int(nblk.sum()) + 2), 0
    for s in range(3):
        tables[s, : nblk[s]] = order[at : at + nblk[s]]
        at += nblk[s]
    T, nb = len(seq_ids), int(nblk.sum()) + 2
    bufs = {
        "q": rng.standard_normal((T, hq, d)).astype(np.float32),
        "k_pool": rng.standard_normal((nb, bs, hkv, d)).astype(np.float32),
        "v_pool": rng.standard_normal((nb, bs, hkv, d)).astype(np.float32),
        "ks_pool": rng.standard_normal((nb, bs, 1)).astype(np.float32),
        "positions": positions[perm],
        "seq_ids": seq_ids[perm],
        "ctx_lens": ctx.astype(np.int32),
        "block_tables": tables,
        "out": poisoned((T, hq, d)),
    }
    sc = {"ntok": T, "hq": hq, "hkv": hkv, "dk": d, "dv": d, "dr": 0, "bs": bs, "mb": tables.shape[1], "scale": 0.3, "window": 9, "softcap": 2.5}
    k = attn_lib.attention_blocks.instantiate(CAUSAL=True, QT=4, KT=8, D=64, PT="f32")
    grid = (-(-T // 4), hq)
    want = {n: a.copy() for n, a in bufs.items()}
    _run(k, grid, want, sc)
    looped = grid_to_loops(k)
    assert any(s.name.startswith("loops_local_") for s in looped.shared)
    # the workgroups in two ranges, as two cores would take them
    half = grid[0] * grid[1] // 2
    _run(looped, (1,), bufs, {**sc, **group_range(grid, 0, half)})
    assert np.isnan(bufs["out"]).any()  # the second half not yet
    _run(looped, (1,), bufs, {**sc, **group_range(grid, half)})
    assert np.isfinite(bufs["out"]).all() and np.array_equal(bufs["out"], want["out"])


def _kernel(body: tuple) -> K.Kernel:
    return K.Kernel("divergent", (K.Buffer("y", dt.f32, readonly=False),), body, (64, 1, 1), (K.Shared("s", dt.f32, 64),))


def test_a_barrier_under_a_thread_dependent_condition_is_refused():
    tid = K.Builtin("thread_id")
    k = _kernel((K.Let("t", tid), K.If(K.Bin("lt", K.Ref("t", dt.i32), K.const(3)), (K.Barrier(),)), K.Store("y", tid, K.const(1.0, "f32"))))
    with pytest.raises(Refusal, match="kernel divergent.*barrier under a condition that depends on the thread"):
        grid_to_loops(k)
    loop = K.For("i", K.const(0), tid, (K.Barrier(),))
    with pytest.raises(Refusal, match="barrier in loop 'i' whose bounds depend on the thread"):
        grid_to_loops(_kernel((loop,)))
    # a uniform condition is a loop boundary like any other
    ok = _kernel(
        (K.If(K.Bin("lt", K.Builtin("group_id"), K.const(3)), (K.Store("s", tid, K.const(2.0, "f32")), K.Barrier())), K.Store("y", tid, K.const(1.0, "f32")))
    )
    assert grid_to_loops(ok).workgroup == (1, 1, 1)


def test_a_matrix_tile_has_no_looped_form():
    k = K.Kernel("tiles", (), (K.MmaTile("a", "b", "c"),), (32, 1, 1), (K.Shared("a", dt.f16, 256), K.Shared("b", dt.f16, 256), K.Shared("c", dt.f32, 256)))
    with pytest.raises(Refusal, match="kernel tiles.*MmaTile has no looped form"):
        grid_to_loops(k)
