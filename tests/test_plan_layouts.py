"""Weights a host plan reads in a layout of its own (``Plan.layouts``): which weights get one, that a
step reads them right whether bound as stored or laid out, and that a weight laid out for another
plan is refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from poot.errors import PootError
from poot.graph import GraphBuilder
from poot.graph.dims import sym
from poot.kernel.library import linear_q8_rows as R
from poot.load.hostmem import huge_page_copy
from poot.plan import compile_plan
from poot.plan.layouts import LaidOut, lay_out, layout_of
from poot.plugins import host
from poot.quant import quantization
from poot.runtime import get_device
from poot.runtime.regions import checked_weight


def _graph():
    """A Q8_0 table the head shares (gathered and multiplied), a Q5_0 projection of 48 rows, and a
    Q8_0 one of 40 rows (not whole groups of 16: stored as it is)."""
    b = GraphBuilder()
    ids = b.input("ids", "i32", [sym("tokens")])
    emb = b.weight("emb", "q8_0", [64, 96])
    proj = b.weight("proj", "q5_0", [48, 96])
    odd = b.weight("odd", "q8_0", [40, 96])
    h = b.gather(emb, ids)
    return b.build({"h": h, "logits": b.linear(h, emb), "p": b.linear(h, proj), "o": b.linear(h, odd)})


TYPES = {"emb": "q8_0", "proj": "q5_0", "odd": "q8_0"}


def _weights(rng):
    return {name: quantization(TYPES[name]).quantize(rng.standard_normal((n, 96)).astype(np.float32)) for name, n in (("emb", 64), ("proj", 48), ("odd", 40))}


def _run(plan, weights, ids):
    dev = get_device("cpu")
    ex = host().hook.poot_executor(device=dev)(plan)
    try:
        return ex.run({"ids": ids}, weights)
    finally:
        ex.close()


def test_q8_0_weights_read_as_16_row_records_give_the_stored_values(rng):
    dev = get_device("cpu")
    plan = compile_plan(_graph(), dev)
    names = {l.kernel.name.split("_PF")[0].split("_BLOCK")[0] for l in plan.launches}
    if "quantize_x_host" not in names:
        pytest.skip("this host has no byte dot product: its products are in f32, on the stored rows")
    assert sorted(plan.layouts) == ["emb", "proj"] and [plan.layouts[w].name for w in ("emb", "proj")] == ["q8_0/rows16", "q5_0/rows16"]
    assert {"gemv_q8_rows16", "gather_q8_rows16"} <= names
    weights = _weights(rng)
    deq = {k: quantization(TYPES[k]).dequantize(v).astype(np.float64) for k, v in weights.items()}
    for tokens in (1, 5):  # the GEMV, then the GEMM
        ids = rng.integers(0, 64, tokens).astype(np.int32)
        out = _run(plan, weights, ids)
        np.testing.assert_array_equal(out["h"], deq["emb"][ids].astype(np.float32))
        h = out["h"].astype(np.float64)
        for name, w in (("logits", "emb"), ("p", "proj"), ("o", "odd")):
            want = h @ deq[w].T
            assert (np.abs(out[name] - want) <= 3e-5 * (np.abs(h) @ np.abs(deq[w]).T)).all(), (name, tokens)
        laid = lay_out(weights, plan.layouts)  # laid out by the holder, once: the same bits
        assert layout_of(laid["emb"]) == R.layout_name("q8_0") and layout_of(laid["odd"]) == "" and laid["odd"] is weights["odd"]
        again = _run(plan, huge_page_copy(laid), ids)
        for name in out:
            np.testing.assert_array_equal(again[name].view(np.int32), out[name].view(np.int32))


def test_a_weight_laid_out_for_another_plan_is_refused_by_name(rng):
    dev = get_device("cpu")
    plan = compile_plan(_graph(), dev)
    if not plan.layouts:
        pytest.skip("this host has no byte dot product: no weight is laid out")
    laid = lay_out(_weights(rng), plan.layouts)
    kept = huge_page_copy({"emb": laid["emb"]})["emb"]
    assert isinstance(kept, LaidOut) and layout_of(kept) == R.layout_name("q8_0") and not kept.flags.writeable
    stored = compile_plan(_graph(), dev, "highest")  # f32 products: every weight read as stored
    assert not stored.layouts
    with pytest.raises(PootError, match="weight 'emb' is given in layout q8_0/rows16, but the plan reads it as the checkpoint stores it"):
        _run(stored, laid, np.zeros(1, np.int32))
    emb = next(n.outputs[0] for n in stored.graph.nodes if n.op == "weight" and n.attrs["name"] == "emb")
    with pytest.raises(PootError, match="weight 'emb' is given in layout q8_0/rows16"):  # what the GPU executors bind through
        checked_weight("emb", emb, laid["emb"])
    assert checked_weight("emb", emb, laid["emb"], plan.layouts["emb"]) is not None
