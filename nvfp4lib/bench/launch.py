"""Launch strategies (the study's round 5C), for any backend.

- ``grouped`` (default): the backend's own launch — one kernel for all groups where it has one;
- ``loop``: one prepared problem per group, launched one after another from Python;
- ``streams``: the same, each group on its own CUDA stream (joined before returning);
- ``graph=True`` on top of any of these: the per-call work captured once in a CUDA graph and replayed.
"""
from __future__ import annotations

import time

import torch

from ..runner import Runner

STRATEGIES = ("grouped", "loop", "streams")


def per_group(factory, a, b, b2, *, out_dtype, streams: bool, **options) -> Runner:
    t0 = time.perf_counter()
    subs = [factory([a[g]], [b[g]], None if b2 is None else [b2[g]], out_dtype=out_dtype, **options)
            for g in range(len(a)) if a[g].shape[0] > 0]
    outputs = []
    it = iter(subs)
    for g in range(len(a)):
        if a[g].shape[0] > 0:
            outputs.append(next(it).outputs[0])
        else:
            outputs.append(torch.empty((0, b[g].shape[0]), dtype=out_dtype, device=a[g].data.device))
    if streams and a[0].data.is_cuda:
        pool = [torch.cuda.Stream(device=a[0].data.device) for _ in subs]

        def run():
            main = torch.cuda.current_stream()
            for s, r in zip(pool, subs):
                s.wait_stream(main)
                with torch.cuda.stream(s):
                    r.fn()
            for s in pool:
                main.wait_stream(s)
    else:
        def run():
            for r in subs:
                r.fn()

    name = "streams (one CUDA stream per group)" if streams else "loop (one launch per group)"
    return Runner(run, outputs, prepare_s=time.perf_counter() - t0, keepalive=subs,
                  held_bytes=sum(r.held_bytes for r in subs),
                  notes=f"{name}; " + (subs[0].notes if subs else ""), info={"strategy": name},
                  tolerance=max((r.tolerance or 0 for r in subs), default=0) or None,
                  not_graphable="; ".join(sorted({r.not_graphable for r in subs if r.not_graphable})))


def graphed(runner: Runner, warmup: int = 2) -> Runner:
    """Capture ``runner``'s per-call work in a CUDA graph; calls replay it."""
    if not runner.outputs or not runner.outputs[0].is_cuda:
        raise RuntimeError("graph=True needs CUDA tensors (CUDA graphs capture GPU work)")
    if runner.not_graphable:
        raise NotImplementedError(f"graph=True refused: {runner.not_graphable}")
    t0 = time.perf_counter()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            runner.fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        runner.fn()
    torch.cuda.synchronize()
    return Runner(graph.replay, runner.outputs, prepare_s=runner.prepare_s + time.perf_counter() - t0,
                  held_bytes=runner.held_bytes, notes=runner.notes + "; CUDA graph",
                  info={**runner.info, "graph": True},
                  tolerance=runner.tolerance, keepalive=(runner, graph))
