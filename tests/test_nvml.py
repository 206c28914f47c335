"""NVML sampler, step tagging and clock sync.

No GPU exists on the machines these tests run on, so the sampler runs against ``FakeNvml``, a
stand-in for the ``pynvml`` module written for these tests (``gpu/capture.py`` runs the
real thing on a GPU). The clock tests use the real torch.profiler.
"""

from __future__ import annotations

import gzip
import json
import threading
import time
from types import SimpleNamespace

import numpy as np
import pynvml
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from tpbench.capture import nvml


class FakeNvml:
    """Only because no GPU exists here: answers the pynvml calls the sampler makes.

    Counters grow by fixed amounts per query so rates are predictable; ``fields`` says which
    field ids the fake driver supports; ``fail_after`` makes queries raise like a lost GPU.
    """

    NVMLError = pynvml.NVMLError

    def __init__(self, fields: set[int] | None = None, links: int = 0, fail_after: int | None = None) -> None:
        self.supported = (
            fields
            if fields is not None
            else {
                pynvml.NVML_FI_DEV_POWER_INSTANT,
                pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
                pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
                pynvml.NVML_FI_DEV_NVLINK_COUNT_XMIT_BYTES,
                pynvml.NVML_FI_DEV_NVLINK_COUNT_RCV_BYTES,
            }
        )
        self.links = links
        self.fail_after = fail_after
        self.queries = 0
        self.counter = 0
        self.lock = threading.Lock()

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetHandleByUUID(self, uuid):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetHandleByIndex(self, index):
        return ("gpu", index)

    def nvmlDeviceGetIndex(self, handle):
        return handle[1]

    def nvmlDeviceGetName(self, handle):
        return b"Fake GPU"

    def nvmlDeviceGetNvLinkState(self, handle, link):
        if link >= self.links:
            raise pynvml.NVMLError(
                pynvml.NVML_ERROR_NOT_SUPPORTED if self.links == 0 else pynvml.NVML_ERROR_INVALID_ARGUMENT
            )
        return pynvml.NVML_FEATURE_ENABLED

    def _query(self) -> None:
        with self.lock:
            self.queries += 1
            if self.fail_after is not None and self.queries > self.fail_after:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    def nvmlDeviceGetUtilizationRates(self, handle):
        self._query()
        self.counter += 1
        return SimpleNamespace(gpu=50, memory=20)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=3 * 2**30, total=80 * 2**30)

    def nvmlDeviceGetClockInfo(self, handle, kind):
        assert kind == pynvml.NVML_CLOCK_SM
        return 1980

    def nvmlDeviceGetPowerUsage(self, handle):
        return 250_000

    def nvmlDeviceGetPcieThroughput(self, handle, counter):
        return 1000 if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else 2000  # KB/s

    def nvmlDeviceGetFieldValues(self, handle, field_ids):
        out = []
        for f in field_ids:
            fid, scope = f if isinstance(f, tuple) else (f, 0)
            ok = fid in self.supported
            value = {
                pynvml.NVML_FI_DEV_POWER_INSTANT: 300_000,
                pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: self.counter * 1_000_000,
                pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: self.counter * 2_000_000,
                pynvml.NVML_FI_DEV_NVLINK_COUNT_XMIT_BYTES: self.counter * 10_000_000,
                pynvml.NVML_FI_DEV_NVLINK_COUNT_RCV_BYTES: self.counter * 20_000_000,
            }.get(fid, 0)
            out.append(
                SimpleNamespace(
                    nvmlReturn=pynvml.NVML_SUCCESS if ok else pynvml.NVML_ERROR_NOT_SUPPORTED,
                    valueType=pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                    value=SimpleNamespace(ullVal=value),
                )
            )
        return out


def _sample(gpu: nvml.Gpu, seconds: float, interval_ms: int = 10) -> list[tuple[float, ...]]:
    sampler = nvml.Sampler(gpu, interval_ms).start()
    time.sleep(seconds)
    return sampler.stop()


def test_open_chooses_batched_fields_when_the_driver_has_them():
    gpu = nvml.open_device(FakeNvml(links=2))
    assert gpu.name == "Fake GPU" and gpu.index == 0
    assert gpu.power_field and gpu.pcie_counters and gpu.nvlink_links == (0, 1)
    assert gpu.sources["pcie"].startswith("field")
    assert len(gpu.fields) == 1 + 2 + 2 * 2  # power, PCIe tx/rx, NVLink tx/rx per link


def test_sampler_arrives_at_the_configured_rate_and_counters_become_rates():
    gpu = nvml.open_device(FakeNvml(links=2))
    rows = _sample(gpu, 0.5, interval_ms=10)
    assert 30 <= len(rows) <= 52
    df = nvml.samples_frame(gpu, rows, [], rank=0, repeat=0)
    gaps_ms = df["t_ns"].diff().dropna() / 1e6
    assert 9 <= gaps_ms.median() <= 12
    assert df["gpu_util_pct"].eq(50).all() and df["mem_used_mb"].eq(3 * 1024).all()
    assert df["power_w"].eq(300).all() and df["sm_clock_mhz"].eq(1980).all()
    # 1 MB (tx) and 2 MB (rx) per query on PCIe, 2 links × 10/20 MB on NVLink: rate = delta / dt.
    dt_s = df["t_ns"].diff() / 1e9
    assert (df["pcie_tx_mb_s"] * dt_s).dropna().round(6).eq(1).all()
    assert (df["pcie_rx_mb_s"] * dt_s).dropna().round(6).eq(2).all()
    assert (df["nvlink_tx_mb_s"] * dt_s).dropna().round(6).eq(20).all()
    assert df["pcie_tx_mb_s"].isna().sum() == 1  # the first sample has no interval
    assert list(df.columns) == list(nvml.COLUMNS)


def test_fallbacks_when_fields_are_missing_and_no_nvlink():
    gpu = nvml.open_device(FakeNvml(fields=set()))
    assert not gpu.power_field and not gpu.pcie_counters and gpu.nvlink_links == () and gpu.fields == []
    assert gpu.sources == {
        "power_w": "nvmlDeviceGetPowerUsage",
        "pcie": "nvmlDeviceGetPcieThroughput",
        "nvlink": "none (no active NVLink, or no byte counters)",
    }
    df = nvml.samples_frame(gpu, _sample(gpu, 0.1), [], rank=1, repeat=2)
    assert df["power_w"].eq(250).all()
    assert df["pcie_tx_mb_s"].eq(1000 * 1024 / 1e6).all()  # KB/s straight from the call
    assert df["nvlink_tx_mb_s"].isna().all()
    assert df["rank"].eq(1).all() and df["repeat"].eq(2).all()


def test_a_failing_gpu_stops_the_sampler_with_a_reason_and_keeps_samples():
    gpu = nvml.open_device(FakeNvml(fail_after=3))
    sampler = nvml.Sampler(gpu, 1).start()
    deadline = time.monotonic() + 5
    while sampler.error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    rows = sampler.stop()
    assert len(rows) == 3
    assert "after 3 samples" in sampler.error and "GPU is lost" in sampler.error


def test_samples_are_tagged_with_their_step_and_phase():
    # Step 0 and 1 with a gap between them (another arm's step, as in a round whose steps are
    # interleaved): a sample in the gap belongs to no step of this case.
    spans = nvml.step_spans([1.0, 1.12, 1.2], [1.1, 1.18, 1.3], warmup_steps=1)
    spans += nvml.step_spans([2.0], [2.1], 0, first_step=3, phase="profile")
    assert [(s.step, s.phase) for s in spans] == [(0, "warmup"), (1, "timed"), (2, "timed"), (3, "profile")]
    t = [int(x * 1e9) for x in (0.5, 1.05, 1.11, 1.15, 1.25, 1.5, 2.05)]
    step, phase = nvml._tag(np.array(t), spans)
    assert step.tolist() == [-1, 0, -1, 1, 2, -1, 3]
    assert phase.tolist() == ["idle", "warmup", "idle", "timed", "timed", "idle", "profile"]


def test_no_gpu_or_no_nvml_is_unavailable_not_an_error():
    cpu = nvml.open_gpu(torch.device("cpu"))
    assert isinstance(cpu, nvml.Unavailable) and "CPU" in cpu.reason
    assert nvml.start_sampler(cpu, 50) is None
    # The real pynvml on a machine without the NVIDIA driver: nvmlInit fails, we say why.
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    none = nvml.open_gpu(torch.device("cuda", 0))
    assert isinstance(none, nvml.Unavailable) and none.reason.startswith("NVML unavailable")


def test_trace_clock_is_unix_time_and_the_probe_measures_the_offset(tmp_path):
    """torch.profiler's ts + baseTimeNanoseconds/1000 is Unix time in µs (CLOCK_REALTIME); the
    probe's offset maps sampler time onto the exported trace's ts exactly."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        real_before = time.time_ns()
        brackets = nvml.clock_probe()
        real_after = time.time_ns()
        torch.ones(8).sum()
    path = tmp_path / "rank0.json"
    prof.export_chrome_trace(str(path))
    gz = tmp_path / "rank0.json.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    sync = nvml.clock_sync(prof, brackets, gz)
    trace = json.loads(path.read_text())
    assert sync.trace_base_ns == trace["baseTimeNanoseconds"]
    probes = [e for e in trace["traceEvents"] if e.get("name") == nvml.CLOCK_PROBE]
    assert len(probes) == len(brackets) == 5
    # The chosen probe's exported ts is exactly where the offset puts its sampler time.
    predicted = sync.probe_ns / 1e3 + sync.offset_us
    assert min(abs(p["ts"] - predicted) for p in probes) < 0.01
    unix_us = min(p["ts"] for p in probes) + trace["baseTimeNanoseconds"] / 1e3
    # The approximate clock torch converts from is accurate to a few µs; allow 1 ms.
    assert real_before / 1e3 - 1000 <= unix_us <= real_after / 1e3 + 1000
    assert sync.uncertainty_us < 1000


def test_trace_base_is_read_from_the_header_only(tmp_path):
    p = tmp_path / "t.json.gz"
    p.write_bytes(
        gzip.compress(
            b'{"schemaVersion": 1, "baseTimeNanoseconds": 1790857026000000000, "traceEvents": ['
            + b'{"ph": "X"},' * 100_000
            + b"{}]}"
        )
    )
    assert nvml.trace_base_ns(p) == 1790857026000000000
    (tmp_path / "bad.json").write_text('{"traceEvents": []}')
    with pytest.raises(ValueError, match="baseTimeNanoseconds"):
        nvml.trace_base_ns(tmp_path / "bad.json")
