"""One GPU run for the Triton swap-AB kernel: check it (and the shipped direct kernel) against the exact reference on
the correctness, edge and benchmark suites, single and dual, then time S1–S4 (single, dual) under CUDA-graph replay,
L2 flushed, median of 20. Writes $OUT/triton_swap.json.

    run(command="source .gpu/env.sh && python scratch_p/gpu_triton_swap.py", carry=[".gpu", "scratch_p"])
"""
import importlib
import importlib.util
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from nvfp4lib.api import validate_operands  # noqa: E402
from nvfp4lib.bench import L2Flusher, check_runner, time_runner  # noqa: E402
from nvfp4lib.launch import graphed  # noqa: E402
from nvfp4lib.problems import BENCHMARK, CORRECTNESS, EDGE, make_inputs  # noqa: E402
from nvfp4lib.reference import reference_grouped_gemm  # noqa: E402

T = importlib.import_module("nvfp4lib.peers.triton_nvfp4")
if not hasattr(T, "_setup_swap"):
    spec = importlib.util.spec_from_file_location(
        "nvfp4lib.peers._triton_wip", os.path.join(os.path.dirname(__file__), "..", "wip", "triton_peer",
                                                   "triton_nvfp4.py"))
    T = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(T)

OUT = os.environ.get("OUT", "/tmp")
res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "check": {}, "time_us": {}, "info": {}}
import triton  # noqa: E402

res["triton"] = triton.__version__
t_start = time.time()

# 1. correctness: swap (first candidate, untimed, fast) on everything; both kernels autotuned on S1–S4
for prob in CORRECTNESS + EDGE + BENCHMARK:
    for dual in (False, True):
        p = prob.with_dual(dual)
        x = make_inputs(p, seed=1111, mode="gaussian", device="cuda")
        a, b, b2 = validate_operands(x.a, x.b, x.b2)
        ref = reference_grouped_gemm(a, b, b2)
        try:
            r = T.prepare(a, b, b2, kernel="swap", autotune=False)
            err = check_runner(r, ref)
        except Exception as e:  # record, go on
            err = f"{type(e).__name__}: {str(e)[:300]}"
        res["check"][f"swap/{p.name}"] = err
        print(f"check swap {p.name:24s} {err}", flush=True)

# 2. timing (uniform inputs, the study's), each runner checked before it is timed
flush = L2Flusher()
for prob in BENCHMARK:
    for dual in (False, True):
        p = prob.with_dual(dual)
        x = make_inputs(p, seed=1111, mode="uniform", device="cuda")
        a, b, b2 = validate_operands(x.a, x.b, x.b2)
        ref = reference_grouped_gemm(a, b, b2)
        for kernel in ("direct", "swap"):
            key = f"{kernel}/{p.name}"
            try:
                r = T.prepare(a, b, b2, kernel=kernel)
                res["info"][key] = r.info
                g = graphed(r)
                err = check_runner(g, ref)
                res["check"][f"{key}/uniform"] = err
                if not err <= 1e-3:
                    raise RuntimeError(f"rel err {err}")
                ts = time_runner(g, iters=20, flush=flush)
                res["time_us"][key] = statistics.median(ts)
            except Exception as e:
                res["time_us"][key] = f"{type(e).__name__}: {str(e)[:300]}"
            print(f"time {key:16s} {res['time_us'][key]} {res['info'].get(key)}", flush=True)
res["wall_s"] = time.time() - t_start
with open(os.path.join(OUT, "triton_swap.json"), "w") as f:
    json.dump(res, f, indent=1, default=str)
print(json.dumps(res["time_us"], indent=1))
