"""GPU time of a call: CUDA events around each call, the L2 flushed before each (the tuning cache and the benchmark
harness both time this way)."""
from __future__ import annotations

import torch

__all__ = ["L2Flusher", "time_runner"]


class L2Flusher:
    """Writes a buffer twice the L2 size so that no operand stays cached between timed runs."""

    def __init__(self, device="cuda"):
        props = torch.cuda.get_device_properties(device)
        size = max(2 * getattr(props, "L2_cache_size", 50 << 20), 64 << 20)
        self.buf = torch.empty(size, dtype=torch.uint8, device=device)

    def __call__(self):
        self.buf.zero_()


def time_runner(runner, *, iters: int = 50, warmup: int = 3, flush: L2Flusher | None = None) -> list[float]:
    """Microseconds per call, one CUDA-event pair around each call, L2 flushed before each."""
    for _ in range(warmup):
        runner()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for s, e in zip(starts, ends):
        if flush is not None:
            flush()
        s.record()
        runner()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
