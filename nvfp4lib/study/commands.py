"""The bench command and the helpers every command shares: problems from --suite/--problem, row writing under the
--record rules (the command line, :mod:`.cli`, and the study's rounds, :mod:`.experiment`, both run it)."""
from __future__ import annotations

from pathlib import Path

__all__ = ["DEFAULT_BACKENDS", "DEFAULT_SUITES", "cmd_bench"]


# `python -m nvfp4lib bench` with no --backend: the kernel users call, eager and graph-replayed, beside the fair bf16
# peer (operands dequantized once, one torch._grouped_mm) and the Triton kernel, on the study's shapes
DEFAULT_BACKENDS = ("cute-hopper", "cute-hopper:graph=1", "torch-bf16-predequant", "torch-bf16-predequant:graph=1",
                    "triton:graph=1")
DEFAULT_SUITES = ("benchmark", "dual")


def _problems(args, default_suites=()):
    from ..problems import get_problem, suite

    probs = []
    suites = args.suite or ([] if args.problem else list(default_suites))
    for s in suites:
        probs.extend(suite(s))
    for p in args.problem or []:
        probs.append(get_problem(p))
    if not probs:
        raise SystemExit("name at least one --suite or --problem")
    if getattr(args, "only", None):
        probs = [p for p in probs if args.only in p.name]
        if not probs:
            raise SystemExit(f"no problem name contains {args.only!r}")
    if getattr(args, "k_sweep", None):
        from ..problems import GroupedProblem
        ks = [int(k) for k in args.k_sweep.split(",")]
        probs = [GroupedProblem(f"{p.name}-k{k}", p.m, p.n, (k,) * p.groups, p.dual, tags=("k-sweep",))
                 for p in probs for k in ks]
    return probs


def _fmt(v, spec):
    return format(v, spec) if isinstance(v, (int, float)) else str(v)


def _add_record_args(p, default: Path, what: str):
    # data/ is tracked: a plain run must leave the checkout clean, so rows reach data/ only when asked for
    p.add_argument("--record", nargs="?", type=Path, const=default, default=None, metavar="FILE",
                   help=f"append the rows to {default.parent.name}/{default.name} (or FILE); without it they go to "
                        f"build/{default.name} (git-ignored)")
    p.add_argument("--no-record", action="store_true", help="write no file (besides --out)")
    p.add_argument("--out", type=Path, help=f"also append the {what} rows to this file (e.g. under $OUT)")


def _write(args, rows, name: str) -> None:
    """Append ``rows`` to --out, and to --record's file or else build/``name``."""
    from ..bench import store

    if not rows:
        return
    if args.out:
        store.append_rows(args.out, rows)
    if args.no_record:
        return
    path = args.record or store.SCRATCH_DIR / name
    n = store.append_rows(path, rows)
    run = f" (run {rows[0]['run_id']})" if rows[0].get("run_id") else ""
    print(f"\nappended {n} rows{run} to {path}" + ("" if args.record else "  (not recorded: add --record for data/)"))


def cmd_bench(args) -> int:
    from ..bench.harness import bench

    probs = _problems(args, DEFAULT_SUITES)
    rows = bench(args.backend or list(DEFAULT_BACKENDS), probs, seed=args.seed, mode=args.mode, iters=args.iters,
                 tol=args.tol,
                 progress=lambda r: print(f"  {r['problem']:<10} {r['label']:<36} {r['status'][:60]}", flush=True))
    print(f"\n{'problem':<10} {'backend':<36} {'median us':>10} {'floor us':>9} {'x floor':>8} "
          f"{'TFLOP/s':>8} {'rel err':>9}  status")
    for r in rows:
        print(f"{r['problem']:<10} {r['label']:<36} {_fmt(r.get('median_us', '-'), '10.1f'):>10} "
              f"{r['floor_us']:9.1f} {_fmt(r.get('ratio_to_floor', '-'), '8.2f'):>8} "
              f"{_fmt(r.get('tflops', '-'), '8.1f'):>8} {_fmt(r.get('rel_err', '-'), '9.2e'):>9}  {r['status'][:50]}")
    _write(args, rows, "bench.jsonl")
    bad = [r for r in rows if r["status"] != "ok"]
    return 1 if bad and args.strict else 0
