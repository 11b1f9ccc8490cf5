"""The offload computes what the model computes: a plan for null:xdna2, with every launch the NPU
takes run as its cores would (``core_plan``: the looped kernel, each of eight cores over its range
of workgroups) and the rest as the host's launches, run on the host CPU against the paged oracle
over prefill and decode. No NPU is here: the host stands in for its cores, running the same looped
kernels an AIE compile starts from."""

from __future__ import annotations

import pytest

from poot.backend import get_device
from poot.plan import compile_plan
from poot.testing.paged import _traced, synthetic_graph, two_sequences_against_oracle
from poot_npu.offload import COLUMNS, core_plan, core_ranges, offloaded


def _executor(graph):  # type: ignore[no-untyped-def]
    from poot_cpu.executor import HostExecutor

    plan = compile_plan(graph, get_device("null:xdna2"))
    cores = core_plan(plan)
    assert len(cores.launches) == len(plan.launches) + (COLUMNS - 1) * len(offloaded(plan))
    return HostExecutor(cores, threads=1), plan


def test_core_ranges_cover_every_workgroup_once():
    for tiles in (1, 7, 8, 9, 64, 12288):
        ranges = core_ranges(tiles)
        assert len(ranges) <= COLUMNS and ranges[0][0] == 0 and ranges[-1][1] == tiles
        assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(ranges, ranges[1:]))


@pytest.mark.parametrize("name", ["llama", "qwen3", "deepseek_v2"])
def test_an_offloaded_model_matches_the_oracle(name, tmp_path, rng):
    g, w = synthetic_graph(name, tmp_path / name, int(rng.integers(0, 2**31)))
    ex, plan = _executor(g)
    worst = two_sequences_against_oracle(ex, g, w, rng)
    ex.close()
    print(f"{name} on null:xdna2's cores (simulated): {len(offloaded(plan))} of {len(plan.launches)} launches offloaded, max |dlogit| {worst:.2g}")
    assert worst < 1e-4


@pytest.mark.slow
def test_smollm2_offloaded_matches_the_oracle(smollm2_path, rng):
    g, w = _traced(smollm2_path)
    ex, plan = _executor(g)
    worst = two_sequences_against_oracle(ex, g, w, rng, vocab=49152, tie=1e-3)
    ex.close()
    print(f"SmolLM2 on null:xdna2's cores (simulated): {len(offloaded(plan))} launches offloaded, max |dlogit| {worst:.2g}")
    assert worst < 1e-2
