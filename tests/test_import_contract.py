"""The import contract between the core and its plugins: a plugin's package imports only the core's
documented public modules (``poot``, ``poot.errors``, the backend SDK ``poot.backend`` with
``poot.kernel.build`` for a backend's own kernels and ``poot.plan.schedules`` for its plan choices,
for model families ``poot.models`` and ``poot.graph``, for quantizations ``poot.quant``), and the core imports
no plugin. Each rule is
checked on every module's syntax tree, so an import inside a function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PUBLIC = {
    "poot",
    "poot.errors",
    "poot.backend",
    "poot.models",
    "poot.models.config",
    "poot.graph",
    "poot.graph.builder",
    "poot.graph.compose",
    "poot.graph.dims",
    "poot.graph.rope",
    "poot.quant",
    "poot.kernel.build",
    "poot.plan.schedules",
}


def _imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return out


def _plugin_packages() -> list[Path]:
    pkgs = [p for p in (ROOT / "plugins").glob("*/poot_*") if p.is_dir()]
    pkgs += [p for p in (ROOT / "plugins" / "models").glob("*/poot_*") if p.is_dir()]
    pkgs += [p for p in (ROOT / "tests" / "plugins").glob("*/poot_*") if p.is_dir()]
    return sorted(pkgs)


def test_plugins_import_only_the_public_api():
    pkgs = _plugin_packages()
    assert len(pkgs) >= 13, pkgs  # cpu, ptx, vulkan, wgpu, rocm, npu, five families and the two test plugins
    bad = [
        f"{f.relative_to(ROOT)}:{line}: {mod}"
        for pkg in pkgs
        for f in pkg.rglob("*.py")
        for line, mod in _imports(f)
        if (mod == "poot" or mod.startswith("poot.")) and mod not in PUBLIC
    ]
    assert not bad, "plugins reach into the core's internals (use poot.backend, or add to it):\n" + "\n".join(bad)


def test_the_core_imports_no_plugin():
    plugins = {p.name for p in _plugin_packages()} | {"poot_broken_missing_dependency"}
    bad = [f"{f.relative_to(ROOT)}:{line}: {mod}" for f in (ROOT / "core" / "poot").rglob("*.py") for line, mod in _imports(f) if mod.split(".")[0] in plugins]
    assert not bad, "the core imports plugins:\n" + "\n".join(bad)


def test_the_backend_sdk_resolves_every_name():
    import poot.backend as sdk

    for name in sdk.__all__:
        assert getattr(sdk, name) is not None, name
