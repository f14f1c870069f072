"""Launch mode: event times (L2 flushed) of the same prepared runner launched directly (two launches from Python)
and as a CUDA graph replay; a one-kernel op both ways; the CPU cost of a direct call.

python wip/rs/diag23.py S4:rs_m128_t128_k128_s4_e,S3:rs_m128_t128_k128_s4_e"""
import statistics
import sys
import time

import torch

from nvfp4lib.api import prepare
from nvfp4lib.bench import L2Flusher, time_runner
from nvfp4lib.launch import graphed
from nvfp4lib.problems import get_problem, make_inputs

flush = L2Flusher()


def med(fn, iters=40):
    return statistics.median(time_runner(fn, iters=iters, flush=flush))


def cpu_us(fn, n=300):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


z = torch.zeros(1, device="cuda")


class Tiny:
    outputs = [z]
    not_graphable = ""
    prepare_s = held_bytes = 0
    notes = ""
    info = {}
    tolerance = None

    def fn(self):
        z.zero_()

    def __call__(self):
        self.fn()


tiny = Tiny()
print(f"tiny kernel: direct {med(tiny):.2f} us, graph {med(graphed(tiny)):.2f} us, flush {med(flush, 10):.1f} us")
for pair in sys.argv[1].split(","):
    pname, cfgs = pair.split(":")
    prob = get_problem(pname)
    inp = make_inputs(prob, seed=1, device="cuda")
    for cfg in cfgs.split("+"):
        direct = prepare(inp.a, inp.b, inp.b2, backend="cute-hopper", config=cfg)
        g = graphed(direct)
        for rep in range(2):
            print(f"{pname:<8} {cfg:<26} direct {med(direct):6.2f} us  graph {med(g):6.2f} us  "
                  f"(cpu per direct call {cpu_us(direct):.1f} us, per replay {cpu_us(g):.1f} us)", flush=True)
