"""A/B of the prologue's dynamic shared memory request and of its group parameters (no row table): event times (graph replays, L2 flushed), interleaved.

python wip/rs/diag28.py S4,S3 rs_m128_t128_k128_s3_e,rs_m128_t128_k128_s4_e"""
import statistics
import sys

from nvfp4lib.api import prepare
from nvfp4lib.bench import L2Flusher, check_runner, time_runner
from nvfp4lib.kernels import hopper_rs
from nvfp4lib.problems import get_problem, make_inputs
from nvfp4lib.reference import reference_grouped_gemm

flush = L2Flusher()
for pname in sys.argv[1].split(","):
    prob = get_problem(pname)
    inp = make_inputs(prob, seed=7, mode="gaussian", device="cuda")
    ref = reference_grouped_gemm(inp.a, inp.b, inp.b2)
    runners = {}
    for cfg in sys.argv[2].split(","):
        for pf in ((0, 0), (32768, 0), (32768, 16)):
            hopper_rs.ACT_SMEM, hopper_rs.PARAM_GROUPS = pf
            r = prepare(inp.a, inp.b, inp.b2, backend="cute-hopper", config=cfg, graph=True)
            runners[(cfg, pf)] = (r, check_runner(r, ref))
    times = {c: [] for c in runners}
    for _ in range(4):
        for c, (r, _) in runners.items():
            times[c] += time_runner(r, iters=15, flush=flush)
    for (c, pf), (r, err) in runners.items():
        print(f"{pname:<8} {c:<28} act_smem,param_groups={pf!s:<12} {statistics.median(times[(c, pf)]):7.2f} us  rel_err {err:.1e}",
              flush=True)
