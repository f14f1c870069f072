"""What a caller pays per call: the four ways of calling the serving path, timed side by side in one run.

Per problem and backend (``bench_calls``), on fresh seeded inputs, each form checked against the exact reference
(its output allocated from a poisoned allocator block, so an unwritten element reads NaN) before it is timed:

- ``graph``: prepared weights, the call captured once in a CUDA graph and replayed; fresh activations are copied
  into the captured inputs before each replay (outside the timed span);
- ``eager``: prepared weights, a fresh activation set each call, no graph;
- ``oneshot``: the public ``grouped_gemm`` / ``grouped_dual_gemm_silu`` with new weights each call (a few weight sets
  cycled; compiled kernels and the tuning cache warm): the weight packing is inside the call;
- ``harness``: the study's harness style, ``compat.custom_kernel`` on the GPU MODE task tuple
  (``compat.custom_kernel_dual`` on the dual task's), a list of fresh inputs each called once (when
  :func:`nvfp4lib.compat.study_tuple` can build the tuple: the dual task is one GEMM, so of the dual problems only
  single-group ones, e.g. suite ``task``, which holds the dual task's benchmark shapes in both forms).

Every timed call is preceded by an L2 flush; CUDA events bracket the call (``median_us``: what the GPU sees) and
``host_us`` is the host time of the call itself (``perf_counter`` around it, no synchronisation). A call that costs
more host time than GPU time is host-bound: ``per_call_us = max(median_us, host_us)``, the column the targets are
stated on. It can overstate what calls issued back to back cost: where the host takes longer to launch a call than
the flush before the start event takes to run, ``median_us`` also holds part of the host time before the launch,
which back-to-back calls overlap with the previous call's GPU work. ``b2b_us`` measures those: the wall time per
iteration of ``iters`` iterations of (flush, call) with one synchronisation at the end, less that of the flushes
alone (``b2b_flush_us``).

A run sweeps all problems and forms ``rounds`` times (:data:`ROUNDS`), one row per round: a form is judged by its
median round (:func:`median_round`), so that one slow stretch of the host does not decide a host-bound verdict.
"""
from __future__ import annotations

import os
import statistics
import time

import torch

from ..formats import NVFP4Tensor
from ..problems import GroupedProblem, make_inputs
from ..reference import reference_grouped_gemm, relative_error
from .harness import L2Flusher
from .roofline import floor_us, measure_ceilings
from .store import new_run_id, provenance

__all__ = ["CALLS", "ROUNDS", "back_to_back", "bench_calls", "host_probe", "median_round", "pack_rows", "time_both"]

CALLS = ("graph", "eager", "oneshot", "harness")
ROUNDS = 3  # sweeps over all problems and forms per run (bench_calls)
TOL = 1e-3


def pack_rows(a: list[NVFP4Tensor]):
    """(a_packed [T, K], offsets int32 [G+1] on a's device, per-group global scales [G]) of a list of groups."""
    offs = [0]
    for t in a:
        offs.append(offs[-1] + int(t.shape[0]))
    dev = a[0].data.device
    packed = NVFP4Tensor(torch.cat([t.data for t in a]), torch.cat([t.scales for t in a]),
                         torch.ones((), dtype=torch.float32, device=dev))
    return packed, torch.tensor(offs, dtype=torch.int32, device=dev), torch.stack([t.global_scale for t in a])


def _poison(nbytes: int) -> None:
    junk = torch.full((nbytes // 2 + 4096,), float("nan"), dtype=torch.float16, device="cuda")
    del junk


def _time(call, prepare, iters: int, flush: L2Flusher) -> dict:
    """``prepare(i)`` (untimed) then ``call(i)`` for i = 0 .. iters-1, each after an L2 flush."""
    for i in range(2):
        prepare(i)
        call(i)
    torch.cuda.synchronize()
    gpu, host = [], []
    for i in range(iters):
        prepare(i)
        flush()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        t0 = time.perf_counter()
        call(i)
        host.append((time.perf_counter() - t0) * 1e6)
        e.record()
        e.synchronize()
        gpu.append(s.elapsed_time(e) * 1e3)
    med, hmed = statistics.median(gpu), statistics.median(host)
    return {"iters": iters, "median_us": med, "min_us": min(gpu), "p90_us": sorted(gpu)[int(0.9 * (iters - 1))],
            "host_us": hmed, "per_call_us": max(med, hmed)}


def back_to_back(call, flush, iters: int, sync=None) -> dict:
    """Wall time per call of ``call(i)`` issued back to back (no synchronisation between calls), each after
    ``flush()``: (flush, call) per iteration less flush alone, both measured the same way."""
    sync = sync or torch.cuda.synchronize

    def wall(fn) -> float:
        fn(0)
        sync()
        t0 = time.perf_counter()
        for i in range(iters):
            fn(i)
        sync()
        return (time.perf_counter() - t0) * 1e6 / iters

    both = wall(lambda i: (flush(), call(i)))
    alone = wall(lambda i: flush())
    return {"b2b_us": both - alone, "b2b_flush_us": alone}


def time_both(call, iters: int, flush: L2Flusher) -> dict:
    """``call(i)`` timed each on its own (:func:`_time`) and back to back (:func:`back_to_back`)."""
    return {**_time(call, lambda i: None, iters, flush), **back_to_back(call, flush, iters)}


def host_probe(reads: int = 200, samples: int = 21) -> dict:
    """The host's speed in this run: the median µs of a fixed piece of Python (``reads`` pairs of tensor attribute
    reads, as a call's checks do), with the GPU idle (``host_probe_idle_us``) and while a kernel keeps the GPU busy
    (``host_probe_busy_us``: a timed call's host steps run during the L2 flush before it), and the host's 1-minute load
    average. On the lent H100 and H200 hosts a one-shot call's Python steps took 2-3x as long with the GPU busy as
    with it idle (development runs, 2026-11-26): these fields let a run's host-bound verdicts be read against it."""
    t = torch.empty(1)

    def work() -> float:
        t0 = time.perf_counter()
        for _ in range(reads):
            t.data_ptr()
            t.is_contiguous()
        return (time.perf_counter() - t0) * 1e6

    out = {"host_probe_idle_us": statistics.median(work() for _ in range(samples))}
    if torch.cuda.is_available():
        busy = []
        for _ in range(samples):
            torch.cuda._sleep(2_000_000)  # ~1 ms of GPU time, longer than the work
            busy.append(work())
            torch.cuda.synchronize()
        out["host_probe_busy_us"] = statistics.median(busy)
    out["host_load_1m"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return out


def _check(outs, ref) -> float:
    torch.cuda.synchronize()
    return relative_error(outs, ref)


def _split(c: torch.Tensor, a) -> list[torch.Tensor]:
    o, out = 0, []
    for t in a:
        out.append(c[o: o + t.shape[0]])
        o += t.shape[0]
    return out


def bench_calls(problems: list[GroupedProblem], *, backend: str = "cute-hopper", calls=CALLS, seed: int = 1111,
                mode: str = "gaussian", iters: int = 30, rounds: int = ROUNDS, sets: int = 4,
                ceilings: dict | None = None, progress=print) -> list[dict]:
    """Rows (one per round, problem and call form) with provenance; nothing is stored here.

    Every problem is set up once (inputs, references, prepared weights); then ``rounds`` sweeps over all problems and
    forms, each row carrying its ``round``. The host-bound forms' times follow the host's state, which on the lent
    machines drifts over seconds (the same eager call's host time 30 µs in one sweep, 92 µs in the next, one process,
    2026-11-26): sweeps spread each form over the run, and :mod:`nvfp4lib.study.serving_report` judges each form by its
    median round."""
    from .. import api, compat
    from ..serving import prepare_weights

    if not torch.cuda.is_available():
        raise RuntimeError("bench_calls needs a CUDA GPU")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    run_id, ceil, flush = new_run_id(), ceilings or measure_ceilings(), L2Flusher()
    knobs = {}
    if backend == "cute-hopper":  # the kernel knobs a call form's times depend on
        from ..kernels.hopper_varlen import kernel
        from ..tuning import rule_knobs

        knobs = {**kernel.call_knobs(), **rule_knobs()}  # (and the shape rule's: which config auto runs)
    probe = host_probe()  # the host's state in this run: its speed decides the host-bound forms' verdicts
    setups = []
    for prob in problems:
        inputs = [make_inputs(prob, seed=seed + s, mode=mode, device="cuda") for s in range(sets)]
        refs = [reference_grouped_gemm(x.a, x.b, x.b2) for x in inputs]
        floor = floor_us(prob, ceil)
        base = {"run_id": run_id, **{f"ceil_{k}": v for k, v in ceil.items()}, **probe, "problem": prob.name,
                "groups": prob.groups, "m": list(prob.m), "n": list(prob.n), "k": list(prob.k), "dual": prob.dual,
                "flops": prob.flops(), "nvfp4_bytes": prob.nvfp4_bytes(), "backend": backend, "seed": seed,
                "input_mode": mode, "floor_us": floor, "kernel_family": "hopper_varlen" if backend == "cute-hopper"
                else backend, "rounds": rounds, **knobs}
        w = prepare_weights(inputs[0].b, inputs[0].b2, backend=backend)
        base["choice"] = w.choice_source(sum(prob.m))  # (rule, tuned or named: once per problem, not per row)
        acts = [pack_rows(x.a) for x in inputs]  # the same weights with each set's activations
        ref_w = [reference_grouped_gemm(x.a, inputs[0].b, inputs[0].b2) for x in inputs]  # (set 0's weights)
        setups.append((prob, base, w, inputs, acts, refs, ref_w, floor))
    rows = []
    for rnd in range(rounds):
        for prob, base, w, inputs, acts, refs, ref_w, floor in setups:
            nbytes = sum(prob.m) * prob.n[0] * 2
            for call in calls:
                row = {**base, "round": rnd, "call": call, "config": w.config_for(sum(prob.m))}
                try:
                    row.update(_one(call, prob, w, inputs, acts, refs, ref_w, nbytes, iters, flush, api, compat))
                except (RuntimeError, ValueError, TypeError, NotImplementedError) as e:
                    row["status"] = f"error: {type(e).__name__}: {str(e)[:400]}"
                if "median_us" in row:
                    row.update({"tflops": prob.flops() / row["per_call_us"] * 1e-6,
                                "gbps": prob.nvfp4_bytes() / row["per_call_us"] * 1e-3,
                                "ratio_to_floor": row["per_call_us"] / floor})
                rows.append(row)
                if progress:
                    progress(row)
    prov = provenance()
    return [{**prov, **r} for r in rows]


def median_round(rows: list[dict]) -> list[dict]:
    """Of each (problem, call form), the row of the median round by ``per_call_us`` (the lower middle one of an even
    count) with the rounds' ``per_call_min_us`` and ``per_call_max_us`` (rows without a time as they are, one per
    form), in first-seen order: what a run's table prints."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["problem"], r["call"]), []).append(r)
    out = []
    for g in groups.values():
        timed = sorted((r for r in g if "per_call_us" in r), key=lambda r: r["per_call_us"])
        out.append({**timed[(len(timed) - 1) // 2], "per_call_min_us": timed[0]["per_call_us"],
                    "per_call_max_us": timed[-1]["per_call_us"]} if timed else g[-1])
    return out


def _one(call, prob, w, inputs, acts, refs, ref_w, nbytes, iters, flush, api, compat) -> dict:
    n = len(inputs)
    if call in ("graph", "eager"):
        ap, off, gs = acts[0]
        _poison(nbytes)
        err = _check(_split(w(ap, off, global_scale=gs), inputs[0].a), ref_w[0])
        if not err <= TOL:
            return {"status": f"wrong: rel_err {err:.3g}", "rel_err": err}
        if call == "eager":
            def eager(i):
                return w(acts[i % n][0], acts[i % n][1], global_scale=acts[i % n][2])

            out = time_both(eager, iters, flush)
        else:
            static = [t.clone() for t in (ap.data, ap.scales, gs)]
            sap = NVFP4Tensor(static[0], static[1], ap.global_scale)
            w(sap, off, global_scale=static[2])
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                c = w(sap, off, global_scale=static[2])

            def load(i):
                src = acts[i % n]
                for d, s in zip(static, (src[0].data, src[0].scales, src[2])):
                    d.copy_(s)

            out = _time(lambda i: graph.replay(), load, iters, flush)
            out.update(back_to_back(lambda i: graph.replay(), flush, iters))  # the inputs last loaded, replayed
            load(1)
            c.fill_(float("nan"))
            graph.replay()
            err = _check(_split(c, inputs[1].a), ref_w[1])
            if not err <= TOL:
                return {"status": f"wrong after replay: rel_err {err:.3g}", "rel_err": err}
        return {**out, "rel_err": err, "status": "ok"}
    if call == "oneshot":
        fn = api.grouped_dual_gemm_silu if prob.dual else api.grouped_gemm

        def run(i):
            x = inputs[i % n]
            return fn(x.a, x.b, x.b2, backend="cute-hopper") if prob.dual else fn(x.a, x.b, backend="cute-hopper")

        err = _check(run(1), refs[1])
        if not err <= TOL:
            return {"status": f"wrong: rel_err {err:.3g}", "rel_err": err}
        return {**time_both(run, iters, flush), "rel_err": err, "status": "ok"}
    if call == "harness":
        try:
            tuples = [compat.study_tuple(x) for x in inputs]
        except ValueError as e:  # the dual task is one GEMM: grouped dual problems are not task inputs
            return {"status": f"skipped: not a task input ({str(e)[:200]})"}
        entry = compat.custom_kernel_dual if prob.dual else compat.custom_kernel
        got = entry(tuples[1])
        outs = [c[..., 0] if c.dim() == 3 else c for c in (got if isinstance(got, (list, tuple)) else [got])]
        err = _check(outs, refs[1])
        if not err <= TOL:
            return {"status": f"wrong: rel_err {err:.3g}", "rel_err": err}
        def harness(i):
            return entry(tuples[i % n])

        return {**time_both(harness, iters, flush), "rel_err": err, "status": "ok"}
    raise ValueError(f"unknown call form {call!r}; known: {CALLS}")
