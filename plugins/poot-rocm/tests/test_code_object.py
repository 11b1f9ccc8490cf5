"""Linked AMDGPU code objects read back: for every launch of SmolLM2's and Gemma 3's plans on
null:gfx942 (and SmolLM2's on null:gfx1100), the metadata note and kernel descriptor agree with each
other, with the kernel's parameters, with the workgroup memory codegen laid out, and with what
``llvm-readelf --notes`` prints (an independent reader); the kernel arguments and the dispatch
packet the executor encodes from them put every value where the metadata says."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess

import pytest

from poot.backend import Buffer, compile_kernel, shared_layout
from poot.errors import LoadError
from poot.graph.passes import DEFAULT_PASSES, PassManager
from poot.load import open_model
from poot.models import StepShapes, family_for
from poot.plan import compile_plan
from poot.plugins import host
from poot.runtime import get_device
from poot_rocm.aql import encode
from poot_rocm.code_object import dispatch, kernargs, read_code_object


def _plan(model: str, arch: str):  # type: ignore[no-untyped-def]
    dev = get_device(f"null:{arch}")
    ck = open_model(model)
    fam = family_for(ck.architecture)
    graph = PassManager(DEFAULT_PASSES).run(fam.trace(fam.parse_config(ck), ck.weights, StepShapes(block_size=16)))
    return compile_plan(graph, dev), host().hook.poot_codegen_target(device=dev)


def _readelf(data: bytes, tmp_path) -> str | None:  # type: ignore[no-untyped-def]
    exe = shutil.which("llvm-readelf")
    if exe is None:
        return None
    path = tmp_path / "k.co"
    path.write_bytes(data)
    r = subprocess.run([exe, "--notes", str(path)], capture_output=True, text=True, timeout=60)
    return r.stdout if r.returncode == 0 else None


@pytest.mark.parametrize("model,arch", [("SmolLM2", "gfx942"), ("gemma3", "gfx942"), ("SmolLM2", "gfx1100")])
def test_every_launchs_code_object_reads_back_as_codegen_laid_it_out(smollm2_path, gemma3_path, model, arch, tmp_path):
    plan, tgt = _plan(model, arch)
    kernels = {l.kernel.name: l.kernel for l in plan.launches}
    checked_readelf = 0
    for name, k in kernels.items():
        data = compile_kernel(k, tgt).data
        (info,) = read_code_object(data, name).values()
        assert info.name == name and info.symbol == f"{name}.kd"
        assert [a.name for a in info.args] == [p.name for p in k.params]  # no hidden arguments
        for a, p in zip(info.args, k.params):
            assert (a.kind, a.size) == (("global_buffer", 8) if isinstance(p, Buffer) else ("by_value", p.dtype.bits // 8)), (name, a)
            assert a.offset % a.size == 0
        ends = [a.offset + a.size for a in info.args]
        assert ends == sorted(ends) and info.kernarg_size == max(ends, default=0) and info.kernarg_align in (4, 8, 16)
        d = info.descriptor
        assert (d.group_bytes, d.private_bytes, d.kernarg_size) == (info.group_bytes, info.private_bytes, info.kernarg_size), name
        assert d.entry_offset != 0 and d.rsrc1 != 0
        assert shared_layout(k, tgt) == ({}, 0)  # workgroup arrays are static on AMDGPU: the code object sizes them
        assert info.group_bytes >= sum(s.size * max(1, s.dtype.bits // 8) for s in k.shared), name
        assert info.wavefront == tgt.subgroup and info.max_workgroup >= k.threads and info.vgprs > 0 and info.sgprs > 0
        out = _readelf(data, tmp_path) if checked_readelf < 6 else None
        if out is not None:  # the same fields as LLVM's own reader prints them
            checked_readelf += 1
            assert int(re.search(r"\.group_segment_fixed_size:\s+(\d+)", out).group(1)) == info.group_bytes  # type: ignore[union-attr]
            assert int(re.search(r"\.kernarg_segment_size:\s+(\d+)", out).group(1)) == info.kernarg_size  # type: ignore[union-attr]
            assert int(re.search(r"\.vgpr_count:\s+(\d+)", out).group(1)) == info.vgprs  # type: ignore[union-attr]
            assert [int(x) for x in re.findall(r"\.offset:\s+(\d+)", out)] == [a.offset for a in info.args]
    assert len(kernels) > 10
    assert checked_readelf or shutil.which("llvm-readelf") is None


def test_kernel_arguments_and_the_packet_put_each_value_where_the_metadata_says(smollm2_path, rng):
    plan, tgt = _plan("SmolLM2", "gfx942")
    launch = next(l for l in plan.launches if l.kernel.name.startswith("add_rms_norm") or l.kernel.name.startswith("rms_norm"))
    k = launch.kernel
    (info,) = read_code_object(compile_kernel(k, tgt).data).values()
    addresses = {p.name: int(rng.integers(1, 1 << 40)) * 256 for p in k.params if isinstance(p, Buffer)}
    scalars = {
        p.name: (int(rng.integers(1, 1 << 20)) if p.dtype.kind == "int" else float(rng.standard_normal())) for p in k.params if not isinstance(p, Buffer)
    }
    raw = kernargs(info, k, addresses, scalars)
    assert len(raw) == info.kernarg_size
    for a in info.args:
        if a.kind == "global_buffer":
            assert struct.unpack_from("<Q", raw, a.offset)[0] == addresses[a.name]
        else:
            got = struct.unpack_from("<i" if isinstance(scalars[a.name], int) else "<f", raw, a.offset)[0]
            assert got == pytest.approx(scalars[a.name], rel=1e-7)
    groups = (int(rng.integers(1, 5000)),)
    p = dispatch(info, k.threads, groups, 0x7F00_0000_0040, 0x7E00_0000_0010)
    fields = struct.unpack_from("<HHHHHHIIIIIQQQQ", encode(p))
    assert fields[2:5] == (k.threads, 1, 1) and fields[6:9] == (groups[0] * k.threads, 1, 1)
    assert fields[9:11] == (info.private_bytes, info.group_bytes) and fields[11:13] == (0x7F00_0000_0040, 0x7E00_0000_0010)
    # the code object of another kernel is refused, not misread
    other = next(l.kernel for l in plan.launches if [p.name for p in l.kernel.params] != [p.name for p in k.params])
    with pytest.raises(ValueError, match="takes"):
        kernargs(info, other, addresses, scalars)


def test_a_malformed_code_object_is_refused_by_name():
    with pytest.raises(LoadError, match="bad.co.*ELF64"):
        read_code_object(b"not an elf" + bytes(64), "bad.co")
    elf = bytearray(64)
    elf[:6] = b"\x7fELF\x02\x01"
    with pytest.raises(LoadError, match="no AMDGPU metadata"):
        read_code_object(bytes(elf), "empty.co")


@pytest.mark.parametrize("arch", ["gfx90a", "gfx942", "gfx1100", "gfx1151", "gfx1201"])
def test_every_target_links_a_models_kernels(arch, tmp_path, rng):
    """Every AMDGCN target poot offers links the kernels of a synthetic Llama planned at its wave's
    width (the wave64 plan of null:gfx942 for CDNA, the wave32 one of null:gfx1100 for RDNA), and
    each code object reads back as that target's: its wave size, the kernel's arguments in order."""
    from poot.testing.paged import synthetic_graph
    from poot_rocm.targets import TARGETS

    tgt = TARGETS[f"amdgcn:{arch}"]
    g, _ = synthetic_graph("llama", tmp_path / "llama", int(rng.integers(0, 2**31)))
    plan = compile_plan(g, get_device("null:gfx942" if tgt.subgroup == 64 else "null:gfx1100"))
    kernels = {repr(l.kernel): l.kernel for l in plan.launches}
    for k in kernels.values():
        data = compile_kernel(k, tgt).data
        assert data[:4] == b"\x7fELF"
        info = read_code_object(data, k.name)[k.name]
        assert info.wavefront == tgt.subgroup and [a.name for a in info.args] == [p.name for p in k.params], (arch, k.name)
    assert len(kernels) > 10
