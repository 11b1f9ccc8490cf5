"""The activation arena: values alive at the same time never overlap, and the arena stays close to
the live peak (the lower bound of any arena)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from poot.plan import Lifetime, live_peak, plan_arena

lifetimes = st.lists(
    st.tuples(st.integers(1, 5000), st.integers(0, 40), st.integers(0, 10)).map(lambda t: (t[0], t[1], t[1] + t[2])),
    min_size=1,
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(lifetimes)
def test_live_values_never_overlap_and_arena_is_near_the_peak(spec):
    vals = [Lifetime(i, size, first, last) for i, (size, first, last) in enumerate(spec)]
    plan = plan_arena(vals, alignment=64)
    for a in vals:
        oa = plan.offsets[a.key]
        assert oa % 64 == 0 and oa + a.size <= plan.size
        for b in vals:
            if a.key < b.key and a.overlaps_in_time(b):
                ob = plan.offsets[b.key]
                assert oa + a.size <= ob or ob + b.size <= oa, (a, b, oa, ob)
    peak = live_peak(vals)
    assert peak <= plan.size <= 2 * peak + 64 * len(vals)


def test_a_chain_reuses_two_buffers():
    # x0 -> x1 -> x2 -> ... each read only by the next: two slots suffice
    vals = [Lifetime(i, 1000, i, i + 1) for i in range(20)]
    plan = plan_arena(vals, alignment=8)
    assert plan.size == 2 * 1000 and len(set(plan.offsets.values())) == 2
