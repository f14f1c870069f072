"""Per-kernel GPU time of prepared cute-hopper runners (torch.profiler over graph replays, L2 flushed before each).

python wip/rs/profile.py S1,S4 rs_t128_k128_s4,rs_t64_k128_s4"""
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from nvfp4lib.api import prepare
from nvfp4lib.bench import L2Flusher
from nvfp4lib.problems import get_problem, make_inputs

ITERS = 10


def short(name):
    for key in ("GroupedNvfp4GemmSm90RS", "ActivationPrologueSm90", "GroupedNvfp4GemmSm90", "index_copy", "cat",
                "fill", "mul", "stack", "copy"):
        if key.lower() in name.lower():
            return key
    return name[:40]


flush = L2Flusher()
for pname in sys.argv[1].split(","):
    prob = get_problem(pname)
    inp = make_inputs(prob, seed=1, device="cuda")
    for cfg in sys.argv[2].split(","):
        try:
            r = prepare(inp.a, inp.b, inp.b2, backend="cute-hopper", config=cfg, graph=True)
        except Exception as e:  # noqa: BLE001
            print(f"{pname:<8} {cfg:<32} FAILED {type(e).__name__}: {str(e)[:200]}")
            continue
        for _ in range(3):
            r()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(ITERS):
                flush()
                r()
            torch.cuda.synchronize()
        t = defaultdict(float)
        for e in prof.key_averages():
            dt = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
            if dt and e.key:
                t[short(e.key)] += dt / ITERS
        t.pop("fill", None)  # the L2 flush
        try:
            # the span of one call: first kernel start to last kernel end between two flushes (overlap via PDL shows)
            evs = sorted((e for e in prof.events() if getattr(e, "device_type", None) is not None
                          and str(e.device_type).endswith("CUDA") and e.time_range.end > e.time_range.start),
                         key=lambda e: e.time_range.start)
            spans, cur = [], []
            for e in evs:
                if short(e.name) == "fill":
                    if cur:
                        spans.append(max(x.time_range.end for x in cur) - min(x.time_range.start for x in cur))
                    cur = []
                else:
                    cur.append(e)
            if cur:
                spans.append(max(x.time_range.end for x in cur) - min(x.time_range.start for x in cur))
            if spans:
                t["span(median)"] = sorted(spans)[len(spans) // 2]
        except Exception as exc:  # noqa: BLE001 (the span is a diagnostic)
            print("span failed:", exc)
        span = t.pop("span(median)", float("nan"))
        parts = " ".join(f"{k}={v:.1f}" for k, v in sorted(t.items(), key=lambda kv: -kv[1]) if v > 0.05)
        print(f"{pname:<8} {cfg:<32} sum={sum(t.values()):7.1f} us  span={span:.1f} us  {parts}", flush=True)
