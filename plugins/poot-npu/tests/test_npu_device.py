"""NPUs through the accel subsystem: absent here (no driver), and the sysfs parsing on a made-up tree."""

from pathlib import Path

from poot_npu import device
from poot_npu.device import ACCEL, npu_devices


def test_real_machine_reports_each_npu_with_a_reason():
    devs = {d.name: d for d in npu_devices()}
    assert set(devs) == {"npu:xdna2", "npu:npu4"}
    for d in devs.values():
        assert not d.available()
        if not ACCEL.exists():
            assert d.unavailable.code == "no-driver"


def test_driver_binding_is_read_from_sysfs(tmp_path: Path, monkeypatch):
    drivers = tmp_path / "bus" / "drivers"
    (drivers / "amdxdna").mkdir(parents=True)
    dev = tmp_path / "devices" / "0000:c5:00.1"
    dev.mkdir(parents=True)
    (dev / "driver").symlink_to(drivers / "amdxdna")
    accel = tmp_path / "class" / "accel"
    (accel / "accel0").mkdir(parents=True)
    (accel / "accel0" / "device").symlink_to(dev)
    devs = {d.name: d for d in npu_devices(accel)}
    assert devs["npu:npu4"].unavailable.code == "no-driver"
    # then what is missing next, in order: its runtime, the AIE toolchain, an executor
    why = devs["npu:xdna2"].unavailable
    assert why.code == "no-driver" and "accel0" in why.message and "libxrt_coreutil" in why.message and "XRT" in why.message
    monkeypatch.setattr(device, "runtime_library", lambda key: "/opt/xilinx/xrt/lib/libxrt_coreutil.so")
    monkeypatch.setenv("PEANO_INSTALL_DIR", str(tmp_path / "no-peano"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    why = {d.name: d for d in npu_devices(accel)}["npu:xdna2"].unavailable
    assert why.code == "unsupported" and "AIE toolchain" in why.message and "PEANO_INSTALL_DIR" in why.message
    monkeypatch.setattr(device, "_toolchain", lambda: object())
    why = {d.name: d for d in npu_devices(accel)}["npu:xdna2"].unavailable
    assert why.code == "unsupported" and "no executor" in why.message
