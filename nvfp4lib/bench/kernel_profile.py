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

For a whole model's step (``generate-bench --profile-step``), each kernel also gets a category (:data:`CATEGORIES`,
:func:`categorize`: the serving kernel, nvfp4lib's Triton kernels, torch's GEMMs, attention, ...), summed per call by
:func:`by_category`; :func:`module_profile` splits an eager call's kernels by the module that launched them (a CUDA
graph's replay keeps no CPU-side record of its modules, so the split needs eager calls: the same kernels where the
model runs the captured form eagerly, as generate-bench's NVFP4 models do).
"""
from __future__ import annotations

import re
import statistics
from collections import Counter, defaultdict

import torch

__all__ = ["CATEGORIES", "categorize", "by_category", "step_summary", "profile_runner", "module_profile", "owner",
           "format_profile"]

# A kernel's category: the first whose pattern ``re.search``es its full name. The order matters: the serving kernel's
# CuTe names hold "cutlass" and the module path ("nvfp4libkernels...": the class name is in the name CuTe DSL mangles);
# cuDNN's and PyTorch's fused attention hold "cutlass"/"sdpa" too; nvfp4lib's Triton kernels are named by their function
# (nn/quant_triton.py, nn/routing_triton.py, kernels/hopper_varlen/gather_triton.py and gemv_triton.py:
# tests/test_kernel_profile.py checks every launched one lands here).
CATEGORIES = (
    ("serving kernel", r"GroupedVarlenGemmSm90|ActivationDecodeSm90|DecodeThenGemmSm90|nvfp4libkernels"),
    ("nvfp4lib Triton", r"^(_amax_kernel|_quant_kernel|_quant_one_kernel|_route_kernel|_route_gather_kernel|"
                        r"_unpermute_kernel|"
                        r"_gather_rows_kernel|_put_rows_kernel|_pack_rows_kernel|gather|_gemv_kernel|_finalize_kernel|"
                        r"_combine_kernel|_symm_(counts|plan|dispatch|combine)_kernel)$"),
    ("attention", r"flash|fmha|sdpa|[Aa]ttention"),
    ("torch grouped GEMM", r"GroupProblemShape|grouped_mm|GroupedGemm|group_gemm"),
    ("torch GEMM", r"cutlass|cublas|xmma|nvjet|gemm|gemv|s16816|wgmma"),
    ("torch elementwise", r"elementwise|CatArrayBatchedCopy|index_kernel|gather_kernel|scatter|copy_kernel|"
                          r"fill_kernel|triton_poi"),
    ("torch reduction", r"reduce|[Ss]oft[Mm]ax|[Tt]op[Kk]|[Ss]ort|[Ss]can|cub::|triton_red|triton_per"),
    ("memcpy/memset", r"^Mem(cpy|set)"),
    ("other", r""),
)
_COMPILED = tuple((name, re.compile(rx)) for name, rx in CATEGORIES)


def categorize(name: str) -> str:
    """The category (:data:`CATEGORIES`) of a kernel's full name."""
    return next(cat for cat, rx in _COMPILED if rx.search(name))


def _tally(pairs) -> dict:
    out = {cat: {"us": 0.0, "kernels": 0} for cat, _ in CATEGORIES}
    for cat, us in pairs:
        out[cat]["us"] += us
        out[cat]["kernels"] += 1
    return {cat: v for cat, v in out.items() if v["kernels"]}


def by_category(kernels) -> dict:
    """``{category: {"us": summed time, "kernels": count}}`` over ``(full kernel name, us)`` pairs, in
    :data:`CATEGORIES`' order (categories with no kernel left out)."""
    return _tally((categorize(name), us) for name, us in kernels)


def step_summary(prof: dict) -> dict:
    """A :func:`profile_runner` result of one step per call, summed: ``categories`` (as :func:`by_category`, of the
    kernels' median times), ``kernels`` per step, ``sum_us`` (the kernels' median times added), ``span_us`` (the step's
    first kernel start to last kernel end) and ``gap_us`` = span - sum (idle GPU time between kernels; negative where
    kernels overlap, as a programmatic-dependent launch lets them)."""
    if "error" in prof:
        raise RuntimeError(f"the step's profile: {prof['error']}")
    total = sum(k["median_us"] for k in prof["kernels"])
    return {"categories": _tally((k["category"], k["median_us"]) for k in prof["kernels"]),
            "kernels": prof["kernels_per_call"], "sum_us": total, "span_us": prof["span_us"],
            "gap_us": prof["span_us"] - total, "iters": prof["iters"]}


def _is_kernel(e) -> bool:
    """Whether a profiler event is a CUDA kernel (a record_function's range on the GPU timeline is not)."""
    from torch.autograd import DeviceType

    return e.device_type == DeviceType.CUDA and e.time_range.end > e.time_range.start and not e.is_user_annotation


def _kernel_records(fn, iters: int) -> list[tuple[str, float, float]]:
    """(name, start us, end us) of every CUDA kernel that ``fn`` launches when run ``iters`` times."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    out = [(e.name, float(e.time_range.start), float(e.time_range.end)) for e in prof.events() if _is_kernel(e)]
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
    # the calls are told apart by count, not by the gaps between them: the runner launches the same kernels, in the
    # same order, every call
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
            "category": categorize(calls[0][j][0]),
            "median_us": statistics.median(c[j][2] - c[j][1] for c in calls),
            "start_us": statistics.median(c[j][1] - c[0][1] for c in calls),
        })
    return {"span_us": statistics.median(spans), "kernels_per_call": per, "kernels": kernels, "iters": iters}


_RANGE = "nvfp4lib.module:"  # the prefix of module_profile's record_function ranges


class _ModuleRanges:
    """A ``record_function`` range named after its class around every module's forward of ``model`` (hooks, removed
    on exit)."""

    def __init__(self, model: torch.nn.Module):
        self.model, self.handles, self.open = model, [], []

    def _enter(self, module, args):
        rf = torch.autograd.profiler.record_function(_RANGE + type(module).__name__)
        rf.__enter__()
        self.open.append(rf)

    def _exit(self, module, args, out):
        self.open.pop().__exit__(None, None, None)

    def __enter__(self):
        for m in self.model.modules():
            self.handles += [m.register_forward_pre_hook(self._enter), m.register_forward_hook(self._exit)]
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        while self.open:  # a forward that raised left its ranges open
            self.open.pop().__exit__(None, None, None)


def owner(event) -> str:
    """The class of the innermost module (a :class:`_ModuleRanges` range) around a profiler's CPU event, or
    "(no module)"."""
    while event is not None:
        if event.name.startswith(_RANGE):
            return event.name[len(_RANGE):]
        event = event.cpu_parent
    return "(no module)"


UNLINKED = "(no torch op)"  # module_profile's name for kernels launched outside torch's ops


def module_profile(fn, model: torch.nn.Module, *, iters: int = 2) -> dict:
    """GPU time per call of ``fn()`` (eager: it runs ``model``'s forward) split by the innermost module whose forward
    launched each kernel (its class name; the CPU event torch links each kernel to, by CUPTI's correlation id) and
    by category: ``{"modules": {module: {category: {"us", "kernels"}}}, "iters"}``, sums divided by ``iters``.
    Kernels that no torch op launched (the serving kernel's TVM-FFI calls, Triton's compiled launches) have no CPU
    event to follow to a module: they are counted under :data:`UNLINKED`, so that the modules add up to every kernel."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with _ModuleRanges(model), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    per = defaultdict(list)
    events = prof.events()
    linked = Counter()
    for e in events:
        # the device events torch linked to this CPU event (by CUPTI's correlation id: the op that launched them);
        # read from the CPU side, as FunctionEvent.linked_correlation_id is missing before torch 2.13
        if e.device_type == DeviceType.CPU:
            for k in e.kernels:
                if k.duration > 0:
                    per[owner(e)].append((k.name, k.duration / iters))
                    linked[k.name, round(k.duration, 3)] += 1
    for e in events:  # kernels no torch op launched (TVM-FFI's and Triton's launchers): no module to name
        if _is_kernel(e):
            key = (e.name, round(e.time_range.end - e.time_range.start, 3))
            if linked[key]:
                linked[key] -= 1
            else:
                per[UNLINKED].append((e.name, key[1] / iters))
    modules = {}
    for m, ks in per.items():
        modules[m] = {c: {"us": v["us"], "kernels": v["kernels"] / iters} for c, v in by_category(ks).items()}
    return {"modules": modules, "iters": iters}


def format_profile(label: str, prof: dict) -> str:
    if "error" in prof:
        return f"{label}: {prof['error']} ({', '.join(prof.get('names', []))})"
    lines = [f"{label}: span {prof['span_us']:.1f} us, {prof['kernels_per_call']} kernels per call"]
    for k in prof["kernels"]:
        lines.append(f"    {k['start_us']:7.1f} +{k['median_us']:7.1f} us  {k['name']}")
    return "\n".join(lines)
