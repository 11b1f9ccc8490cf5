"""The host device's capabilities come from LLVM's view of this CPU and from the OS."""

import os

import llvmlite.binding as llvm

from poot_cpu.device import host_device, vector_bits


def test_host_device_matches_llvm_and_os():
    d = host_device()
    assert d.name == "cpu" and d.available() and d.target == "host"
    caps = d.capabilities
    llvm.initialize_all_targets()
    features = {k: bool(v) for k, v in llvm.get_host_cpu_features().items()}
    assert caps.vector_bits == vector_bits(features)
    assert caps.subgroup_size == 1  # what kernels see on the host target (poot.codegen.host_target)
    assert caps.compute_units == len(os.sched_getaffinity(0))
    assert caps.memory_bytes > 1 << 28
    assert caps.shared_memory_bytes >= 32 * 1024
    assert dict(caps.details)["llvm cpu"] == llvm.get_host_cpu_name()
    assert {"f32", "f16", "bf16", "i8", "i32"} <= caps.dtypes


def test_vector_width_from_features():
    assert vector_bits({"avx512f": True, "avx2": True}) == 512
    assert vector_bits({"avx2": True}) == 256
    assert vector_bits({"neon": True}) == 128
    assert vector_bits({}) == 64
