"""The CUDA kernel runner behind `POOT_TEST_DEVICE=cuda:0`: where no NVIDIA driver is present (CI),
asking for it is a clear error, never a silent CPU run; the target chosen for a device follows its
compute capability."""

from __future__ import annotations

import numpy as np
import pytest

from poot.runtime import Capabilities, Device


def _dev(arch: str) -> Device:
    caps = Capabilities(frozenset({"f32"}), 1, 1024, 48 * 1024, 32, 1 << 30, details=(("arch", arch),))
    return Device("cuda", 0, "test", target="nvptx", capabilities=caps)


def test_target_follows_compute_capability():
    from poot_ptx.runtime import target_for

    assert target_for(_dev("sm_90")) == "nvptx:sm_90a"  # Hopper's own code (wgmma): compute capability 9.0 alone runs it
    assert target_for(_dev("sm_100")) == "nvptx:sm_90"
    assert target_for(_dev("sm_89")) == "nvptx:sm_80"
    with pytest.raises(Exception, match="sm_75"):
        target_for(_dev("sm_75"))


def test_asking_for_a_missing_gpu_is_an_error(monkeypatch):
    from poot.errors import DeviceUnavailable
    from poot.runtime import get_device

    try:
        get_device("cuda:0")
        pytest.skip("a CUDA device is present: the kernel tests run on it with POOT_TEST_DEVICE=cuda:0")
    except DeviceUnavailable:
        pass
    from poot.kernel.library import norms
    from poot.testing import kernels

    monkeypatch.setenv("POOT_TEST_DEVICE", "cuda:0")
    kernels._RUNNERS.clear()
    x = np.ones((2, 8), np.float32)
    with pytest.raises(DeviceUnavailable, match="cuda:0"):
        kernels.run_host(norms.rms_norm.instantiate(BLOCK=32), (2,), {"x": x, "w": np.ones(8, np.float32), "y": np.empty_like(x)}, {"cols": 8, "eps": 1e-6})
