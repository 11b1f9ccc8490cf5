"""The ROCm executor against a simulated AMD GPU (``conftest.SimulatedAgent``: no AMD GPU is
reachable here): every step's packets are read back from the ring as bytes, their kernels found by
descriptor address, their arguments read out of kernarg memory at the metadata's offsets, and run on
the host, packets between two barrier bits last to first. Logits equal the oracle's over prefill and
decode; a barrier bit taken away, a wrong kernarg offset or a missing completion signal fails."""

from __future__ import annotations

import numpy as np
import pytest

from poot.plan import compile_plan
from poot.testing.paged import _traced, synthetic_graph, two_sequences_against_oracle


def _executor(sim, graph, arch: str = "gfx942", agent=None):  # type: ignore[no-untyped-def]
    from poot_rocm.executor import RocmExecutor

    agent = agent or sim.SimulatedAgent(arch)
    return RocmExecutor(compile_plan(graph, sim.simulated_device(arch)), agent=agent), agent


@pytest.mark.parametrize("name,arch", [("llama", "gfx942"), ("llama", "gfx1100"), ("qwen3", "gfx942"), ("deepseek_v2", "gfx942")])
def test_families_through_aql_packets_match_the_oracle(sim, name, arch, tmp_path, rng):
    g, w = synthetic_graph(name, tmp_path / name, int(rng.integers(0, 2**31)))
    ex, agent = _executor(sim, g, arch)
    worst = two_sequences_against_oracle(ex, g, w, rng)
    ring = agent.rings[0]
    # every step: one doorbell after its packets, the first acquiring and the last releasing at system scope
    assert sum(1 for e in ring.log if e[0] == "doorbell") == 3
    assert agent.ran[0]["acquire"] == 2 and agent.ran[0]["barrier"] == 1
    finals = [p for p in agent.ran if p["signal"]]
    assert len(finals) == 3 and all(p["release"] == 2 for p in finals)
    concurrent = sum(1 for p in agent.ran if not p["barrier"])
    print(f"{name} on simulated {arch}: max |dlogit| {worst:.2g}; {len(agent.ran)} packets, {concurrent} without a barrier bit")
    ex.close()
    assert agent.closed and not agent.memory, "device memory left allocated after close"
    assert worst < 1e-4


def test_a_missing_barrier_bit_gives_wrong_logits(sim, tmp_path, rng, monkeypatch):
    """With the barrier bit on the first packet only, the simulated GPU runs the step's launches in
    the order a GPU may (last to first): the logits are wrong, so the bits the executor sets matter."""
    import poot_rocm.executor as rx

    monkeypatch.setattr(rx, "barriers", lambda accesses: [i == 0 for i in range(len(accesses))])
    g, w = synthetic_graph("llama", tmp_path / "llama", int(rng.integers(0, 2**31)))
    ex, _ = _executor(sim, g)
    with pytest.raises(AssertionError, match="non-finite logits|argmax differs"):
        two_sequences_against_oracle(ex, g, w, rng)
    ex.close()


def test_a_kernel_argument_at_the_wrong_offset_is_caught(sim, tmp_path, rng, monkeypatch):
    """Arguments packed 8 bytes later than the metadata says: the simulated GPU reads garbage
    addresses and scalars, and the step fails."""
    import poot_rocm.executor as rx

    real = rx.kernargs
    monkeypatch.setattr(rx, "kernargs", lambda info, kernel, addresses, scalars: bytes(8) + real(info, kernel, addresses, scalars)[:-8])
    g, w = synthetic_graph("llama", tmp_path / "llama", int(rng.integers(0, 2**31)))
    ex, _ = _executor(sim, g)
    with pytest.raises(AssertionError, match="lies in no allocation|run past an allocation"):
        two_sequences_against_oracle(ex, g, w, rng)
    ex.close()


def test_a_step_longer_than_the_ring_is_published_in_pieces(sim, tmp_path, rng):
    from poot_rocm.executor import RocmExecutor

    g, w = synthetic_graph("llama", tmp_path / "llama", int(rng.integers(0, 2**31)))
    agent = sim.SimulatedAgent()
    ex = RocmExecutor(compile_plan(g, sim.simulated_device("gfx942")), agent=agent, ring_slots=8)
    worst = two_sequences_against_oracle(ex, g, w, rng)
    doorbells = sum(1 for e in agent.rings[0].log if e[0] == "doorbell")
    ex.close()
    assert worst < 1e-4 and doorbells > 3 * 2


@pytest.mark.slow
def test_smollm2_through_aql_packets_matches_the_oracle(sim, smollm2_path, rng):
    """The real SmolLM2 checkpoint (Q4_1 weights bound as stored), prefill and greedy decode."""
    g, w = _traced(smollm2_path)
    ex, agent = _executor(sim, g)
    worst = two_sequences_against_oracle(ex, g, w, rng, vocab=49152, tie=1e-3)
    ex.close()
    print(f"SmolLM2 on simulated gfx942: max |dlogit| {worst:.2g} over {len(agent.ran)} packets")
    assert worst < 1e-2


@pytest.mark.parametrize("arch", ["gfx942", "gfx1100"])
def test_packets_of_a_subgroup_plan_point_at_its_buffers(sim, smollm2_path, arch):
    """SmolLM2's decode step planned for null:ARCH itself (wave64 / wave32 subgroup kernels, which
    the host cannot run): captured and published, every packet's kernel is loaded, its workgroup is
    the kernel's, its kernel arguments lie in kernarg memory, and every buffer address among them
    lies inside an allocation of device memory."""
    from poot.backend import get_device, storage_dtype
    from poot.graph.dims import Dim
    from poot.graph.passes import DEFAULT_PASSES, PassManager
    from poot.load import open_model
    from poot.models import StepShapes, family_for
    from poot_rocm.executor import RocmExecutor

    ck = open_model(str(smollm2_path))
    fam = family_for(ck.architecture)
    g = PassManager(DEFAULT_PASSES).run(fam.trace(fam.parse_config(ck), ck.weights, StepShapes(block_size=16)))
    plan = compile_plan(g, get_device(f"null:{arch}"))
    agent = sim.SimulatedAgent(arch, execute=False)
    ex = RocmExecutor(plan, agent=agent)
    weights = {t.name: t.raw() for t in ck.weights.tensors.values()}
    env = {"tokens": 1, "batch": 1, "max_blocks": 4, "rows": 1, "blocks": 4}
    pools = {n: np.zeros([Dim.evaluate(d, env) for d in plan.inputs[n].type.shape], storage_dtype(plan.inputs[n].type.dtype)) for n in ex.pool_names()}
    ex.bind(weights, pools)
    step = ex.capture(env)
    ex.agent.store_signal(step.signal, 1)
    ex.ring.publish(step.packets)
    assert len(agent.ran) == len(step.packets) == len([l for l in step.storage.launches if min(l.grid(env)) >= 1])
    assert agent.signals[step.signal] == 0
    ex.close()
