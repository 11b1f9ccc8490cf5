"""Pod runs: a poot command as a Ray job on an existing cluster (``poot pod run``).

Ray's job submission API does the cluster's part: one head on a workstation, a set of machines, or
Kubernetes through KubeRay all take the same job. ``pod_run`` ships this source tree as the job's
working directory (Ray's ``working_dir``, without what git ignores there, the virtual environment
and the git folder) or runs the poot installed there (``tree=None``), asks for the CPUs and GPUs given,
streams the job's log, and brings the command's result files home out of the log
(``poot.pod.remote`` sends them). A job that fails is reported as one: a non-zero exit status
naming the job and how it ended, with whatever results it sent.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import re
import shlex
import subprocess
import sys
import tarfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import PootError
from .remote import MARKER

__all__ = ["PodError", "pod_run", "results_from_log", "tree_excludes"]

# left out of a shipped tree besides what git ignores there (``tree_excludes``)
EXCLUDES = [".git", ".venv", "venv", "**/__pycache__", "**/*.egg-info", "pod-results", "*.gguf", "*.safetensors"]


def tree_excludes(tree: Path) -> list[str]:
    """What a shipped tree leaves out: ``EXCLUDES``, and every path git ignores in it, from
    .gitignore files, ``.git/info/exclude`` and the user's global excludes alike (Ray reads only the
    first), anchored at the tree's root. Without git, or outside a checkout, ``EXCLUDES`` alone."""
    try:
        r = subprocess.run(  # (paths under the tree, relative to it, also where it is inside a larger checkout)
            ["git", "ls-files", "--others", "--ignored", "--exclude-standard", "--directory", "-z"],
            cwd=tree,
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return list(EXCLUDES)
    if r.returncode != 0:
        return list(EXCLUDES)
    ignored = [e.decode(errors="surrogateescape") for e in r.stdout.split(b"\0") if e]
    return [*EXCLUDES, *("/" + re.sub(r"([\\\[\]*?])", r"\\\1", path) for path in ignored)]  # (glob characters taken literally)


class PodError(PootError):
    """A pod run that could not start, or a job that did not end well."""


def _client(address: str) -> Any:
    import logging

    try:
        from ray.job_submission import JobSubmissionClient
    except ImportError:
        raise PodError("poot pod talks to Ray's job server through Ray's client, which is not installed: pip install 'poot[pod]'") from None
    for name in [n for n in logging.root.manager.loggerDict if n == "ray" or n.startswith("ray.")]:
        logging.getLogger(name).setLevel(logging.ERROR)  # Ray's packaging and connection chatter; its errors still show
    try:
        return JobSubmissionClient(address)
    except Exception as e:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ValueError ...
        raise PodError(f"no Ray job server answers at {address} ({type(e).__name__}: {e}); give the dashboard's address, e.g. http://HEAD:8265") from None


def results_from_log(log: str) -> tuple[bytes, int] | None:
    """The gzipped tar and exit status a job's ``poot.pod.remote`` wrote into ``log`` (None when it
    wrote none: the job ended before); raises ``PodError`` when the data is damaged."""
    chunks: dict[int, str] = {}
    end = None
    for line in log.splitlines():
        if not line.startswith(MARKER + " "):
            continue
        parts = line.split(" ")
        if parts[1] == "end" and len(parts) == 5:
            end = (parts[2], int(parts[3]), int(parts[4]))
        elif parts[1].isdigit() and len(parts) == 3:
            chunks[int(parts[1])] = parts[2]
    if end is None:
        return None
    if sorted(chunks) != list(range(len(chunks))):
        raise PodError(f"the job's results came back with pieces missing ({len(chunks)} pieces, not numbered 0..{len(chunks) - 1})")
    data = base64.b64decode("".join(chunks[i] for i in range(len(chunks))))
    digest, size, status = end
    if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
        raise PodError(f"the job's results came back damaged ({len(data)} bytes where {size} were sent, or another checksum)")
    return data, status


def _unpack(data: bytes, into: Path) -> list[Path]:
    if not data:
        return []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        if members:
            into.mkdir(parents=True, exist_ok=True)
            tar.extractall(into, members=members, filter="data")  # no absolute paths, no links out of the folder
        return [into / m.name for m in members]


async def _stream(client: Any, job_id: str, deadline: float) -> None:
    async for chunk in client.tail_job_logs(job_id):
        for line in chunk.splitlines():
            if not line.startswith(MARKER):
                print(line, flush=True)
        if time.monotonic() > deadline:
            return


def pod_run(
    address: str,
    args: Sequence[str],
    gpus: float = 0,
    cpus: float = 1,
    tree: Path | None = None,
    results: Path | None = None,
    timeout: float = 3600,
    env: Mapping[str, str] | None = None,
    python: str = "python",
) -> int:
    """Run ``poot ARGS`` as a Ray job at ``address``; returns its exit status (0: the job succeeded)."""
    from ray.job_submission import JobStatus

    if tree is not None:
        tree = tree.resolve()
        if not (tree / "core" / "poot" / "pod" / "remote.py").is_file():
            raise PodError(f"{tree} is not a poot source tree (no core/poot/pod/remote.py): give --tree, or --installed to run the cluster's poot")
    client = _client(address)
    runtime_env: dict[str, Any] = {"env_vars": {"PYTHONUNBUFFERED": "1", **dict(env or {})}}
    command = " ".join(shlex.quote(a) for a in args)
    if tree is not None:
        runtime_env["working_dir"] = str(tree)
        runtime_env["excludes"] = tree_excludes(tree)
        entrypoint = f"{python} core/poot/pod/remote.py {command}"
    else:
        entrypoint = f"{python} -m poot.pod.remote {command}"
    print(
        f"poot pod: submitting 'poot {command}' to {address}" + (f" with the tree at {tree}" if tree else " (the cluster's poot)"), file=sys.stderr, flush=True
    )
    try:
        job_id = client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env, entrypoint_num_cpus=cpus, entrypoint_num_gpus=gpus or None)
    except Exception as e:  # noqa: BLE001 - Ray's errors for a refused job (too large a tree, no such resources)
        raise PodError(f"the cluster at {address} refused the job: {e}") from None
    print(f"poot pod: job {job_id}", file=sys.stderr, flush=True)
    deadline = time.monotonic() + timeout
    try:
        asyncio.run(asyncio.wait_for(_stream(client, job_id, deadline), timeout))
    except (asyncio.TimeoutError, TimeoutError):
        pass
    except Exception as e:  # noqa: BLE001 - a broken log stream: the job goes on; its log is read whole below
        print(f"poot pod: the log stream broke ({type(e).__name__}: {e}); waiting for the job", file=sys.stderr, flush=True)
    terminal = {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}
    status = client.get_job_status(job_id)
    while status not in terminal:
        if time.monotonic() > deadline:
            client.stop_job(job_id)
            raise PodError(f"job {job_id} ran past {timeout:.0f} s and was stopped")
        time.sleep(1)
        status = client.get_job_status(job_id)
    info = client.get_job_info(job_id)
    got = results_from_log(client.get_job_logs(job_id))
    where = results or Path("pod-results") / job_id
    if got is not None:
        files = _unpack(got[0], where)
        print(f"poot pod: {len(files)} result file{'s' if len(files) != 1 else ''} in {where}" + (f": {', '.join(f.name for f in files)}" if files else ""))
    if status == JobStatus.SUCCEEDED:
        print(f"poot pod: job {job_id} succeeded")
        return 0
    why = ((info.message or "").strip().splitlines() or [""])[0].split(", last available logs")[0]  # Ray's own line, not the log it quotes
    exit_status = f"poot exited with {got[1]}" if got is not None else "no results came back"
    print(f"poot pod: job {job_id} {status.value.lower()}: {exit_status}" + (f" ({why})" if why else ""), file=sys.stderr)
    return 1
