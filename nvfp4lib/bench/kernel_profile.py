"""Where a call's GPU time goes, kernel by kernel: CUPTI's kernel records (``torch.profiler``) over many calls, the L2
flushed before each, as :func:`nvfp4lib.timing.time_runner` times them.

A call (eager, or one CUDA-graph replay) launches a few kernels: for the serving path the activation prologue and the
GEMM. The CUDA-event time of :mod:`nvfp4lib.timing` is their sum plus the gaps between them; this splits it:

- ``kernels``: per kernel name, its median duration and median start relative to the call's first kernel (so a
  programmatic-dependent launch that overlaps its predecessor shows a start before the predecessor's end);
- ``span_us``: first kernel start to last kernel end of a call, median over calls (what the events time, less the
  launch latency in front of the first kernel).

The flush kernels are told apart by running the flusher alone under the profiler first (their names), not by
guessing. Needs a GPU; returns a dict, prints nothing.
"""
from __future__ import annotations

import statistics

import torch

__all__ = ["profile_runner", "format_profile"]


def _kernel_records(fn, iters: int) -> list[tuple[str, float, float]]:
    """(name, start us, end us) of every CUDA kernel that ``fn`` launches when run ``iters`` times."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    out = []
    for e in prof.events():
        if e.device_type == DeviceType.CUDA and e.time_range.end > e.time_range.start:
            out.append((e.name, float(e.time_range.start), float(e.time_range.end)))
    return sorted(out, key=lambda r: r[1])


def _short(name: str, width: int = 60) -> str:
    name = name.split("(")[0]
    return name if len(name) <= width else name[: width // 2 - 2] + "..." + name[-(width // 2 - 1):]


def profile_runner(runner, *, iters: int = 30, flush=None) -> dict:
    """Kernel-level profile of ``runner()`` (a call): see the module doc."""
    runner()
    flush_names = set()
    if flush is not None:
        flush_names = {name for name, _, _ in _kernel_records(flush, 2)}

    def step():
        if flush is not None:
            flush()
        runner()

    records = [r for r in _kernel_records(step, iters) if r[0] not in flush_names]
    # calls: runs of kernels separated by a flush; here, by gaps longer than any call's own gaps would be is fragile,
    # so count kernels per call instead: the runner launches the same kernels every call
    if not records or len(records) % iters:
        return {"error": f"{len(records)} kernel records for {iters} calls: not a whole number per call",
                "names": sorted({_short(n) for n, _, _ in records})}
    per = len(records) // iters
    calls = [records[i * per:(i + 1) * per] for i in range(iters)]
    spans = [c[-1][2] - c[0][1] for c in calls]
    kernels = []
    for j in range(per):
        kernels.append({
            "name": _short(calls[0][j][0]),
            "median_us": statistics.median(c[j][2] - c[j][1] for c in calls),
            "start_us": statistics.median(c[j][1] - c[0][1] for c in calls),
        })
    return {"span_us": statistics.median(spans), "kernels_per_call": per, "kernels": kernels, "iters": iters}


def format_profile(label: str, prof: dict) -> str:
    if "error" in prof:
        return f"{label}: {prof['error']} ({', '.join(prof.get('names', []))})"
    lines = [f"{label}: span {prof['span_us']:.1f} us, {prof['kernels_per_call']} kernels per call"]
    for k in prof["kernels"]:
        lines.append(f"    {k['start_us']:7.1f} +{k['median_us']:7.1f} us  {k['name']}")
    return "\n".join(lines)
