"""What bounds a kernel for notebooks 10 and 11: one line per profiled kernel of the latest run of each case
(``data/profiles.jsonl``, :mod:`nvfp4lib.bench.ncu_profile`), with the few numbers that say where its time goes; and
the MoE layer's per-CTA timelines (``moe-bench --timeline`` rows of ``data/moe.jsonl``) as a budget per GEMM."""
from __future__ import annotations

import pandas as pd

__all__ = ["load_profiles", "profile_table", "opcode_difference", "timeline_budget", "GEMM_ROLE"]

# The kernels a case profiles, in launch order, where the order names them: a MoE layer's call runs the gate/up GEMM
# and then the down GEMM
GEMM_ROLE = {layer: ("gate/up", "down") for layer in ("qwen3-moe", "mixtral", "deepseek-v3")}
# A layer's weights by GEMM: gate and up (2·I·H) against down (H·I)
GEMM_SHARE = {"gate_up": 2 / 3, "down": 1 / 3}


def load_profiles(path=None) -> pd.DataFrame:
    from ..bench import store

    return pd.DataFrame(store.read_rows(path or store.PROFILES))


def _role(case: str, kernel: str, i: int) -> str:
    """The profiled kernel's name in the table: its role where :data:`GEMM_ROLE` names it, else class and index."""
    for prefix, roles in GEMM_ROLE.items():
        if case.startswith(prefix) and i < len(roles):
            return roles[i]
    return f"{kernel} #{i}"


def _top(d, n: int) -> str:
    if not isinstance(d, dict):
        return ""
    return ", ".join(f"{k} {v:.0%}" for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:n])  # (stored sorted by key)


def _sites(sites, n: int) -> str:
    """The ``n`` SASS lines holding the most warp-stall samples (rows from 2026-11-29 on): share, line, main reason."""
    if not isinstance(sites, list):
        return ""
    def opcode(line: str) -> str:  # (its predicate kept: "@!P0 BRA")
        words = line.split(" ")
        return " ".join(words[:2] if words[0].startswith("@") else words[:1])

    return "; ".join(f"{share:.0%} at +{off:#x} {opcode(line)} ({reason})" for off, line, share, reason in sites[:n])


def profile_table(rows: pd.DataFrame, prefix: str = "") -> pd.DataFrame:
    """Of the cases starting with ``prefix``, the latest run's rows of each: the kernel's time under ncu (alone, caches
    flushed), its grid, registers and warp instructions executed, how busy its issue slots were and with how many
    warps, its DRAM throughput, its top stall reasons and opcodes, the SASS lines where its warps stall most (rows with
    stall sites); the GPU and commit last. Empty without rows."""
    if rows is None or not len(rows) or "case" not in rows:
        return pd.DataFrame()
    sel = rows[rows["case"].astype(str).str.startswith(prefix)]
    if not len(sel):
        return pd.DataFrame()
    sel = sel[sel["run_id"] == sel.groupby("case")["run_id"].transform("max")]
    out = pd.DataFrame({
        "case": sel["case"],
        "kernel": [_role(c, k, int(i)) for c, k, i in zip(sel["case"], sel["kernel"], sel["kernel_id"])],
        "us (ncu)": sel["duration_us"].round(1),
        "CTAs": sel["grid"].astype(int),
        "regs": sel["registers"].astype(int),
        "instructions (M)": (sel["instructions"] / 1e6).round(2),
        "issue busy %": sel["issue_busy_pct"].round(1),
        "IPC": sel["ipc_active"].round(2),
        "warps/sched": sel["warps_active"].round(2),
        "eligible": sel["warps_eligible"].round(2),
        "DRAM %": sel["dram_pct"].round(1),
        "top stalls": sel["stalls"].map(lambda d: _top(d, 3)),
        "top opcodes": sel["opcodes"].map(lambda d: _top(d, 4)),
        "top stall sites": (sel["stall_sites"] if "stall_sites" in sel else pd.Series("", index=sel.index)).map(
            lambda s: _sites(s, 3)),
        "gpu": sel["gpu"].str.replace("NVIDIA ", ""),
        "commit": sel["git_commit"].astype(str).str[:7],
    })
    return out.reset_index(drop=True)


def opcode_difference(rows: pd.DataFrame, case: str, other: str) -> pd.DataFrame:
    """Warp instructions (millions) by opcode of the latest row of ``case`` and of ``other`` (the first kernel of
    each), and case - other, most added first. Only opcodes in both rows' recorded top lists: an opcode below one
    row's list has an unknown count there. Empty where either case has no row."""
    if rows is None or not len(rows) or "case" not in rows:
        return pd.DataFrame()
    picked = []
    for c in (case, other):
        sel = rows[(rows["case"] == c) & (rows["kernel_id"] == 0)]
        if not len(sel):
            return pd.DataFrame()
        r = sel.loc[sel["run_id"].idxmax()]
        picked.append({op: share * r["sass_instructions"] / 1e6 for op, share in r["opcodes"].items()})
    a, b = picked
    both = [op for op in a if op in b]
    out = pd.DataFrame({case: [a[op] for op in both], other: [b[op] for op in both]},
                       index=pd.Index(both, name="opcode"))
    out["difference"] = out[case] - out[other]
    return out.sort_values("difference", ascending=False).round(2)


def timeline_budget(rows: pd.DataFrame, min_tokens: int = 2) -> pd.DataFrame:
    """Per GEMM of each row with T >= ``min_tokens`` of the latest timeline probe run (``moe-bench --timeline``)
    whose GEMM stamped every CTA (a grid past the stamp buffer's ``TIMELINE_CTAS`` is left out): the CTAs that had a
    tile and how many per SM, the median CTA's time and the part of it outside the mainloop (tile search, wait, first
    stage, epilogue: ``fixed``), the slowest CTA, the GEMM's span (first start to last end), ``span x mainloop share``
    (the span scaled by the median CTA's mainloop share: about what the span would be were every CTA's fixed phases
    hidden under other CTAs' mainloops, as a persistent kernel would try) and the GEMM's weights streamed over the span
    against the run's measured copy ceiling. Empty without such rows."""
    from ..kernels.hopper_varlen.kernel import TIMELINE_CTAS
    from .moe_report import LABELS

    if rows is None or not len(rows) or "timeline" not in rows:
        return pd.DataFrame()
    sel = rows[rows["timeline"].map(lambda v: isinstance(v, dict)) & (rows["tokens"] >= min_tokens)]
    if not len(sel):
        return pd.DataFrame()
    sel = sel[sel["run_id"] == sel["run_id"].max()]
    out = []
    for _, r in sel.sort_values(["layer", "tokens", "mode"]).iterrows():
        for gemm, g in r["timeline"].items():
            ph = g.get("phases") or {}
            if "total" not in ph or "mainloop" not in ph or g["ctas"] >= TIMELINE_CTAS:
                continue
            total, main = ph["total"][0], ph["mainloop"][0]
            gbps = GEMM_SHARE.get(gemm, float("nan")) * r["touched_weight_bytes"] / (g["span_us"] * 1e3)
            out.append({"layer": r["layer"], "T": int(r["tokens"]), "mode": LABELS.get(r["mode"], r["mode"]),
                        "GEMM": gemm.replace("_", "/"), "CTAs": g["tiles"], "per SM": g["tiles"] / r["sm_count"],
                        "median CTA us": total, "fixed us": total - main, "fixed %": 100 * (total - main) / total,
                        "slowest CTA us": ph["total"][2], "span us": g["span_us"],
                        "span x mainloop share us": g["span_us"] * main / total,
                        "weights GB/s": gbps, "of copy ceiling %": 100 * gbps / r["ceil_copy_gbps"],
                        "gpu": str(r["gpu"]).replace("NVIDIA ", ""), "commit": str(r["git_commit"])[:7]})
    return pd.DataFrame(out).round(2)
