"""Notebook 09's step table as data: for every step of the fast path, the measured numbers of the rows that back it.

The rows come from ``data/bench.jsonl`` (bench runs) and ``data/history.jsonl`` (the development logs migrated by
``tools/migrate_wip_logs.py``); which rows back which step is ``experiment.FAST_PATH`` (the configs of steps 0-9, the
development rounds of steps 10-30) plus :data:`BENCH_COMMITS` (the bench runs of the default, ``config="auto"``, that
a step's outcome refers to). Nothing here is typed from a log: every value is computed from the rows.
"""

from __future__ import annotations

import math
from statistics import median

import pandas as pd

from ..bench import store
from .experiment import FAST_PATH

__all__ = ["BENCH_COMMITS", "PREDICTED_US", "SHAPE_ORDER", "step_rows", "step_table", "run_summary", "fmt"]

# Bench runs of the v3 default (label cute-hopper[graph=True], kernel family hopper_rs) behind a step, by commit: the
# first default (step 14); before/after the commit that made the step's change (15, 20); the runs where `auto` timed
# the step's candidates (23), and the run at the step's commit (27, 30).
BENCH_COMMITS = {14: ("366aee7",), 15: ("366aee7", "b19f1e5"), 20: ("417d774", "84fac66"),
                 23: ("db91a56", "30f2014"), 27: ("146899c",), 30: ("c862942",)}

# The step table's predictions that named a time on a benchmark shape, by step and shape (typed when the step was
# planned, before its run: a prediction is not a measurement). The notebook prints each beside the step's measured time.
PREDICTED_US = {8: {"S1": 250.0}}

SHAPE_ORDER = ["S1", "S2", "S3", "S4", "S1-dual", "S2-dual", "S3-dual", "S4-dual"]
DEFAULT_LABEL = "cute-hopper[graph=True]"
NO_GPU = "GPU not recorded"


def fmt(values, digits: int = 1) -> str:
    """Median of ``values`` with its min-max when they differ (repeats in one log or run), as text."""
    v = sorted(float(x) for x in values if x is not None and not (isinstance(x, float) and math.isnan(x)))
    if not v:
        return ""
    m = f"{median(v):.{digits}f}"
    lo, hi = f"{v[0]:.{digits}f}", f"{v[-1]:.{digits}f}"
    return m if lo == hi else f"{m} ({lo}-{hi})"


def _gpu(r: dict) -> str:
    g = r.get("gpu")
    return g if isinstance(g, str) and g else NO_GPU


def _bench_source(r: dict) -> dict:
    return {"source": f"bench run {r['run_id']}", "commit": r["git_commit"][:7], "GPU": _gpu(r)}


def _hist_source(r: dict) -> dict:
    return {"source": "log " + r["source_log"].rsplit("/", 1)[-1], "commit": r["git_commit"][:7], "GPU": _gpu(r)}


def _bench_records(rows: list[dict], what: str) -> list[dict]:
    out = []
    for r in rows:
        src = _bench_source(r)
        cfg = r.get("info_config") or (r.get("options") or {}).get("config") or ""
        out.append({**src, "what": f"{what}: median us (graph replay)", "problem": r["problem"],
                    "value": r["median_us"], "digits": 1})
        out.append({**src, "what": f"{what}: x floor (floor of the same run)", "problem": r["problem"],
                    "value": r.get("ratio_to_floor"), "digits": 2})
        if cfg and what.startswith("default"):
            out.append({**src, "what": "default: tiling auto chose", "problem": r["problem"], "text": cfg})
    return out


def _config_rows(family: str, config: str, bench: list[dict]) -> list[dict]:
    """Steps 0-9: each shape's latest ok run of the step's config (what the chart of the steps plots)."""
    label = f"cute-hopper[config={config},graph=True]"
    rows = [r for r in bench if r.get("label") == label and r.get("kernel_family") == family
            and r.get("status") == "ok" and r.get("problem") in SHAPE_ORDER]
    latest = {}
    for r in sorted(rows, key=lambda r: r["run_id"]):
        latest[r["problem"]] = r
    return list(latest.values())


def _default_rows(commits: tuple[str, ...], bench: list[dict]) -> list[dict]:
    return [r for r in bench if r.get("label") == DEFAULT_LABEL and r.get("kernel_family") == "hopper_rs"
            and r.get("status") == "ok" and r.get("problem") in SHAPE_ORDER
            and any(r["git_commit"].startswith(c) for c in commits)]


def _variant(r: dict) -> str:
    extra = [f"{k}={r[k]}" for k in ("act_smem", "param_groups", "prefetch", "section") if k in r]
    return " ".join([r.get("config") or ""] + extra).strip()


def _history_records(rows: list[dict]) -> list[dict]:
    """One record per (log, variant, quantity, problem): the median (min-max) over the log's repeats."""
    groups: dict[tuple, list] = {}

    def add(r, what, problem, value, digits=1):
        key = (tuple(_hist_source(r).items()), what, problem, digits)
        groups.setdefault(key, []).append(value)

    checks: dict[tuple, list] = {}
    timeline: list[dict] = []
    for r in rows:
        kind, v = r["kind"], _variant(r)
        if kind == "profile span":
            add(r, f"{v}: kernel-time sum us", r["problem"], r.get("sum_us"))
            if r.get("span_us") is not None:
                add(r, f"{v}: span us", r["problem"], r["span_us"])
            for k, t in sorted((r.get("kernels_us") or {}).items()):
                add(r, f"{v}: {k} us", r["problem"], t)
        elif kind == "dev bench":
            add(r, f"{v}: median us (events, graph replay)", r["problem"], r.get("median_us"))
        elif kind == "k sweep":
            for q in ("full_us", "gemm_alone_us", "prologue_alone_us"):
                if r.get(q) is not None:
                    add(r, f"{v} K={r['k']}: {q.replace('_us', '')} us", r["problem"].split("-K")[0], r[q])
        elif kind == "launch":
            for q in ("graph_us", "direct_us", "flush_us"):
                if r.get(q) is not None:
                    add(r, f"launch: {q.replace('_us', '')} us", r["problem"], r[q])
        elif kind == "timeline":
            pts = r["points"]  # each stamp: (first, median, last CTA) in us from the first GEMM CTA's start
            for p in sorted(pts, key=lambda p: (pts[p][1], p)):
                if pts[p][0] >= 0:  # a stamp the kernel never wrote reads back as a huge negative time: skipped
                    lo, mid, hi = pts[p]
                    timeline.append({**_hist_source(r), "what": f"{v}: {p} at us, median CTA [first-last]",
                                     "problem": r["problem"], "text": f"{mid:.2f} [{lo:.2f}-{hi:.2f}]"})
        elif kind == "dev check":
            key = tuple(_hist_source(r).items())
            checks.setdefault(key, []).append(r)
    out = list(timeline)
    for (src, what, problem, digits), vals in groups.items():
        out.append({**dict(src), "what": what, "problem": problem, "value_list": vals, "digits": digits})
    for src, rs in checks.items():
        n = sum(r.get("cases", 1) for r in rs)
        bad = sum(r.get("failures", 0) if "cases" in r else int(r.get("check") != "ok") for r in rs)
        errs = [r.get("max_rel_err", r.get("rel_err")) for r in rs]
        errs = [e for e in errs if isinstance(e, (int, float))]
        failing = sorted({r.get("config") or "" for r in rs
                          if (r.get("failures", 0) if "cases" in r else int(r.get("check") != "ok"))})
        text = f"{n - bad} of {n} ok" + (f", max rel err {max(errs):.1e}" if errs else "")
        out.append({**dict(src), "what": "exactness checks", "problem": "checks",
                    "text": text + (f"; not ok: {', '.join(failing)}" if failing else "")})
    return out


def step_rows(step: int, bench: list[dict] | None = None, history: list[dict] | None = None) -> list[dict]:
    """The records (source, commit, GPU, what, problem, value) behind ``step``."""
    bench = store.read_rows(store.BENCH) if bench is None else bench
    history = store.read_rows(store.HISTORY) if history is None else history
    (_, family, config, dev, _title), = [s for s in FAST_PATH if s[0] == step]
    recs = []
    if config is not None:
        recs += _bench_records(_config_rows(family, config, bench), f"config {config}")
    if step in BENCH_COMMITS:
        recs += _bench_records(_default_rows(BENCH_COMMITS[step], bench), "default (auto)")
    recs += _history_records([r for r in history if r.get("round") in dev])
    return recs


def step_table(steps=None, bench=None, history=None) -> pd.DataFrame:
    """Every step's measured numbers: one row per (step, source, commit, GPU, quantity), one column per shape; cells
    are the median over the source's repeats with the min-max when they differ. Steps with no rows get one row
    saying so."""
    bench = store.read_rows(store.BENCH) if bench is None else bench
    history = store.read_rows(store.HISTORY) if history is None else history
    steps = [s[0] for s in FAST_PATH] if steps is None else steps
    out = []
    for step in steps:
        recs = step_rows(step, bench, history)
        if not recs:
            out.append({"step": step, "source": "no rows in data/", "commit": "", "GPU": "", "what": "",
                        "problem": "S1", "cell": ""})
        for r in recs:
            if "text" in r:
                cell = r["text"]
            else:
                cell = fmt(r.get("value_list", [r.get("value")]), r.get("digits", 1))
            out.append({"step": step, **{k: r[k] for k in ("source", "commit", "GPU", "what", "problem")},
                        "cell": cell})
    df = pd.DataFrame(out)
    index = ["step", "source", "commit", "GPU", "what"]
    t = df.pivot_table(index=index, columns="problem", values="cell", aggfunc="first", sort=False)
    cols = [c for c in SHAPE_ORDER if c in t.columns] + sorted(c for c in t.columns if c not in SHAPE_ORDER)
    t = t[cols].fillna("")
    t.columns.name = None
    return t


def run_summary(commit: str, bench: list[dict] | None = None) -> dict:
    """The default's rows in the bench run at ``commit`` with the fastest peer of the same run: per shape the time,
    the floor, its ratio, and the speedup over the fastest peer; plus the run's id, GPU and measured bf16 rate."""
    bench = store.read_rows(store.BENCH) if bench is None else bench
    mine = _default_rows((commit,), bench)
    if not mine:
        return {}
    rid = max(r["run_id"] for r in mine)
    run = [r for r in bench if r["run_id"] == rid and r.get("status") == "ok"]
    per = {}
    for r in (r for r in run if r.get("label") == DEFAULT_LABEL):
        peers = [q["median_us"] for q in run if q["problem"] == r["problem"] and not q["label"].startswith("cute-")]
        per[r["problem"]] = {"us": r["median_us"], "floor_us": r["floor_us"], "x_floor": r["ratio_to_floor"],
                             "fastest_peer": min((q for q in run if q["problem"] == r["problem"]
                                                  and not q["label"].startswith("cute-")),
                                                 key=lambda q: q["median_us"], default={}).get("label"),
                             "vs_fastest_peer": min(peers) / r["median_us"] if peers else float("nan")}
    return {"run_id": rid, "commit": mine[0]["git_commit"][:7], "gpu": _gpu(mine[0]),
            "bf16_tflops": mine[0].get("ceil_bf16_tflops"), "flops": {r["problem"]: r["flops"] for r in mine},
            "shapes": per}
