"""Event times (graph replays, L2 flushed, median of 40) of configs side by side, each checked first.

python wip/rs/diag25.py S4,S3 rs_m128_t128_k128_s4_e,rs_m128_t128_k128_s6_e_i"""
import statistics
import sys

from nvfp4lib.api import prepare
from nvfp4lib.bench import L2Flusher, check_runner, time_runner
from nvfp4lib.problems import get_problem, make_inputs
from nvfp4lib.reference import reference_grouped_gemm

flush = L2Flusher()
for pname in sys.argv[1].split(","):
    prob = get_problem(pname)
    inp = make_inputs(prob, seed=7, mode="gaussian", device="cuda")
    ref = reference_grouped_gemm(inp.a, inp.b, inp.b2)
    runners = {}
    for cfg in sys.argv[2].split(","):
        try:
            r = prepare(inp.a, inp.b, inp.b2, backend="cute-hopper", config=cfg, graph=True)
            runners[cfg] = (r, check_runner(r, ref))
        except Exception as e:  # noqa: BLE001
            print(f"{pname:<8} {cfg:<28} FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
    times = {c: [] for c in runners}
    for _ in range(3):  # interleaved rounds
        for c, (r, _) in runners.items():
            times[c] += time_runner(r, iters=15, flush=flush)
    for c, (r, err) in runners.items():
        print(f"{pname:<8} {c:<28} {statistics.median(times[c]):7.2f} us  rel_err {err:.1e}", flush=True)
