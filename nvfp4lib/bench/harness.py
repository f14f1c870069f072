"""The benchmark harness: check, then time, with the L2 flushed, against the floor of this GPU.

Method (the same for every backend, in the same run):
1. fresh seeded inputs on the GPU; the exact reference computed once;
2. the backend prepares (one-time weight work, timed separately as ``prepare_s``);
3. outputs poisoned with NaN, one run, checked against the reference (normwise relative
   error ≤ tol, all finite) — a backend that fails is recorded as failed and not timed;
4. ``iters`` timed runs, each after an L2 flush, CUDA events around the call alone;
   median and spread reported; the output is checked again after timing;
5. TFLOP/s, GB/s (NVFP4 bytes) and the ratio to the floor
   ``max(FLOPs / bf16 MMA rate, NVFP4 bytes / copy bandwidth)``, both measured in this run.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from ..problems import GroupedProblem, make_inputs
from ..reference import reference_grouped_gemm, relative_error
from ..timing import L2Flusher, time_runner
from .backends import prepare
from .roofline import floor_us, measure_ceilings
from .store import kernel_family, new_run_id, provenance

__all__ = ["BackendSpec", "bench", "time_runner", "check_runner", "L2Flusher"]

DEFAULT_TOL = 1e-3


@dataclass(frozen=True)
class BackendSpec:
    backend: str
    options: dict = field(default_factory=dict)
    label: str = ""

    @property
    def name(self) -> str:
        if self.label:
            return self.label
        extra = ",".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        return f"{self.backend}[{extra}]" if extra else self.backend

    @classmethod
    def parse(cls, text: str) -> "BackendSpec":
        """'cute-hopper:config=baseline' or 'torch-bf16:graph=1,strategy=loop'."""
        backend, _, rest = text.partition(":")
        opts = {}
        for item in filter(None, rest.split(",")):
            k, eq, v = item.partition("=")
            if not eq:
                raise ValueError(f"backend option {item!r} in {text!r} is not key=value")
            opts[k] = {"1": True, "true": True, "0": False, "false": False}.get(v.lower(), v)
            if isinstance(opts[k], str) and opts[k].lstrip("-").isdigit():
                opts[k] = int(opts[k])
        return cls(backend, opts)


def check_runner(runner, ref) -> float:
    """Poison the outputs, run once, return the normwise relative error (inf if anything is unwritten)."""
    runner.poison()
    out = runner()
    if out[0].is_cuda:
        torch.cuda.synchronize()
    return relative_error(out, ref)


def bench(specs, problems, *, seed: int = 1111, mode: str = "uniform", iters: int = 50,
          tol: float = DEFAULT_TOL, ceilings: dict | None = None, progress=None) -> list[dict]:
    """Check and time every backend spec on every problem; returns rows (nothing is stored here)."""
    if not torch.cuda.is_available():
        raise RuntimeError("bench needs a CUDA GPU (none found); notebooks plot recorded data instead")
    specs = [BackendSpec.parse(s) if isinstance(s, str) else s for s in specs]
    run_id = new_run_id()
    ceil = ceilings or measure_ceilings()
    flush = L2Flusher()
    rows = []
    for prob in problems:
        inp = make_inputs(prob, seed=seed, mode=mode, device="cuda")
        ref = reference_grouped_gemm(inp.a, inp.b, inp.b2)
        floor = floor_us(prob, ceil)
        for spec in specs:
            row = _row_base(run_id, ceil, prob, spec, seed, mode, floor)
            try:
                t0 = time.perf_counter()
                runner = prepare(inp.a, inp.b, inp.b2, backend=spec.backend, **spec.options)
                torch.cuda.synchronize()
                row["prepare_s"] = time.perf_counter() - t0
                row["held_bytes"] = runner.held_bytes
                row["notes"] = runner.notes
                row.update({f"info_{k}": v for k, v in runner.info.items()})
                if "config" in runner.info:  # the config that ran (auto's choice) and so its family
                    row["config"] = runner.info["config"]
                    row["kernel_family"] = kernel_family(spec.backend, row["config"])
                if runner.info.get("ablation"):
                    # a diagnostic with parts of the work removed: wrong by design, timed to attribute time
                    row.update(_timing_fields(time_runner(runner, iters=iters, flush=flush), prob, floor))
                    row["status"] = f"ablation ({runner.info['ablation']}): timed, not checked"
                    err = tol_used = None
                else:
                    err = check_runner(runner, ref)
                    row["rel_err"] = err
                    row["tol"] = tol_used = max(tol, runner.tolerance or 0.0)
                if err is None:
                    pass
                elif not err <= tol_used:
                    row["status"] = f"wrong: rel_err {err:.3g} > {tol_used}"
                else:
                    times = time_runner(runner, iters=iters, flush=flush)
                    err2 = relative_error(runner.outputs, ref)
                    if not err2 <= tol_used:
                        row["status"] = f"wrong after timing: rel_err {err2:.3g}"
                    else:
                        row.update(_timing_fields(times, prob, floor))
                        row["status"] = "ok"
            except (RuntimeError, ValueError, TypeError, NotImplementedError) as e:
                row["status"] = f"error: {type(e).__name__}: {str(e)[:400]}"
            finally:
                torch.cuda.synchronize()
            rows.append(row)
            if progress is not None:
                progress(row)
    # Provenance last, so the clocks recorded are those of a GPU under load, not idle.
    prov = provenance()
    return [{**prov, **r} for r in rows]


def _row_base(run_id, ceil, prob: GroupedProblem, spec: BackendSpec, seed, mode, floor):
    # until prepare says which config ran: the one asked for (cute-hopper's default is auto)
    config = spec.options.get("config", "auto" if spec.backend == "cute-hopper" else "default") \
        if spec.backend.startswith("cute-") else None
    return {
        "run_id": run_id, **{f"ceil_{k}": v for k, v in ceil.items()},
        "problem": prob.name, "groups": prob.groups, "m": list(prob.m), "n": list(prob.n),
        "k": list(prob.k), "dual": prob.dual, "flops": prob.flops(), "nvfp4_bytes": prob.nvfp4_bytes(),
        "backend": spec.backend, "options": spec.options, "label": spec.name, "seed": seed,
        # explicit in every row (never inferred later): a peer is its own family and has no config
        "config": config, "kernel_family": kernel_family(spec.backend, config),
        "input_mode": mode, "floor_us": floor,
    }


def _timing_fields(times, prob, floor):
    med = statistics.median(times)
    q = statistics.quantiles(times, n=10) if len(times) >= 10 else [min(times)] * 9
    return {
        "iters": len(times), "median_us": med, "p10_us": q[0], "p90_us": q[-1], "min_us": min(times),
        "tflops": prob.flops() / med * 1e-6, "gbps": prob.nvfp4_bytes() / med * 1e-3,
        "ratio_to_floor": med / floor,
    }
