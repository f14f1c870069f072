"""moe-bench --timeline's reading of the GEMMs' per-CTA stamps (nvfp4lib.bench.timeline), on the CPU with a buffer
filled as the kernel's TIMELINE note lays it out."""
import pytest
import torch

pytest.importorskip("cutlass")  # (the buffer's size is the kernel module's)

from nvfp4lib.bench.timeline import PHASES, Timeline  # noqa: E402


def _cta(buf, gemm, cta, cycles, start_ns, clock_mhz=1000.0):
    """CTA ``cta`` of ``gemm`` stamped at ``cycles`` (six clock64 stamps), starting at ``start_ns`` global time."""
    buf[gemm, cta, :6] = torch.tensor(cycles, dtype=torch.int64)
    buf[gemm, cta, 6] = start_ns
    buf[gemm, cta, 7] = start_ns + int((cycles[5] - cycles[0]) / clock_mhz * 1e3)


def test_summary_reads_phases_spreads_and_the_clock():
    tl = Timeline("cpu")
    assert tl.summary() == {}  # nothing stamped
    base = 10_000
    _cta(tl.buf, 0, 0, [base + c for c in (0, 100, 600, 1600, 9600, 10600)], 5_000_000)
    _cta(tl.buf, 0, 1, [base + c for c in (0, 300, 800, 2800, 10800, 11800)], 5_002_000)
    tl.buf[0, 2, :2] = torch.tensor([7, 9])  # a CTA with no tile: stamps 0 and 1 only
    tl.buf[0, 2, 6] = 5_001_000
    s = tl.summary()
    assert set(s) == {"gate_up"}  # the down GEMM stamped nothing
    g = s["gate_up"]
    assert g["ctas"] == 3 and g["tiles"] == 2
    assert g["clock_mhz"] == pytest.approx(1000.0)  # from the stamps: no driver clock on the CPU
    assert g["start_spread_us"] == pytest.approx(2.0) and g["span_us"] == pytest.approx(2.0 + 11.8)
    ph = g["phases"]
    assert list(ph) == [p for p, _, _ in PHASES]
    assert ph["mainloop"] == [8.0, 8.0, 8.0] and ph["first stage"] == [1.5, 1.0, 2.0]
    assert ph["total"][1:] == [10.6, 11.8]
    assert tl.summary(clock_mhz=2000.0)["gate_up"]["phases"]["mainloop"] == [4.0, 4.0, 4.0]
    tl.clear()
    assert tl.summary() == {}
