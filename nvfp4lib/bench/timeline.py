"""Per-CTA timelines of the serving kernel's GEMMs in one MoE layer call (``moe-bench --timeline``): where a decode
GEMM's time goes, CTA by CTA.

A :class:`Timeline` owns the buffer that :data:`nvfp4lib.kernels.hopper_varlen.kernel.TIMELINE` points the GEMMs at
while they are built (:meth:`Timeline.building`); after a graph replay, :meth:`Timeline.summary` reads the stamps
back: per GEMM (the dual gate/up GEMM and the down GEMM), how many CTAs started and how many had a tile, the phases
of the CTAs with a tile from their own SM's cycle counter (median, first and last CTA, in us at the card's SM clock),
and from the global timer how far apart the CTAs started and when the last one ended. A development probe: the
stamps cost each CTA a few stores, so rows measured with it are kept out of the shipped rows.
"""
from __future__ import annotations

import contextlib

import torch

__all__ = ["PHASES", "GEMMS", "Timeline"]

GEMMS = ("gate_up", "down")  # the buffer's regions: dual GEMMs, then single ones (the kernel's TIMELINE note)
# (name, first stamp, last stamp) of each phase, stamps as the kernel's TIMELINE note numbers them
PHASES = (("schedule", 0, 1), ("wait", 1, 2), ("first stage", 2, 3), ("mainloop", 3, 4), ("epilogue", 4, 5),
          ("total", 0, 5))


class Timeline:
    """The stamp buffer on ``device`` (zeros: a CTA's row stays zero where it never ran)."""

    def __init__(self, device):
        from ..kernels.hopper_varlen.kernel import TIMELINE_CTAS

        self.buf = torch.zeros((len(GEMMS), TIMELINE_CTAS, 8), dtype=torch.int64, device=device)
        dev = self.buf.device
        props = torch.cuda.get_device_properties(dev) if dev.type == "cuda" else None
        # the SM clock the driver reports (kHz), else estimated from the stamps themselves (summary)
        self.clock_mhz = getattr(props, "clock_rate", 0) / 1e3 or None

    @contextlib.contextmanager
    def building(self):
        """GEMMs built inside the block stamp into this buffer (a runner compiles when it is made)."""
        from ..kernels.hopper_varlen import kernel

        old = kernel.TIMELINE
        kernel.TIMELINE = self.buf.data_ptr()
        try:
            yield
        finally:
            kernel.TIMELINE = old

    def clear(self) -> None:
        self.buf.zero_()

    def summary(self, clock_mhz: float | None = None) -> dict:
        """Per GEMM that stamped: ``ctas`` (started), ``tiles`` (CTAs with a tile), ``start_spread_us`` (last CTA's
        start after the first's), ``span_us`` (first start to last end), ``clock_mhz`` (cycles per us used) and
        ``phases``: {phase: [median, min, max] us over the CTAs with a tile}."""
        b = self.buf.cpu()
        mhz = clock_mhz or self.clock_mhz or _clock_from_stamps(b)
        out = {}
        for r, name in enumerate(GEMMS):
            x = b[r]
            started = x[:, 0] != 0
            if not bool(started.any()):
                continue
            done = started & (x[:, 5] != 0)
            g0 = x[started, 6].double()
            row = {"ctas": int(started.sum()), "tiles": int(done.sum()), "clock_mhz": mhz,
                   "start_spread_us": float(g0.max() - g0.min()) / 1e3}
            if bool(done.any()):
                row["span_us"] = float(x[done, 7].double().max() - g0.min()) / 1e3
                d = x[done].double()
                row["phases"] = {p: _spread((d[:, b_] - d[:, a]) / mhz) for p, a, b_ in PHASES} if mhz else {}
            out[name] = row
        return out


def _spread(v: torch.Tensor) -> list[float]:
    return [round(float(v.quantile(0.5)), 3), round(float(v.min()), 3), round(float(v.max()), 3)]  # (a true median)


def _clock_from_stamps(b: torch.Tensor) -> float | None:
    """Cycles per us from the CTAs that ran at least 1 us: their cycles (stamps 0 to 5) over their global time
    (stamps 6 to 7), the median; None where none did."""
    x = b.reshape(-1, 8).double()
    ns = x[:, 7] - x[:, 6]
    ok = (x[:, 0] != 0) & (x[:, 5] != 0) & (ns >= 1000)
    if not bool(ok.any()):
        return None
    return float(((x[ok, 5] - x[ok, 0]) / (ns[ok] / 1e3)).quantile(0.5))
