"""The one-shot gather on its own (GPU): how close packing new weights comes to the copy floor.

A one-shot call (``nvfp4lib.grouped_gemm`` with new weights, the study's harness) spends one Triton launch,
:mod:`nvfp4lib.kernels.hopper_varlen.gather`, to pack the weights into the kernel's layout (and copy the activation
rows) before its GEMM. ``python -m nvfp4lib gather-bench`` times that launch alone per shape and knob setting
(``kcu``: 64×64 units per program; ``warps``), writing rows to build/ (``data/gather.jsonl`` with ``--record``):

- ``part``: ``weights`` (what ``prepare_weights`` and a one-shot call pack) or ``weights+rows`` (a one-shot call's
  whole gather);
- ``median_us``, ``min_us``: the launch's GPU time, median of ``iters`` launches, each after an L2 flush and a GPU
  sleep (``torch.cuda._sleep``) that the host's launch hides behind, so the events time the kernel and not the host;
- ``bytes``: read + written (codes and scales of every weight matrix, the packed weights, and the rows' codes and
  scales twice), ``gbps`` and ``ratio_to_floor`` against ``bytes / copy bandwidth`` measured in the same run;
- ``identical``: the packed weights equal the torch prepack's byte for byte (and the rows their source).
"""
from __future__ import annotations

import itertools
import statistics

import torch

from ..problems import GroupedProblem, make_inputs
from .harness import L2Flusher
from .roofline import measure_ceilings
from .store import new_run_id, provenance

SLEEP_CYCLES = 1_000_000  # ~0.6 ms of GPU sleep before each timed launch: longer than any launch's host time


def _time(fn, iters: int, flush: L2Flusher) -> list[float]:
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(iters):
        flush()
        torch.cuda.synchronize()
        torch.cuda._sleep(SLEEP_CYCLES)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e) * 1e3)
    return out


def bench_gather(problems: list[GroupedProblem], *, kcus=None, warps=None, prefetches=None, onces=None,
                 rows_firsts=None, wholes=None, iters: int = 40, seed: int = 1, ceilings: dict | None = None,
                 progress=None) -> list[dict]:
    """Rows (problem × part × kcu × warps × prefetch × once × rows_first × whole) with provenance; nothing is
    stored here."""
    from ..kernels.common.sm90 import POST_SCALE
    from ..kernels.hopper_varlen import gather as G
    from ..kernels.hopper_varlen.config import NWG
    from ..kernels.hopper_varlen.runner import pack_torch
    from ..serving import _oneshot_config

    kcus, warps = tuple(kcus or (G.KCU,)), tuple(warps or (G.WARPS,))
    prefetches, onces = tuple(prefetches or (G.PREFETCH,)), tuple(onces or (G.ONCE,))
    rows_firsts, wholes = tuple(rows_firsts or (G.ROWS_FIRST,)), tuple(wholes or (G.WHOLE,))
    run_id, ceil, flush = new_run_id(), ceilings or measure_ceilings(), L2Flusher()
    prov = provenance()
    rows = []
    for prob in problems:
        x = make_inputs(prob, seed=seed, mode="uniform", device="cuda")
        n, k, groups, t = prob.n[0], prob.k[0], len(prob.m), sum(prob.m)
        cfg = _oneshot_config(x.b[0].data.device, prob.dual, torch.float16, groups, n, k, t)
        n_pad, k_pad = -(-n // cfg.tile_m) * cfg.tile_m, -(-k // cfg.tile_k) * cfg.tile_k
        blocks = cfg.tile_m * (2 if prob.dual else 1) // (64 * NWG)
        sets = [x.b] if x.b2 is None else [x.b, x.b2]
        want = pack_torch(x.b, x.b2, n_pad, k_pad, blocks)[0]
        table = G.group_table(x.a, x.b, x.b2)
        if table is None:
            raise ValueError(f"{prob.name}: the inputs cannot be read in place (not contiguous or misaligned)")
        weight_bytes = sum(m.data.numel() + m.scales.numel() for w in sets for m in w)
        row_bytes = sum(a.data.numel() + a.scales.numel() for a in x.a)
        base = {"run_id": run_id, **{f"ceil_{key}": v for key, v in ceil.items()}, "problem": prob.name,
                "dual": prob.dual, "groups": groups, "n": n, "k": k, "tokens": t, "config": cfg.name, **prov}
        for part, rows_in in (("weights", 0), ("weights+rows", t)):
            for kcu, w, pf, once, rf, wh in itertools.product(kcus, warps, prefetches, onces, rows_firsts, wholes):
                row = {**base, "part": part, "kcu": kcu, "warps": w, "prefetch": pf, "once": once, "rows_first": rf,
                       "whole": wh, "iters": iters}
                try:
                    plan = G.Plan(groups, n, k, n_pad, k_pad, NWG, blocks, prob.dual, rows_in, kcu, w, pf, once, rf,
                                  wh)
                    row.update(_one(G, plan, table, x, want, iters, flush, POST_SCALE))
                    moved = weight_bytes + row["packed_bytes"] + (2 * row_bytes if rows_in else 0)
                    floor = moved / (ceil["copy_gbps"] * 1e3)
                    row.update(bytes=moved, gbps=moved / row["median_us"] / 1e3, floor_us=floor,
                               ratio_to_floor=row["median_us"] / floor,
                               status="ok" if row["identical"] else "wrong: packed bytes differ")
                except Exception as e:  # noqa: BLE001 (recorded: a knob that fails is a finding)
                    row["status"] = f"error: {type(e).__name__}: {str(e)[:300]}"
                rows.append(row)
                if progress:
                    progress(row)
    return rows


def _one(G, plan, table, x, want, iters, flush, post):
    full = torch.tensor(plan.header + table, dtype=torch.int64, device=x.b[0].data.device)
    packed, small = G.run(full, plan, post=post)
    same = torch.equal(packed, want)
    if plan.rows:
        codes, scales = G.views(small, plan)[:2]
        same = same and torch.equal(codes, torch.cat([a.data for a in x.a])) and torch.equal(
            scales, torch.cat([a.scales.view(torch.uint8) for a in x.a]))
    ts = _time(lambda: G.run(full, plan, post=post), iters, flush)
    return {"median_us": statistics.median(ts), "min_us": min(ts), "packed_bytes": packed.numel(),
            "identical": bool(same)}


def _print_row(r: dict) -> None:
    knobs = (f"  {r['problem']:<9} {r['part']:<13} kcu={r['kcu']:<3} warps={r['warps']:<2} pf={r['prefetch']} "
             f"once={r.get('once', 0)} rf={r.get('rows_first', 0)} whole={r.get('whole', 0)}")
    if r["status"] != "ok":
        print(f"{knobs} {r['status'][:90]}")
        return
    print(f"{knobs} {r['median_us']:8.1f} us "
          f"{r['gbps']:7.0f} GB/s  x floor {r['ratio_to_floor']:5.2f}", flush=True)


def add_command(sub, add_problems, problems, add_record_args, write) -> None:
    """``python -m nvfp4lib gather-bench``, registered on ``sub`` (argparse subparsers)."""
    from .store import GATHER

    p = sub.add_parser("gather-bench", help="time the one-shot gather alone per shape and knob (GPU); rows to "
                                            "build/ (data/ with --record)")
    add_problems(p)
    p.add_argument("--kcu", type=int, action="append", help="64x64 units per program (repeatable; default: the "
                                                            "shipped value)")
    p.add_argument("--warps", type=int, action="append", help="warps per program (repeatable)")
    p.add_argument("--prefetch", type=int, action="append", choices=(0, 1),
                   help="1: each unit's loads issued before the previous unit's stores (repeatable)")
    p.add_argument("--once", type=int, action="append", choices=(0, 1),
                   help="1: each code pair loaded by one lane, moved to the storing lanes through shared memory "
                        "(repeatable)")
    p.add_argument("--rows-first", type=int, action="append", choices=(0, 1),
                   help="1: the activation rows' programs before the weights' (repeatable)")
    p.add_argument("--whole", type=int, action="append", choices=(0, 1),
                   help="1 (with --once 1): a program's units loaded at once, no loop over them (repeatable)")
    p.add_argument("--iters", type=int, default=40)
    add_record_args(p, GATHER, "gather")

    def run(args) -> int:
        if not torch.cuda.is_available():
            print("gather-bench needs a CUDA GPU (none here)")
            return 2
        rows = bench_gather(problems(args), kcus=args.kcu, warps=args.warps, prefetches=args.prefetch,
                            onces=args.once, rows_firsts=args.rows_first, wholes=args.whole, iters=args.iters,
                            progress=_print_row)
        write(args, rows, GATHER.name)
        return 0 if all(r["status"] == "ok" for r in rows) else 1

    p.set_defaults(fn=run)
