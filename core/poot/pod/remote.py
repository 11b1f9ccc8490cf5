"""What a pod job runs on the cluster: ``python core/poot/pod/remote.py ARGS`` from a shipped source
tree (Ray unpacks it as the job's working directory), or ``python -m poot.pod.remote ARGS`` where poot
is installed there.

From a tree, poot and its plugins are made importable without installing anything: the tree's
``core/`` and each plugin's folder go first on the path, and each distribution's entry points (read
from its pyproject.toml) are written as a dist-info folder there, so plugins are found as an
installed poot finds them, and ahead of any poot installed on the cluster.

The command runs in a fresh results folder (``check`` gets ``--out .``; ``profile``'s ``--trace`` and
``--plot`` files land there when named relatively). Its files then go back through the job's log:
a gzipped tar in base64 lines after a marker, with its SHA-256, which ``poot pod run`` takes out of
the log and unpacks at home. This module imports nothing of poot's until the path is set up."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import sys
import tarfile
import tempfile
from pathlib import Path

MARKER = "POOT-POD-RESULTS"  # then: "<index> <base64>", and last "end <sha256> <bytes> <exit status>"
CHUNK = 48 * 1024  # base64 characters a log line
MAX_RESULTS = 64 << 20  # bytes of gzipped results a job sends back


def _dist_infos(tree: Path, into: Path) -> list[Path]:
    """A dist-info folder under ``into`` for each pyproject.toml of ``tree`` (the core and every
    plugin) with its entry points; the folders holding their packages, to put on the path."""
    import tomllib

    roots = []
    for pp in [tree / "pyproject.toml", *sorted(tree.glob("plugins/*/pyproject.toml")), *sorted(tree.glob("plugins/models/*/pyproject.toml"))]:
        if not pp.is_file():
            continue
        meta = tomllib.loads(pp.read_text())
        project = meta.get("project", {})
        name = project.get("name")
        if not name:
            continue
        packages = meta.get("tool", {}).get("setuptools", {}).get("packages", [])
        where = packages.get("find", {}).get("where", ["."]) if isinstance(packages, dict) else ["."]  # a list: packages in the folder itself
        roots += [pp.parent / w for w in where]
        folder = into / f"{re.sub(r'[-_.]+', '_', name)}-{project.get('version', '0')}.dist-info"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {project.get('version', '0')}\n")
        groups = project.get("entry-points", {})
        lines = []
        for group, eps in groups.items():
            lines.append(f"[{group}]")
            lines += [f"{k} = {v}" for k, v in eps.items()]
        scripts = project.get("scripts", {})
        if scripts:
            lines.append("[console_scripts]")
            lines += [f"{k} = {v}" for k, v in scripts.items()]
        (folder / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return roots


def _send(folder: Path, status: int) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for f in sorted(folder.rglob("*")):
            if f.is_file():
                tar.add(f, arcname=str(f.relative_to(folder)))
    data = buf.getvalue()
    if len(data) > MAX_RESULTS:
        print(f"poot pod: the results are {len(data)} bytes gzipped, over {MAX_RESULTS}: not sent back", flush=True)
        data = b""
    text = base64.b64encode(data).decode()
    out = sys.stdout
    out.flush()
    for i in range(0, len(text), CHUNK):
        out.write(f"{MARKER} {i // CHUNK} {text[i : i + CHUNK]}\n")
    out.write(f"{MARKER} end {hashlib.sha256(data).hexdigest()} {len(data)} {status}\n")
    out.flush()


def main(argv: list[str]) -> int:
    here = Path(__file__).resolve()
    tree = here.parents[3] if (here.parents[3] / "core" / "poot" / "pod" / "remote.py").is_file() else None
    if tree is not None and __package__ in (None, ""):
        sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here.parent]  # (the script's own folder)
        site = Path(tempfile.mkdtemp(prefix="poot-pod-site-"))
        roots = _dist_infos(tree, site)
        paths = [str(site)] + [str(r) for r in roots]
        sys.path[:0] = paths
        os.environ["PYTHONPATH"] = os.pathsep.join(paths + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    results = Path(tempfile.mkdtemp(prefix="poot-pod-results-"))
    args = list(argv)
    if args and args[0] == "check" and "--out" not in args:
        args += ["--out", "."]
    os.chdir(results)
    from poot.cli import main as poot_main

    print(f"poot pod: running poot {' '.join(args)} on {os.uname().nodename}" + (f" from the tree at {tree}" if tree else ""), flush=True)
    try:
        status = poot_main(args)
    except SystemExit as e:  # argparse's errors
        status = e.code if isinstance(e.code, int) else 1
    _send(results, status)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
