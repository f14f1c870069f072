"""What a call of the serving path costs, per call form: the tables and the figure of notebook 10.

Reads rows of ``data/calls.jsonl`` (written by :mod:`nvfp4lib.bench.calls`, one row per problem and call form) and, for
reference, the host-scheduled kernel's graph rows of ``data/bench.jsonl``. Pure pandas and matplotlib: no GPU.
Every time compared here is ``per_call_us`` (the larger of the GPU time and the host time of the call: what a caller
issuing calls back to back gets), the column issue 18's targets are stated on; both floors come from
:func:`nvfp4lib.bench.roofline.add_floors` (the measured floor of the row's own run, and the datasheet floor of its
GPU).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..bench.calls import CALLS
from ..bench.roofline import add_floors
from ..bench.store import HOPPER_KERNELS, dirty_state
from ..problems import GroupedProblem
from ..tuning import rule_knobs
from .plots import caption
from .plots import shown as _shown

__all__ = ["CALLS", "latest_calls", "missing_calls", "runs_used", "calls_table", "host_scheduled_reference",
           "serving_against_host", "floor_target", "ISSUE41_FLOOR_X", "weight_bytes", "predictions", "targets",
           "calls_figure", "back_to_back", "verdicts_by_run", "full_runs", "misses_by_shape", "host_correlation",
           "Verdict", "verdict", "eager_host_table", "shown", "calls_ab_runs", "TARGET_TEXT", "AUTO_NOT_SHIPPED",
           "rule_as_shipped", "at_defaults", "problem_names"]

# the kernel that scheduled its tiles on the host (prepare(a, b) built the tile table from each group's M): the
# graph times the serving kernel must stay within 10% of
HOST_SCHEDULED_KERNEL = HOPPER_KERNELS[2]
HOST_SCHEDULED_LABEL = "cute-hopper[graph=True]"


def problem_names(problems) -> list[str]:
    return [p.name if isinstance(p, GroupedProblem) else str(p) for p in problems]


def latest_calls(rows: pd.DataFrame, problems=None, backend: str = "cute-hopper") -> pd.DataFrame:
    """Of each (problem, call form) of ``backend``: the latest run with an ok row (latest: the largest run_id, which
    starts with the run's UTC time), and of its ok rows (one per round, :func:`nvfp4lib.bench.calls.bench_calls`) the
    one of the median ``per_call_us`` (the lower middle one of an even count), with ``rounds_ok``, ``rounds_not_ok``
    (rounds of that run whose row is not ok: a wrong result in any round shows here), ``per_call_min_us`` and
    ``per_call_max_us`` over its ok rounds, both floors and both ratios of ``per_call_us``: ``x_floor_measured``,
    ``x_floor_datasheet``. Ordered by ``problems`` (all problems present, if None), then by call form."""
    if rows is None or not len(rows):
        return pd.DataFrame()
    mine = shipped_calls(rows[rows["backend"] == backend])
    if problems is not None:
        mine = mine[mine["problem"].isin(problem_names(problems))]
    sel = mine[mine["status"] == "ok"]
    if not len(sel):
        return pd.DataFrame()
    keys = ["problem", "call"]
    sel = _median_rounds(sel[sel["run_id"] == sel.groupby(keys)["run_id"].transform("max")], keys)
    not_ok = mine[mine["status"] != "ok"].groupby(keys + ["run_id"]).size()
    sel = sel.assign(rounds_not_ok=[int(not_ok.get((p, c, r), 0)) for p, c, r in
                                    zip(sel["problem"], sel["call"], sel["run_id"])])
    out = add_floors(sel)
    # add_floors divides the GPU time; a host-bound call costs its host time: the targets are on per_call_us
    out["x_floor_measured"] = out["per_call_us"] / out["floor_measured_us"]
    out["x_floor_datasheet"] = out["per_call_us"] / out["floor_datasheet_us"]
    order = problem_names(problems) if problems is not None else list(dict.fromkeys(rows["problem"]))
    out["_p"] = out["problem"].map({p: i for i, p in enumerate(order)})
    out["_c"] = out["call"].map({c: i for i, c in enumerate(CALLS)}).fillna(len(CALLS))
    return out.sort_values(["_p", "_c"]).drop(columns=["_p", "_c"]).reset_index(drop=True)


def shipped_calls(rows: pd.DataFrame) -> pd.DataFrame:
    """The calls rows that ran the kernel as the package ships it now: each knob of
    :func:`.kernels.hopper_varlen.kernel.call_knobs` and :func:`nvfp4lib.tuning.rule_knobs` equal to its default, or
    absent (rows from before the knob, which came in on 2026-11-27), and no config from a tuning cache. A knob's A/B
    (every run of a commit whose runs set the knob both ways, the shipped side too: short alternating runs,
    :func:`knob_ab`) stays out of the headline."""
    from ..kernels.hopper_varlen import kernel

    defaults = {**kernel.call_knobs(), **rule_knobs()}
    keep = pd.Series(True, index=rows.index)
    for knob in defaults:
        if knob in rows:
            keep &= rows.groupby("git_commit")[knob].transform("nunique") <= 1
    return rule_as_shipped(at_defaults(rows[keep], kernel.call_knobs()))  # (the rule's knobs: rule_as_shipped)


def _ok_shipped(rows: pd.DataFrame, problems, backend: str, clean_only: bool = True) -> pd.DataFrame:
    """The ok rows of ``backend`` on ``problems`` that ran the kernel as shipped (:func:`shipped_calls`), without the
    runs of a dirty tree (``clean_only``)."""
    sel = shipped_calls(rows[(rows["status"] == "ok") & (rows["backend"] == backend)
                             & rows["problem"].isin(problem_names(problems))])
    if clean_only and "git_dirty" in sel:
        sel = sel[~sel["git_dirty"].fillna(False).astype(bool)]
    return sel


def rule_as_shipped(rows: pd.DataFrame, prefix: str = "") -> pd.DataFrame:
    """The rows whose config="auto" took the shape rule as shipped now: not a tuning cache's choice (``choice``
    "tuned"), each knob of :func:`nvfp4lib.tuning.rule_knobs` at its value now, and of its kind (a knob that was an
    on/off switch before it took a number, as ``dual_96``: True is not the number 1); rows from before those fields
    (absent or NaN) stay. A row with a knob set otherwise stays too where that did not change its problem's config:
    its ``config`` is the one the rule picks now (:func:`rule_config`; e.g. a dual rule by K on a single GEMM).
    ``prefix``: the knobs' prefix (bench rows carry them as ``info_*``)."""
    keep = pd.Series(True, index=rows.index)
    if prefix + "choice" in rows:
        keep &= rows[prefix + "choice"].ne("tuned")
    knobs = pd.Series(True, index=rows.index)
    for knob, value in rule_knobs().items():
        if prefix + knob in rows:
            col = rows[prefix + knob]
            is_bool = isinstance(value, bool)
            same_kind = col.map(lambda v, b=is_bool: isinstance(v, (bool, np.bool_)) == b)
            knobs &= col.isna() | ((col == value) & same_kind)
    if "config" in rows and "problem" in rows:
        knobs |= rows["config"].astype(str) == rows["problem"].map(lambda p: rule_config(p) if isinstance(p, str)
                                                                     else None)
    return rows[keep & knobs]


def at_defaults(rows: pd.DataFrame, defaults: dict) -> pd.DataFrame:
    """The rows whose knobs (the keys of ``defaults``, where ``rows`` has them) equal the default value or are
    absent (rows recorded before the knob existed)."""
    keep = pd.Series(True, index=rows.index)
    for knob, value in defaults.items():
        if knob in rows:
            keep &= rows[knob].isna() | (rows[knob] == value)
    return rows[keep]


def knob_ab(rows: pd.DataFrame, knob: str = "fused_prologue", problems=None, backend: str = "cute-hopper"):
    """A calls knob's A/B: of the latest commit with ok rows of both settings of ``knob``, per (problem, call) the
    median over all its rounds and runs of each setting's per-call, GPU and host time, and on - off. Runs of both
    settings alternate on one machine when recorded by one command (see notebook 10). Empty without such rows."""
    if rows is None or not len(rows) or knob not in rows:
        return pd.DataFrame()
    sel = rows[(rows["status"] == "ok") & (rows["backend"] == backend) & rows[knob].notna()]
    if problems is not None:
        sel = sel[sel["problem"].isin(problem_names(problems))]
    both = sel.groupby("git_commit")[knob].nunique()
    both = both[both == 2]
    if not len(both):
        return pd.DataFrame()
    last = sel[sel["git_commit"].isin(both.index)].sort_values("run_id")["git_commit"].iloc[-1]
    sel = sel[sel["git_commit"] == last]
    t = sel.pivot_table(index=["problem", "call"], columns=knob, values=["per_call_us", "median_us", "host_us"],
                        aggfunc="median", sort=False)
    out = pd.DataFrame({"commit": str(last)[:7], "runs": sel.groupby(["problem", "call"])["run_id"].nunique()})
    for col, name in (("per_call_us", "per call"), ("median_us", "GPU"), ("host_us", "host")):
        out[f"{name} off"], out[f"{name} on"] = t[(col, 0)], t[(col, 1)]
        out[f"{name} on - off"] = t[(col, 1)] - t[(col, 0)]
    order = [(p, c) for p in (problem_names(problems) if problems is not None else dict.fromkeys(sel["problem"]))
             for c in CALLS if (p, c) in out.index]
    return out.reindex(order)


def _median_rounds(sel: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per group of ``keys``, the row of the median ``per_call_us`` (the lower middle one of an even count, as
    :func:`nvfp4lib.bench.calls.median_round` picks it), with ``rounds_ok`` (the group's rows), ``per_call_min_us`` and
    ``per_call_max_us``."""
    sel = sel.sort_values(keys + ["per_call_us"], kind="stable")
    by = sel.groupby(keys, sort=False)["per_call_us"]
    sel = sel.assign(rounds_ok=by.transform("size"), per_call_min_us=by.transform("min"),
                     per_call_max_us=by.transform("max"))
    return sel[sel.groupby(keys, sort=False).cumcount() == (sel["rounds_ok"] - 1) // 2]


def missing_calls(rows: pd.DataFrame, problems, calls=CALLS, backend: str = "cute-hopper") -> pd.DataFrame:
    """The (problem, call form) pairs without an ok row, each with the status of its latest row (why it is
    missing), or 'never run'."""
    have = latest_calls(rows, problems, backend)
    done = set(zip(have["problem"], have["call"])) if len(have) else set()
    sel = rows[rows["backend"] == backend] if rows is not None and len(rows) else pd.DataFrame()
    out = []
    for p in problem_names(problems):
        for c in calls:
            if (p, c) in done:
                continue
            r = sel[(sel["problem"] == p) & (sel["call"] == c)] if len(sel) else sel
            last = r.sort_values("run_id").iloc[-1] if len(r) else None
            out.append({"problem": p, "call": c, "latest run": None if last is None else last["run_id"],
                        "status": "never run" if last is None else last["status"]})
    return pd.DataFrame(out, columns=["problem", "call", "latest run", "status"])


HOST_STATE = {"host_probe_idle_us": "host probe us (GPU idle)", "host_probe_busy_us": "host probe us (GPU busy)",
              "host_load_1m": "host load 1 min"}  # calls.host_probe's fields (None in runs recorded before them)


def runs_used(latest: pd.DataFrame) -> pd.DataFrame:
    """One line per run that supplied rows of ``latest``: its commit, date, GPU, inputs, what it supplied, and the
    host's state in it (:func:`nvfp4lib.bench.calls.host_probe`)."""
    if not len(latest):
        return pd.DataFrame()
    out = []
    for run, g in latest.groupby("run_id"):
        first = g.iloc[0]
        amended = first.get("amended")
        out.append({"run_id": run, "git_commit": str(first["git_commit"])[:7],
                    "dirty tree": dirty_state(first.get("git_dirty")), "date": str(first["date"])[:16],
                    "gpu": first["gpu"], "inputs": first["input_mode"], "iters": int(first["iters"]),
                    "rounds": int(first["rounds"]) if pd.notna(first.get("rounds", np.nan)) else 1,
                    "forms": ", ".join(c for c in CALLS if c in set(g["call"])),
                    "problems": ", ".join(dict.fromkeys(g["problem"])),
                    "provenance amended": isinstance(amended, list) and len(amended) > 0,
                    **{name: first.get(key) for key, name in HOST_STATE.items()}})
    return pd.DataFrame(out).set_index("run_id")


def history(rows: pd.DataFrame, problems, backend: str = "cute-hopper", clean_only: bool = True) -> pd.DataFrame:
    """Per-call time (µs) of every (problem, call form), one column per recorded run (``commit date``, oldest first;
    a run of several rounds: its median round): how each change moved each form. ``clean_only`` drops runs of a dirty
    tree."""
    if rows is None or not len(rows):
        return pd.DataFrame()
    sel = _ok_shipped(rows, problems, backend, clean_only)
    if not len(sel):
        return pd.DataFrame()
    sel = _median_rounds(sel, ["run_id", "problem", "call"])  # a run of several rounds: its median round
    sel = sel.assign(run=sel["git_commit"].astype(str).str[:7] + " " + sel["date"].astype(str).str[:10])
    t = sel.sort_values("run_id").pivot_table(index=["problem", "call"], columns="run", values="per_call_us",
                                              aggfunc="last", sort=False)
    order = [(p, c) for p in problem_names(problems) for c in CALLS if (p, c) in t.index]
    return t.reindex(order)[list(dict.fromkeys(sel.sort_values("run_id")["run"]))]


def calls_table(latest: pd.DataFrame) -> pd.DataFrame:
    """``latest`` as a table indexed by (problem, call): per-call time (the median round) and the rounds' range, GPU
    and host time, both floors and both ratios, and the run, commit and input mode each row came from."""
    if not len(latest):
        return pd.DataFrame()
    t = latest.set_index(["problem", "call"])
    t = t.assign(**{"host-bound": t["host_us"] > t["median_us"], "commit": t["git_commit"].str[:7]})
    if "b2b_us" not in t:  # rows recorded before back-to-back timing existed
        t = t.assign(b2b_us=np.nan)
    cols = {"per_call_us": "per call us", "per_call_min_us": "rounds' min us", "per_call_max_us": "rounds' max us",
            "rounds_ok": "rounds", "rounds_not_ok": "rounds not ok", "median_us": "GPU us", "host_us": "host us",
            "host-bound": "host-bound",
            "b2b_us": "back-to-back us",
            "floor_measured_us": "measured floor us", "x_floor_measured": "x measured floor",
            "floor_datasheet_us": "datasheet floor us", "x_floor_datasheet": "x datasheet floor",
            "config": "config", "run_id": "run", "commit": "commit", "input_mode": "inputs"}
    return t[list(cols)].rename(columns=cols)


def back_to_back(latest: pd.DataFrame) -> pd.DataFrame:
    """Per shape (rows of ``latest`` that have ``b2b_us``): each form's cost issued back to back (a loop of calls, one
    synchronisation at the end), the graph replay's, the eager form's per-call time (its event started on an idle
    GPU), and back-to-back eager over graph."""
    if not len(latest) or "b2b_us" not in latest:
        return pd.DataFrame()
    t = latest.dropna(subset=["b2b_us"]).pivot_table(index="problem", columns="call", values="b2b_us", sort=False)
    out = t.rename(columns=lambda c: f"{c} back-to-back us")
    per_call = latest.set_index(["problem", "call"])["per_call_us"]
    if "eager" in t and "graph" in t:
        out["eager per call us"] = [per_call.get((p, "eager"), np.nan) for p in out.index]
        out["eager / graph, back to back"] = t["eager"] / t["graph"]
    return out


def calls_ab_runs(rows: pd.DataFrame, before: str, after: str, call: str = "oneshot") -> pd.Series:
    """The runs :func:`calls_ab` compares (index: run id, oldest first; value: 'before' or 'after'), empty if none."""
    if rows is None or not len(rows):
        return pd.Series(dtype=object)
    ok = rows[rows["status"] == "ok"]
    runs = ok.groupby("run_id").agg(alone=("call", lambda c: set(c) == {call}), commit=("git_commit", "first"))
    com = runs["commit"].astype(str)
    runs["side"] = np.where(com.str.startswith(before), "before", np.where(com.str.startswith(after), "after", ""))
    member = runs["alone"] & (runs["side"] != "")
    runs["block"] = (~member).cumsum()  # (run ids sort by time)
    full = [b for b, g in runs[member].groupby("block") if set(g["side"]) == {"before", "after"}]
    if not full:
        return pd.Series(dtype=object)
    return runs.loc[member & (runs["block"] == full[-1]), "side"]


def calls_ab(rows: pd.DataFrame, before: str, after: str, call: str = "oneshot", problems=None) -> pd.DataFrame:
    """One call form at two commits, measured alternately on one machine: the latest unbroken sequence of runs of
    ``data/calls.jsonl`` that timed that form alone at either commit (a run of anything else ends a sequence: the
    lent machines share one host name), per problem the median over its runs of each commit's per-call, host and
    back-to-back times, and the per-call time after / before. Empty without such a sequence holding both commits."""
    runs = calls_ab_runs(rows, before, after, call)
    if not len(runs):
        return pd.DataFrame()
    ok = rows[rows["status"] == "ok"]
    sel = ok[ok["run_id"].isin(runs.index)].assign(side=lambda r: r["run_id"].map(runs))
    g = sel.groupby(["problem", "side"])
    cols = {}
    for value, name in (("per_call_us", "per call"), ("host_us", "host"), ("b2b_us", "back to back")):
        t = g[value].median().unstack("side")
        cols[f"{name} {before}"], cols[f"{name} {after}"] = t["before"], t["after"]
    out = pd.DataFrame(cols)
    out["per call after / before"] = out[f"per call {after}"] / out[f"per call {before}"]
    out["runs"] = g["run_id"].nunique().unstack("side").min(axis=1)
    order = problem_names(problems) if problems is not None else list(dict.fromkeys(sel["problem"]))
    return out.reindex([p for p in order if p in out.index])


def host_scheduled_reference(bench_rows: pd.DataFrame, problems) -> pd.DataFrame:
    """The host-scheduled kernel's CUDA-graph times (``data/bench.jsonl``, label ``cute-hopper[graph=True]``, kernel
    ``swap-AB register decode``): the latest run that timed every one of ``problems``, indexed by problem, with its
    run, commit and config. Empty if no run qualifies."""
    if bench_rows is None or not len(bench_rows):
        return pd.DataFrame()
    want = problem_names(problems)
    sel = bench_rows[(bench_rows["label"] == HOST_SCHEDULED_LABEL) & (bench_rows["status"] == "ok")
                     & (bench_rows["kernel"] == HOST_SCHEDULED_KERNEL) & bench_rows["problem"].isin(want)]
    runs = [r for r, g in sel.groupby("run_id") if set(want) <= set(g["problem"])]
    if not runs:
        return pd.DataFrame()
    run = sel[sel["run_id"] == max(runs)].set_index("problem").loc[want]
    return pd.DataFrame({"graph us": run["median_us"], "run": run["run_id"], "commit": run["git_commit"].str[:7],
                         "config": run["info_config"]})


def weight_bytes(problem: GroupedProblem) -> int:
    """The NVFP4 weight bytes of ``problem`` (codes, 0.5 B per element, and E4M3 scales, 1 B per 16; both weight
    matrices of a dual problem): what a prepack reads once and writes once."""
    return problem.n_b * sum(n * k // 2 + n * k // 16 for n, k in zip(problem.n, problem.k))


def _per_call(latest: pd.DataFrame, problem: str, call: str) -> float:
    r = latest[(latest["problem"] == problem) & (latest["call"] == call)] if len(latest) else latest
    return float(r["per_call_us"].iloc[0]) if len(r) else float("nan")


def predictions(latest: pd.DataFrame, problems, launches: int, launch_us: float) -> pd.DataFrame:
    """The predictions written before the measurement, made numeric from the measured times they build on:
    the eager call's host time = ``launches`` x ``launch_us``; eager = graph + that; oneshot = eager + one pass over
    the weights (read and write of :func:`weight_bytes` at the copy bandwidth measured in the same run as the
    oneshot row); harness = oneshot (single GEMMs). Each (``call``: the form, or 'eager host' for the host time)
    beside the measured time and measured / predicted."""
    out = []
    for p in problems:
        graph, eager, oneshot = (_per_call(latest, p.name, c) for c in ("graph", "eager", "oneshot"))
        r = latest[(latest["problem"] == p.name) & (latest["call"] == "eager")] if len(latest) else latest
        eager_host = float(r["host_us"].iloc[0]) if len(r) else float("nan")
        r = latest[(latest["problem"] == p.name) & (latest["call"] == "oneshot")] if len(latest) else latest
        weight_pass = 2 * weight_bytes(p) / (float(r["ceil_copy_gbps"].iloc[0]) * 1e3) if len(r) else float("nan")
        pred = {"eager host": (launches * launch_us, eager_host), "eager": (graph + launches * launch_us, eager),
                "oneshot": (eager + weight_pass, oneshot)}
        if not p.dual:  # the harness's dual task is one GEMM: a grouped dual problem has no harness form
            pred["harness"] = (oneshot, _per_call(latest, p.name, "harness"))
        for call, (want, got) in pred.items():
            out.append({"problem": p.name, "call": call, "predicted us": want, "measured us": got,
                        "measured / predicted": got / want})
    return pd.DataFrame(out).set_index(["problem", "call"])


def targets(latest: pd.DataFrame, problems, reference: pd.DataFrame | None = None) -> pd.DataFrame:
    """Issue 18's targets per problem, on ``per_call_us``: graph within 10% of the host-scheduled kernel's graph
    time (where ``reference`` has it), eager <= 1.1 x graph + 10 us, oneshot <= 2 x eager + 20 us, harness below the
    study's B200 baseline (single GEMMs that have one: S1-S4). Verdict 'holds', 'misses', or 'no data'."""
    out = []

    def add(p, target, measured, limit, strict=False):
        if np.isnan(measured) or np.isnan(limit):
            verdict = "no data"
        else:
            verdict = "holds" if (measured < limit if strict else measured <= limit) else "misses"
        out.append({"problem": p, "target": target, "measured us": measured, "limit us": limit,
                    "measured / limit": measured / limit, "verdict": verdict})

    for p in problems:
        graph, eager, oneshot, harness = (_per_call(latest, p.name, c) for c in CALLS)
        if reference is not None and len(reference) and p.name in reference.index:
            add(p.name, "graph <= 1.1 x host-scheduled graph", graph, 1.1 * float(reference.loc[p.name, "graph us"]))
        add(p.name, "eager <= 1.1 x graph + 10 us", eager, 1.1 * graph + 10)
        add(p.name, "oneshot <= 2 x eager + 20 us", oneshot, 2 * eager + 20)
        if p.b200_baseline_us is not None and not p.dual:  # the baseline was measured on the single GEMMs
            add(p.name, "harness < B200 baseline", harness, float(p.b200_baseline_us), strict=True)
    return pd.DataFrame(out).set_index(["problem", "target"])


def full_runs(rows: pd.DataFrame, problems, backend: str = "cute-hopper") -> list[str]:
    """The recorded runs (oldest first) that timed the graph, eager and one-shot forms of every one of ``problems`` with
    the kernel as shipped, on a clean tree: the runs a verdict on all of issue 18's targets can come from."""
    if rows is None or not len(rows):
        return []
    names = set(problem_names(problems))
    sel = _ok_shipped(rows, problems, backend)
    return [run for run, g in sel.groupby("run_id", sort=True)
            if set(g["problem"]) == names and all(names <= set(g.loc[g["call"] == c, "problem"])
                                                  for c in ("graph", "eager", "oneshot"))]


def verdicts_by_run(rows: pd.DataFrame, problems, reference: pd.DataFrame | None = None,
                    backend: str = "cute-hopper") -> pd.DataFrame:
    """Per recorded run that timed the graph, eager and one-shot forms of every problem (as shipped, clean tree): how
    many of :func:`targets` held, per target, beside the host's state in that run: the Python probe
    (:func:`nvfp4lib.bench.calls.host_probe`) and the median host µs of the run's graph replays and eager calls, which
    follow the speed of the host's launch path (driver calls), which the probe does not time."""
    out = []
    for run, g, t in _judged_runs(rows, problems, reference, backend):
        t = t.reset_index()
        t = t[t["verdict"] != "no data"]
        rec = {"run": run, "commit": str(g["git_commit"].iloc[0])[:7], "date": str(g["date"].iloc[0])[:16],
               "rounds": int(g["round"].nunique()) if "round" in g and g["round"].notna().any() else 1}
        for kind, v in t.groupby(t["target"].str.split().str[0], sort=False)["verdict"]:
            rec[kind] = f"{int((v == 'holds').sum())} of {len(v)}"
        rec["host probe us"] = g["host_probe_idle_us"].iloc[0] if "host_probe_idle_us" in g else np.nan
        for call in ("graph", "eager"):
            rec[f"{call} host us"] = float(g.loc[g["call"] == call, "host_us"].median())
        out.append(rec)
    return pd.DataFrame(out).set_index("run") if out else pd.DataFrame()


def _judged_runs(rows: pd.DataFrame, problems, reference: pd.DataFrame | None, backend: str):
    """(run id, the run's ok shipped rows, its :func:`targets`) of each of :func:`full_runs`, oldest first."""
    if rows is None or not len(rows):
        return
    sel = _ok_shipped(rows, problems, backend)
    sel = sel[sel["run_id"].isin(full_runs(rows, problems, backend))]
    for run, g in sel.groupby("run_id", sort=True):
        yield run, g, targets(latest_calls(g, problems, backend), problems, reference)


def misses_by_shape(rows: pd.DataFrame, problems, reference: pd.DataFrame | None = None,
                    backend: str = "cute-hopper") -> pd.DataFrame:
    """Per problem and target form, over every one of :func:`full_runs`: in how many runs the target missed, of the
    runs that judged it ('3 of 27'), and the commit of the latest run where it missed ('—' if it never did)."""
    recs = []
    for run, g, t in _judged_runs(rows, problems, reference, backend):
        for (problem, target), v in t["verdict"].items():
            if v != "no data":
                recs.append({"problem": problem, "form": target.split()[0], "run": run, "missed": v == "misses",
                             "commit": str(g["git_commit"].iloc[0])[:7]})
    if not recs:
        return pd.DataFrame()
    df = pd.DataFrame(recs)
    out = {}
    for (problem, form), g in df.groupby(["problem", "form"], sort=False):
        last = g[g["missed"]].sort_values("run")["commit"]
        out.setdefault(problem, {})[f"{form} missed"] = f"{int(g['missed'].sum())} of {len(g)}"
        out[problem][f"{form} last missed at"] = last.iloc[-1] if len(last) else "—"
    t = pd.DataFrame.from_dict(out, orient="index")
    cols = [f"{c} {w}" for c in CALLS for w in ("missed", "last missed at") if f"{c} {w}" in t]
    return t.reindex(index=[p for p in problem_names(problems) if p in t.index], columns=cols).fillna("—")


def host_correlation(verdicts: pd.DataFrame) -> pd.DataFrame:
    """Across the runs of :func:`verdicts_by_run`: per target form, the rank (Spearman) correlation of the number of
    shapes on which it held with the run's median host time of its eager calls and of its graph replays (negative:
    the slower the host, the fewer held), and how many runs it rests on."""
    if not len(verdicts):
        return pd.DataFrame()
    out = {}
    for form in (c for c in CALLS if c in verdicts):
        held = verdicts[form].dropna().str.split().str[0].astype(int)
        out[form] = {"runs": len(held)}
        for c in ("eager", "graph"):
            host = verdicts.loc[held.index, f"{c} host us"]
            # (a constant column has no rank correlation: left missing, shown as '—')
            out[form][f"vs {c} host us"] = (held.corr(host, method="spearman")
                                            if held.nunique() > 1 and host.nunique() > 1 else np.nan)
    return pd.DataFrame.from_dict(out, orient="index")


# issue 18's targets as :func:`targets` judges them (each at most 50 characters: pandas shows it whole)
TARGET_TEXT = {"graph": "graph <= 1.1 x host-scheduled kernel's graph", "eager": "eager <= 1.1 x graph + 10 us",
               "oneshot": "oneshot <= 2 x eager + 20 us", "harness": "harness < the study's B200 baseline"}


@dataclass(frozen=True)
class Verdict:
    """The answer of notebook 10: one run's four call forms per problem against both floors and issue 18's targets.
    ``latest``: the run's :func:`latest_calls`; ``table``: one row per (problem, call); ``held``: per target form,
    the shapes it held on and the shapes judged; ``later``: runs recorded after it that did not time every form."""
    run: str
    commit: str
    date: str
    latest: pd.DataFrame
    table: pd.DataFrame
    held: dict
    later: list
    reference: pd.DataFrame | None = None

    def lines(self) -> list[str]:
        """The verdict as the notebook prints it above its tables."""
        first = self.latest.iloc[0]
        rounds = int(first["rounds"]) if pd.notna(first.get("rounds", np.nan)) else 1
        n_held, n = sum(h for h, _ in self.held.values()), sum(k for _, k in self.held.values())
        out = [f"run {self.run} at commit {self.commit} ({self.date} UTC), data/calls.jsonl",
               f"GPU: {first['gpu']} (SM clock {first.get('smi_clocks_sm', '?')} of max "
               f"{first.get('smi_clocks_max_sm', '?')}, driver {first.get('smi_driver_version', '?')}); "
               f"{rounds} rounds per form, each form judged by its median round; inputs: {first['input_mode']}",
               f"issue 18's targets held: {n_held} of {n}"]
        missed = self.table[self.table["verdict"] == "misses"]
        for (p, c), r in missed.iterrows():
            out.append(f"missed: {p} {c}, {r['per call us']:.2f} us against {r['limit us']:.2f}")
        out.append(f"rounds whose result did not match the exact reference: {int(self.latest['rounds_not_ok'].sum())}")
        ref = self.reference
        if ref is not None and len(ref):
            out.append(f"the graph target's host-scheduled kernel: run {ref['run'].iloc[0]} at "
                       f"{ref['commit'].iloc[0]}, data/bench.jsonl")
        if self.later:
            out.append(f"later runs not judged here (some forms or shapes only, a dirty tree, or a knob's A/B): "
                       f"{len(self.later)}, the latest {self.later[-1]}")
        return out

    def summary(self) -> pd.DataFrame:
        """Per target form: the target, on how many shapes it held, and the shape closest to its limit."""
        judged = self.table[self.table["verdict"].isin(["holds", "misses"])]
        out = {}
        for form, (held, n) in self.held.items():
            g = judged.xs(form, level="call")["per call / limit"]
            out[form] = {"target": TARGET_TEXT[form], "held on": f"{held} of {n}", "closest to its limit": g.idxmax(),
                         "its per call / limit": g.max()}
        return pd.DataFrame.from_dict(out, orient="index").rename_axis("form")


def verdict(rows: pd.DataFrame, problems, reference: pd.DataFrame | None = None, run: str | None = None,
            backend: str = "cute-hopper") -> Verdict | None:
    """The verdict at ``run`` (default: the latest of :func:`full_runs`), or None without such a run."""
    runs = full_runs(rows, problems, backend)
    if run is None:
        if not runs:
            return None
        run = runs[-1]
    sel = rows[rows["run_id"] == run]
    latest = latest_calls(sel, problems, backend)
    if not len(latest):
        return None
    tg = targets(latest, problems, reference).reset_index()
    tg["call"] = tg["target"].str.split().str[0]
    t = latest.set_index(["problem", "call"])
    limits = tg.set_index(["problem", "call"])
    table = pd.DataFrame({"per call us": t["per_call_us"], "GPU us": t["median_us"], "host us": t["host_us"],
                          "measured floor us": t["floor_measured_us"], "x measured floor": t["x_floor_measured"],
                          "datasheet floor us": t["floor_datasheet_us"], "x datasheet floor": t["x_floor_datasheet"]})
    table["limit us"] = limits["limit us"].reindex(table.index)
    table["per call / limit"] = limits["measured / limit"].reindex(table.index)
    table["verdict"] = limits["verdict"].reindex(table.index).fillna("no target")
    held = {}
    for form, g in tg[tg["verdict"] != "no data"].groupby("call", sort=False):
        held[form] = (int((g["verdict"] == "holds").sum()), len(g))
    later = sorted(r for r in set(rows.loc[rows["run_id"] > run, "run_id"]) if r not in runs)
    return Verdict(run=run, commit=str(sel["git_commit"].iloc[0])[:7], date=str(sel["date"].iloc[0])[:16],
                   latest=latest, table=table, held=held, later=later, reference=reference)


DUAL_TUPLE_TARGET = 2.0  # issue 41: the dual tuple's time per call at most this times the group tuple's, same size


def task_tuples(rows: pd.DataFrame, problems=None) -> pd.DataFrame:
    """The GPU MODE tuples at one size (``calls --suite task --call harness``): per task shape, the group tuple's
    (``compat.custom_kernel``, one GEMM) and the dual tuple's (``compat.custom_kernel_dual``) time per call from the
    latest run that timed both (each its median round, L2 flushed), back to back too, and their ratio against
    :data:`DUAL_TUPLE_TARGET`; ``exact``: every round of both checked ok against the reference."""
    from ..problems import TASK

    problems = problems or TASK
    if rows is None or not len(rows):
        return pd.DataFrame()
    names = [n for p in problems for n in (p.name, f"{p.name}-dual")]
    h = rows[(rows["call"] == "harness") & rows["problem"].isin(names)]
    out = []
    for p in problems:
        both = h[h["problem"].isin([p.name, f"{p.name}-dual"])]
        ok = both[both["status"] == "ok"]
        runs = [r for r in sorted(set(ok["run_id"]), reverse=True) if ok[ok["run_id"] == r]["problem"].nunique() == 2]
        if not runs:
            continue
        run = both[both["run_id"] == runs[0]]
        med = _median_rounds(run[run["status"] == "ok"], ["problem"]).set_index("problem")
        g, d = med.loc[p.name], med.loc[f"{p.name}-dual"]
        out.append({"shape": p.name, "M x N x K": f"{p.m[0]} x {p.n[0]} x {p.k[0]}",
                    "group tuple us": g["per_call_us"], "dual tuple us": d["per_call_us"],
                    "group b2b us": g["b2b_us"], "dual b2b us": d["b2b_us"],
                    "dual / group": d["per_call_us"] / g["per_call_us"],
                    f"<= {DUAL_TUPLE_TARGET:g}x": d["per_call_us"] <= DUAL_TUPLE_TARGET * g["per_call_us"],
                    "exact": bool((run["status"] == "ok").all()), "rounds": int(min(g["rounds_ok"], d["rounds_ok"])),
                    "gpu": d["gpu"], "commit": str(d["git_commit"])[:7], "run": runs[0]})
    return pd.DataFrame(out)


ISSUE41_FLOOR_X = 1.5  # issue 41: the serving kernel's graph replay within this of the measured floor


def floor_target(latest: pd.DataFrame) -> pd.DataFrame:
    """Issue 41's second kernel target on a calls run's latest rows (:func:`latest_calls`): per problem, the graph
    replay's time over the measured floor (the same run's bf16 matmul rate and copy bandwidth) against
    :data:`ISSUE41_FLOOR_X`."""
    if latest is None or not len(latest):
        return pd.DataFrame()
    g = latest[latest["call"] == "graph"].set_index("problem")
    out = pd.DataFrame({"graph us": g["per_call_us"], "measured floor us": g["floor_measured_us"],
                        "x measured floor": g["x_floor_measured"]})
    out[f"<= {ISSUE41_FLOOR_X:g}x (issue 41)"] = out["x measured floor"] <= ISSUE41_FLOOR_X
    return out


# Commits at which config="auto" chose by a rule that is not shipped now: their auto rows are an arm of that rule's
# A/B, not the serving kernel as shipped (serving_against_host leaves them out; notebook 10's rounds show them)
AUTO_NOT_SHIPPED = {"aca63ef": "tuning.SHORT_K on (96-token tiles for K <= 4096 at 65-128 rows per group); off again "
                               "from c2ab5a1"}


def rule_config(problem: str) -> str | None:
    """The config the shape rule as set now picks for a study problem's call on a cache miss
    (:func:`nvfp4lib.serving.rule_choice`); None for a problem that is not one group shape (N and K shared) or not
    known. Remembered per problem and rule knobs (:func:`nvfp4lib.tuning.rule_knobs`: a knob set otherwise, as tests
    and A/B arms do, gets its own answer)."""
    return _rule_config(problem, tuple(sorted(rule_knobs().items())))


@functools.cache
def _rule_config(problem: str, knobs: tuple) -> str | None:
    from ..problems import get_problem
    from ..serving import rule_choice

    try:
        p = get_problem(problem)
    except (KeyError, ValueError):
        return None
    if len(set(p.n)) != 1 or len(set(p.k)) != 1:
        return None
    return rule_choice(p.dual, len(p.m), p.n[0], p.k[0], sum(p.m))


def serving_against_host(bench_rows: pd.DataFrame, problems=None, gpu: str | None = None) -> pd.DataFrame:
    """Issue 41's first target, from ``data/bench.jsonl``: per problem, the latest run that replayed both the serving
    kernel as shipped (``cute-hopper:graph=1``, its ``auto`` config) and a host-scheduled config (``rs_*``) in CUDA
    graphs in one process; each's median over that run's rows (a run may time the serving kernel before and after
    the other, to show drift), their ratio and whether the serving kernel is at most as slow (target: ratio <= 1).
    Runs at a commit of :data:`AUTO_NOT_SHIPPED`, under a tuning cache or with another shape rule
    (:func:`rule_as_shipped`) do not count.
    ``gpu``: only runs on a card whose name contains it (None: the latest run on any card)."""
    if bench_rows is None or not len(bench_rows) or "options" not in bench_rows:
        return pd.DataFrame()
    ok = bench_rows[(bench_rows["status"] == "ok") & (bench_rows["backend"] == "cute-hopper")]
    if gpu is not None:
        ok = ok[ok["gpu"].astype(str).str.contains(gpu, regex=False)]
    opts = ok["options"].apply(lambda o: o if isinstance(o, dict) else {})
    ok = ok[opts.apply(lambda o: bool(o.get("graph")))]
    named = opts.loc[ok.index].apply(lambda o: o.get("config"))
    cfg = ok["config"].astype(str)
    as_shipped = ~ok["git_commit"].astype(str).str[:7].isin(AUTO_NOT_SHIPPED)
    serving = rule_as_shipped(ok[named.isna() & cfg.str.startswith("vl_") & as_shipped], "info_")
    from ..kernels.hopper_varlen.runner import build_knobs

    serving = at_defaults(serving, {f"info_{k}": v for k, v in build_knobs().items()})  # (its build knobs' A/B arms)
    host = ok[cfg.str.startswith("rs_")]
    out = []
    for p in (problem_names(problems) if problems else dict.fromkeys(serving["problem"])):
        s, h = serving[serving["problem"] == p], host[host["problem"] == p]
        runs = sorted(set(s["run_id"]) & set(h["run_id"]))
        if not runs:
            continue
        s, h = s[s["run_id"] == runs[-1]], h[h["run_id"] == runs[-1]]
        su, hu = float(s["median_us"].median()), float(h["median_us"].median())
        out.append({"problem": p, "serving us": su, "serving rows": len(s), "serving config": s["config"].iloc[0],
                    "host-scheduled us": hu, "host-scheduled config": h["config"].iloc[0],
                    "serving / host-scheduled": su / hu, "<= 1 (issue 41)": su <= hu, "gpu": s["gpu"].iloc[0],
                    "commit": str(s["git_commit"].iloc[0])[:7], "run": runs[-1]})
    return pd.DataFrame(out).set_index("problem") if out else pd.DataFrame()


def eager_host_table(latest: pd.DataFrame) -> pd.DataFrame:
    """Per problem of ``latest``: the eager call's per-call, GPU, host and back-to-back time beside the graph replay's
    per-call and host time, what an eager call costs over a replay, and whether it is host-bound."""
    if not len(latest):
        return pd.DataFrame()
    t = latest.set_index(["problem", "call"])
    eager, graph = t.xs("eager", level="call"), t.xs("graph", level="call")
    out = pd.DataFrame({"graph per call us": graph["per_call_us"], "eager per call us": eager["per_call_us"]})
    out["eager - graph us"] = out["eager per call us"] - out["graph per call us"]
    out["eager host us"] = eager["host_us"]
    out["eager GPU us"] = eager["median_us"]
    if "b2b_us" in eager:
        out["eager back-to-back us"] = eager["b2b_us"]
    out["graph host us"] = graph["host_us"]
    out["eager host-bound"] = eager["host_us"] > eager["median_us"]
    return out.reindex([p for p in dict.fromkeys(latest["problem"]) if p in out.index])


def shown(df: pd.DataFrame, digits: int = 1) -> pd.DataFrame:
    """``df`` for display (:func:`.plots.shown`): floats rounded to ``digits``, a missing value as '—'."""
    return _shown(df, digits)


COLORS = {"graph": "C0", "eager": "C1", "oneshot": "C2", "harness": "C3"}


def calls_figure(latest: pd.DataFrame, problems, reference: pd.DataFrame | None = None,
                 source: str = "data/calls.jsonl"):
    """Per problem, log-scale bars of the four call forms' per-call times (a dot: the host time of the call), the
    measured floor (solid) and the datasheet floor (dashed) across the group, and the host-scheduled kernel's graph
    time (red tick) where ``reference`` has it. A form without an ok row is marked 'n/a'."""
    names = problem_names(problems)
    width = 0.8 / len(CALLS)
    fig, ax = plt.subplots(figsize=(max(7.0, 1.45 * len(names) + 2.5), 4.8))
    x = np.arange(len(names))
    bottom = float(latest[["per_call_us", "floor_datasheet_us"]].min().min()) / 2 if len(latest) else 1.0
    for i, call in enumerate(CALLS):
        xs = x + (i - (len(CALLS) - 1) / 2) * width
        vals = [_per_call(latest, p, call) for p in names]
        host = [float(latest[(latest["problem"] == p) & (latest["call"] == call)]["host_us"].iloc[0])
                if not np.isnan(v) else np.nan for p, v in zip(names, vals)]
        ax.bar(xs, vals, width, color=COLORS[call], label=f"{call} (per call)")
        ax.plot(xs, host, "o", color="k", ms=3, label="host time of the call" if i == 0 else None)
        for xi, v in zip(xs, vals):
            if np.isnan(v):
                ax.text(xi, bottom * 1.15, "n/a", ha="center", va="bottom", fontsize=6, rotation=90)
    for j, p in enumerate(names):
        r = latest[latest["problem"] == p] if len(latest) else latest
        if not len(r):
            continue
        last = r.sort_values("run_id").iloc[-1]  # the floors of the latest run that timed this problem
        ax.hlines(last["floor_measured_us"], j - 0.45, j + 0.45, colors="k", lw=1.5,
                  label="measured floor (latest run)" if j == 0 else None)
        ax.hlines(last["floor_datasheet_us"], j - 0.45, j + 0.45, colors="k", lw=1.2, linestyles="--",
                  label="datasheet floor" if j == 0 else None)
        if reference is not None and len(reference) and p in reference.index:
            ref = float(reference.loc[p, "graph us"])
            ax.hlines(ref, j - 0.45, j - 0.45 + width, colors="r", lw=2.5,
                      label="host-scheduled kernel, graph (data/bench.jsonl)" if j == 0 else None)
    ax.set_yscale("log")
    ax.set_ylim(bottom=bottom)
    ax.set_xticks(x, names)
    ax.set_ylabel("time per call (us, median; log scale)")
    ax.set_title("cute-hopper serving path: what a call costs, per call form")
    ax.grid(axis="y", which="both", alpha=0.2)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    text = caption(latest, source)
    if reference is not None and len(reference):
        text += (f"; reference: run {reference['run'].iloc[0]} at {reference['commit'].iloc[0]}, "
                 f"data/bench.jsonl")
    fig.text(0.01, -0.02, text, fontsize=7, ha="left", va="top")
    return fig
