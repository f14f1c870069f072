"""Command line: ``python -m nvfp4lib {study,bench,check,record,compile,info}``."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .commands import DEFAULT_BACKENDS, _add_record_args, _fmt, _problems, _write, cmd_bench


def cmd_calls(args) -> int:
    """The four ways of calling the serving path (graph, eager, oneshot, harness), side by side (GPU)."""
    from ..bench.calls import ROUNDS, bench_calls, median_round

    probs, rounds = _problems(args), ROUNDS if args.rounds is None else args.rounds
    from ..kernels.hopper_varlen import kernel

    if args.fused_prologue is not None:
        kernel.FUSED_PROLOGUE = args.fused_prologue == "on"
    if args.eager_fused is not None:
        kernel.EAGER_FUSED = args.eager_fused == "on"
    if args.slice_barrier_all is not None:
        kernel.SLICE_BARRIER_ALL = args.slice_barrier_all == "on"
    rows = bench_calls(probs, calls=tuple(args.call or ("graph", "eager", "oneshot", "harness")), seed=args.seed,
                       mode=args.mode, iters=args.iters, rounds=rounds, progress=lambda r: print(
                           f"  round {r['round']} {r['problem']:<10} {r['call']:<8} {r['status'][:60]}", flush=True))
    print(f"\nthe median of {rounds} rounds (per call: the rounds' range)")
    print(f"{'problem':<10} {'call':<8} {'config':<32} {'GPU us':>8} {'host us':>8} {'per call':>9} {'range':>13} "
          f"{'b2b us':>8} {'floor':>7} {'x floor':>8}  status")
    for r in median_round(rows):
        rng = f"{r['per_call_min_us']:.0f}-{r['per_call_max_us']:.0f}" if "per_call_min_us" in r else "-"
        print(f"{r['problem']:<10} {r['call']:<8} {r.get('config', ''):<32} {_fmt(r.get('median_us', '-'), '8.1f'):>8} "
              f"{_fmt(r.get('host_us', '-'), '8.1f'):>8} {_fmt(r.get('per_call_us', '-'), '9.1f'):>9} {rng:>13} "
              f"{_fmt(r.get('b2b_us', '-'), '8.1f'):>8} "
              f"{r['floor_us']:7.1f} {_fmt(r.get('ratio_to_floor', '-'), '8.2f'):>8}  {r['status'][:40]}")
    _write(args, rows, "calls.jsonl")
    return 0


def cmd_tune(args) -> int:
    """Time every candidate config of the serving kernel on each problem and cache the fastest (GPU)."""
    import torch

    from ..bench.calls import pack_rows
    from ..problems import make_inputs
    from ..serving import prepare_weights
    from ..tuning import cache_dir

    if not torch.cuda.is_available():
        print("tune needs a CUDA GPU (sm_90)", file=sys.stderr)
        return 2
    for prob in _problems(args):
        inp = make_inputs(prob, seed=args.seed, mode="gaussian", device="cuda")
        w = prepare_weights(inp.b, inp.b2, out_dtype=getattr(torch, args.out_dtype))
        ap, off, gs = pack_rows(inp.a)
        times = w.impl.tune_bucket(ap.data, ap.scales.view(torch.uint8), gs, off)
        best = min(times, key=times.get)
        print(f"{prob.name:<10} {best:<34} " + "  ".join(f"{c}={t:.1f}us" for c, t in sorted(times.items())))
    print(f"cached in {cache_dir() / 'tuning.json'}")
    return 0


def cmd_profile(args) -> int:
    """Each backend's call split into its kernels (CUPTI records over many calls, L2 flushed before each) (GPU)."""
    import json

    import torch

    from ..bench.backends import prepare
    from ..bench.harness import BackendSpec
    from ..bench.kernel_profile import format_profile, profile_runner
    from ..problems import make_inputs
    from ..timing import L2Flusher

    if not torch.cuda.is_available():
        print("profile needs a CUDA GPU", file=sys.stderr)
        return 2
    flush, results = L2Flusher(), []
    for prob in _problems(args):
        inp = make_inputs(prob, seed=args.seed, device="cuda")
        for spec in [BackendSpec.parse(s) for s in args.backend]:
            runner = prepare(inp.a, inp.b, inp.b2, backend=spec.backend, **spec.options)
            prof = profile_runner(runner, iters=args.iters, flush=flush)
            label = f"{prob.name} {spec.name} {runner.info.get('config', '')}"
            print(format_profile(label, prof), flush=True)
            results.append({"problem": prob.name, "backend": spec.name, "config": runner.info.get("config"), **prof})
            del runner
    if args.out:
        with open(args.out, "a") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    return 0


def cmd_check(args) -> int:
    """Each backend against the exact reference (fp64 accumulation, one rounding to the output dtype) per input
    distribution; rows (normwise and elementwise max relative error, mismatching elements) to build/ or --record."""
    import torch

    from ..bench.backends import prepare
    from ..bench.harness import BackendSpec
    from ..bench.store import new_run_id, provenance
    from ..problems import make_inputs
    from ..reference import compare, reference_grouped_gemm

    device = "cuda" if torch.cuda.is_available() else "cpu"
    failures, rows, run_id = 0, [], new_run_id()
    for spec in [BackendSpec.parse(s) for s in args.backend]:
        for prob in _problems(args):
            for mode in args.modes:
                for seed in args.seeds:
                    inp = make_inputs(prob, seed=seed, mode=mode, device=device)
                    ref = reference_grouped_gemm(inp.a, inp.b, inp.b2, accumulate=torch.float64)
                    row = {"run_id": run_id, "backend": spec.backend, "label": spec.name, "problem": prob.name,
                           "dual": prob.dual, "input_mode": mode, "seed": seed, "reference": "fp64, one rounding"}
                    try:
                        runner = prepare(inp.a, inp.b, inp.b2, backend=spec.backend, **spec.options)
                        runner.poison()  # an element the backend does not write reads NaN
                        row.update(compare(runner(), ref))
                        err = row["rel_err"] if not row["nonfinite_mismatched"] else float("inf")
                        ok = err <= args.tol
                        msg = (f"rel_err {err:.2e} max_rel {row['max_rel_err']:.2e} mismatched {row['mismatched']} "
                               f"(non-finite on one side only: {row['nonfinite_mismatched']})")
                    except (RuntimeError, ValueError, TypeError, NotImplementedError) as e:
                        ok, msg = False, f"{type(e).__name__}: {e}"
                    row["status"] = "ok" if ok else f"fail: {msg[:300]}"
                    rows.append(row)
                    failures += not ok
                    print(f"{'ok  ' if ok else 'FAIL'} {spec.name:<32} {prob.name:<16} {mode:<8} seed={seed:<6} {msg}")
    print(f"\n{failures} failure(s)")
    prov = provenance() if rows else {}
    _write(args, [{**prov, **r} for r in rows], "exactness.jsonl")
    return 1 if failures else 0


def cmd_record(args) -> int:
    from ..bench import store

    total = 0
    for f in args.files:
        n = store.merge(f, args.into)
        print(f"{f}: {n} new rows appended to {args.into}")
        total += n
    return 0


def cmd_amend(args) -> int:
    from ..bench import store

    n = store.amend(args.file, set(args.run_id), args.reason, git_commit=args.git_commit)
    print(f"amended git_commit of {n} rows (runs {', '.join(args.run_id)}) in {args.file}; old values kept")
    return 0 if n else 1


def cmd_aot(args) -> int:
    import os
    import sys

    if "cutlass" in sys.modules and os.environ.get("CUTE_DSL_ARCH") == "sm_90a":
        raise SystemExit("aot: cutlass was imported with CUTE_DSL_ARCH=sm_90a; run the command in a fresh process")
    os.environ["CUTE_DSL_ARCH"] = "sm_100a"  # (not the target: the compile then makes no JIT engine, no GPU needed)
    from ..kernels.common import aot
    from ..kernels.hopper_varlen.runner import aot_compile

    recipes = aot.read_manifest(args.manifest)
    print(f"{len(recipes)} kernels of {args.manifest} into {args.out} (for {aot.GPU_ARCH})")
    status = aot.build(recipes, args.out, aot_compile)
    built = [s for s in status if s["status"] == "built"]
    print(f"built {len(built)}, kept {len(status) - len(built)}, "
          f"{sum(s.get('seconds', 0) for s in built):.0f} s; load them with {aot.AOT_ENV}={args.out}")
    return 0


def cmd_compile(args) -> int:
    from .compile_reports import compile_rows

    rows = compile_rows(args.arch, args.config, sweep=args.sweep, dual=args.dual)
    for r in rows:
        res = r["error"][:100] if r.get("error") else (
            f"regs={r.get('registers')} spills={r.get('spill_stores')}/{r.get('spill_loads')} "
            f"smem={r.get('smem_bytes')} wgmma={r.get('wgmma.mma_async')} "
            f"tma={r.get('cp.async.bulk.tensor')} tcgen05.mma={r.get('tcgen05.mma')}")
        print(f"{r['arch']:<8} {r['config']:<28} {'dual' if r.get('dual') else 'single':<6} {res}")
    _write(args, rows, "compile.jsonl")
    return 0


def cmd_study(args) -> int:
    from .notebooks import run_study

    live = {"auto": None, "live": True, "recorded": False}[args.mode]
    return run_study(live=live, only=args.only, html=not args.no_html)


def cmd_probe(args) -> int:
    """Capability probes whose answers are findings (e.g. torch._scaled_mm with NVFP4 on this GPU)."""
    from ..bench import store
    from ..bench.peers.torch_peers import probe_scaled_mm_fp4
    from ..bench.peers.triton_nvfp4 import probe_dot_scaled

    run_id, prov = store.new_run_id(), store.provenance()
    rows = [{"run_id": run_id, **prov, "probe": "torch._scaled_mm NVFP4", **probe_scaled_mm_fp4()},
            {"run_id": run_id, **prov, **probe_dot_scaled()}]
    for r in rows:
        print(f"{r['probe']}: supported={r['supported']} {r.get('note', '')}{r['error']}")
    _write(args, rows, "probes.jsonl")
    return 0


def cmd_b200_check(args) -> int:
    """A B200 owner's first run: correctness of cute-blackwell on every suite, then the benchmark, recorded."""
    import torch

    if not torch.cuda.is_available():
        print("b200-check needs an sm_100 GPU (B200/GB200): no CUDA device here. The Blackwell kernel is "
              "compiled for sm_100a, not run; see `python -m nvfp4lib compile --arch sm_100a`.")
        return 2
    cap = torch.cuda.get_device_capability()
    if cap[0] != 10:
        print(f"b200-check needs an sm_100 GPU (B200/GB200); this is sm_{cap[0]}{cap[1]} "
              f"({torch.cuda.get_device_name()}). Nothing was run.")
        return 2
    ns = argparse.Namespace
    ok = cmd_check(ns(backend=["cute-blackwell"], suite=["correctness", "edge", "benchmark"], problem=None,
                      modes=["uniform", "gaussian"], seeds=[1111, 1, 2], tol=1e-3, k_sweep=None))
    ok |= cmd_check(ns(backend=["cute-blackwell"], suite=["correctness-dual", "dual"], problem=None,
                       modes=["uniform", "gaussian"], seeds=[1111], tol=1e-3, k_sweep=None))
    if ok != 0:
        print("correctness failed: not benchmarking")
        return 1
    # recording is the point of this command: a B200 run is the data the repo lacks
    return cmd_bench(ns(backend=["cute-blackwell:config=baseline", "cute-blackwell:config=ws_pipelined",
                                 "torch-bf16:graph=1"], suite=["benchmark", "dual"], problem=None, seed=1111,
                        mode="uniform", iters=50, tol=1e-3, record=args.record, no_record=False, out=None,
                        strict=True, k_sweep=None))


def cmd_headline(args) -> int:
    """The README's headline table from data/bench.jsonl (``--write README.md`` puts it between the markers)."""
    from ..bench import store
    from . import headline

    block = headline.markdown(headline.headline(store.load()))
    if args.write:
        changed = headline.write_readme(args.write, block, headline.shapes_markdown())
        print(f"{args.write}: {'updated' if changed else 'already up to date'}")
    else:
        print(block)
    return 0


def cmd_info(args) -> int:
    from ..bench.backends import available_backends
    from ..bench.store import provenance

    for k, v in provenance().items():
        print(f"{k:>16}: {v}")
    print(f"{'backends':>16}: {', '.join(available_backends())}")
    return 0


def cmd_docs(args) -> int:
    """The generated pages under docs/ (the command line, the kernel configs)."""
    from . import docs

    if args.write:
        changed = docs.write(build_parser())
        print("\n".join(f"{p.relative_to(docs.ROOT)}: updated" for p in changed) or "docs/: already up to date")
        return 0
    stale = [p for p, text in docs.pages(build_parser()).items() if not p.exists() or p.read_text() != text]
    print("\n".join(f"{p.relative_to(docs.ROOT)}: stale" for p in stale) or "docs/: up to date")
    return 1 if stale else 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.fn(args)


def build_parser() -> argparse.ArgumentParser:
    from ..bench.store import BENCH, CALLS, COMPILE, PROBES

    ap = argparse.ArgumentParser(prog="python -m nvfp4lib", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)

    def add_problems(p):
        p.add_argument("--suite", action="append", help="benchmark, dual, correctness, correctness-dual, edge")
        p.add_argument("--problem", action="append", help="S1, S1-dual, C3, ...")

    p = sub.add_parser("bench", help="check then time backends on problems (GPU); rows to build/ (data/ with --record)")
    add_problems(p)
    p.add_argument("--backend", action="append",
                   help="backend[:key=value,...] (repeatable); default: " + " ".join(DEFAULT_BACKENDS) + ". "
                        "cute-hopper is the serving kernel users call (eager; graph=1 replays a CUDA graph); the "
                        "study's kernels are its named configs, e.g. cute-hopper:config=baseline")
    p.add_argument("--seed", type=int, default=1111)
    p.add_argument("--mode", default="uniform", choices=["uniform", "gaussian", "heavy"])
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--tol", type=float, default=1e-3)
    _add_record_args(p, BENCH, "bench")
    p.add_argument("--strict", action="store_true", help="exit non-zero if any backend failed")
    p.add_argument("--only", help="keep the problems whose name contains this (e.g. N7168)")
    p.add_argument("--k-sweep", help="replace K by each of these (e.g. 256,512,1024): time vs K splits fixed costs")
    p.set_defaults(fn=cmd_bench)

    p = sub.add_parser("calls", help="time the serving path per call: graph, eager, oneshot, harness (GPU)")
    add_problems(p)
    p.add_argument("--call", action="append", choices=["graph", "eager", "oneshot", "harness"])
    p.add_argument("--seed", type=int, default=1111)
    p.add_argument("--mode", default="gaussian", choices=["uniform", "gaussian", "heavy"])
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--rounds", type=int, help="sweeps over all problems and forms (default: calls.ROUNDS); each form "
                   "is judged by its median round")
    p.add_argument("--fused-prologue", choices=["on", "off"], help="the NVFP4 call as one kernel or two (default: "
                   "as shipped, kernels.hopper_varlen.kernel.FUSED_PROLOGUE); rows carry the setting")
    p.add_argument("--eager-fused", choices=["on", "off"], help="with the prologue not fused: calls not under "
                   "CUDA-graph capture as one kernel (default: as shipped, kernels.hopper_varlen.kernel.EAGER_FUSED); "
                   "rows carry the setting")
    p.add_argument("--slice-barrier-all", choices=["on", "off"], help="in the one-kernel call, warp 0 meets the "
                   "slices' barrier with the other warps (default: as shipped, kernels.hopper_varlen.kernel."
                   "SLICE_BARRIER_ALL); rows carry the setting")
    _add_record_args(p, CALLS, "calls")
    p.set_defaults(fn=cmd_calls)

    from ..bench.ep_bench import run_command as run_ep_bench  # moe-bench --ep W: the layer over W GPUs (torchrun)
    from ..bench.moe_bench import add_command as add_moe_bench  # moe-bench: NVFP4MoE against its bf16 peer (GPU)
    add_moe_bench(sub, _add_record_args, _write, ep_run=run_ep_bench)
    from ..bench.generate_bench import add_command as add_generate_bench  # generate-bench: NVFP4 model vs bf16 (GPU)
    add_generate_bench(sub, _add_record_args, _write)

    from ..bench.ncu_profile import add_command as add_ncu  # ncu: a command's kernels under Nsight Compute (GPU)
    add_ncu(sub, _add_record_args, _write)

    from ..bench.gather_bench import add_command as add_gather_bench  # gather-bench: the one-shot gather alone (GPU)
    add_gather_bench(sub, add_problems, _problems, _add_record_args, _write)

    from .experiment import add_command as add_experiment  # experiment: rerun a round the notebooks show (GPU)
    add_experiment(sub, _add_record_args, _write)

    from ..hf.cli import add_commands as add_hf  # make-checkpoint, generate: NVFP4 checkpoints in, tokens out
    add_hf(sub)

    p = sub.add_parser("tune", help="time the serving kernel's configs per problem and cache the fastest (GPU)")
    add_problems(p)
    p.add_argument("--seed", type=int, default=1111)
    p.add_argument("--out-dtype", default="float16", choices=["float16", "bfloat16"])
    p.set_defaults(fn=cmd_tune)

    p = sub.add_parser("profile", help="a call's kernels and their GPU time, from CUPTI records (GPU)")
    add_problems(p)
    p.add_argument("--backend", action="append", required=True, help="backend[:key=value,...] (repeatable)")
    p.add_argument("--seed", type=int, default=1111)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--out", type=Path, help="append one JSON line per (problem, backend) to this file")
    p.set_defaults(fn=cmd_profile)

    p = sub.add_parser("check", help="correctness against the exact reference (GPU if present)")
    add_problems(p)
    p.add_argument("--backend", action="append", required=True)
    p.add_argument("--modes", nargs="+", default=["uniform", "gaussian"])
    p.add_argument("--seeds", nargs="+", type=int, default=[1111])
    p.add_argument("--tol", type=float, default=1e-3)
    _add_record_args(p, BENCH.parent / "exactness.jsonl", "exactness")
    p.set_defaults(fn=cmd_check)

    p = sub.add_parser("record", help="append rows measured elsewhere (the GPU machine) to data/")
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--into", type=Path, default=BENCH)
    p.set_defaults(fn=cmd_record)

    p = sub.add_parser("compile", help="compile kernels with fake tensors (no GPU needed); report resources")
    p.add_argument("--arch", default="sm_90a", choices=["sm_90a", "sm_100a"])
    p.add_argument("--config", action="append", help="config name (repeatable); default: the shipped ones")
    p.add_argument("--sweep", action="store_true", help="all shipped and study configs, rejected ones too")
    p.add_argument("--dual", action="store_true", help="also compile the dual variants")
    _add_record_args(p, COMPILE, "compile")
    p.set_defaults(fn=cmd_compile)

    p = sub.add_parser("aot", help="build a manifest's kernels ahead of time for sm_90a (no GPU needed); a process "
                                   "with NVFP4LIB_AOT=DIR loads them instead of compiling")
    p.add_argument("manifest", type=Path, help="recipes, one JSON per line: what a process with "
                                               "NVFP4LIB_AOT_RECORD=FILE compiled")
    p.add_argument("--out", type=Path, required=True, help="the directory of built libraries (<digest>.so)")
    p.set_defaults(fn=cmd_aot)

    p = sub.add_parser("study", help="run every notebook (papermill) and render HTML")
    p.add_argument("--mode", default="auto", choices=["auto", "live", "recorded"])
    p.add_argument("--only", nargs="+", help="run only notebooks whose name starts with/contains these")
    p.add_argument("--no-html", action="store_true")
    p.set_defaults(fn=cmd_study)

    p = sub.add_parser("amend", help="correct the git commit of recorded runs (old values kept in 'amended')")
    p.add_argument("run_id", nargs="+")
    p.add_argument("--git-commit", required=True)
    p.add_argument("--reason", required=True)
    p.add_argument("--file", type=Path, default=BENCH)
    p.set_defaults(fn=cmd_amend)

    p = sub.add_parser("probe", help="probe what this GPU/torch supports (torch._scaled_mm NVFP4)")
    _add_record_args(p, PROBES, "probe")
    p.set_defaults(fn=cmd_probe)

    p = sub.add_parser("b200-check", help="on a B200: check cute-blackwell on every suite, then benchmark and record")
    p.add_argument("--record", type=Path, default=BENCH)
    p.set_defaults(fn=cmd_b200_check)

    p = sub.add_parser("info", help="provenance of this machine and the backends known")
    p.set_defaults(fn=cmd_info)

    p = sub.add_parser("headline", help="the README's headline table, computed from data/bench.jsonl")
    p.add_argument("--write", type=Path, metavar="README", help="replace the block between the file's markers")
    p.set_defaults(fn=cmd_headline)

    p = sub.add_parser("docs", help="check the generated pages under docs/ (--write: regenerate them)")
    p.add_argument("--write", action="store_true")
    p.set_defaults(fn=cmd_docs)
    return ap


if __name__ == "__main__":
    sys.exit(main())
