"""The development rounds of the serving path (notebook 10's "How we got here"), as data: per round the change, the
prediction typed before its GPU run, and which recorded rows measure its outcome.

A prediction is a forecast and stays as it was written. An outcome is never typed: :func:`rounds_table` computes it
from ``data/calls.jsonl`` and ``data/gather.jsonl`` (naming the runs it used), or says that ``data/`` holds no row of
it (the round was measured by a development script whose output was not recorded).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np
import pandas as pd

from . import gather_report as gr
from . import serving_report as sr

__all__ = ["Sources", "Round", "ROUNDS", "NOT_RECORDED", "rounds_table", "PREDICTED_LAUNCHES", "PREDICTED_LAUNCH_US",
           "gather_pair", "gather_knob", "calls_pair", "runs_compare", "form_in_runs", "target_at", "joined",
           "fused_knob", "first_run_predictions", "gather_first"]

NOT_RECORDED = "not recorded in data/"
# the first round's prediction: an eager call's host work is this many launches of this many µs each (issue 18's probe)
PREDICTED_LAUNCHES, PREDICTED_LAUNCH_US = 2, 6.0


class Sources(NamedTuple):
    """What an outcome is computed from: the rows of data/calls.jsonl and data/gather.jsonl, the problems, the
    host-scheduled kernel's graph times (:func:`serving_report.host_scheduled_reference`), data/bench.jsonl and
    data/tuned.jsonl."""
    calls: pd.DataFrame
    gather: pd.DataFrame
    problems: list
    reference: pd.DataFrame | None = None
    bench: pd.DataFrame | None = None  # data/bench.jsonl: the serving kernel's graph replays per config
    tuned: pd.DataFrame | None = None  # data/tuned.jsonl: bench runs under a tuning cache `nvfp4lib tune` filled


# an outcome: (text, the run ids it rests on), or None where data/ has no rows for it
Outcome = Callable[[Sources], "tuple[str, list[str]] | None"]


@dataclass(frozen=True)
class Round:
    change: str  # what changed, with the commit that shipped, reverted or measured it
    commit: str  # the change's commit(s)
    prediction: str  # typed before the GPU run
    outcome: Outcome | None = None  # None: measured by a development script only
    measured_by: str = ""  # for an unrecorded outcome: what measured it


def _f(x: float, digits: int = 1) -> str:
    return "—" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{x:.{digits}f}"


def _pick(series: pd.Series, shapes) -> list[str]:
    return [s for s in shapes if s in series.index and pd.notna(series[s])]


def _gather_runs(rows: pd.DataFrame, commits, kcu: int = 8, warps: int = 4) -> list[str]:
    ok = rows[(rows["status"] == "ok") & (rows["kcu"] == kcu) & (rows["warps"] == warps)]
    return sorted(set(ok.loc[ok["git_commit"].astype(str).str[:7].isin([c[:7] for c in commits]), "run_id"]))


def gather_pair(before: str, after: str, shapes=("S1", "S2", "S4", "S1-dual"), part: str = "weights") -> Outcome:
    """The gather's GPU time at two commits (:func:`gather_report.gather_ab`, knobs as shipped)."""
    def measure(src: Sources):
        ab = gr.gather_ab(src.gather, before, after, src.problems)
        if not len(ab):
            return None
        t = ab.xs(part, level="part")
        b, a = t[f"{before} us"], t[f"{after} us"]
        text = (f"{part}, GPU us {before} → {after}: "
                + ", ".join(f"{s} {_f(b[s])} → {_f(a[s])}" for s in _pick(a, shapes) if pd.notna(b[s]))
                + f"; {after} at {_f(t['after x floor'].min(), 2)}-{_f(t['after x floor'].max(), 2)}x the copy floor; "
                + ("outputs byte-identical" if bool(ab["identical"].all()) else "an output differed"))
        return text, _gather_runs(src.gather, (before, after))
    return measure


def gather_knob(commit: str, knob: str, shapes=("S1", "S2", "S4", "S1-dual"), part: str = "weights") -> Outcome:
    """The gather's GPU time with ``knob`` off and on in the runs at ``commit`` that timed both (the other knobs as
    shipped): median over those runs."""
    def measure(src: Sources):
        g = src.gather
        if knob not in g:
            return None
        defaults = {k: v for k, v in gr.gather_knobs().items() if k != knob}
        sel = sr.at_defaults(g[(g["status"] == "ok") & (g["kcu"] == 8) & (g["warps"] == 4) & (g["part"] == part)
                                & g["git_commit"].astype(str).str.startswith(commit) & g[knob].notna()], defaults)
        both = sel.groupby("run_id")[knob].nunique()
        sel = sel[sel["run_id"].isin(both[both == 2].index)]
        if not len(sel):
            return None
        t = sel.pivot_table(index="problem", columns=knob, values="median_us", aggfunc="median")
        text = (f"{part}, GPU us with {knob} 0 → 1: " + ", ".join(f"{s} {_f(t.loc[s, 0])} → {_f(t.loc[s, 1])}"
                                                                 for s in _pick(t[1], shapes))
                + f"; 1 / 0 over the shapes: {_f((t[1] / t[0]).min(), 3)}-{_f((t[1] / t[0]).max(), 3)}")
        return text, sorted(set(sel["run_id"]))
    return measure


def calls_pair(before: str, after: str, call: str = "oneshot", shapes=("S1", "S1-dual", "S4"),
               values=("per call", "back to back")) -> Outcome:
    """One call form at two commits timed alternately on one machine (:func:`serving_report.calls_ab`)."""
    def measure(src: Sources):
        ab = sr.calls_ab(src.calls, before, after, call, src.problems)
        if not len(ab):
            return None
        parts = []
        for v in values:
            b, a = ab[f"{v} {before}"], ab[f"{v} {after}"]
            parts.append(f"{call} {v} us {before} → {after}: "
                         + ", ".join(f"{s} {_f(b[s])} → {_f(a[s])}" for s in _pick(a, shapes)))
        return "; ".join(parts), list(sr.calls_ab_runs(src.calls, before, after, call).index)
    return measure


def _full_run_at(src: Sources, commit: str) -> list[str]:
    runs = sr.full_runs(src.calls, src.problems)
    if not runs:
        return []
    com = src.calls.drop_duplicates("run_id").set_index("run_id")["git_commit"].astype(str)
    return [r for r in runs if com[r].startswith(commit)]


def runs_compare(before: str, after: str, call: str = "eager") -> Outcome:
    """The latest full run (:func:`serving_report.full_runs`) at each of two commits: ``call``'s host time (median over
    the shapes, and after - before per shape), the graph replays after / before, and the ``call`` target's verdicts.
    Runs of two machines: the host's speed differs between them."""
    def measure(src: Sources):
        b_runs, a_runs = _full_run_at(src, before), _full_run_at(src, after)
        if not b_runs or not a_runs:
            return None
        runs = [b_runs[-1], a_runs[-1]]
        lat = [sr.latest_calls(src.calls[src.calls["run_id"] == r], src.problems).set_index(["problem", "call"])
               for r in runs]
        host = [x.xs(call, level="call")["host_us"] for x in lat]
        graph = [x.xs("graph", level="call")["per_call_us"] for x in lat]
        held = [sr.verdict(src.calls, src.problems, src.reference, run=r).held.get(call, (0, 0)) for r in runs]
        d, g = host[1] - host[0], graph[1] / graph[0]
        text = (f"{call} host us, median over the shapes, {before} → {after}: {_f(host[0].median())} → "
                f"{_f(host[1].median())} (per shape {d.min():+.1f} to {d.max():+.1f}); graph replays after / before "
                f"{_f(g.min(), 2)}-{_f(g.max(), 2)}; {call} target held on {held[0][0]} of {held[0][1]} → "
                f"{held[1][0]} of {held[1][1]} shapes; two machines")
        return text, runs
    return measure


def form_in_runs(commits, problem: str = "S4", call: str = "graph") -> Outcome:
    """One form of one problem in every full run at ``commits``: its per-call time against its target's limit."""
    def measure(src: Sources):
        parts, runs = [], []
        for c in commits:
            for r in _full_run_at(src, c):
                t = sr.verdict(src.calls, src.problems, src.reference, run=r).table.loc[(problem, call)]
                parts.append(f"{c} {t['per call us']:.2f} ({t['verdict']})")
                runs.append(r)
        if not runs:
            return None
        lim = sr.verdict(src.calls, src.problems, src.reference, run=runs[-1]).table.loc[(problem, call), "limit us"]
        return f"{problem} {call} per call us, limit {lim:.2f}: " + ", ".join(parts), runs
    return measure


def target_at(commit: str, call: str = "graph", shapes=("S1-dual", "S2-dual")) -> Outcome:
    """``call``'s target in the latest full run at ``commit``: on how many shapes it held, and some shapes' times."""
    def measure(src: Sources):
        runs = _full_run_at(src, commit)
        if not runs:
            return None
        v = sr.verdict(src.calls, src.problems, src.reference, run=runs[-1])
        held, n = v.held.get(call, (0, 0))
        t = v.table.xs(call, level="call")
        return (f"{call} target at {commit}: held on {held} of {n} shapes ("
                + ", ".join(f"{s} {_f(t.loc[s, 'per call us'])} us" for s in shapes if s in t.index) + ")"), [runs[-1]]
    return measure


def joined(*outcomes: Outcome) -> Outcome:
    """Several outcomes of one round, in order; None if none has rows."""
    def measure(src: Sources):
        got = [g for g in (o(src) for o in outcomes) if g is not None]
        if not got:
            return None
        return "; ".join(t for t, _ in got), list(dict.fromkeys(r for _, runs in got for r in runs))
    return measure


def _knob_runs(src: Sources, ab: pd.DataFrame, knob: str) -> list[str]:
    """The calls runs of a knob's A/B (:func:`serving_report.knob_ab`'s commit, rows carrying the knob)."""
    commit = str(ab["commit"].iloc[0])
    return sorted(set(src.calls.loc[src.calls["git_commit"].astype(str).str.startswith(commit)
                                    & src.calls[knob].notna(), "run_id"]))


def fused_knob(shapes=("S1", "S4", "S2-dual")) -> Outcome:
    """The fused prologue's A/B (:func:`serving_report.knob_ab`): eager host time and graph replays, on - off."""
    def measure(src: Sources):
        ab = sr.knob_ab(src.calls, "fused_prologue", src.problems)
        if not len(ab):
            return None
        eager, graph = ab.xs("eager", level="call"), ab.xs("graph", level="call")
        h, gpu = eager["host on - off"], graph["per call on - off"]
        text = (f"eager host us, on - off: median {h.median():+.1f} ({h.min():+.1f} to {h.max():+.1f}; lower on "
                f"{int((h < 0).sum())} of {len(h)} shapes); graph replay per call, on - off: {gpu.min():+.1f} to "
                f"{gpu.max():+.1f} us, beyond ±2 on {int((gpu.abs() > 2).sum())} of {len(gpu)}")
        return text, _knob_runs(src, ab, "fused_prologue")
    return measure


def calls_knob(knob: str) -> Outcome:
    """A calls knob's A/B (:func:`serving_report.knob_ab`): per call form, the per-call time on - off over the
    shapes."""
    def measure(src: Sources):
        ab = sr.knob_ab(src.calls, knob, src.problems)
        if not len(ab):
            return None
        parts = []
        for call in dict.fromkeys(ab.index.get_level_values("call")):
            d = ab.xs(call, level="call")["per call on - off"]
            parts.append(f"{call} per call, on - off: {d.min():+.1f} to {d.max():+.1f} us over {len(d)} shapes "
                         f"(median {d.median():+.1f})")
        return "; ".join(parts), _knob_runs(src, ab, knob)
    return measure


def first_run_predictions() -> Outcome:
    """The first prediction made numeric (:func:`serving_report.predictions`) on the first full run recorded."""
    def measure(src: Sources):
        runs = sr.full_runs(src.calls, src.problems)
        if not runs:
            return None
        latest = sr.latest_calls(src.calls[src.calls["run_id"] == runs[0]], src.problems)
        pred = sr.predictions(latest, src.problems, PREDICTED_LAUNCHES, PREDICTED_LAUNCH_US)["measured / predicted"]
        parts = [f"{c} {x.min():.2f}-{x.max():.2f}" for c, x in pred.dropna().groupby(level="call", sort=False)]
        commit = str(src.calls.loc[src.calls["run_id"] == runs[0], "git_commit"].iloc[0])[:7]
        return f"measured / predicted on the first full run ({commit}): " + ", ".join(parts), [runs[0]]
    return measure


def gather_first(commit: str = "6ce62ac", development=None) -> Outcome:
    """The first recorded gather run (``commit``): the weights at kcu 8 against the development run's times, and
    kcu 1 against kcu 8."""
    def measure(src: Sources):
        t = gr.gather_table(src.gather, src.problems, commit=commit)
        if not len(t) or "weights kcu=1 us" not in t:
            return None
        r = t["weights kcu=1 us"] / t["weights kcu=8 us"]
        dev = pd.Series(development or {})
        got = t["weights kcu=8 us"].reindex(dev.index) / dev
        text = ("weights kcu=8 us: " + ", ".join(f"{s} {_f(t.loc[s, 'weights kcu=8 us'])}" for s in dev.index
                                                 if s in t.index)
                + f" (recorded / development {got.min():.3f}-{got.max():.3f}); "
                + f"kcu=1 / kcu=8 {r.min():.2f}-{r.max():.2f}")
        return text, _gather_runs(src.gather, (commit,), kcu=8)
    return measure


_DEV_WEIGHTS_US = {"S1": 153.7, "S2": 82.4, "S3": 21.9, "S4": 12.8, "S1-dual": 300.4, "S4-dual": 21.4}


def _cute_rows(src: Sources, commit: str, graph: bool = True, table: str = "bench") -> pd.DataFrame:
    """The bench's graph-replay rows (``graph``; else its eager calls) of the cute-hopper backend at ``commit`` (status
    ok), from ``src.bench`` (or another table of ``src``: "tuned")."""
    b = getattr(src, table)
    if b is None or not len(b) or "label" not in b:
        return pd.DataFrame()
    graphed = b["label"].astype(str).str.contains("graph=True")
    ok = b[(b["status"] == "ok") & (b["backend"] == "cute-hopper") & (graphed if graph else ~graphed)]
    return ok[ok["git_commit"].astype(str).str[:7] == commit[:7]]


def bench_commits(before: str, after: str, shapes=None, label: str = "cute-hopper[graph=True]") -> Outcome:
    """The shipped call's graph replay (``label``: the serving kernel as ``auto`` picks it) at two commits: the
    median over each commit's runs, on ``shapes`` (default: the sources' problems)."""
    def measure(src: Sources):
        med, runs = {}, {}
        for c in (before, after):
            r = _cute_rows(src, c)
            r = r[r["label"] == label] if len(r) else r
            if not len(r):
                return None
            med[c] = r.groupby("problem")["median_us"].median()
            runs[c] = sorted(set(r["run_id"]))
        b, a = med[before], med[after]
        names = shapes or [p.name for p in src.problems]
        counts = {c: f"{len(runs[c])} run{'s' * (len(runs[c]) > 1)}" for c in runs}
        text = (f"graph us, {before} ({counts[before]}) → {after} ({counts[after]}): "
                + ", ".join(f"{s} {_f(b[s])} → {_f(a[s])}" for s in names if s in a.index and s in b.index))
        return text, runs[before] + runs[after]
    return measure


def bench_ab(commit: str, pairs, reference_prefix: str = "rs_", modes=("graph",)) -> Outcome:
    """In the runs at ``commit``: per (shape, config A, config B) the graph replays (and with "eager" in ``modes``, the
    eager calls) of both configs, each the median of its rows, beside the host-scheduled kernel's config (name
    starting ``reference_prefix``) timed in the same run."""
    return _per_mode({mode: _ab_parts(commit, pairs, reference_prefix, mode == "graph") for mode in modes})


def _per_mode(parts_of: dict) -> Outcome:
    """One outcome of several modes' parts ({mode: outcome}): "graph us: ...; eager us: ...", the runs of all."""
    def measure(src: Sources):
        got = {mode: f(src) for mode, f in parts_of.items()}
        got = {mode: g for mode, g in got.items() if g is not None}
        if not got:
            return None
        return ("; ".join(f"{mode} us: {text}" for mode, (text, _) in got.items()),
                sorted({run for _, runs in got.values() for run in runs}))
    return measure


def auto_at(commit: str, shapes, modes=("graph", "eager"), table: str = "bench") -> Outcome:
    """In the runs at ``commit`` (of ``src.bench``, or ``table``): per shape the config ``auto`` ran and its median per
    mode, beside the host-scheduled kernel's graph replays in the same runs."""
    def part(src: Sources, graph: bool):
        r = _cute_rows(src, commit, graph, table)
        if not len(r) or "options" not in r:
            return None
        auto = r[r["options"].apply(lambda o: not (isinstance(o, dict) and o.get("config")))]
        host = r[r["config"].astype(str).str.startswith("rs_")]
        parts = []
        for shape in shapes:
            a, h = auto[auto["problem"] == shape], host[host["problem"] == shape]
            if len(a):
                parts.append(f"{shape} {a['config'].iloc[0]} {_f(a['median_us'].median())}"
                             + (f" (host-scheduled {_f(h['median_us'].median())})" if len(h) else ""))
        return (", ".join(parts), sorted(set(r["run_id"]))) if parts else None

    return _per_mode({mode: (lambda src, graph=(mode == "graph"): part(src, graph)) for mode in modes})


def build_knob_ab(commit: str, knob: str, shapes, values=(False, True)) -> Outcome:
    """In the runs at ``commit``: per shape the ``auto`` call's graph replays with a build knob (bench rows'
    ``info_<knob>``, set by ``--backend cute-hopper:<knob>=...``) at each of ``values``, each the median of its rows,
    beside the host-scheduled kernel's config timed in the same run."""
    def measure(src: Sources):
        r = _cute_rows(src, commit)
        col = f"info_{knob}"
        if not len(r) or col not in r or "options" not in r:
            return None
        named = r["options"].apply(lambda o: isinstance(o, dict) and bool(o.get("config")))
        auto, host = r[~named & r[col].notna()], r[r["config"].astype(str).str.startswith("rs_")]
        parts = []
        for shape in shapes:
            a, h = auto[auto["problem"] == shape], host[host["problem"] == shape]
            med = [a[a[col] == v]["median_us"].median() for v in values]
            if any(np.isnan(m) for m in med):
                continue
            parts.append(f"{shape} " + " → ".join(_f(m) for m in med)
                         + (f" (host-scheduled {_f(h['median_us'].median())})" if len(h) else ""))
        return (f"{knob} {' → '.join(map(str, values))}: " + ", ".join(parts), sorted(set(r["run_id"]))) if parts \
            else None
    return measure


def _ab_parts(commit: str, pairs, reference_prefix: str, graph: bool):
    def measure(src: Sources):
        r = _cute_rows(src, commit, graph)
        if not len(r):
            return None
        med = r.groupby(["problem", "config"])["median_us"].median()
        parts = []
        for shape, a, b in pairs:
            if (shape, a) not in med.index or (shape, b) not in med.index:
                continue
            ref = [c for (p, c) in med.index if p == shape and str(c).startswith(reference_prefix)]
            parts.append(f"{shape} {_f(med[(shape, a)])} → {_f(med[(shape, b)])}"
                         + (f" (host-scheduled {_f(med[(shape, ref[0])])})" if ref else ""))
        if not parts:
            return None
        return ", ".join(parts), sorted(set(r["run_id"]))
    return measure


ROUNDS = (
    Round("the serving path: prepared weights, the call `w(a_packed, offsets)` scheduled from device offsets; one-shot "
          "calls pack new weights in one pass", "826ad80",
          f"eager ≈ graph + {PREDICTED_LAUNCHES} launches of ~{PREDICTED_LAUNCH_US:.0f} us of host time; oneshot ≈ "
          "eager + one read and write of the weights at the measured copy bandwidth; harness ≈ oneshot",
          first_run_predictions()),
    Round("the one-shot gather alone, timed by `gather-bench` (weights and rows packed in one Triton launch)",
          "6ce62ac", "weights at kcu=8 as in the development run: S1 153.7 us, S2 82.4, S3 21.9, S4 12.8, S1-dual "
          "300.4, S4-dual 21.4; kcu=1 about twice as long", gather_first("6ce62ac", _DEV_WEIGHTS_US)),
    Round("eager call: prologue and GEMM from one compiled host function; each check by the cheapest torch query",
          "78ee5fe", "-6 to -12 us of host time per eager call (one TVM-FFI entry less), ~-4 us from the checks",
          runs_compare("5467d03", "78ee5fe", "eager")),
    Round("gather: 64 registers instead of 114-145 (4 activation rows of 256-byte steps, 32-bit offsets)", "2fe0d84",
          "S1's weights 154 → ~100 us (±15), S1-dual 300 → ~200, S2 82 → ~55; S4 unchanged",
          gather_pair("db1decc", "2fe0d84")),
    Round("gather: one load per lane, four words written (reverted in f50f1a7)", "77b4697",
          "S1's weights 122 → ~100 us (~1.1x the copy floor)", gather_pair("2fe0d84", "77b4697")),
    Round("one-shot: small plans read the table from pinned memory in place", "287b621",
          "host time -12 us per call on S4, -18 on S1; GPU time a few us more on S3/S4, ~15 on S1",
          measured_by="a development A/B in one process"),
    Round("one-shot host path: one checked pass over the operands, a lane per (rows, stream), prepared driver "
          "launches", "4006b9d", "S1 one-shot ~280 us per call, S1-dual ~512; S4's host time 66 → ~50 us",
          calls_pair("65b7964", "4006b9d", values=("per call", "host"))),
    Round("one-shot: the gather in two launches, weights first (reverted in a7da4a4)", "7349399",
          "S1 per call 10-18 us less", calls_pair("4006b9d", "7349399")),
    Round("gather: two units' loads in flight (PREFETCH)", "db7e1a9", "S1's weights 122 → ~95-100 us",
          gather_knob("db7e1a9", "prefetch")),
    Round("gather: each word's bytes by two PTX byte permutes (PRMT; removed)", "27c1624",
          "-10 to -15% if instruction issue is the limit", gather_knob("27c1624", "prmt")),
    Round("gather: scales loaded 4 bytes of a row at a time, 8x fewer L1 wavefronts (reverted in ba1ccd9)", "13f4a12",
          "S1's weights → ~95-100 us if the L1 is the limit", gather_pair("27c1624", "13f4a12")),
    Round("GEMM: a regression found in the records (the warp tile search of 0b14006); fix in 97e5d79: each thread "
          "walks up to 32 groups again", "97e5d79",
          "5dda5fa (before 0b14006) replays S1-dual in ~225 us and S2-dual in ~139 on the same card",
          joined(calls_pair("5dda5fa", "e65a017", "graph", shapes=("S1", "S1-dual", "S2-dual"), values=("per call",)),
                 target_at("97e5d79", "graph"))),
    Round("the call as one kernel: the prologue decoded by the GEMM's first CTAs (FUSED_PROLOGUE, off by default)",
          "a5f736b", "-4 to -6 us of host time per eager call; GPU time within ±2 us", fused_knob()),
    Round("one-shot: the weights' shape, device and addresses read once per tensor", "41f4b7e",
          "per call -10 us on S1 and S1-dual, -6 on S2, ~0 on S4", measured_by="a development A/B in one process"),
    Round("three pipeline stages at 256 rows per group (S3, S4); eager device checks as integer compares", "7c31321",
          "~0.3 us faster than four stages: S4's graph target holds", form_in_runs(("02ad01d", "7c31321"))),
    Round("one-shot: one driver event per 16 calls (a ring of 64 pinned slots)", "c6ea3e4",
          "-2 to -6 us of host time per one-shot call", measured_by="a development A/B in one process"),
    Round("fused call: warp 0 issues its weight loads before the slices are decoded (reverted in dee1f02)", "e76d778",
          "the fused call's extra GPU time in graph replays down to 0-2 us", measured_by="a development A/B"),
    Round("eager calls: scales passed as E4M3 (no view), output sizes as arguments", "35053fa",
          "-2 to -3 us of host time per eager call", measured_by="timeit on the host"),
    Round("gather: each code pair loaded once, moved through shared memory (ONCE)", "6b02f58",
          "S1's weights ~115 → ~100 us", gather_knob("6b02f58", "once")),
    Round("one-shot: the gather in two launches again (reverted in cd3486b)", "f72483c",
          "15-20 us less per call on S1, 20-30 on S1-dual", measured_by="a development A/B in one process"),
    Round("gather: the activation rows' programs first (ROWS_FIRST)", "404e20a",
          "S1's weights and rows ~124 → ~116 us, S1-dual ~7 us less",
          gather_knob("404e20a", "rows_first", part="weights+rows")),
    Round("gather: a program loads its units at once (WHOLE; default from 11271bc)", "674dc09",
          "S1's weights ~110 → 90-95 us", gather_knob("674dc09", "whole")),
    Round("eager calls not under capture run one kernel (EAGER_FUSED)", "8909dba",
          "-3 to -6 us of host time per eager call; graph replays unchanged", runs_compare("6b02f58", "8909dba")),
    Round("graph replays without a captured zero-fill: a stream's fused-call counters were zeroed by a kernel that "
          "the first call on the capture stream put into the graph (a kernel profile, `python -m nvfp4lib profile`, "
          "found three kernels per replay); now made zeroed with the weights", "398d015",
          "-1.0 to -1.7 us per graph replay on every shape (the 0.7 us fill, and the prologue starting ~1 us later "
          "behind it)", bench_commits("4741697", "cacb795", shapes=("S2", "S3", "S4", "S2-dual", "S4-dual"))),
    Round("the stage wait without a suspend-time hint (`wait=\"spin\"`, configs `*_w`): ncu found the serving "
          "GEMM 7-11% more cycles than the host-scheduled one with the same tiling and PTX loop, its SASS an inline "
          "TRYWAIT + NANOSLEEP loop at the top stall (A/B in one run at cacb795, the same kernels as 398d015)",
          "398d015",
          "the gap to the host-scheduled kernel closes: S3 33.9 → ~31, S2-dual 137 → ~128 us",
          bench_ab("cacb795", (("S4", "vl_m128_t128_k128_s3_e", "vl_m128_t128_k128_s3_e_w"),
                               ("S3", "vl_m128_t128_k128_s3_e", "vl_m128_t128_k128_s3_e_w"),
                               ("S2", "vl_m128_t256_k128_s3_v32_e", "vl_m128_t256_k128_s3_v32_e_w"),
                               ("S2-dual", "vl_dual_m64_t256_k128_s3_v32_e", "vl_dual_m64_t256_k128_s3_v32_e_w"),
                               ("S4-dual", "vl_dual_m128_t128_k128_s3", "vl_dual_m128_t128_k128_s3_w")))),
    Round("the spin wait adopted for every single-GEMM tiling from 128 rows per group and the dual 256-token tiling "
          "(S1 was not in the A/B); the headline's shapes against its five runs", "63083e2",
          "S1-S4 and the duals 1-3 us faster than at 4741697; S2-S4 still behind the host-scheduled kernel",
          bench_commits("4741697", "63083e2")),
    Round("the spin wait taken back from every tier (kept as the named `*_w` configs): S1's graph replay had "
          "regressed by 41 us with it (its eager call, the fused kernel with the same wait, had not: 128.4 us), a "
          "failure not understood yet", "after 63083e2", "every shape back to the hinted wait's times at cacb795 "
          "and before (S1 ~128 us)", measured_by="not run: the session's GPU time was spent"),
    Round("the spin wait's A/B again, on an H200, every benchmark and dual shape: per shape one process, the shipped "
          "config (the hinted wait) first and last, its `*_w` form (on S2 and S2-dual also the 96-token `*_w` tiling) "
          "and the host-scheduled kernel's config between (`bench --problem P --backend ...`, graph replay)",
          "c3891fe", "none written down before the run: it repeats the H100 A/B and S1's regression above",
          bench_ab("c3891fe", (("S1", "vl_m128_t256_k128_s3_v32_e", "vl_m128_t256_k128_s3_v32_e_w"),
                               ("S2", "vl_m128_t256_k128_s3_v32_e", "vl_m128_t256_k128_s3_v32_e_w"),
                               ("S2", "vl_m128_t256_k128_s3_v32_e", "vl_m128_t96_k128_s3_e_w"),
                               ("S3", "vl_m128_t128_k128_s3_e", "vl_m128_t128_k128_s3_e_w"),
                               ("S4", "vl_m128_t128_k128_s3_e", "vl_m128_t128_k128_s3_e_w"),
                               ("S1-dual", "vl_dual_m64_t256_k128_s3_v32_e", "vl_dual_m64_t256_k128_s3_v32_e_w"),
                               ("S2-dual", "vl_dual_m64_t256_k128_s3_v32_e", "vl_dual_m64_t256_k128_s3_v32_e_w"),
                               ("S2-dual", "vl_dual_m64_t256_k128_s3_v32_e", "vl_dual_m64_t96_k128_s3_e_w"),
                               ("S3-dual", "vl_dual_m128_t128_k128_s3", "vl_dual_m128_t128_k128_s3_w"),
                               ("S4-dual", "vl_dual_m128_t128_k128_s3", "vl_dual_m128_t128_k128_s3_w")))),
    Round("the stage wait tried once without a hint, then the hinted wait (`wait=\"once\"`, configs `*_o`: the "
          "host-scheduled kernel's SASS shape); the same A/B on every shape, and the shipped config eager beside the "
          "host-scheduled kernel's", "fcd3748",
          "S3 ~32 us and S2 ~67 (most of the spin wait's gain), S1 stays at the hinted wait's ~123; S4 and the duals "
          "within 1%", bench_ab("fcd3748", (("S1", "vl_m128_t256_k128_s3_v32_e", "vl_m128_t256_k128_s3_v32_e_o"),
                                            ("S2", "vl_m128_t256_k128_s3_v32_e", "vl_m128_t256_k128_s3_v32_e_o"),
                                            ("S3", "vl_m128_t128_k128_s3_e", "vl_m128_t128_k128_s3_e_o"),
                                            ("S4", "vl_m128_t128_k128_s3_e", "vl_m128_t128_k128_s3_e_o"),
                                            ("S1-dual", "vl_dual_m64_t256_k128_s3_v32_e",
                                             "vl_dual_m64_t256_k128_s3_v32_e_o"),
                                            ("S2-dual", "vl_dual_m64_t256_k128_s3_v32_e",
                                             "vl_dual_m64_t256_k128_s3_v32_e_o"),
                                            ("S3-dual", "vl_dual_m128_t128_k128_s3", "vl_dual_m128_t128_k128_s3_o"),
                                            ("S4-dual", "vl_dual_m128_t128_k128_s3", "vl_dual_m128_t128_k128_s3_o")))),
    Round("the once-wait shipped for the single GEMM's two study tiers (tuning.ONCE_WAIT; the duals keep the hinted "
          "wait); checked in graph replay and eager calls against the hinted config and the host-scheduled kernel",
          "819396d", "graph replay as in the A/B before; none written down for the eager calls (the fused kernel, with "
          "the same wait) before the run",
          bench_ab("819396d", (("S1", "vl_m128_t256_k128_s3_v32_e", "vl_m128_t256_k128_s3_v32_e_o"),
                               ("S2", "vl_m128_t256_k128_s3_v32_e", "vl_m128_t256_k128_s3_v32_e_o"),
                               ("S3", "vl_m128_t128_k128_s3_e", "vl_m128_t128_k128_s3_e_o"),
                               ("S4", "vl_m128_t128_k128_s3_e", "vl_m128_t128_k128_s3_e_o")),
                   modes=("graph", "eager"))),
    Round("the 96-token tilings with the once-wait (`vl_m128_t96_k128_s3_e_o`, `vl_dual_m64_t96_k128_s3_e_o`: two "
          "CTAs per SM, the host-scheduled kernel's tiling of S2 and the duals) against the tier S1 and S2 share: per "
          "shape one process, the shipped config first and last, the arm and the host-scheduled kernel between, "
          "graph replay and eager calls", "5f3b1c1",
          "S2 ~65 us and S2-dual ~127 in graph replay, level with the host-scheduled kernel; S1 ~135 and S1-dual ~221: "
          "slower, so the tier cannot take them",
          bench_ab("5f3b1c1", (("S1", "vl_m128_t256_k128_s3_v32_e_o", "vl_m128_t96_k128_s3_e_o"),
                               ("S2", "vl_m128_t256_k128_s3_v32_e_o", "vl_m128_t96_k128_s3_e_o"),
                               ("S1-dual", "vl_dual_m64_t256_k128_s3_v32_e", "vl_dual_m64_t96_k128_s3_e_o"),
                               ("S2-dual", "vl_dual_m64_t256_k128_s3_v32_e", "vl_dual_m64_t96_k128_s3_e_o")),
                   modes=("graph", "eager"))),
    Round("a rule by K for that tier: at 65-128 rows per group a K of at most 4096 takes the 96-token tiles "
          "(tuning.SHORT_K; S2 and S2-dual have K = 2048, S1 7168); shipped in aca63ef, switched off in c2ab5a1 after "
          "the MoE layers it reached ran slower with it (notebook 11's rounds)", "aca63ef",
          "S2 and S2-dual as their 96-token arms in the A/B before, S1 and S1-dual unchanged; MoE layers: Mixtral-like "
          "T = 512 ~3% faster, DeepSeek-like T = 4096 ~1%",
          auto_at("aca63ef", ("S1", "S2", "S1-dual", "S2-dual"))),
    Round("`nvfp4lib tune` on S2 and S2-dual with the rule off (the 96-token arms are tuning candidates), then the "
          "auto call under that cache beside the host-scheduled kernel (data/tuned.jsonl)", "c2ab5a1",
          "tuning takes the 96-token arm on S2-dual (S2: either, they were within 1 us)",
          auto_at("c1ecaa4", ("S2", "S2-dual"), table="tuned")),
    Round("the 96-token tilings in 32-token steps (`vl_m128_t96_k128_s3_v32_e_o`, `vl_dual_m64_t96_k128_s3_v32_e_o`: "
          "128 rows split into two 64-token tiles instead of 96 + 32 padded to 96 each) against the shipped config, "
          "the 96-token once-wait arm and the host-scheduled kernel: per shape one process, the shipped config first "
          "and last, graph replay (and eager calls of the shipped config and the new arm)", "b8fb3ad",
          "graph replay S2 65.7 → ~65 us, S2-dual 128.4 → ~126.5, S1 131.7 → ~128 (still behind the shipped 120.7)",
          bench_ab("b8fb3ad", (("S1", "vl_m128_t256_k128_s3_v32_e_o", "vl_m128_t96_k128_s3_v32_e_o"),
                               ("S2", "vl_m128_t256_k128_s3_v32_e_o", "vl_m128_t96_k128_s3_v32_e_o"),
                               ("S1-dual", "vl_dual_m64_t256_k128_s3_v32_e", "vl_dual_m64_t96_k128_s3_v32_e_o"),
                               ("S2-dual", "vl_dual_m64_t256_k128_s3_v32_e", "vl_dual_m64_t96_k128_s3_v32_e_o")),
                   modes=("graph", "eager"))),
    Round("the dual tier of 65-128 rows per group takes the 96-token tiles in 32-token steps (tuning.DUAL_96); "
          "narrowed to up to 64 rows per group in 8dda376 after the MoE layers with 128 rows per expert ran slower "
          "with it (notebook 11's rounds), so S1-dual and S2-dual keep the 256-token tile unless tuned", "93846e4",
          "S1-dual and S2-dual as their arms in the A/B before (~215 and ~125 us in graph replay)",
          auto_at("93846e4", ("S1-dual", "S2-dual"))),
    Round("`nvfp4lib tune` on S1-dual and S2-dual with the dual tier narrowed (the 96-token forms are candidates), "
          "then the auto call under that cache beside the host-scheduled kernel (data/tuned.jsonl)", "a3a7d06",
          "tuning takes the 96-token form in 32-token steps on S2-dual (~125 us, level with the host-scheduled "
          "kernel) and the 256-token tile on S1-dual (their eager times in the A/B: 130.4 against 138.9, and 222.8 "
          "against 221.6)", auto_at("a3a7d06", ("S1-dual", "S2-dual"), table="tuned")),
    Round("the tile search by warp 0 alone, handed to the other warps in shared memory (`TILE_HANDOFF`; the search "
          "shortened too): ncu counted more warp instructions in the serving GEMM than in the host-scheduled one at "
          "the same tiling (the profiles above), and the SASS of both puts the added ones before the mainloop, in the "
          "tile search every warp ran. A/B in one process per shape: the auto call with the handoff, without it "
          "(`cute-hopper:handoff=0`), the host-scheduled kernel, then both again", "8ea0fce",
          "the GEMM's instructions within ~2% of the host-scheduled kernel's; graph replay S2 ~1 us faster (66.4 → "
          "~65.4, host-scheduled 65.0), S3 and S4 ~0.5 us, the duals alike",
          build_knob_ab("8ea0fce", "handoff", ("S1", "S2", "S3", "S4", "S1-dual", "S2-dual", "S3-dual", "S4-dual"))),
    Round("with the handoff, S2-dual the one shape still behind by default: dual GEMMs of K <= 2048 take the 96-token "
          "tiles in 32-token steps over the whole tier of 65-128 rows (`tuning.DUAL_96_K`; the tier's losses were at "
          "K = 4096 and 7168). A/B in one process: the auto call (the 256-token tile), the 96-token form, the "
          "host-scheduled kernel; shipped at 2048 after it and the MoE layers' A/B (notebook 11)", "aa522f9",
          "S2-dual ~124 us in graph replay (133.0 with the 256-token tile, host-scheduled 125.6)",
          bench_ab("aa522f9", (("S2-dual", "vl_dual_m64_t256_k128_s3_v32_e", "vl_dual_m64_t96_k128_s3_v32_e_o"),),
                   modes=("graph", "eager"))),
    Round("W4A4's weight decode without the block scale's x 2^7, the epilogue's factor carrying it (`kernel."
          "RAW_SCALE`: 8 fewer instructions per K tile; shipped after the MoE layers' A/B, notebook 11), then one "
          "process per shape: the auto call, the host-scheduled kernel, the auto call again", "034a790",
          "none written for these shapes before the run (the MoE A/B's was for the decode GEMMs)",
          auto_at("034a790", ("S1", "S2", "S3", "S4", "S1-dual", "S2-dual", "S3-dual", "S4-dual"), modes=("graph",))),
    Round("with the handoff, warp 0 waits at its barrier with the other warps (`kernel.HANDOFF_WAIT`: racecheck's "
          "reports on the plain GEMM came with its non-waiting arrival); one process: the auto call without it "
          "(`cute-hopper:graph=1,handoff_wait=0`) and with it", "3881c0e",
          "racecheck clean on the plain GEMM; every shape within 1%",
          build_knob_ab("3881c0e", "handoff_wait", ("S1", "S2", "S3", "S4", "S1-dual", "S2-dual", "S3-dual",
                                                   "S4-dual"))),
    Round("in the one-kernel call warp 0 meets the slices' barrier 2 with warps 1.. (`kernel.SLICE_BARRIER_ALL`: "
          "the fused kernel's last racecheck report); the call as one kernel in every form (`calls --fused-prologue "
          "on`), the knob off, then on, one process each", "f706c55",
          "racecheck clean on the fused kernel; times unchanged (warp 0 waits for the slices at the ring's barrier "
          "right after anyway)", calls_knob("slice_barrier_all")),
)


def rounds_table(src: Sources, rounds=ROUNDS) -> pd.DataFrame:
    """One line per round: the change, the prediction, the outcome computed from data/ (or 'not recorded in data/'
    and what measured it), the change's commit, and the runs the outcome rests on."""
    out = []
    for i, r in enumerate(rounds, 1):
        got = r.outcome(src) if r.outcome is not None else None
        if got is None:
            text = NOT_RECORDED + (f" ({r.measured_by})" if r.measured_by else "")
            runs = "—"
        else:
            text, run_ids = got
            runs = ", ".join(run_ids)
        out.append({"round": i, "change": r.change, "prediction": r.prediction, "outcome": text, "commit": r.commit,
                    "run": runs})
    return pd.DataFrame(out).set_index("round")
