"""The one-shot gather alone (``data/gather.jsonl``, :mod:`nvfp4lib.bench.gather_bench`) for notebook 10: the latest
run per problem, a knob's settings run by run, two commits on one machine, and the gather as shipped beside what a
one-shot call costs over an eager one."""
from __future__ import annotations

import numpy as np
import pandas as pd

from .serving_report import at_defaults, problem_names

__all__ = ["gather_table", "gather_knobs", "gather_shipped", "gather_variants", "gather_ab", "gather_now"]


def gather_table(rows: pd.DataFrame, problems=None, commit: str | None = None) -> pd.DataFrame:
    """The latest run of ``data/gather.jsonl`` (the one-shot gather alone, :mod:`nvfp4lib.bench.gather_bench`; the
    latest at ``commit`` if given) as one row per problem: GPU time and ratio to the copy floor per (part, kcu), and
    whether every output was byte-identical to the torch prepack. Empty without rows."""
    if rows is None or not len(rows):
        return pd.DataFrame()
    sel = gather_shipped(rows[rows["status"] == "ok"])
    if commit is not None:
        sel = sel[sel["git_commit"].astype(str).str.startswith(commit)]
    if not len(sel):
        return pd.DataFrame()
    sel = sel[sel["run_id"] == sel["run_id"].max()]
    t = sel.pivot_table(index="problem", columns=["part", "kcu"], values=["median_us", "ratio_to_floor"],
                        aggfunc="last", sort=False)
    t = t[sorted(t.columns, key=lambda c: (c[1], c[2], c[0] != "median_us"))]  # part, kcu, time before ratio
    t.columns = [f"{part} kcu={kcu} {'us' if v == 'median_us' else 'x floor'}" for v, part, kcu in t.columns]
    t["identical"] = sel.groupby("problem")["identical"].all()
    t["commit"] = sel.groupby("problem")["git_commit"].last().str[:7]
    order = problem_names(problems) if problems is not None else list(dict.fromkeys(sel["problem"]))
    return t.reindex([p for p in order if p in t.index])


def gather_knobs() -> dict:
    """The gather-bench knobs that rows carry, at the package's defaults now:
    :func:`.kernels.hopper_varlen.gather.knobs` (in rows since db7e1a9, a963b7f, 404e20a and 674dc09: absent before,
    that commit's code) and ``prmt``, a knob of one development commit, shipped off."""
    from ..kernels.hopper_varlen import gather

    now = gather.knobs()
    return {"prefetch": now["prefetch"], "prmt": 0, **now}  # (the labels' order: prmt after prefetch)


def gather_shipped(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows that ran the gather as its commit shipped it: knob values equal to the package's defaults now, or
    absent (rows from before the knob)."""
    return at_defaults(rows, gather_knobs())


def gather_variants(rows: pd.DataFrame, commits, problems=None, part: str = "weights", kcu: int = 8,
                    warps: int = 4) -> pd.DataFrame:
    """The gather's GPU time (``part``, ``kcu``, ``warps``) in every run of ``data/gather.jsonl`` at any of
    ``commits``, one column per (run, commit, knob setting): a knob A/B within one run compares on one machine,
    columns of different runs compare across machines. Empty without such rows."""
    if rows is None or not len(rows):
        return pd.DataFrame()
    sel = rows[(rows["status"] == "ok") & (rows["part"] == part) & (rows["kcu"] == kcu) & (rows["warps"] == warps)]
    sel = sel[sel["git_commit"].astype(str).str[:7].isin([c[:7] for c in commits])]
    if not len(sel):
        return pd.DataFrame()
    knobs = [k for k in gather_knobs() if k in sel]
    label = sel["date"].astype(str).str[11:16] + " " + sel["git_commit"].astype(str).str[:7]
    setting = pd.Series("", index=sel.index)
    for knob in knobs:
        setting = setting + np.where(sel[knob].notna(), f" {knob}=" + sel[knob].fillna(-1).astype(int).astype(str), "")
    sel = sel.assign(run=label, setting=setting.str.strip().replace("", "as shipped"))
    t = sel.pivot_table(index="problem", columns=["run_id", "run", "setting"], values="median_us", aggfunc="median")
    t.columns = t.columns.droplevel(0)
    order = problem_names(problems) if problems is not None else list(dict.fromkeys(sel["problem"]))
    return t.reindex([p for p in order if p in t.index])


def gather_ab(rows: pd.DataFrame, before: str, after: str, problems=None, kcu: int = 8, warps: int = 4) -> pd.DataFrame:
    """The gather at two commits measured on one machine (``data/gather.jsonl``, rows of both commits sharing a
    host and date): per problem and part, the median over runs of each commit's GPU time at (``kcu``, ``warps``),
    after / before, the ratio to the copy floor after, and whether every output of both was byte-identical."""
    if rows is None or not len(rows):
        return pd.DataFrame()
    sel = gather_shipped(rows[(rows["status"] == "ok") & (rows["kcu"] == kcu) & (rows["warps"] == warps)])
    com = sel["git_commit"].astype(str)
    sel = sel.assign(side=np.where(com.str.startswith(before), "before", np.where(com.str.startswith(after), "after",
                                                                                    "")))
    sel = sel[sel["side"] != ""]
    if not len(sel) or set(sel["side"]) != {"before", "after"}:
        return pd.DataFrame()
    g = sel.groupby(["problem", "part", "side"])
    t = g["median_us"].median().unstack("side")
    out = pd.DataFrame({f"{before} us": t["before"], f"{after} us": t["after"],
                        "after / before": t["after"] / t["before"],
                        "after x floor": g["ratio_to_floor"].median().unstack("side")["after"],
                        "runs": g["run_id"].nunique().unstack("side").min(axis=1),
                        "identical": g["identical"].all().unstack("side").all(axis=1)})
    order = problem_names(problems) if problems is not None else list(dict.fromkeys(sel["problem"]))
    return out.reindex([(p, part) for p in order for part in ("weights", "weights+rows") if (p, part) in out.index])


def gather_now(gather_rows: pd.DataFrame, problems, latest: pd.DataFrame | None = None):
    """The one-shot gather as shipped (knobs at the package's defaults, ``KCU`` units and ``WARPS`` warps per program):
    the latest run of ``data/gather.jsonl`` that timed it, per problem its GPU time and ratio to the copy floor for the
    weights alone and with the activation rows, whether every output was byte-identical to the torch prepack, and,
    from ``latest`` (a calls run, another machine and time), what a one-shot call costs over an eager one. Returns
    (table, run id, commit); (empty, None, None) without rows."""
    from ..kernels.hopper_varlen import gather

    if gather_rows is None or not len(gather_rows):
        return pd.DataFrame(), None, None
    sel = gather_shipped(gather_rows[(gather_rows["status"] == "ok") & (gather_rows["kcu"] == gather.KCU)
                               & (gather_rows["warps"] == gather.WARPS)])
    if not len(sel):
        return pd.DataFrame(), None, None
    run = sel["run_id"].max()
    sel = sel[sel["run_id"] == run]
    t = sel.pivot_table(index="problem", columns="part", values=["median_us", "ratio_to_floor"], aggfunc="last")
    out = pd.DataFrame({f"{part} {'us' if v == 'median_us' else 'x copy floor'}": t[(v, part)]
                        for part in ("weights", "weights+rows") for v in ("median_us", "ratio_to_floor")
                        if (v, part) in t})
    out["identical"] = sel.groupby("problem")["identical"].all()
    if latest is not None and len(latest):
        pc = latest.set_index(["problem", "call"])["per_call_us"]
        out["oneshot - eager us (calls run)"] = [pc.get((p, "oneshot"), np.nan) - pc.get((p, "eager"), np.nan)
                                                 for p in out.index]
        if "weights+rows us" in out:
            out["gather / (oneshot - eager)"] = out["weights+rows us"] / out["oneshot - eager us (calls run)"]
    out = out.reindex([p for p in problem_names(problems) if p in out.index])
    return out, run, str(sel["git_commit"].iloc[0])[:7]
