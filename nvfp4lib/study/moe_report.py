"""The MoE layer against its bf16 peer: the tables, targets and figure of notebook 11.

Reads rows of ``data/moe.jsonl`` (written by :mod:`nvfp4lib.bench.moe_bench`: one row per layer, token count T,
routing and mode, the bf16 peer's included). Pure pandas and matplotlib: no GPU. Times are ``median_us`` of graph
replays with the L2 flushed; each row's floor is its own run's (``floor_us``: NVFP4 bytes for the layer, bf16 bytes for
the peer; ``floor_nvfp4_us`` on every row). Issue 21's targets are judged per (layer, T, routing) by :func:`targets`.

The notebook's answer rests on one commit (:func:`verdict`: the latest commit whose ok rows cover every layer, T,
routing and mode of the bench's grid); the tables after it (:func:`answer_table`, :func:`regime_table`,
:func:`mode_table`, :func:`eager_summary`, :func:`miss_table`) read that commit's rows only, and :func:`shown` turns a
table into what the page shows (rounded, "—" where a value is missing).
"""
from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import NullLocator

from ..bench.moe_bench import LABELS, LAYERS, ROUTINGS, TOKENS, floor_bound, moe_floor_us
from ..bench.roofline import H100_SXM_DATASHEET
from ..bench.store import dirty_state
from .plots import caption
from .plots import shown as _shown
from .serving_report import at_defaults, rule_as_shipped

__all__ = ["NO_DATA", "shipped_rows", "targets_41", "RECORD_COMMAND", "expected_touched", "predicted_floors",
           "latest_moe", "not_ok", "runs_used", "time_table", "eager_table", "memory_table", "targets",
           "target_summary", "time_figure", "DECODE_MAX_T", "PREFILL_MIN_T", "Verdict", "grid", "verdict",
           "verdict_lines", "shown", "answer_table", "regime_table", "mode_table", "eager_summary", "miss_table",
           "layers_table", "TARGET_SHORT"]

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


_TARGET_COLS = ["layer", "T", "routing", "mode", "target", "measured us", "limit us", "measured / limit", "verdict"]


def _judge(latest: pd.DataFrame, checks_of, provenance: bool = False) -> pd.DataFrame:
    """One row per (layer, T, routing) of ``latest``, NVFP4 mode and check that ``checks_of(layer, T, mode, peer
    us, NVFP4 floor us)`` lists as (target, limit us): the mode's ``median_us``, the limit, their ratio and the verdict
    ('holds', 'misses', or 'no data' where a time it needs has no ok row); with ``provenance``, the commit and run of
    the mode's row too."""
    out = []
    for layer, t, routing in _cases(latest):
        peer = _one(latest, layer, t, routing, PEER)
        floor = _one_any(latest, layer, t, routing, "floor_nvfp4_us")
        for lab in (W4A4, W4A16):
            us = _one(latest, layer, t, routing, lab)
            prov = {}
            if provenance:
                row = latest[(latest["layer"] == layer) & (latest["tokens"] == t) & (latest["routing"] == routing)
                             & (latest["label"] == lab)]
                prov = {"commit": str(row["git_commit"].iloc[0])[:7] if len(row) else "",
                        "run": row["run_id"].iloc[0] if len(row) else ""}
            for target, limit in checks_of(layer, t, lab, peer, floor):
                verdict = "no data" if np.isnan(us) or np.isnan(limit) else ("holds" if us <= limit else "misses")
                out.append({"layer": layer, "T": t, "routing": routing, "mode": lab, "target": target,
                            "measured us": us, "limit us": limit, "measured / limit": us / limit, "verdict": verdict,
                            **prov})
    return pd.DataFrame(out, columns=_TARGET_COLS + (["commit", "run"] if provenance else []))


def targets(latest: pd.DataFrame) -> pd.DataFrame:
    """Issue 21's targets per (layer, T, routing) and NVFP4 mode, on ``median_us`` (:func:`_judge`):

    - decode (T <= 64): the mode >= 2.5x faster than the bf16 peer (its time <= the peer's / 2.5);
    - decode on the DeepSeek- and Mixtral-like layers at 8 <= T <= 64: <= 1.5x the NVFP4 floor;
    - prefill (T >= 512): W4A16 no slower than the peer; W4A4 within 1.3x of it."""
    def checks(layer, t, lab, peer, floor):
        out = []
        if t <= DECODE_MAX_T:
            out.append(("decode: >= 2.5x faster than the bf16 peer", peer / 2.5))
            if layer in FLOOR_LAYERS and t >= 8:
                out.append(("decode: <= 1.5x the NVFP4 floor", 1.5 * floor))
        if t >= PREFILL_MIN_T:
            out.append(("prefill: no slower than the bf16 peer", peer) if lab == W4A16
                       else ("prefill: within 1.3x the bf16 peer", 1.3 * peer))
        return out
    return _judge(latest, checks)


# Issue 41's targets for the layer (H100, graph replay, both routings): Qwen3-like T = 1 at most ISSUE41_T1_US in both
# modes; every layer at T in ISSUE41_DECODE_T within its factor of the NVFP4 floor; prefill at ISSUE41_PREFILL_T no
# slower than the bf16 layer and within ISSUE41_COMPUTE of the compute floor
ISSUE41_T1_US = 20.0
ISSUE41_FLOOR = {"deepseek-v3": 1.3, "mixtral": 1.3, "qwen3-moe": 2.0}
ISSUE41_DECODE_T = (1, 8, 64)
ISSUE41_PREFILL_T = 4096
ISSUE41_COMPUTE = 1.2
ISSUE41_GPU = "H100"


def shipped_rows(rows: pd.DataFrame, gpu: str = ISSUE41_GPU) -> pd.DataFrame:
    """The ok rows measured on ``gpu`` with the layer's knobs as shipped when they ran: a knob A/B's other arm (split-K
    off or the 'balance' rule, the one-program quantizer, the GEMV decode path, the wide decode form that left the
    package, captured small calls fused, the chained-launch arms not shipped, W4A4 through codes and prologues once
    the quantizer wrote the operands, W4A4 with static activation scales, reported apart from the scales computed per
    call, the routing's L2 prefetch that left the package, the W4A16 GEMMs asking for all their first stages' weights
    before their wait, and the W4A4 GEMMs asking for only some while the knob also took them, the GEMMs' tile search
    in the other form than shipped, W4A16's scales through the route not shipped and its weights in the word layout
    not shipped, W4A4's quantizer in small tiles on small inputs, W4A16's routing and gather in two launches, its GEMMs'
    early trigger, the pair rule's other minimum, W4A4's amax in its own launch) and the timeline probes' rows are
    left out."""
    if rows is None or not len(rows) or "status" not in rows:
        return pd.DataFrame()
    sel = rows[(rows["status"] == "ok") & rows["gpu"].astype(str).str.contains(gpu)]
    for col, other in (("split_k", False), ("split_rule", "balance"), ("quant_one_program", True), ("gemv", True),
                       ("wide_decode", "idle"), ("wide_decode", "all"), ("deep_decode", True), ("chain_pdl", False),
                       ("input_scales", "static"), ("prefetch_l2", True), ("quant_small_tiles", 1)):
        if col in sel:
            sel = sel[~sel[col].apply(lambda v, o=other: v is o or v == o)]
    if "timeline" in sel:  # (development probes: GEMMs built with per-CTA stamps)
        sel = sel[sel["timeline"].isna()]
    if "fuse_max_rows" in sel:  # (captured small calls fused: lost, off)
        sel = sel[~(pd.to_numeric(sel["fuse_max_rows"], errors="coerce") > 0)]
    if "chain_pdl" in sel:
        sel = sel[~_chain_unshipped(sel)]
    if "quant_operand" in sel:  # (the A/B's arm through codes and prologues; rows before the knob had no field)
        sel = sel[~_switched_off(sel["quant_operand"])]
    if "split_rule" in sel:  # (the 'pair' rule's A/B: its 'idle' arm, at the commits whose runs had both)
        commit = sel["git_commit"].astype(str).str[:7]
        paired = commit.isin(set(commit[sel["split_rule"].eq("pair")]))
        sel = sel[~(paired & sel["split_rule"].eq("idle"))]
    sel = rule_as_shipped(sel)  # (the shape rule's knobs: tuning.ONCE_WAIT, SHORT_K, DUAL_96 at their values now)
    from ..kernels.common import pdl
    from ..kernels.hopper_rs import ops
    from ..kernels.hopper_varlen import config, kernel
    from ..nn import moe, routing

    # (hopper_varlen.kernel.TILE_HANDOFF's, hopper_rs.ops.A16_INT_SCALE's and A16_OWN_WORDS', nn.routing.ROUTE_GATHER's,
    # pdl.CHAIN_GEMM_A16's, config.PAIR_MIN_K_TILES', kernel.EARLY_DESCRIPTORS', kernel.HANDOFF_WAIT's and
    # nn.moe.COMBINE_IN_GEMM's A/B arms;
    # rows before a knob had no field)
    sel = at_defaults(sel, {"tile_handoff": int(kernel.TILE_HANDOFF), "a16_int_scale": int(ops.A16_INT_SCALE),
                            "a16_own_words": int(ops.A16_OWN_WORDS), "route_gather": int(routing.ROUTE_GATHER),
                            "chain_gemm_a16": int(pdl.CHAIN_GEMM_A16), "pair_min_k_tiles": config.PAIR_MIN_K_TILES,
                            "amax_in_route": int(routing.AMAX_IN_ROUTE),
                            "early_descriptors": int(kernel.EARLY_DESCRIPTORS), "raw_scale": int(kernel.RAW_SCALE),
                            "combine_in_gemm": int(moe.COMBINE_IN_GEMM),
                            "handoff_wait": int(kernel.HANDOFF_WAIT)})
    if "prewait_stages" in sel:  # (hopper_varlen.kernel.PREWAIT_STAGES, shipped for the W4A16 decode GEMMs only)
        pw = pd.to_numeric(sel["prewait_stages"], errors="coerce")
        w4a16 = _in_mode(sel, "bf16")
        both = sel["git_commit"].astype(str).str[:7].isin(PREWAIT_BOTH_MODES)
        sel = sel[~((w4a16 & (pw == 0)) | (~w4a16 & both & (pw > 0)))]
    return sel


def _switched_off(col: pd.Series) -> pd.Series:
    """The rows whose on/off knob was off (False or 0); a row without the field (NaN, None) is not."""
    return col.apply(lambda v: v is False or v == 0)


# the commits whose runs had PREWAIT_STAGES take the W4A4 GEMMs too (its two A/Bs, before it was shipped for W4A16)
PREWAIT_BOTH_MODES = ("488aabc", "a7f6fab")


def _in_mode(sel: pd.DataFrame, mode: str) -> pd.Series:
    """The rows of the layer mode ``mode`` ("nvfp4": W4A4, "bf16": W4A16), by their mode, or their label where the
    rows have no mode column."""
    if "mode" in sel:
        return sel["mode"].eq(mode)
    return sel["label"].astype(str).str.contains({"nvfp4": "W4A4", "bf16": "W4A16"}[mode])


def _chain_unshipped(sel: pd.DataFrame) -> pd.Series:
    """Chained rows not in the shipped form (kernels.common.pdl): W4A4 without the GEMM trigger, W4A16 with it (the
    first A/B's rows, before chain_gemm was recorded, had every GEMM trigger)."""
    chained = sel["chain_pdl"].apply(lambda v: v is True or v == 1)
    gemm = sel["chain_gemm"] if "chain_gemm" in sel else pd.Series(None, index=sel.index, dtype=object)
    unknown = gemm.isna()
    w4a4 = _in_mode(sel, "nvfp4")
    gemm_on = gemm.apply(lambda v: v is True or v == 1)
    return chained & ((w4a4 & ~unknown & ~gemm_on) | (~w4a4 & (unknown | gemm_on)))


def targets_41(rows: pd.DataFrame, gpu: str = ISSUE41_GPU) -> pd.DataFrame:
    """Issue 41's layer targets (the ISSUE41_* constants) on the latest row of each case among
    :func:`shipped_rows` measured on ``gpu`` (:func:`_judge`): per (layer, T, routing, mode, target) the measured time,
    the limit, their ratio, the verdict and the commit and run of the row (the cases' latest rows may come from
    different runs: the commit column says which; the issue is done on one run at one commit). The issue's card is
    :data:`ISSUE41_GPU`; another card's rows judged the same way show where the layer stands there (each row's floors
    from that run's measured ceilings)."""
    latest = latest_moe(shipped_rows(rows, gpu))

    def checks(layer, t, lab, peer, floor):
        out = []
        if layer == "qwen3-moe" and t == 1:
            out.append((f"Qwen3-like T=1: <= {ISSUE41_T1_US:g} us", ISSUE41_T1_US))
        if t in ISSUE41_DECODE_T and layer in ISSUE41_FLOOR:
            out.append((f"decode: <= {ISSUE41_FLOOR[layer]:g}x the NVFP4 floor", ISSUE41_FLOOR[layer] * floor))
        if t == ISSUE41_PREFILL_T:
            bound = next(iter(latest[(latest["layer"] == layer) & (latest["tokens"] == t)]["floor_bound"]), "")
            out.append(("prefill: no slower than the bf16 layer", peer))
            out.append((f"prefill: <= {ISSUE41_COMPUTE:g}x the {bound} floor", ISSUE41_COMPUTE * floor))
        return out
    return _judge(latest, checks, provenance=True)


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
    commits = ", ".join(dict.fromkeys(str(c)[:7] for c in latest["git_commit"]))
    fig.text(0.01, -0.02, f"{caption(latest, source)}, commit {commits}", fontsize=7, ha="left", va="top")
    return fig


# --- the answer at one commit --------------------------------------------------------------------------------------

TARGET_SHORT = {"decode: >= 2.5x faster than the bf16 peer": "decode: 2.5x faster than bf16",
                "decode: <= 1.5x the NVFP4 floor": "decode: 1.5x the floor",
                "prefill: no slower than the bf16 peer": "prefill: no slower than bf16",
                "prefill: within 1.3x the bf16 peer": "prefill: within 1.3x of bf16"}
MODE_SHORT = {W4A4: "W4A4", W4A16: "W4A16", PEER: "bf16"}
PEER_NEAR_FLOOR = 1.5  # miss_table: a bf16 layer within this of its own floor reads its weights near copy speed
ZIPF_SLOWER = 1.1  # miss_table: zipf routing this much slower than uniform (same layer, T, mode) is named as a cause


def grid(layers=LAYERS, tokens=TOKENS, routings=ROUTINGS, labels=tuple(ORDER)) -> set[tuple]:
    """Every (layer, T, routing, label) case of ``python -m nvfp4lib moe-bench``'s default run."""
    return {(x.name if hasattr(x, "name") else x, t, r, lab) for x in layers for t in tokens for r in routings
            for lab in labels}


@dataclass(frozen=True)
class Verdict:
    """The rows the notebook's answer rests on: ``latest`` (:func:`latest_moe` of the rows at ``commit``), whether
    they cover the whole :func:`grid` (``missing``: how many of its cases have no ok row there), and ``newer``: one
    line per run recorded after the commit's last run (at other commits, none complete)."""

    commit: str
    latest: pd.DataFrame
    missing: int
    newer: pd.DataFrame

    @property
    def short(self) -> str:
        return str(self.commit)[:7]


def _cases_ok(rows: pd.DataFrame) -> set[tuple]:
    ok = rows[rows["status"] == "ok"]
    return set(zip(ok["layer"], ok["tokens"].astype(int), ok["routing"], ok["label"]))


def verdict(rows: pd.DataFrame, cases: set | None = None) -> Verdict | None:
    """The latest commit whose ok rows cover every case of ``cases`` (default :func:`grid`), else the commit of the
    latest ok row; None without an ok row. Commits are ordered by their latest run (run ids start with the UTC
    time); several runs at one commit (e.g. one per ``--layer``) count together, the latest ok row of a case wins."""
    if rows is None or not len(rows) or "status" not in rows or not (rows["status"] == "ok").any():
        return None
    cases = grid() if cases is None else cases
    ok = rows[rows["status"] == "ok"]
    last_run = ok.groupby("git_commit")["run_id"].max().sort_values()
    complete = [c for c in last_run.index if cases <= _cases_ok(rows[rows["git_commit"] == c])]
    commit = complete[-1] if complete else last_run.index[-1]
    at = rows[rows["git_commit"] == commit]
    later = rows[rows["run_id"] > at["run_id"].max()]
    newer = [{"run_id": run, "commit": str(g["git_commit"].iloc[0])[:7], "ok rows": int((g["status"] == "ok").sum()),
              "layers": ", ".join(_layer_order(g["layer"])), "routing": ", ".join(sorted(set(g["routing"]))),
              "T": ", ".join(str(t) for t in sorted(set(g["tokens"].astype(int))))}
             for run, g in later.groupby("run_id")]
    return Verdict(commit=commit, latest=latest_moe(at), missing=len(cases - _cases_ok(at)),
                   newer=pd.DataFrame(newer, columns=["run_id", "commit", "ok rows", "layers", "routing", "T"]))


def verdict_lines(v: Verdict | None, tg: pd.DataFrame) -> list[str]:
    """The answer in a few lines: the commit, its runs (id, layers, GPU, date), how complete they are, how many of
    the target checks (:func:`targets`) hold, and the newer runs left out of it."""
    if v is None:
        return [NO_DATA]
    lt = v.latest
    out = [f"Verdict at commit {v.short}, from {lt['run_id'].nunique()} moe-bench run(s) in data/moe.jsonl:"]
    for run, g in lt.groupby("run_id"):
        out.append(f"  run {run}: {', '.join(_layer_order(g['layer']))} on {', '.join(sorted(set(g['gpu'])))}, "
                   f"{str(g['date'].iloc[0])[:10]}, {len(g)} ok rows")
    out.append("  every layer, T, routing and mode of the bench has an ok row there" if not v.missing else
               f"  {v.missing} cases of the bench's grid have no ok row at this commit (no commit has them all)")
    judged = tg[tg["verdict"] != "no data"] if len(tg) else tg
    held = int((judged["verdict"] == "holds").sum()) if len(judged) else 0
    out.append(f"Targets of issue 21: {held} of {len(judged)} checks hold"
               + (f", {len(tg) - len(judged)} without data" if len(tg) > len(judged) else "")
               + ("; every one holds" if len(judged) and held == len(judged) else ""))
    for _, r in v.newer.iterrows():
        out.append(f"Newer, not in the verdict (commit {r['commit']} covers part of the grid): run {r['run_id']}, "
                   f"{r['layers']}, {r['routing']}, T {r['T']}, {r['ok rows']} ok rows")
    return out


def shown(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` as the page shows it (:func:`.plots.shown`): times (columns ending in ``us``) to 0.1, other floats to
    0.01, "—" where a value is missing (a case without an ok row), so that no NaN reaches a reader."""
    return _shown(df, 2, time_digits=1)


def _miss_text(g: pd.DataFrame) -> str:
    miss = g[g["verdict"] == "misses"]
    return "; ".join(f"{MODE_SHORT.get(r['mode'], r['mode'])} {TARGET_SHORT.get(r['target'], r['target'])} "
                     f"({r['measured / limit']:.2f}x the limit)" for _, r in miss.iterrows()) or "none"


def answer_table(latest: pd.DataFrame, tg: pd.DataFrame) -> pd.DataFrame:
    """Per (layer, T, routing): each NVFP4 mode's time and the bf16 layer's, the bf16 layer's time over each mode's
    (above 1: NVFP4 faster), each mode's time over the NVFP4 floor and the bf16 layer's over its own, and the target
    checks that hold and those that miss (with measured / limit)."""
    tt = time_table(latest)
    if not len(tt):
        return pd.DataFrame()
    out = pd.DataFrame(index=tt.index)
    out["touched experts"] = tt["touched experts"]
    for lab in ORDER:
        out[f"{MODE_SHORT[lab]} us"] = tt[f"{lab} us"]
    for lab in (W4A4, W4A16):
        out[f"bf16 / {MODE_SHORT[lab]}"] = tt[f"{lab} speed-up vs peer"]
    for lab in ORDER:
        out[f"{MODE_SHORT[lab]} x {'its' if lab == PEER else 'NVFP4'} floor"] = tt[f"{lab} x floor"]
    held, missed = [], []
    for key in out.index:
        g = tg[(tg["layer"] == key[0]) & (tg["T"] == key[1]) & (tg["routing"] == key[2])] if len(tg) else tg
        j = g[g["verdict"] != "no data"] if len(g) else g
        held.append(f"{int((j['verdict'] == 'holds').sum())} of {len(j)}" if len(j) else "—")
        missed.append(_miss_text(g) if len(g) else "none")
    out["targets held"] = held
    out["missed"] = missed
    return out


def _regime(t: int) -> str | None:
    return "decode" if t <= DECODE_MAX_T else "prefill" if t >= PREFILL_MIN_T else None


def regime_table(latest: pd.DataFrame, tg: pd.DataFrame) -> pd.DataFrame:
    """Per (layer, regime, mode), over the regime's T and both routings: the bf16 layer's time over the mode's (lowest
    and highest), the mode's time over the NVFP4 floor and the bf16 layer's over its own (lowest, highest), and the
    target checks that hold. Decode: T <= :data:`DECODE_MAX_T`; prefill: T >= :data:`PREFILL_MIN_T`."""
    tt = time_table(latest)
    if not len(tt):
        return pd.DataFrame()
    tt = tt.reset_index()
    tt["regime"] = tt["T"].map(_regime)
    out = []
    for layer in _layer_order(tt["layer"]):
        for regime in ("decode", "prefill"):
            g = tt[(tt["layer"] == layer) & (tt["regime"] == regime)]
            if not len(g):
                continue
            ts = sorted(set(g["T"]))
            for lab in (W4A4, W4A16):
                sp, xf, pf = g[f"{lab} speed-up vs peer"], g[f"{lab} x floor"], g[f"{PEER} x floor"]
                j = tg[(tg["layer"] == layer) & (tg["T"].isin(ts)) & (tg["mode"] == lab)
                       & (tg["verdict"] != "no data")] if len(tg) else tg
                out.append({"layer": layer, "regime": regime, "mode": MODE_SHORT[lab],
                            "T": ", ".join(map(str, ts)), "bf16 / mode, lowest": sp.min(),
                            "bf16 / mode, highest": sp.max(), "mode x NVFP4 floor, lowest": xf.min(),
                            "mode x NVFP4 floor, highest": xf.max(), "bf16 x its floor, lowest": pf.min(),
                            "bf16 x its floor, highest": pf.max(),
                            "targets held": f"{int((j['verdict'] == 'holds').sum())} of {len(j)}" if len(j) else "—"})
    return pd.DataFrame(out).set_index(["layer", "regime", "mode"])


def mode_table(latest: pd.DataFrame) -> pd.DataFrame:
    """Per (layer, T): W4A4's time over W4A16's (below 1: W4A4 faster) in a graph replay and in an eager call, for
    each routing."""
    if not len(latest):
        return pd.DataFrame()
    out = {}
    for layer, t, routing in _cases(latest):
        row = out.setdefault((layer, t), {})
        for col, name in (("median_us", "graph"), ("eager_per_call_us", "eager")):
            row[f"W4A4 / W4A16, {name}, {routing}"] = (_one(latest, layer, t, routing, W4A4, col)
                                                      / _one(latest, layer, t, routing, W4A16, col))
    df = pd.DataFrame.from_dict(out, orient="index")
    df.index = pd.MultiIndex.from_tuples(df.index, names=["layer", "T"])
    return df.dropna(axis=1, how="all")


def eager_summary(latest: pd.DataFrame) -> pd.DataFrame:
    """Per (layer, T, routing): each form's eager call (``eager_per_call_us``: one call on its own, the larger of its
    GPU and host time), its ratio to the same form's graph replay, and the bf16 layer's eager time over each NVFP4
    mode's (above 1: NVFP4 faster without a graph too). Empty where no row has eager timings."""
    et = eager_table(latest)
    if not len(et) or not et.filter(like="eager us").notna().any().any():
        return pd.DataFrame()
    out = pd.DataFrame(index=et.index)
    for lab in ORDER:
        out[f"{MODE_SHORT[lab]} eager us"] = et[f"{lab} eager us"]
    for lab in ORDER:
        out[f"{MODE_SHORT[lab]} eager / graph"] = et[f"{lab} eager / graph"]
    for lab in (W4A4, W4A16):
        out[f"bf16 / {MODE_SHORT[lab]}, eager"] = et[f"{PEER} eager us"] / et[f"{lab} eager us"]
    return out


def _signals(r: dict, other_holds: bool, smallest_excess: float) -> str:
    """What the row's own numbers say about a miss, each signal only where it applies (thresholds: this module's
    constants): compute-bound; the other mode holds the check; zipf slower than uniform; the share of the time above
    the floor that every call of the mode pays (its smallest excess over its floor in the same rows: the chain of
    small kernels the floor does not count); bf16 near its floor while the mode is not (bandwidth not drawn)."""
    mode, other = MODE_SHORT[r["mode"]], "W4A16" if r["mode"] == W4A4 else "W4A4"
    out = []
    if r["bound"] == "compute":
        out.append(f"compute-bound: {mode} at {r['x floor']:.2f}x the MMA floor, bf16 at {r['bf16 x floor']:.2f}x "
                   f"its own: {mode}'s GEMM mainloop runs below the bf16 GEMM's rate")
    if other_holds:
        out.append(f"{other} holds this check: the gap is "
                   + ("W4A4's quantization of the activations and the intermediate" if mode == "W4A4"
                      else "W4A16's in-register weight decode"))
    if r["zipf / uniform"] >= ZIPF_SLOWER:
        out.append(f"skewed routing: {r['zipf / uniform']:.2f}x the uniform case's time")
    if r["bound"] != "compute" and r["above floor us"] > 0:
        out.append(f"fixed costs: the smallest excess over the floor of any {mode} call, {smallest_excess:,.1f} us, "
                   f"is {smallest_excess / r['above floor us']:.0%} of this one's {r['above floor us']:,.1f} us")
    if r["bound"] != "compute" and r["bf16 x floor"] <= PEER_NEAR_FLOOR < r["x floor"]:
        out.append(f"bandwidth: bf16 at {r['bf16 x floor']:.2f}x its floor, {mode} at {r['x floor']:.2f}x the "
                   f"NVFP4 floor with {r['copies per expert']:,.1f} token copies per touched expert")
    return "; ".join(out) or f"near the limit ({r['measured / limit']:.2f}x it)"


def miss_table(latest: pd.DataFrame, tg: pd.DataFrame) -> pd.DataFrame:
    """One line per target check that misses: measured / limit, the mode's time over the NVFP4 floor and the bf16
    layer's over its own, the floor's bound, touched experts and token copies per touched expert, the time above the
    NVFP4 floor, zipf over uniform (the same layer, T and mode), and the signals of :func:`_signals`."""
    miss = tg[tg["verdict"] == "misses"] if len(tg) else tg
    nv = latest[latest["label"] != PEER] if len(latest) else latest
    smallest = (nv["median_us"] - nv["floor_nvfp4_us"]).groupby(nv["label"]).min() if len(nv) else {}
    out = []
    for m in miss.rename(columns={"measured / limit": "over"}).itertuples():
        r = latest[(latest["layer"] == m.layer) & (latest["tokens"] == m.T) & (latest["routing"] == m.routing)]
        mine = r[r["label"] == m.mode].iloc[0]
        floor = float(mine["floor_nvfp4_us"])
        uni = _one(latest, m.layer, m.T, "uniform", m.mode)
        others = tg[(tg["layer"] == m.layer) & (tg["T"] == m.T) & (tg["routing"] == m.routing)
                    & (tg["mode"] != m.mode) & (tg["target"].str.split(":").str[0] == m.target.split(":")[0])]
        rec = {"layer": m.layer, "T": m.T, "routing": m.routing, "mode": m.mode,
               "check": TARGET_SHORT.get(m.target, m.target), "measured / limit": m.over,
               "x floor": float(mine["median_us"]) / floor,
               "bf16 x floor": _one(latest, m.layer, m.T, m.routing, PEER, "ratio"),
               "bound": str(mine.get("floor_bound") or "—"), "touched experts": int(mine["touched_experts"]),
               "copies per expert": m.T * int(mine["top_k"]) / int(mine["touched_experts"]), "floor us": floor,
               "above floor us": float(mine["median_us"]) - floor,
               "zipf / uniform": float(mine["median_us"]) / uni if m.routing != "uniform" else float("nan")}
        rec["signals"] = _signals({**rec, "zipf / uniform": np.nan_to_num(rec["zipf / uniform"])},
                                  bool(len(others)) and bool((others["verdict"] == "holds").all()),
                                  float(smallest.get(m.mode, np.nan)))
        rec["mode"] = MODE_SHORT[m.mode]
        out.append(rec)
    cols = ["layer", "T", "routing", "mode", "check", "measured / limit", "x floor", "bf16 x floor", "bound",
            "touched experts", "copies per expert", "floor us", "above floor us", "zipf / uniform", "signals"]
    df = pd.DataFrame(out, columns=cols).rename(columns={"x floor": "mode x NVFP4 floor",
                                                          "bf16 x floor": "bf16 x its floor",
                                                          "floor us": "NVFP4 floor us"})
    return df.set_index(["layer", "T", "routing", "mode", "check"])


def layers_table(layers=LAYERS) -> pd.DataFrame:
    """The bench's layers: shape, top-k, and the weights' bytes in NVFP4 and in bf16 (GB) and their ratio."""
    return pd.DataFrame([{"layer": x.name, "like": x.like, "experts E": x.experts, "top-k": x.top_k,
                          "hidden H": x.hidden, "intermediate I": x.intermediate,
                          "NVFP4 weights GB": x.weight_bytes("nvfp4") / 1e9,
                          "bf16 weights GB": x.weight_bytes("bf16") / 1e9,
                          "bf16 / NVFP4 bytes": x.weight_bytes("bf16") / x.weight_bytes("nvfp4")}
                         for x in layers]).set_index("layer")
