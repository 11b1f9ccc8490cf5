"""What the executor reads back from a linked AMDGPU code object (an ELF file, code object v5): each
kernel's metadata (the ``NT_AMDGPU_METADATA`` note, msgpack: its arguments with their offsets and
sizes, kernarg segment size, group and private segment sizes, registers, wavefront size) and its
kernel descriptor (the 64-byte ``<name>.kd`` symbol the dispatch packet's kernel object points to);
and from them, a launch's kernel arguments (``kernargs``) and its dispatch packet (``dispatch``).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgpack

from poot.backend import Kernel, dtypes
from poot.errors import LoadError

from .aql import DispatchPacket

__all__ = ["KernelArg", "KernelDescriptor", "CodeObjectKernel", "read_code_object", "kernargs", "dispatch"]

_NT_AMDGPU_METADATA = 32
_SHT_SYMTAB, _SHT_NOTE, _SHT_DYNSYM = 2, 7, 11


@dataclass(frozen=True)
class KernelArg:
    """One kernel argument as the metadata lays it out in the kernarg segment."""

    name: str
    offset: int
    size: int
    kind: str  # "global_buffer", "by_value", or a hidden argument's kind


@dataclass(frozen=True)
class KernelDescriptor:
    """The fields of ``kernel_descriptor_t`` a dispatch depends on (AMDGPU usage notes, code object v5)."""

    group_bytes: int
    private_bytes: int
    kernarg_size: int
    entry_offset: int
    rsrc1: int
    rsrc2: int
    rsrc3: int
    properties: int


@dataclass(frozen=True)
class CodeObjectKernel:
    name: str
    symbol: str
    args: tuple[KernelArg, ...]
    kernarg_size: int
    kernarg_align: int
    group_bytes: int
    private_bytes: int
    sgprs: int
    vgprs: int
    wavefront: int
    max_workgroup: int
    descriptor: KernelDescriptor


def _sections(data: bytes, source: str) -> list[tuple[int, int, int, int, int, int]]:
    """(name offset, type, address, file offset, size, link) of every section of an ELF64 file."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise LoadError(source, "not a little-endian ELF64 code object")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    out = []
    for i in range(shnum):
        name, kind, _, addr, off, size, link = struct.unpack_from("<IIQQQQI", data, shoff + i * shentsize)
        out.append((name, kind, addr, off, size, link))
    return out


def _notes(data: bytes, off: int, size: int) -> list[tuple[bytes, int, bytes]]:
    out, at, end = [], off, off + size
    while at + 12 <= end:
        namesz, descsz, kind = struct.unpack_from("<III", data, at)
        at += 12
        name = data[at : at + namesz].rstrip(b"\0")
        at += -(-namesz // 4) * 4
        out.append((name, kind, data[at : at + descsz]))
        at += -(-descsz // 4) * 4
    return out


def _symbols(data: bytes, sections: list[tuple[int, int, int, int, int, int]]) -> dict[str, int]:
    """Symbol name -> value (its address), from the symbol tables."""
    out: dict[str, int] = {}
    for _, kind, _, off, size, link in sections:
        if kind not in (_SHT_SYMTAB, _SHT_DYNSYM):
            continue
        strtab = sections[link]
        for at in range(off, off + size, 24):
            name_at, _info, _other, _shndx, value, _size = struct.unpack_from("<IBBHQQ", data, at)
            end = data.index(b"\0", strtab[3] + name_at)
            out[data[strtab[3] + name_at : end].decode()] = value
    return out


def _descriptor(data: bytes, sections: list[tuple[int, int, int, int, int, int]], address: int, source: str, symbol: str) -> KernelDescriptor:
    for _, kind, addr, off, size, _ in sections:
        if kind != 8 and addr <= address < addr + size and address + 64 <= addr + size:  # (8: NOBITS, no file bytes)
            at = off + address - addr
            group, private, kernarg, _, entry = struct.unpack_from("<IIIIq", data, at)
            rsrc3, rsrc1, rsrc2, props = struct.unpack_from("<IIIH", data, at + 44)
            return KernelDescriptor(group, private, kernarg, entry, rsrc1, rsrc2, rsrc3, props)
    raise LoadError(source, f"kernel descriptor {symbol} at {address:#x} lies in no section")


def read_code_object(data: bytes, source: str = "code object") -> dict[str, CodeObjectKernel]:
    """Every kernel of a linked code object by name, from its metadata note and descriptors; a
    LoadError naming ``source`` where either is missing or malformed."""
    sections = _sections(data, source)
    meta: Any = None
    for _, kind, _, off, size, _ in sections:
        if kind == _SHT_NOTE:
            for name, nkind, desc in _notes(data, off, size):
                if name == b"AMDGPU" and nkind == _NT_AMDGPU_METADATA:
                    meta = msgpack.unpackb(desc, raw=False, strict_map_key=False)
    if not isinstance(meta, dict) or not isinstance(meta.get("amdhsa.kernels"), list):
        raise LoadError(source, "no AMDGPU metadata note (NT_AMDGPU_METADATA with amdhsa.kernels)")
    symbols = _symbols(data, sections)
    out = {}
    for k in meta["amdhsa.kernels"]:
        try:
            sym = k[".symbol"]
            if sym not in symbols:
                raise LoadError(source, f"kernel {k['.name']}: no symbol {sym} for its descriptor")
            args = tuple(KernelArg(a.get(".name", ""), a[".offset"], a[".size"], a[".value_kind"]) for a in k.get(".args", []))
            out[k[".name"]] = CodeObjectKernel(
                k[".name"],
                sym,
                args,
                k[".kernarg_segment_size"],
                k[".kernarg_segment_align"],
                k[".group_segment_fixed_size"],
                k[".private_segment_fixed_size"],
                k[".sgpr_count"],
                k[".vgpr_count"],
                k[".wavefront_size"],
                k[".max_flat_workgroup_size"],
                _descriptor(data, sections, symbols[sym], source, sym),
            )
        except KeyError as e:
            raise LoadError(source, f"kernel metadata lacks {e}") from None
    return out


def kernargs(info: CodeObjectKernel, kernel: Kernel, addresses: Mapping[str, int], scalars: Mapping[str, float | int]) -> bytes:
    """The kernarg segment of one launch of ``kernel``: each buffer's device address and each scalar
    where the code object's metadata puts them (checked against the kernel's own parameters, so a
    code object of another kernel is refused)."""
    if [a.name for a in info.args if not a.kind.startswith("hidden")] != [p.name for p in kernel.params]:
        raise ValueError(f"code object kernel {info.name} takes {[a.name for a in info.args]}, not {kernel.name}'s {[p.name for p in kernel.params]}")
    out = bytearray(info.kernarg_size)
    params = {p.name: p for p in kernel.params}
    for a in info.args:
        if a.kind == "global_buffer":
            struct.pack_into("<Q", out, a.offset, addresses[a.name])
        elif a.kind == "by_value":
            dt = params[a.name].dtype  # type: ignore[union-attr]
            code = {(dtypes.f32, 4): "<f", (dtypes.i32, 4): "<i", (dtypes.i64, 8): "<q", (dtypes.f64, 8): "<d"}.get((dt, a.size))
            if code is None:
                raise ValueError(f"{info.name}: argument {a.name} of {dt} in {a.size} bytes")
            struct.pack_into(code, out, a.offset, scalars[a.name])
        else:
            raise ValueError(f"{info.name}: hidden argument {a.kind} is not provided by this executor")
    return bytes(out)


def dispatch(info: CodeObjectKernel, threads: int, groups: tuple[int, ...], kernel_object: int, kernarg: int, barrier: bool = True) -> DispatchPacket:
    """The dispatch packet of one launch: ``groups`` workgroups of ``threads`` work-items (one
    dimension of threads, as poot's kernels are written), the segment sizes the code object asks for."""
    if threads > info.max_workgroup:
        raise ValueError(f"{info.name}: workgroups of {threads} work-items, the code object allows {info.max_workgroup}")
    g = (tuple(groups) + (1, 1, 1))[:3]
    return DispatchPacket((threads, 1, 1), (g[0] * threads, g[1], g[2]), info.private_bytes, info.group_bytes, kernel_object, kernarg, barrier=barrier)
