"""The MoE layer against its bf16 peer: the tables, targets and figure of notebook 11.

Reads rows of ``data/moe.jsonl`` (written by :mod:`nvfp4lib.bench.moe_bench`: one row per layer, token count T,
routing and mode, the bf16 peer's included). Pure pandas and matplotlib: no GPU. Times are ``median_us`` of graph
replays with the L2 flushed; each row's floor is its own run's (``floor_us``: NVFP4 bytes for the layer, bf16 bytes for
the peer;
``floor_nvfp4_us`` on every row). Issue 21's targets are judged per (layer, T, routing) by :func:`targets`.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import NullLocator

from ..bench.moe_bench import LABELS, LAYERS, ROUTINGS, TOKENS, floor_bound, moe_floor_us
from ..bench.roofline import H100_SXM_DATASHEET
from ..bench.store import dirty_state
from .plots import caption

__all__ = ["NO_DATA", "RECORD_COMMAND", "expected_touched", "predicted_floors", "latest_moe", "not_ok", "runs_used",
           "time_table", "eager_table", "memory_table", "targets", "target_summary", "time_figure", "step_table",
           "DECODE_MAX_T", "PREFILL_MIN_T"]

RECORD_COMMAND = "python -m nvfp4lib moe-bench --record"
NO_DATA = ("No H100 run of the MoE layer benchmark is recorded yet (data/moe.jsonl holds no rows). To make one, on "
           f"the H100: `{RECORD_COMMAND}` (all three layers, T in 1 8 64 512 4096, uniform and zipf routing, both "
           "modes and the bf16 peer; `--layer NAME` to split the run).")
PEER = LABELS["peer"]
W4A4, W4A16 = LABELS["nvfp4"], LABELS["bf16"]
ORDER = [W4A4, W4A16, PEER]
DECODE_MAX_T, PREFILL_MIN_T = 64, 512
FLOOR_LAYERS = ("deepseek-v3", "mixtral")  # the decode floor target is stated on these two


def expected_touched(experts: int, top_k: int, tokens: int) -> float:
    """Expected number of experts that get at least one copy under uniform routing (k distinct per token)."""
    return experts * (1 - (1 - top_k / experts) ** tokens)


def predicted_floors(layers=LAYERS, tokens=TOKENS, ceilings: dict = H100_SXM_DATASHEET) -> pd.DataFrame:
    """Before any measurement: per layer and T, the experts touched on average under uniform routing, the NVFP4 and
    bf16 floors (``moe_bench.moe_floor_us`` with ``ceilings``, the H100 datasheet's by default) and their ratio, the
    speed-up over the peer that an NVFP4 layer at its floor would have over a peer at its own."""
    out = []
    for layer in layers:
        for t in tokens:
            touched = expected_touched(layer.experts, layer.top_k, t)
            nv, bf = (moe_floor_us(layer, t, touched, ceilings, f) for f in ("nvfp4", "bf16"))
            out.append({"layer": layer.name, "T": t, "expected touched experts": touched, "NVFP4 floor us": nv,
                        "bf16 floor us": bf, "bf16 floor / NVFP4 floor": bf / nv,
                        "NVFP4 floor bound": floor_bound(layer, t, touched, ceilings, "nvfp4"),
                        "bf16 floor bound": floor_bound(layer, t, touched, ceilings, "bf16")})
    return pd.DataFrame(out).set_index(["layer", "T"])


def _layer_order(names) -> list[str]:
    known = [x.name for x in LAYERS]
    return [n for n in known if n in set(names)] + sorted(set(names) - set(known))


def latest_moe(rows: pd.DataFrame) -> pd.DataFrame:
    """The latest row with status ok of each (layer, T, routing, label) (latest: the largest run_id, which starts
    with the run's UTC time), ordered by layer (as :data:`~nvfp4lib.bench.moe_bench.LAYERS`), T, routing, label."""
    if rows is None or not len(rows) or "status" not in rows:
        return pd.DataFrame()
    sel = rows[rows["status"] == "ok"]
    if not len(sel):
        return pd.DataFrame()
    sel = sel.sort_values("run_id").groupby(["layer", "tokens", "routing", "label"], sort=False).tail(1)
    layers = _layer_order(sel["layer"])
    sel = sel.assign(_l=sel["layer"].map({n: i for i, n in enumerate(layers)}),
                     _r=sel["routing"].map({r: i for i, r in enumerate(ROUTINGS)}).fillna(len(ROUTINGS)),
                     _m=sel["label"].map({m: i for i, m in enumerate(ORDER)}).fillna(len(ORDER)))
    return sel.sort_values(["_l", "tokens", "_r", "_m"]).drop(columns=["_l", "_r", "_m"]).reset_index(drop=True)


def not_ok(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (layer, label), the cases (T, routing) whose latest row is not ok, and the last such status: what is
    missing and why (e.g. W4A16 not implemented in the kernel yet). A case whose latest run failed after an earlier
    ok one is listed too; :func:`latest_moe` still tabulates the earlier ok row."""
    if rows is None or not len(rows):
        return pd.DataFrame(columns=["layer", "label", "cases", "status"])
    key = ["layer", "tokens", "routing", "label"]
    last = rows.sort_values("run_id").groupby(key, sort=False).tail(1)
    bad = last[last["status"] != "ok"]
    out = [{"layer": lay, "label": lab, "cases": len(g), "status": g.iloc[-1]["status"][:160]}
           for (lay, lab), g in bad.groupby(["layer", "label"], sort=False)]
    return pd.DataFrame(out, columns=["layer", "label", "cases", "status"])


def runs_used(latest: pd.DataFrame) -> pd.DataFrame:
    """One line per run that supplied rows of ``latest``: commit, date, GPU, the ceilings measured in it."""
    if not len(latest):
        return pd.DataFrame()
    out = []
    for run, g in latest.groupby("run_id"):
        first = g.iloc[0]
        out.append({"run_id": run, "git_commit": str(first["git_commit"])[:7],
                    "dirty tree": dirty_state(first.get("git_dirty")),
                    "date": str(first["date"])[:16], "gpu": first["gpu"], "iters": int(first["iters"]),
                    "bf16 TFLOP/s": first["ceil_bf16_tflops"], "copy GB/s": first["ceil_copy_gbps"],
                    "layers": ", ".join(_layer_order(g["layer"])), "rows": len(g)})
    return pd.DataFrame(out).set_index("run_id")


def _one(latest, layer, t, routing, label, col="median_us") -> float:
    if not len(latest) or col not in latest.columns:
        return float("nan")
    r = latest[(latest["layer"] == layer) & (latest["tokens"] == t) & (latest["routing"] == routing)
               & (latest["label"] == label)]
    return float(r[col].iloc[0]) if len(r) else float("nan")


def _cases(latest) -> list[tuple]:
    return list(dict.fromkeys(zip(latest["layer"], latest["tokens"], latest["routing"]))) if len(latest) else []


def step_table(rows: pd.DataFrame, before: str, after: str, routing: str = "uniform",
               max_t: int = DECODE_MAX_T) -> pd.DataFrame:
    """One optimisation step at decode sizes: per (layer, T <= ``max_t``), each label's ok median time in the run at
    commit ``before`` and in the run at ``after`` (the latest of each), their ratio, and, after, W4A4 minus W4A16 and
    the peer over each NVFP4 mode. Empty where either commit has no ok row."""
    if rows is None or not len(rows) or "git_commit" not in rows:
        return pd.DataFrame()
    ok = rows[(rows["status"] == "ok") & (rows["routing"] == routing) & (rows["tokens"] <= max_t)]
    t = {}
    for tag, commit in (("before", before), ("after", after)):
        sel = ok[ok["git_commit"] == commit].sort_values("run_id")
        if not len(sel):
            return pd.DataFrame()
        t[tag] = sel.pivot_table(index=["layer", "tokens"], columns="label", values="median_us", aggfunc="last")
    out = pd.DataFrame(index=t["after"].index)
    for label in ORDER:
        if label in t["before"] and label in t["after"]:
            out[f"{label} {before} us"] = t["before"][label]
            out[f"{label} {after} us"] = t["after"][label]
            out[f"{label} speed-up"] = t["before"][label] / t["after"][label]
    a = t["after"]
    if {W4A4, W4A16} <= set(a.columns):
        out[f"W4A4 - W4A16 at {after} us"] = a[W4A4] - a[W4A16]
    for label in (W4A4, W4A16):
        if {label, PEER} <= set(a.columns):
            out[f"peer / {label} at {after}"] = a[PEER] / a[label]
    layers = _layer_order(out.index.get_level_values(0))
    return out.reindex(sorted(out.index, key=lambda i: (layers.index(i[0]), i[1])))


def time_table(latest: pd.DataFrame) -> pd.DataFrame:
    """Indexed by (layer, T, routing): per label its time (us) and its ratio to its own floor, the touched experts,
    the NVFP4 floor, and each NVFP4 mode's speed-up over the bf16 peer (peer time / mode time)."""
    out = []
    for layer, t, routing in _cases(latest):
        row = {"layer": layer, "T": t, "routing": routing,
               "touched experts": int(_one_any(latest, layer, t, routing, "touched_experts")),
               "NVFP4 floor us": _one_any(latest, layer, t, routing, "floor_nvfp4_us")}
        peer = _one(latest, layer, t, routing, PEER)
        for lab in ORDER:
            us = _one(latest, layer, t, routing, lab)
            row[f"{lab} us"] = us
            row[f"{lab} x floor"] = _one(latest, layer, t, routing, lab, "ratio")
            if lab != PEER:
                row[f"{lab} speed-up vs peer"] = peer / us
        out.append(row)
    return pd.DataFrame(out).set_index(["layer", "T", "routing"]) if out else pd.DataFrame()


def eager_table(latest: pd.DataFrame) -> pd.DataFrame:
    """Indexed by (layer, T, routing): per label the graph replay's time beside the eager call's (``eager_per_call_us``:
    each call on its own, the larger of its GPU and host time; ``eager_b2b_us``: calls issued back to back) and their
    ratio; NaN where a row has no eager timing (rows recorded before moe-bench timed it)."""
    out = []
    for layer, t, routing in _cases(latest):
        row = {"layer": layer, "T": t, "routing": routing}
        for lab in ORDER:
            graph = _one(latest, layer, t, routing, lab)
            eager = _one(latest, layer, t, routing, lab, "eager_per_call_us")
            row[f"{lab} graph us"] = graph
            row[f"{lab} eager us"] = eager
            row[f"{lab} eager back to back us"] = _one(latest, layer, t, routing, lab, "eager_b2b_us")
            row[f"{lab} eager / graph"] = eager / graph
        out.append(row)
    return pd.DataFrame(out).set_index(["layer", "T", "routing"]) if out else pd.DataFrame()


def _one_any(latest, layer, t, routing, col) -> float:
    r = latest[(latest["layer"] == layer) & (latest["tokens"] == t) & (latest["routing"] == routing)]
    return float(r[col].iloc[0]) if len(r) else float("nan")


def memory_table(latest: pd.DataFrame) -> pd.DataFrame:
    """Per layer and label: the weights' bytes in their format (GB), the device memory the built layer holds (GB,
    measured in the run: allocated after building it minus before, plus, for the NVFP4 layer, the NVFP4 weight lists
    it was given and keeps referenced), and the held bytes over the NVFP4 weight bytes."""
    if not len(latest):
        return pd.DataFrame()
    out = []
    for layer in _layer_order(latest["layer"]):
        g = latest[latest["layer"] == layer]
        nv = g[g["label"] != PEER]["weight_bytes"]
        nv_bytes = float(nv.iloc[0]) if len(nv) else float("nan")
        for lab in ORDER:
            r = g[g["label"] == lab]
            if not len(r):
                continue
            held = float(r["held_bytes"].iloc[-1]) if "held_bytes" in r and r["held_bytes"].notna().any() else np.nan
            out.append({"layer": layer, "label": lab, "weight GB": float(r["weight_bytes"].iloc[0]) / 1e9,
                        "held GB": held / 1e9, "held / NVFP4 weight bytes": held / nv_bytes})
    return pd.DataFrame(out).set_index(["layer", "label"])


def targets(latest: pd.DataFrame) -> pd.DataFrame:
    """Issue 21's targets per (layer, T, routing) and NVFP4 mode, on ``median_us``:

    - decode (T <= 64): the mode >= 2.5x faster than the bf16 peer (its time <= the peer's / 2.5);
    - decode on the DeepSeek- and Mixtral-like layers at 8 <= T <= 64: <= 1.5x the NVFP4 floor;
    - prefill (T >= 512): W4A16 no slower than the peer; W4A4 within 1.3x of it.

    Verdict 'holds', 'misses', or 'no data' (a time it needs has no ok row)."""
    out = []
    for layer, t, routing in _cases(latest):
        peer = _one(latest, layer, t, routing, PEER)
        floor = _one_any(latest, layer, t, routing, "floor_nvfp4_us")
        for lab in (W4A4, W4A16):
            us = _one(latest, layer, t, routing, lab)
            checks = []
            if t <= DECODE_MAX_T:
                checks.append(("decode: >= 2.5x faster than the bf16 peer", peer / 2.5))
                if layer in FLOOR_LAYERS and t >= 8:
                    checks.append(("decode: <= 1.5x the NVFP4 floor", 1.5 * floor))
            if t >= PREFILL_MIN_T:
                checks.append(("prefill: no slower than the bf16 peer", peer) if lab == W4A16
                              else ("prefill: within 1.3x the bf16 peer", 1.3 * peer))
            for target, limit in checks:
                verdict = "no data" if np.isnan(us) or np.isnan(limit) else ("holds" if us <= limit else "misses")
                out.append({"layer": layer, "T": t, "routing": routing, "mode": lab, "target": target,
                            "measured us": us, "limit us": limit, "measured / limit": us / limit,
                            "verdict": verdict})
    cols = ["layer", "T", "routing", "mode", "target", "measured us", "limit us", "measured / limit", "verdict"]
    return pd.DataFrame(out, columns=cols)


def target_summary(tg: pd.DataFrame) -> pd.DataFrame:
    """Per (target, mode): how many cases hold, miss or lack data, and the worst measured / limit."""
    if not len(tg):
        return pd.DataFrame()
    out = []
    for (target, mode), g in tg.groupby(["target", "mode"], sort=False):
        judged = g[g["verdict"] != "no data"]
        miss = g[g["verdict"] == "misses"]
        out.append({"target": target, "mode": mode, "holds": int((g["verdict"] == "holds").sum()),
                    "misses": len(miss), "no data": len(g) - len(judged),
                    "worst measured / limit": judged["measured / limit"].max() if len(judged) else np.nan,
                    "missed on": ", ".join(f"{r.layer} T={r.T} {r.routing}" for r in miss.itertuples())})
    return pd.DataFrame(out).set_index(["target", "mode"])


COLORS = {W4A4: "C0", W4A16: "C2", PEER: "C3"}
STYLES = {"uniform": "-", "zipf": "--"}


def time_figure(latest: pd.DataFrame, source: str = "data/moe.jsonl"):
    """One panel per layer: time against T (log-log) for each mode and the peer (solid: uniform routing, dashed:
    zipf), with the NVFP4 floor (black dotted) and the peer's bf16 floor (grey dotted) of the uniform routing."""
    layers = _layer_order(latest["layer"])
    fig, axes = plt.subplots(1, len(layers), figsize=(4.6 * len(layers) + 1.5, 4.2), squeeze=False)
    for ax, layer in zip(axes[0], layers):
        g = latest[latest["layer"] == layer]
        for lab in ORDER:
            for routing in ROUTINGS:
                r = g[(g["label"] == lab) & (g["routing"] == routing)].sort_values("tokens")
                if len(r):
                    ax.plot(r["tokens"], r["median_us"], STYLES.get(routing, ":"), marker="o", ms=3,
                            color=COLORS.get(lab, "C7"), label=f"{lab}, {routing}")
        for col, color, name in (("floor_nvfp4_us", "k", "NVFP4 floor"), ("floor_bf16_us", "0.6", "bf16 floor")):
            f = g[g["routing"] == "uniform"].groupby("tokens")[col].first()
            if len(f):
                ax.plot(f.index, f.values, ":", color=color, lw=1.4, label=f"{name} (uniform)")
        first = g.iloc[0]
        ax.set_title(f"{first.get('like') or layer}: E={int(first['experts'])}, k={int(first['top_k'])}, "
                     f"H={int(first['hidden'])}, I={int(first['intermediate'])}", fontsize=9)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ts = sorted(set(g["tokens"]))
        ax.set_xticks(ts, [str(t) for t in ts])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel("tokens T")
        ax.grid(which="both", alpha=0.2)
    axes[0][0].set_ylabel("time per layer call (us, median, graph replay; log)")
    seen = {}
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(lab, h)
    fig.legend(list(seen.values()), list(seen),  fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 0.95))
    fig.suptitle("MoE expert layer: NVFP4 (W4A4, W4A16) against the bf16 peer (torch._grouped_mm)", fontsize=10)
    fig.tight_layout()
    fig.text(0.01, -0.02, caption(latest, source), fontsize=7, ha="left", va="top")
    return fig
