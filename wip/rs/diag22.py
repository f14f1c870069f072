"""Where S4's time goes: event times (L2 flushed) of graphs holding the prologue + GEMM, the GEMM alone (activations
already decoded) and the prologue alone; S4-like problems with K = 128 .. 3072 (fixed cost vs cost per K tile).

python wip/rs/diag22.py rs_m128_t128_k128_s4_e"""
import dataclasses
import statistics
import sys

import torch

from nvfp4lib.bench import L2Flusher, time_runner
from nvfp4lib.kernels import hopper_rs
from nvfp4lib.kernels.hopper import get_config
from nvfp4lib.problems import get_problem, make_inputs

flush = L2Flusher()


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


def med(fn):
    return statistics.median(time_runner(fn, iters=40, flush=flush))


def empty():
    pass


base = get_problem("S4")
for cfgname in sys.argv[1].split(","):
    cfg = get_config(cfgname, dual=False)
    for k in (128, 384, 768, 1536, 3072):
        prob = dataclasses.replace(base, name=f"S4k{k}", k=(k,) * base.groups)
        inp = make_inputs(prob, seed=1, device="cuda")
        r = hopper_rs.prepare(inp.a, inp.b, inp.b2, cfg)
        cl = dict(zip(r.fn.__code__.co_freevars, (c.cell_contents for c in r.fn.__closure__)))
        pro, pargs, gemm, gargs, stream = cl["prologue"], cl["pro_args"], cl["gemm"], cl["gemm_args"], cl["stream"]
        full = graph_of(r.fn)
        gonly = graph_of(lambda: gemm(*gargs, stream()))
        ponly = graph_of(lambda: pro(*pargs, stream()))
        t = {n: med(f) for n, f in (("full", full), ("gemm", gonly), ("prologue", ponly))}
        print(f"{cfgname:<26} K={k:<5} ktiles={k // 128:<3} full={t['full']:6.2f} gemm_alone={t['gemm']:6.2f} "
              f"prologue_alone={t['prologue']:6.2f} us (events, L2 flushed)", flush=True)
# an empty graph's cost by events (a one-kernel graph: the flush buffer's zero_ on a 1-element tensor)
z = torch.zeros(1, device="cuda")
print(f"one tiny kernel graph: {med(graph_of(lambda: z.zero_())):.2f} us")
