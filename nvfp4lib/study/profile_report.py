"""What bounds a kernel (``data/profiles.jsonl``, :mod:`nvfp4lib.bench.ncu_profile`) for notebooks 10 and 11: one line
per profiled kernel of the latest run of each case, with the few numbers that say where its time goes."""
from __future__ import annotations

import pandas as pd

__all__ = ["load_profiles", "profile_table", "opcode_difference", "GEMM_ROLE"]

# The kernels a case profiles, in launch order, where the order names them: a MoE layer's call runs the gate/up GEMM
# and then the down GEMM
GEMM_ROLE = {"qwen3-moe": ("gate/up", "down"), "mixtral": ("gate/up", "down")}


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
