"""The study's rounds as commands: ``python -m nvfp4lib experiment <round>`` reruns what a notebook shows.

A round is data: the benchmark runs (backend specs x suites) whose rows a notebook plots, or, for a step of the fast
path (notebook 09) that was measured by a development script, the development round whose rows are in
``data/history.jsonl``. Running a round whose configs this tree ships benchmarks them with the bench command's
machinery (check, then time; rows with provenance to ``build/bench.jsonl``, to ``data/`` only with ``--record``).
A round whose code left the package is answered with where it is: the commits that measured it (read from the rows
in ``data/``), ``git show <commit>:<path>`` for its kernel and script, and the command line to rerun it in a checkout
of that commit. Nothing here needs a GPU but the benchmark itself.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..bench import store

__all__ = ["Run", "Round", "ROUNDS", "FAST_PATH", "shipped_configs", "missing_configs", "where_measured",
           "not_shipped_message", "run_round", "add_command", "CODE_PATHS", "code_path"]

PEER = "torch-grouped-mm:graph=1"
# notebook 09's final comparison: the default (graph replay and eager) beside every peer of the same run
PEERS_09 = ("triton:graph=1", PEER, "torch-bf16:graph=1", "torch-bf16:strategy=streams,graph=1",
            "torch-compile:graph=1", "torch-dequant:graph=1")


@dataclass(frozen=True)
class Run:
    """One bench invocation: every spec on every problem of the suites (``k_sweep``: K replaced by each value)."""

    specs: tuple[str, ...]
    suites: tuple[str, ...] = ("benchmark",)
    k_sweep: str | None = None

    def argv(self, iters: int) -> list[str]:
        out = ["python", "-m", "nvfp4lib", "bench"]
        for s in self.suites:
            out += ["--suite", s]
        for b in self.specs:
            out += ["--backend", b]
        return out + (["--k-sweep", self.k_sweep] if self.k_sweep else []) + ["--iters", str(iters)]


@dataclass(frozen=True)
class Round:
    """What a notebook shows for one round or step, and how it was measured."""

    name: str
    notebook: str
    title: str
    runs: tuple[Run, ...] = ()  # benchmark runs (bench rows in data/bench.jsonl)
    family: str | None = None  # the kernel family whose rows the notebook reads (None: the current one)
    dev_rounds: tuple[int, ...] = ()  # development rounds of data/history.jsonl (measured by a wip/ script)

    def labels(self) -> set[str]:
        from ..bench.harness import BackendSpec

        return {BackendSpec.parse(s).name for r in self.runs for s in r.specs}


def _cute(*configs: str) -> tuple[str, ...]:
    return tuple(f"cute-hopper:config={c},graph=1" for c in configs)


def _round_notebooks() -> dict[str, Round]:
    r1 = ("baseline", "stages2", "stages3", "stages4", "tma_batched", "tma_stages2_batched", "tma_stages3_batched",
          "tma_stages4_batched", "tile64x128_stages2_tma_batched", "tile64x128_stages3_tma_batched",
          "baseline_no_dequant", "baseline_no_mma", "tma_batched_no_dequant", "tma_batched_no_mma")
    r1d = ("baseline_dual", "baseline_dual_stages2", "baseline_dual_stages3", "baseline_dual_stages4")
    r2 = ("baseline", "tile64x128", "tile128x64", "tile64x64", "tile128x256", "tma_epilogue", "tile64x128_tma",
          "tile128x64_tma", "tile64x64_tma", "tile128x256_tma", "tma_batched", "tile64x128_tma_batched",
          "tile64x64_tma_batched", "tile128x256_tma_batched", "tma_stages2_batched", "tile64x128_stages2_tma_batched",
          "tile64x64_stages2_tma_batched")
    r3 = ("baseline", "tma_epilogue", "stages2", "tma_stages2", "tile64x128", "tile64x128_tma", "tile128x64",
          "tile128x64_tma", "tile64x64", "tile64x64_tma", "producer_consumer", "producer_consumer_tma", "tile128x256",
          "tile128x256_tma", "tma_batched")
    r3d = ("baseline_dual", "baseline_dual_tma", "producer_consumer_dual", "producer_consumer_dual_tma")
    r4 = ("baseline", "producer_consumer", "stages2", "producer_consumer_stages2", "tma_epilogue",
          "producer_consumer_tma", "tma_batched", "producer_consumer_tma_batched", "pc2_tma_batched",
          "tma_stages2_batched", "pc2_stages2_tma_batched", "tile64x128_stages2_tma_batched",
          "pc2_stages2_tile64x128_tma_batched")
    r4d = ("baseline_dual", "producer_consumer_dual", "baseline_dual_tma", "producer_consumer_dual_tma",
           "baseline_dual_tma_batched", "producer_consumer_dual_tma_batched", "dual_stages2_tma_batched")
    h = "cute-hopper:config=baseline"
    r5 = (h, h + ",graph=1", h + ",strategy=loop", h + ",strategy=streams", h + ",strategy=streams,graph=1",
          "torch-bf16", "torch-bf16:graph=1", "torch-bf16:strategy=streams", "torch-bf16:strategy=streams,graph=1",
          "torch-grouped-mm", PEER, "torch-dequant", "torch-compile", "torch-compile:graph=1")
    return {r.name: r for r in (
        Round("round1", "02", "pipeline stages 1-4 (two sweeps, 64x128 at 2 vs 3 stages, ablations; the dual sweep)",
              (Run(_cute(*r1) + (PEER,)), Run(_cute(*r1d), ("dual",))), "hopper_smem"),
        Round("round2", "03", "tile sizes (four families of decode and epilogue)", (Run(_cute(*r2) + (PEER,)),),
              "hopper_smem"),
        Round("round3", "04", "SIMT vs TMA-store epilogue in pairs, the dual pairs, and a K-sweep of both",
              (Run(_cute(*r3) + (PEER,)), Run(_cute(*r3d) + (PEER,), ("dual",)),
               Run(_cute("baseline", "tma_epilogue") + ("cute-hopper:graph=1",), k_sweep="256,512,1024,2048,4096")),
              "hopper_smem"),
        Round("round4", "05", "warp specialization: none vs producer/consumer in pairs, the dual pairs",
              (Run(_cute(*r4) + (PEER,)), Run(_cute(*r4d) + (PEER,), ("dual",))), "hopper_smem"),
        Round("round4-v3", "05", "round 4 on the swap-AB kernel: none, producer/consumer, ping-pong on one tile",
              (Run(_cute("rs_m128_t128_k128_s4", "rs_m128_t128_k128_s4_dw", "rs_m128_t128_k128_s4_pp") + (PEER,)),),
              "hopper_rs", (20,)),
        Round("round5", "06", "wildcards: launch strategies (streams, graphs), torch.compile, the torch peers",
              (Run(r5),), None),  # the launch strategy is the question, not the kernel
    )}


# Notebook 09's steps: (step, family, config or None for the default, development rounds, what changed).
FAST_PATH = (
    (0, "hopper_bf16_decode", "baseline", (), "v1 baseline: the study's kernel mirrored"),
    (1, "hopper_bf16_decode", "vec4", (), "v1: 8 codes per 32-bit word"),
    (2, "hopper_bf16_decode", "vec4_wg2", (), "v1: two warpgroups"),
    (3, "hopper_bf16_decode", "vec4_wg2_dec2", (), "v1: two more decode-only warpgroups"),
    (4, "hopper_smem", "baseline", (), "v2: fp16 decode, 64-K sub-blocks double-buffered"),
    (5, "hopper_smem", "tma_epilogue", (), "v2: TMA-store epilogue"),
    (6, "hopper_smem", "tma_batched", (), "v2: batched shared loads"),
    (7, "hopper_smem", "tma_stages2_batched", (), "v2: 2 TMA stages"),
    (8, "hopper_smem", "tile64x128_stages2_tma_batched", (), "v2: 64-row tiles"),
    (9, "hopper_smem", "tile64x128_stages2_tma_batched_auto", (), "v2 default: split-K where tiles are few"),
    (10, "hopper_rs", None, (2,), "v3: swap-AB, register-sourced weights"),
    (11, "hopper_rs", None, (3,), "v3: one-launch prologue"),
    (12, "hopper_rs", None, (3,), "v3: 256-row CTAs"),
    (13, "hopper_rs", None, (4,), "v3: one wgmma N per 32 tokens"),
    (14, "hopper_rs", None, (), "v3: PDL + auto (bench rows of the default)"),
    (15, "hopper_rs", None, (), "v3: warp 0 refills once both warpgroups released a stage (no log kept)"),
    (16, "hopper_rs", None, (7,), "v3: ablations no_x, no_store"),
    (17, "hopper_rs", None, (8,), "v3: dual epilogue split over both warpgroups"),
    (18, "hopper_rs", None, (8, 12, 14), "v3: act_decode='fused' (removed)"),
    (19, "hopper_rs", None, (9,), "v3: staged epilogue (*_e)"),
    (20, "hopper_rs", None, (), "v3: prologue loads together; auto compiles first (bench rows)"),
    (21, "hopper_rs", None, (17,), "v3: act_decode='warpgroup' (*_dw)"),
    (22, "hopper_rs", None, (18,), "v3: ablations of the decode warpgroup"),
    (23, "hopper_rs", None, (19,), "v3: the decode warpgroup's loads coalesced"),
    (24, "hopper_rs", None, (22, 24), "v3: per-CTA timeline, K sweep"),
    (25, "hopper_rs", None, (23,), "v3: direct launch vs graph replay"),
    (26, "hopper_rs", None, (25,), "v3: act_decode='inline' (*_e_i)"),
    (27, "hopper_rs", None, (26, 27), "v3: three stages for 128-token tiles"),
    (28, "hopper_rs", None, (28,), "v3: L2 prefetch of the first weight stages (on an H200; removed)"),
    (29, "hopper_rs", None, (29,), "v3: the prologue asks for 32 KB of shared memory"),
    (30, "hopper_rs", None, (30, 31), "v3: group parameters as kernel arguments; the default"),
)


DEFAULT_STEPS = (14, 20, 30)  # steps whose rows are bench runs of the shipped default (config auto)


def _fast_path() -> dict[str, Round]:
    out = {}
    for step, family, config, dev, title in FAST_PATH:
        default = step in DEFAULT_STEPS
        runs = ((Run(_cute(config) + (PEER,)), Run(_cute(config) + (PEER,), ("dual",))) if config
                else (Run(("cute-hopper:graph=1", "cute-hopper") + PEERS_09, ("benchmark", "dual")),) if default
                else ())
        out[f"fast-path-{step}"] = Round(f"fast-path-{step}", "09", f"step {step}: {title}", runs, family, dev)
    return out


ROUNDS: dict[str, Round] = {**_round_notebooks(), **_fast_path()}


def shipped_configs() -> dict[str, str | None]:
    """The cute-hopper configs this tree ships (the backend's table): name -> the kernel family that runs it."""
    from ..kernels.hopper_smem import kernel as hopper

    table = {**hopper.CONFIGS, **getattr(hopper, "SWEEP_CONFIGS", {})}
    return {n: getattr(c, "family", None) for n, c in table.items()}


def missing_configs(rnd: Round, shipped: dict[str, str | None] | None = None) -> list[str]:
    """The configs ``rnd`` runs that this tree does not ship, or ships for another kernel family than the one the
    notebook's rows come from (v1's ``baseline`` is not today's): empty means the round can be rerun here."""
    from ..bench.harness import BackendSpec

    shipped = shipped_configs() if shipped is None else shipped
    names = [BackendSpec.parse(s).options.get("config") for r in rnd.runs for s in r.specs
             if s.startswith("cute-hopper")]
    return list(dict.fromkeys(n for n in names if n is not None and (
        n not in shipped or (rnd.family and shipped[n] and shipped[n] != rnd.family))))


def where_measured(rnd: Round) -> list[dict]:
    """The commits whose rows in data/ the notebook shows for ``rnd``: one dict per commit with its bench runs (rows of
    the round's own kernel configs; peers are measured at every commit) or its development logs."""
    found: dict[str, dict] = {}
    labels = {lab for lab in rnd.labels() if lab.startswith("cute-")}

    def entry(r):
        return found.setdefault(r["git_commit"], {"commit": r["git_commit"], "date": r["date"], "runs": set(),
                                                  "logs": set(), "scripts": set(), "gpu": set()})

    for r in store.read_rows(store.BENCH):
        if r.get("label") in labels and (rnd.family is None or r.get("kernel_family") == rnd.family):
            e = entry(r)
            e["runs"].add(r["run_id"])
            e["gpu"].add(r.get("gpu"))
    for r in store.read_rows(store.HISTORY):
        if r.get("round") in rnd.dev_rounds:
            e = entry(r)
            e["logs"].add(r["source_log"])
            e["gpu"].add(r.get("gpu") or "GPU not recorded in the log")
            if r.get("script"):
                e["scripts"].add(r["script"])
    return sorted(found.values(), key=lambda e: e["date"])


CODE_PATHS = {  # where each Hopper family's kernel was, newest layout first (git show <commit>:<path>): the family
    # folders of kernels/ since 034f218, single files before; the bf16-decode kernel left before the folders
    "hopper_bf16_decode": ("nvfp4lib/kernels/sm90.py",),
    "hopper_smem": ("nvfp4lib/kernels/hopper_smem/", "nvfp4lib/kernels/hopper.py"),
    "hopper_rs": ("nvfp4lib/kernels/hopper_rs/", "nvfp4lib/kernels/hopper_rs.py"),
    "hopper_varlen": ("nvfp4lib/kernels/hopper_varlen/",)}


def code_path(family: str, commit: str) -> str:
    """The path of ``family``'s kernel at ``commit`` (the first of :data:`CODE_PATHS` that git finds there; without
    git or the commit, the newest layout)."""
    paths = CODE_PATHS[family]
    for p in paths:
        if store._git("cat-file", "-e", f"{commit}:{p.rstrip('/')}") is not None:  # None: not there, or no git
            return p
    return paths[0]


def not_shipped_message(rnd: Round, missing: list[str], iters: int = 30) -> str:
    """Where the code of ``rnd`` is, and how to rerun it, for a round this tree cannot run."""
    why = (f"its configs {', '.join(missing)} are not shipped by this tree" if missing else
           "it was measured by a development script (wip/), not by the bench command")
    lines = [f"{rnd.name} (notebook {rnd.notebook}, {rnd.title}) cannot be rerun from this tree: {why}."]
    places = where_measured(rnd)
    if not places:
        return "\n".join(lines + ["  no rows of it are recorded in data/: nothing to reproduce."])
    for e in places:
        what = ([f"{len(e['runs'])} bench run(s) in data/bench.jsonl"] if e["runs"] else []) + \
            ([f"logs {', '.join(sorted(e['logs']))} (rows in data/history.jsonl)"] if e["logs"] else [])
        lines.append(f"  measured at {e['commit'][:7]} ({e['date'][:10]}, {', '.join(sorted(map(str, e['gpu'])))}): "
                     + "; ".join(what))
    last = places[-1]
    c = last["commit"][:7]
    if rnd.family in CODE_PATHS:
        lines.append(f"  the kernel (latest of these): git show {c}:{code_path(rnd.family, c)}")
    for s in sorted(last["scripts"]):
        lines.append(f"  the script:  git show {c}:{s}")
    rerun = (" && ".join(f"bash {s}" for s in sorted(last["scripts"])) if last["scripts"] else
             " && ".join(" ".join(r.argv(iters)) for r in rnd.runs))
    if rerun:
        lines.append(f"  to rerun it (on an H100): git worktree add ../nvfp4lib-{c} {c} && cd ../nvfp4lib-{c} && "
                     f"{rerun}")
    return "\n".join(lines)


def run_round(name: str, *, iters: int = 30, record=None, no_record: bool = False, out=None) -> int:
    """Rerun round ``name`` on this machine's GPU through the bench command: rows to build/bench.jsonl, or appended to
    ``record`` (e.g. ``store.BENCH``); ``out``: also to this file. Returns the exit status: 0 ran, 1 a backend failed,
    2 no GPU, 3 not shipped (the message says where its code is)."""
    if name not in ROUNDS:
        raise ValueError(f"unknown round {name!r}; known: {', '.join(ROUNDS)} (python -m nvfp4lib experiment --list)")
    rnd = ROUNDS[name]
    missing = missing_configs(rnd)
    if missing or not rnd.runs:
        print(not_shipped_message(rnd, missing, iters))
        return 3
    import torch

    if not torch.cuda.is_available():
        print(f"experiment {name} needs a CUDA GPU (sm_90, an H100 for the study's numbers); none here. "
              f"It would run:\n" + "\n".join("  " + " ".join(r.argv(iters)) for r in rnd.runs))
        return 2
    from .commands import cmd_bench

    status = 0
    for r in rnd.runs:
        ns = argparse.Namespace(backend=list(r.specs), suite=list(r.suites), problem=None, seed=1111, mode="uniform",
                                iters=iters, tol=1e-3, strict=True, only=None, k_sweep=r.k_sweep,
                                record=record, no_record=no_record, out=out)
        status |= cmd_bench(ns)
    return status


def _list() -> str:
    shipped = shipped_configs()
    out = [f"{'round':<15} {'notebook':<8} {'runs here':<10} what"]
    for r in ROUNDS.values():
        here = "yes" if r.runs and not missing_configs(r, shipped) else "history"
        out.append(f"{r.name:<15} {r.notebook:<8} {here:<10} {r.title}")
    out.append("'history': the code left the package; the command prints the commit that had it and how to rerun it")
    return "\n".join(out)


def add_command(sub, add_record_args, write) -> None:
    """``python -m nvfp4lib experiment``: the parser and the command, registered on ``sub`` (argparse subparsers).
    ``write`` is not used: the rows go through the bench command's own writing (the same --record rules)."""
    p = sub.add_parser("experiment", help="rerun a round the notebooks show (GPU); rows to build/ (data/ with "
                                          "--record); --list names them")
    p.add_argument("round", nargs="?", help="a round name (see --list), e.g. round1, fast-path-30")
    p.add_argument("--list", action="store_true", help="list the rounds and whether this tree can rerun them")
    p.add_argument("--iters", type=int, default=30)
    add_record_args(p, store.BENCH, "bench")

    def run(args) -> int:
        if args.list:
            print(_list())
            return 0
        if not args.round:
            p.error("name a round (python -m nvfp4lib experiment --list shows them)")
        if args.round not in ROUNDS:
            p.error(f"unknown round {args.round!r}; known: {', '.join(ROUNDS)}")
        return run_round(args.round, iters=args.iters, record=args.record, no_record=args.no_record, out=args.out)

    p.set_defaults(fn=run)

