"""Per-CTA timeline of the prologue-mode GEMM (ablate="timeline": %globaltimer stamps), L2 flushed before each call:
as shipped (prologue + GEMM, one graph) and the GEMM alone (activations already decoded).

python wip/rs/diag24.py S4:rs_m128_t128_k128_s4_e_timeline,S4-dual:rs_dual_m128_t128_k128_s4_timeline"""
import statistics
import sys

import torch

from nvfp4lib.bench import L2Flusher
from nvfp4lib.kernels import hopper_rs
from nvfp4lib.kernels.hopper import ABLATIONS
from nvfp4lib.launch import graphed
from nvfp4lib.problems import get_problem, make_inputs

flush = L2Flusher()
REPS = 7


def graph_of(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(); fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g.replay


def show(label, r, replay):
    per = {p: [] for p in hopper_rs.TIMELINE_POINTS}
    for _ in range(REPS):
        flush()
        replay()
        torch.cuda.synchronize()
        tl = hopper_rs.read_timeline(r)
        for p, v in tl.items():
            per[p].append(sorted(v))
    print(label)
    for p, runs in per.items():  # per point: min / median / max over CTAs, each the median over the calls
        q = [statistics.median(run[int(f * (len(run) - 1))] for run in runs) for f in (0.0, 0.5, 1.0)]
        print(f"   {p:<15} min {q[0]:6.2f}  med {q[1]:6.2f}  max {q[2]:6.2f} us", flush=True)


for pair in sys.argv[1].split(","):
    pname, cname = pair.split(":")
    prob = get_problem(pname)
    inp = make_inputs(prob, seed=1, device="cuda")
    r = hopper_rs.prepare(inp.a, inp.b, inp.b2, ABLATIONS[cname])
    cl = dict(zip(r.fn.__code__.co_freevars, (c.cell_contents for c in r.fn.__closure__)))
    gemm, gargs, stream = cl["gemm"], cl["gemm_args"], cl["stream"]
    show(f"{pname} {cname}: prologue + GEMM (graph)", r, graph_of(r.fn))
    show(f"{pname} {cname}: GEMM alone (graph)", r, graph_of(lambda: gemm(*gargs, stream())))
