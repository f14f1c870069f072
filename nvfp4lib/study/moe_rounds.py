"""Notebook 11's development rounds as data: what each round changed, what was predicted before it was measured, and
the outcome, computed from the rows of ``data/moe.jsonl`` that measured it.

A :class:`Round` names the commits whose recorded runs measured its outcome; its ``outcome`` reads them through a
:class:`Reader` (which remembers the runs it read, so the table names them). Predictions are forecasts, typed here as
they were written down before the run; outcomes are never typed: a round whose effect was measured only in a
development run outside ``data/`` says so (``unrecorded``). A commit of the data that no round names gets a generated
row (its rows against the previous commit's), so new runs show up here without editing this module.
"""
from __future__ import annotations

import pandas as pd

from . import moe_runs as runs
from .moe_reader import (
    KEY,
    NO_PREDICTION,
    NOT_RECORDED,
    PEER,
    SHORT,
    W4A4,
    W4A16,
    Reader,
    Round,
    ab_at,
    arm_means_at,
    arms_in_order,
    chain_steps,
    gemm_phases,
    generic,
    in_turn,
    not_probe,
    per_label,
    profile_kernels,
    rounds_table_of,
    span,
    speedups,
    split_ab,
    timed_in_order,
    timeline_phases,
)
from .moe_report import DECODE_MAX_T, PREFILL_MIN_T, predicted_floors
from .moe_tile_rounds import TILE_ROUNDS

__all__ = ["Round", "ROUNDS", "Reader", "rounds_table", "NOT_RECORDED", "NO_PREDICTION"]


# --- the predictions and outcomes of each round ---------------------------------------------------------------------

def _floors_prediction() -> str:
    p = predicted_floors()
    dec = p[p.index.get_level_values("T") <= DECODE_MAX_T]
    mem = int(((dec["NVFP4 floor bound"] == "memory") & (dec["bf16 floor bound"] == "memory")).sum())
    top = p[p.index.get_level_values("T") == p.index.get_level_values("T").max()]
    comp = int((top["NVFP4 floor bound"] == "compute").sum())
    ratio = span(dec["bf16 floor / NVFP4 floor"])
    return (f"From the H100 datasheet floors alone (no run): at T <= {DECODE_MAX_T} both floors are memory-bound in "
            f"{mem} of {len(dec)} (layer, T) cases and bf16 floor / NVFP4 floor is {ratio}x: an NVFP4 layer at its "
            "floor beats a bf16 layer at its own by that much (the decode target asks 2.5x). "
            f"At T = {int(top.index.get_level_values('T')[0])} the NVFP4 floor is compute-bound on {comp} of "
            f"{len(top)} layers: prefill can at best match bf16.")


def _first_run(r: Reader) -> str | None:
    d = r.at("b3d663e", routing=None)
    if not len(d):
        return None
    dec, pre = d[d["tokens"] <= DECODE_MAX_T], d[d["tokens"] == d["tokens"].max()]
    return (f"both routings, T <= {DECODE_MAX_T}: {speedups(dec, (W4A4,))}; T = {int(pre['tokens'].max())}: "
            f"{speedups(pre, (W4A4,))}")


def _w4a16_built(r: Reader) -> str | None:
    d = r.at("a29692e", routing=None)
    if not len(d):
        return None
    dec, pre = d[d["tokens"] <= DECODE_MAX_T], d[d["tokens"] >= PREFILL_MIN_T]
    n16 = int((d["label"] == W4A16).sum())
    return (f"W4A16 ok in {n16} cases; T <= {DECODE_MAX_T}: {speedups(dec)}; T >= {PREFILL_MIN_T}: {speedups(pre)} "
            "(both routings)")


def _quantizer(r: Reader) -> str | None:
    def gap(commit):
        d = r.at(commit, tokens=lambda t: t <= DECODE_MAX_T)
        if not len(d):
            return pd.Series(dtype=float)
        w = d.pivot_table(index=["layer", "tokens"], columns="label", values="median_us", aggfunc="last")
        return (w[W4A4] - w[W4A16]).dropna() if {W4A4, W4A16} <= set(w.columns) else pd.Series(dtype=float)
    before, after = gap("a29692e"), gap("5467d03")
    if not len(after):
        return None
    return (f"W4A4 - W4A16 at T <= {DECODE_MAX_T}, uniform: {span(after, '{:+,.1f}')} us at 5467d03 "
            f"(at a29692e: {span(before, '{:+,.1f}')} us)")


def _speedup_between(before: str, after: str, **narrow):
    def outcome(r: Reader) -> str | None:
        p = r.pair(before, after, **narrow)
        if not len(p):
            return None
        return (f"{before} -> {after}, time before / after: "
                + per_label(p, lambda g: g["before"] / g["after"], "{:.2f}x", names={PEER: "bf16 (untouched)"}))
    return outcome


def _deepseek_t8(r: Reader) -> str | None:
    p = r.pair("a29692e", "5467d03", layers=["deepseek-v3"], tokens=[8])
    if not len(p):
        return None
    parts = [f"{SHORT[row.label]} {row.before:,.1f} -> {row.after:,.1f} us ({row.after / row.before - 1:+.1%})"
             for row in p.itertuples()]
    return "deepseek-v3, T = 8, uniform, whole layer, a29692e -> 5467d03: " + ", ".join(parts)


def _routing_launch(r: Reader) -> str | None:
    small = r.pair("5467d03", "e48509f", tokens=lambda t: t <= 8)
    if not len(small):
        return None
    out = ("5467d03 -> e48509f, uniform, T <= 8, time after - before: "
           + per_label(small, lambda g: g["after"] - g["before"], "{:+,.1f}") + " us")
    mid = r.pair("5467d03", "e48509f", layers=["deepseek-v3", "qwen3-moe"], tokens=[64])
    if len(mid):
        out += "; T = 64 at k = 8 (512 copies): " + per_label(mid, lambda g: g["after"] - g["before"], "{:+,.1f}") \
            + " us"
    big = r.pair("5467d03", "e48509f", layers=["mixtral"], tokens=[512])
    if len(big):
        out += "; mixtral T = 512 (1024 copies): " + per_label(big, lambda g: g["after"] - g["before"], "{:+,.1f}") \
            + " us"
    return out


def _routing_limit(r: Reader) -> str | None:
    parts = []
    for layer, t, lab, commits in (("qwen3-moe", 64, W4A4, ("5467d03", "e48509f", "b89955e")),
                                   ("deepseek-v3", 64, W4A4, ("5467d03", "e48509f", "78ee5fe")),
                                   ("mixtral", 512, W4A16, ("5467d03", "e48509f", "363d7d6"))):
        vals = []
        for c in commits:
            d = r.at(c, layers=[layer], tokens=[t])
            d = d[d["label"] == lab]
            if len(d):
                vals.append(f"{float(d['median_us'].iloc[0]):,.1f} us ({c})")
        if len(vals) == len(commits):
            parts.append(f"{layer} T = {t} {SHORT[lab]}, uniform: " + " -> ".join(vals))
    return "; ".join(parts) or None


def _eager_added(r: Reader) -> str | None:
    d = r.at("363d7d6", tokens=[1])
    if not len(d) or "eager_per_call_us" not in d:
        return None
    return ("T = 1, uniform, eager call / graph replay over the three layers: "
            + per_label(d, lambda g: g["eager_per_call_us"] / g["median_us"], "{:.2f}x"))


def _eager_between(before: str, after: str):
    def outcome(r: Reader) -> str | None:
        e = r.pair(before, after, col="eager_per_call_us", tokens=[1])
        g = r.pair(before, after, tokens=[1])
        if not len(e):
            return None
        return (f"{before} -> {after}, T = 1, uniform, eager call after - before: "
                + per_label(e, lambda x: x["after"] - x["before"], "{:+,.1f}") + " us; graph replays (untouched): "
                + per_label(g, lambda x: x["after"] / x["before"] - 1, "{:+.1%}"))
    return outcome


def _loop_back(r: Reader) -> str | None:
    p = r.pair("49b6b84", "c81fa1a", layers=["mixtral"])
    if not len(p):
        return None
    big, small = p[p["tokens"] >= PREFILL_MIN_T], p[p["tokens"] <= DECODE_MAX_T]
    pct = lambda x: x["after"] / x["before"] - 1  # noqa: E731
    return ("mixtral, uniform, graph replay, 49b6b84 -> c81fa1a (another card and day), time change: "
            f"T >= {PREFILL_MIN_T}: " + per_label(big, pct, "{:+.1%}", names={PEER: "bf16 (untouched)"})
            + f"; T <= {DECODE_MAX_T}: " + per_label(small, pct, "{:+.1%}", names={PEER: "bf16 (untouched)"}))


def _fused_gather(r: Reader) -> str | None:
    p = r.pair("2c539d9", "6fc5c7f")
    if not len(p):
        return None
    t1 = p[p["tokens"] == 1]
    return (f"2c539d9 (GEMM path rows) -> 6fc5c7f, uniform, graph replay, {len(p)} cases, time after - before: "
            + per_label(p, lambda g: g["after"] - g["before"], "{:+.1f} us", labels=(W4A4, W4A16))
            + "; T = 1: " + per_label(t1, lambda g: g["after"] - g["before"], "{:+.1f} us", labels=(W4A4, W4A16)))


def _gemv_ab(r: Reader) -> str | None:
    """The decode path's rows (``gemv`` true) against the GEMM path's (``gemv_max_tokens`` 0) at one commit."""
    ab = ab_at(r, "2c539d9", "gemv")
    if ab is None:
        return None
    d, off, on = ab[0], ab[1]["median_us"], ab[2]["median_us"]
    ratio = (on / off).dropna()
    if not len(ratio):
        return None
    r.used["2c539d9"] = sorted(set(d["run_id"]))
    q16 = [f"{on[k]:.1f} us against {off[k]:.1f}" for k in ratio.index if k[0] == "qwen3-moe" and k[1] == 1
           and k[3] == W4A16]
    return (f"GEMV over GEMM graph time {span(ratio)}x over {len(ratio)} cases (above one: slower)"
            + (f"; Qwen3-like T = 1 W4A16 {q16[0]}" if q16 else "")
            + ". The GEMVs' CUDA-core decode and reductions cost more per weight byte than the tensor-core "
            "GEMM's, and re-read weights per token copy: the path stays off (GEMV_MAX_TOKENS = 0)")


def _small_tiles(r: Reader) -> str | None:
    """The small-tiles A/B, after what the profile it came from shows: each W4A4 quantize launch's step in the chain."""
    ab = arm_means_at(runs.SMALL_TILES_COMMIT, "quant_small_tiles", ("default tiles", "small tiles"), "W4A4")(r)
    d = r.at(runs.CHAIN_PROFILE_COMMIT, tokens=(1,))
    d = d[d["label"] == W4A4] if len(d) and "profile" in d else d.iloc[0:0]
    steps = [f"{us:.1f}" for _, row in d.iterrows() for name, us in chain_steps(row["profile"]) if "quant" in name]
    head = ("the profile (W4A4 T = 1): the quantize launches end " + " and ".join(steps) + " us after the kernel "
            "before them") if steps else None
    return "; ".join(x for x in (head, ab) if x) or None


def _vs_peer_at(commit: str):
    """A run as shipped beside the bf16 layer at ``commit``: per layer, T and routing, each mode's graph time and the
    bf16 peer's, and the mode over the peer (above one: slower than bf16)."""
    def outcome(r: Reader) -> str | None:
        d = r.at(commit, routing=None)
        if not len(d):
            return None
        r.used[commit] = sorted(set(d["run_id"]))
        t = d.pivot_table(index=["layer", "tokens", "routing"], columns="label", values="median_us", aggfunc="first")
        if PEER not in t:
            return None
        parts = [f"{k[0]} T = {k[1]} {k[2]}: " + ", ".join(
            f"{SHORT.get(lab, lab)} {v[lab]:.0f} us ({v[lab] / v[PEER]:.2f}x)" for lab in (W4A4, W4A16)
            if lab in t and v[lab] == v[lab]) + f", bf16 {v[PEER]:.0f} us" for k, v in t.iterrows()]
        return "graph replay, each mode over the bf16 layer: " + "; ".join(parts)
    return outcome


def _a16_scale_ab_at(commit: str):
    """The W4A16 scale route's A/B at ``commit`` (moe-bench --a16-int-scale)."""
    return arm_means_at(commit, "a16_int_scale", ("f32 route", "integer route"), "W4A16")


def _profiled(d: pd.DataFrame) -> pd.Series:
    """The rows with a graph-replay profile (an A/B run with --profile, not a run as shipped at the same commit)."""
    return d["profile"].map(lambda p: isinstance(p, dict)) if "profile" in d else pd.Series(False, index=d.index)


# the W4A16 word layout's A/B (moe-bench --a16-own-words): its three runs
_a16_own_ab = in_turn([arm_means_at(c, "a16_own_words", ("fp16 path's bytes", "own words"), "W4A16")
                        for c in (runs.A16_OWN_COMMIT, runs.A16_OWN_MORE_COMMIT, runs.A16_OWN_PROFILE_COMMIT)])


def _wide_ab(r: Reader) -> str | None:
    """The wide decode form's A/B at :data:`.moe_runs.WIDE_COMMIT`: off against the shipped rule (where a call's grid
    fits one CTA per SM), and how the other arm (every call wide) fared, wrong cases counted from every row."""
    base = split_ab(runs.WIDE_COMMIT, "wide_decode", ("off", "idle"), keep=None,
                     names=("wide form off", "wide where the grid fits one CTA per SM"))(r)
    if base is None:
        return None
    d = r.all[r.all["git_commit"].astype(str).str[:7] == runs.WIDE_COMMIT]
    d = d[d["wide_decode"].eq("all")]
    bad = d[d["status"] != "ok"]
    off = r.rows[(r.rows["commit"] == runs.WIDE_COMMIT) & r.rows["wide_decode"].eq("off")].set_index(KEY)["median_us"]
    ok = d[d["status"] == "ok"].set_index(KEY)["median_us"]
    ratio = (ok / off.reindex(ok.index)).dropna()
    return (base + f". Every call wide (the A/B's third arm): {len(bad)} of {len(d)} cases wrong ("
            + ", ".join(f"{x.layer} T = {x.tokens} {SHORT.get(x.label, x.label)}" for x in bad.itertuples())
            + f"), the others {span(ratio)}x the narrow form's time. The form left the package: slower where it was "
            "meant to help, and wrong in cases not debugged")


def _chain_ab(r: Reader) -> str | None:
    """The second chained-launch A/B (three arms in one run): unchained against chained without any GEMM trigger,
    then that against every GEMM letting the next kernel launch."""
    commit = runs.CHAIN_COMMITS[1]
    first = split_ab(commit, "chain_pdl", (False, True), keep=lambda d: d["chain_gemm"].eq(False),
                      names=("unchained", "chained, no GEMM trigger"))(r)
    second = split_ab(commit, "chain_gemm", (False, True), keep=lambda d: d["chain_pdl"].eq(True),
                       names=("chained, no GEMM trigger", "every GEMM letting the next kernel launch"))(r)
    if first is None or second is None:
        return None
    return f"{first}. Then {second}"


def _chain_shipped(r: Reader) -> str | None:
    """The shipped form's run (chained; the NVFP4-activation GEMMs letting the next kernel launch) against the second
    A/B's unchained arm, the same cases, graph replay."""
    ab = ab_at(r, runs.CHAIN_COMMITS[1], "chain_pdl", keep=lambda d: d["chain_gemm"].eq(False))
    now = r.at(runs.CHAIN_COMMITS[2], tokens=(1, 8, 64))
    if ab is None or not len(now):
        return None
    off = ab[1]["median_us"]
    both = pd.concat({"off": off, "now": now.set_index(KEY)["median_us"]}, axis=1).dropna()
    if not len(both):
        return None
    faster = int((both["now"] < both["off"]).sum())
    q = [f"{SHORT.get(k[3], k[3])} {v['off']:.1f} -> {v['now']:.1f} us" for k, v in both.iterrows()
         if k[0] == "qwen3-moe" and k[1] == 1]
    return (f"the shipped form (one run at {runs.CHAIN_COMMITS[2]}) against the unchained arm of the run before "
            f"({runs.CHAIN_COMMITS[1]}), {len(both)} cases, uniform, graph replay: faster in {faster}; the ratio "
            f"shipped / unchained {span(both['now'] / both['off'])}. Qwen3-like T = 1: {', '.join(q)}")


def _timeline(r: Reader) -> str | None:
    """The per-CTA phases of each T = 1 row of the timeline run: median us of each phase, per GEMM."""
    d = r.at(runs.TIMELINE_COMMIT, tokens=(1,))
    if not len(d) or "timeline" not in d:
        return None
    from ..bench.timeline import PHASES

    parts = []
    for _, row in d.iterrows():
        gemms = [f"{gemm} {tiles} CTAs: "
                 + ", ".join(f"{k} {ph[k][0]:.1f}" for k, _, _ in PHASES if k in ph and k != "total")
                 + f" (total {ph['total'][0]:.1f})" for gemm, tiles, ph in gemm_phases(row)]
        if gemms:
            parts.append(f"{row['layer']} {SHORT.get(row['label'], row['label'])}: {'; '.join(gemms)}")
    if not parts:
        return None
    return ("median us per CTA with a tile, one graph replay, T = 1 (phases: tile search, wait for the kernel "
            "before, first stage landed after that, rest of the mainloop, epilogue): " + " | ".join(parts))


def _operand_ab(commit: str):
    """A QUANT_TO_OPERAND A/B in one run (moe-bench --quant-operand off on)."""
    return split_ab(commit, "quant_operand", (False, True), keep=None,
                     names=("codes and prologue", "quantized into the operand"))


def _operand_shipped(r: Reader) -> str | None:
    """The shipped run: the Mixtral-like T = 1 A/B repeated (both routings), and the layer as shipped at T = 1."""
    d = r.rows[r.rows["commit"] == runs.OPERAND_COMMITS[2]] if len(r.rows) else r.rows
    if not len(d) or "quant_operand" not in d:
        return None
    # (the A/B's runs hold the Mixtral-like layer alone; the shipped run every layer)
    alone = d.groupby("run_id")["layer"].agg(lambda v: set(v) == {"mixtral"})
    ab = d[d["run_id"].isin(alone[alone].index) & (d["tokens"] == 1) & (d["label"] == W4A4)].sort_values("run_id")
    cells = [f"{g} {'on' if v else 'off'} {x:.1f} us" for (g, v), x in
             ab.groupby(["routing", "quant_operand"])["median_us"].last().items()]
    ship = r.at(runs.OPERAND_COMMITS[2], tokens=(1,), routing=None)
    q = [f"{SHORT.get(x['label'], x['label'])} {x['routing']} {x['median_us']:.1f} us" for _, x in ship.iterrows()
         if x["layer"] == "qwen3-moe"]
    r.used[runs.OPERAND_COMMITS[2]] = sorted(set(d["run_id"]))
    return ("Mixtral-like T = 1 W4A4 A/B repeated (one run): " + ", ".join(cells)
            + "; the layer as shipped, Qwen3-like T = 1: " + ", ".join(q))


def _prefetch_ab(r: Reader) -> str | None:
    """The L2 prefetch's A/B: the arms in the order they ran, and one pair's kernels (Qwen3-like T = 1 uniform)."""
    base = arms_in_order(runs.PREFETCH_COMMIT, "prefetch_l2", {False: "off", True: "on"})(r)
    if base is None:
        return None
    d = r.rows[(r.rows["commit"] == runs.PREFETCH_COMMIT) & (r.rows["routing"] == "uniform")
               & (r.rows["label"] == W4A4)].sort_values("run_id")
    kern = [f"{'on' if x['prefetch_l2'] else 'off'}: {profile_kernels(x)}" for _, x in d.head(2).iterrows()
            if "profile" in x and profile_kernels(x)]
    return base + (". The first pair's W4A4 kernels (uniform, us): " + " | ".join(kern) if kern else "") + \
        ". The prefetch left the package"


def _prewait_first(r: Reader) -> str | None:
    """The first PREWAIT_STAGES A/B (timed rows), then its timeline probe (Qwen3-like T = 1, per value)."""
    base = split_ab(runs.PREWAIT_COMMITS[0], "prewait_stages", (0, 2), keep=not_probe,
                     names=("all first stages before the wait", "2"))(r)
    if base is None:
        return None
    d = r.rows[r.rows["commit"] == runs.PREWAIT_COMMITS[0]]
    probe = d[~not_probe(d)].sort_values("run_id") if "timeline" in d else d.iloc[0:0]
    lines = [f"{int(x['prewait_stages']) or 'all first'} stages before the wait, {SHORT.get(x['label'], x['label'])}: "
             f"{timeline_phases(x)}"
             for _, x in probe.iterrows()]
    r.used[runs.PREWAIT_COMMITS[0]] = sorted(set(d["run_id"]))
    return base + (". The timeline probe (Qwen3-like T = 1, median us per CTA): " + " | ".join(lines) if lines else "")


def _prewait_eager(r: Reader) -> str | None:
    """The eager re-measure: per case, each arm's graph time and eager time per call with the host probe read after
    it, in the order the arms ran; then each arm's eager host time per call in units of the host probe (the host's
    speed at the time), and how many cases the PREWAIT arm's graph replays were faster in."""
    d = timed_in_order(r, runs.PREWAIT_EAGER_COMMIT,
                        ("prewait_stages", "eager_per_call_us", "eager_host_us", "host_probe_idle_us"))
    if d is None:
        return None
    parts = []
    for key, g in d.groupby(["layer", "tokens", "label"], sort=False):
        arms = ", ".join(f"{int(x['prewait_stages'])}: {x['median_us']:.1f} / {x['eager_per_call_us']:.0f} "
                         f"(probe {x['host_probe_idle_us']:.0f})" for _, x in g.iterrows())
        parts.append(f"{key[0]} T = {key[1]} {SHORT.get(key[2], key[2])}: {arms}")
    units = d["eager_host_us"] / d["host_probe_idle_us"]  # an eager call's host time in units of the probe
    arms = "; ".join(f"PREWAIT {int(v)}: mean {g.mean():.2f}, {span(g)} over {len(g)} rows"
                     for v, g in units.groupby(d["prewait_stages"]))
    graph = d.groupby(["layer", "tokens", "label", "prewait_stages"])["median_us"].mean().unstack()
    faster = int((graph[2] < graph[0]).sum()) if {0, 2} <= set(graph.columns) else 0
    return ("stages before the wait: graph us / eager us per call (host probe us), in the order run: "
            + "; ".join(parts) + f". An eager call's host time over the host probe: {arms}. Graph replay, mean of "
            f"each arm's two: 2 faster in {faster} of {len(graph)} cases")


def _prewait_shipped(r: Reader) -> str | None:
    """The shipped run with PREWAIT_STAGES for the W4A16 decode GEMMs against the run before it (QUANT_TO_OPERAND's
    shipped run), both routings, per mode."""
    p = r.pair(runs.OPERAND_COMMITS[2], runs.PREWAIT_COMMITS[2], routing=None)
    if not len(p):
        return None
    parts = []
    for lab in (W4A16, W4A4):
        g = p[p["label"] == lab]
        if len(g):
            faster = int((g["after"] < g["before"]).sum())
            parts.append(f"{SHORT[lab]} after / before {span(g['after'] / g['before'])} ({faster} of {len(g)} faster)")
    q = [f"{SHORT.get(x['label'], x['label'])} {x['routing']} {x['after']:.1f} us (was {x['before']:.1f})"
         for _, x in p.iterrows() if x["layer"] == "qwen3-moe" and x["tokens"] == 1]
    return (f"the shipped run ({runs.PREWAIT_COMMITS[2]}) against the run before ({runs.OPERAND_COMMITS[2]}), "
            f"{len(p)} cases, both routings, graph replay: " + ", ".join(parts) + ". Qwen3-like T = 1: " + ", ".join(q))


ROUNDS = (
    Round("NVFP4MoE end to end on cute-hopper, W4A4 only (W4A16 not built): the first moe-bench run",
          _floors_prediction, ("b3d663e",), _first_run),
    Round("W4A16 kernel mode: NVFP4MoE(activations='bf16') on cute-hopper, bf16 activations straight into wgmma, "
          "weights decoded to bf16 in registers", "",
          ("a29692e",), _w4a16_built),
    Round("The W4A4 quantizer in two Triton launches (nn/quant_triton.py) instead of ~45 torch kernels per pass",
          "W4A4 at T <= 64 costs about the W4A16 time plus ~10 us.", ("5467d03",), _quantizer),
    Round("Decode tiles: 16- and 32-token tiles, two CTAs per SM, chosen up to 16 rows per expert",
          "The GEMMs at 1-2 rows per expert go from ~1 TB/s to 2 TB/s or more.", ("5467d03",),
          _speedup_between("a29692e", "5467d03", tokens=lambda t: t <= DECODE_MAX_T),
          "the per-GEMM bandwidths (a development sweep)"),
    Round("A warp-parallel tile search: each CTA finds its tile by warp shuffles, not a loop over the G groups",
          "~20% off DeepSeek's down GEMM at T = 8.", ("5467d03",), _deepseek_t8,
          "the down GEMM's own time (a development sweep)"),
    Round("Routing and the weighted un-permute in one Triton launch each (nn/routing_triton.py), shared with the "
          "bf16 peer", "~20-25 us off every layer call at decode sizes, ours and the peer's; the ratio to the peer "
          "grows most where our call is shortest.", ("e48509f",), _routing_launch),
    Round("The one-program routing only up to 128 token copies, torch's form above", "",
          ("b89955e", "78ee5fe", "363d7d6"), _routing_limit),
    Round("moe-bench times each layer eagerly too (eager_* fields)", "", ("363d7d6",), _eager_added),
    Round("Triton launches after the first call the compiled launcher directly (kernels/common/triton_launch.py)",
          "About -250 us per W4A4 eager call at T = 1 (6 launches x ~45 us), about -80 us for W4A16 and the peer.",
          ("b6e4a9a",), _eager_between("363d7d6", "b6e4a9a"),
          "the A/B alternating both launch paths on one card (a development run)"),
    Round("The fast launch keys on id(kernel) (a JITFunction hashed its source on each call)", "",
          ("49b6b84",), _eager_between("b6e4a9a", "49b6b84")),
    Round("GEMMs of at most 32 groups find their tile in a loop again (kernel.LOOP_GROUPS), the warp search above",
          "Mixtral-like layer (8 experts): T >= 512 2-8% faster in a graph; T <= 64 unchanged within +-3%.",
          ("c81fa1a",), _loop_back, "the A/B of both forms on one H100, one process each (a development run)"),
    Round("Decode steps (T <= 8) as weight-streaming Triton GEMVs on the packed weights: no routing, gather or "
          "un-permute; K split to ~1024 programs (nn/moe_gemv.py). An A/B in one run: the same commit, path off",
          "Qwen3-like T = 1, W4A16: from ~35 us to ~12-15 us (the two GEMMs streaming 19 MB at 2-2.5 TB/s instead of "
          "~0.8, the routing, gather and un-permute gone).", ("2c539d9",), _gemv_ab),
    Round("W4A4 quantizes the token copies in packed order in one Triton launch (the gather fused into the quantizer, "
          "no memset with a static scale); W4A16 gathers its bf16 rows in one Triton launch instead of index_select",
          "", ("2c539d9", "6fc5c7f"), _fused_gather),
    Round("Split-K at decode (the _x configs): a call whose tiles leave SMs idle splits each tile's K over several "
          "CTAs; the tile's last CTA adds the fp32 slices in slice order and runs the epilogue (one launch). First "
          "rule: up to two CTAs per SM, slices of at least 2 K tiles. An A/B in one run (moe-bench --split-k off on)",
          "Qwen3-like T = 1: gate/up 15 -> 8-10 us, down 8 -> 5-6 us, the layer 32.5 -> ~25 us (W4A16) and 43 -> "
          "~35 us (W4A4); Mixtral-like T = 1's down GEMM about 2x faster.", ("e599182",), split_ab("e599182")),
    Round("Split-K rule: one CTA per SM (sms // CTAs slices), slices of at least 4 K tiles: a second CTA on an SM "
          "shares its decode throughput, so only idle SMs gain",
          "Qwen3-like T = 1 unsplit (as with split-K off); Mixtral-like T = 1's down GEMM in 2 slices about as fast "
          "as in 4.", ("75912ef",), split_ab("75912ef")),
    Round("Split-K rule 'balance' (a knob, SPLIT_RULE): the fewest slices that minimise the busiest SM's K tiles, "
          "so a 96-tile GEMM on 132 SMs splits too. An A/B in one run against the shipped 'idle' rule "
          "(moe-bench --split-k idle balance)",
          "Qwen3-like T = 1's gate/up GEMM in 4 slices about 25% faster (W4A4 12.1 -> ~9-10 us), the layer 2-3 us "
          "faster; every other case unchanged.", ("d8f8ad5",),
          split_ab("d8f8ad5", "split_rule", ("idle", "balance"), keep=None, names=("rule idle", "balance"))),
    Round("The W4A4 quantizer's one-program form (a knob, nn.quant_triton.ONE_PROGRAM): where the padded tile holds "
          "at most 16384 elements, x's amax, the global scale and the rows in one launch instead of a memset, the "
          "amax launch and the quantize launch. An A/B in one run (moe-bench --quant-one-program off on)",
          "Qwen3-like W4A4 T = 1 about 5-6 us faster (its two quantizations ~3 us each instead of ~5.5 and ~7 us); "
          "T = 8 unchanged (past the knob's size).", ("57ed0a0",),
          split_ab("57ed0a0", "quant_one_program", (False, True), keep=None, names=("one program off", "on"))),
    Round("The one-launch routing as one tl.sort of (expert, copy) keys with tl.histogram's offsets (made for the EP "
          "layer), which lets it take up to 1024 token copies (nn.routing_triton.ROUTE_MAX_COPIES; torch's form "
          "above 128 before). An A/B in one run on an H200 (moe-bench --route-max-copies 128 1024) at T = 64 and 128",
          "None written for the single layer before the run (the EP change's: the sort takes ~5-10 us at 1024 "
          "copies, where torch's form is ~7 kernels).", ("c42370e",),
          split_ab("c42370e", "route_max_copies", (128, 1024), keep=None, names=("torch form above 128 copies",
                                                                                  "the sort up to 1024"))),
    Round("The wide decode form (a knob then, hopper_varlen.config.WIDE_DECODE): four warpgroups per CTA, the second "
          "pair taking each stage's odd 64-K sub-block into its own accumulators and handing them over through shared "
          "memory; a decode call took it where its grid fits one CTA per SM. An A/B in one run on an H200 "
          "(moe-bench --wide-decode off idle all, T = 1, 8, 64, uniform)",
          "Qwen3-like T = 1: gate/up GEMM 12 -> ~8 us, down 8 -> ~6.5 us, the layer ~5 us faster in both modes; "
          "Mixtral-like T = 1's down GEMM ~1.5x faster; grids past one CTA per SM unchanged (every call wide: within "
          "5%).", (runs.WIDE_COMMIT,), _wide_ab,
          "an ncu probe of both forms (Qwen3-like T = 1): twice the warps and eligible warps per scheduler, issue "
          "slots 28 -> 32% busy, 20% more instructions, the GEMMs as long or longer (development, in "
          "hopper_varlen/config.py)"),
    Round("The deep decode form (a knob then, hopper_varlen.config.DEEP_DECODE): the 16-token decode tilings at 16 "
          "stages instead of 8 (216 KB, one CTA per SM) where a call's grid fits one CTA per SM, so a CTA requests "
          "twice the stages at once. An A/B in one run on an H200 (moe-bench --deep-decode off on, T = 1, 8, uniform)",
          "Qwen3-like T = 1: gate/up GEMM 11.5-13 -> ~7-8 us (its down GEMM, all 6 K tiles in flight already, "
          "unchanged), the layer ~4-5 us faster in both modes; Mixtral-like T = 1's down GEMM ~1.5x faster.",
          (runs.DEEP_COMMIT,), split_ab(runs.DEEP_COMMIT, "deep_decode", (False, True), keep=None,
                                    names=("8 stages", "16 stages where the grid fits one CTA per SM")),
          "the ncu source counters that led to it: the top stall of that GEMM is the wait for a stage's TMA data "
          "(development, in hopper_varlen/config.py)"),
    Round("Captured NVFP4 calls of at most 64 rows as the fused kernel (hopper_varlen.kernel.FUSE_MAX_ROWS): the "
          "prologue's work inside the GEMM, one launch instead of two per GEMM. An A/B in one run on an H200 "
          "(moe-bench --fuse-max-rows 0 64, W4A4, T = 1, 8, uniform)",
          "Qwen3-like T = 1 W4A4 ~2-3 us faster (two prologue launches of 1.3-1.4 us gone, each GEMM a little "
          "longer); DeepSeek- and Mixtral-like decode likewise in absolute terms.", (runs.FUSE_COMMIT,),
          split_ab(runs.FUSE_COMMIT, "fuse_max_rows", (0, 64), keep=None,
                    names=("prologue kernel", "fused at up to 64 rows"))),
    Round("Chained launches (kernels.common.pdl.CHAIN): the layer's Triton kernels and the activation prologue "
          "launched by programmatic dependent launch, each waiting for the kernel before it, then letting the next "
          "launch; every GEMM letting the next kernel launch when its mainloop ends; the two amax words cleared by "
          "the routing launch (no fill kernels). An A/B in one run on an H200 (moe-bench --chain-pdl off on, "
          "T = 1, 8, 64, uniform)",
          "Each link hides ~0.5 us of a small kernel's launch and start: the W4A16 layer ~2 us faster, the W4A4 "
          "layer ~4-6 us faster; prefill unchanged.", (runs.CHAIN_COMMITS[0],),
          split_ab(runs.CHAIN_COMMITS[0], "chain_pdl", (False, True), keep=None,
                    names=("unchained", "chained, every GEMM letting the next launch"))),
    Round("The GEMM's trigger as its own knob (pdl.CHAIN_GEMM). A second A/B in one run on an H200 (moe-bench "
          "--chain-pdl off on gemm: unchained; chained without any GEMM trigger; chained with every GEMM's)",
          "None written as numbers; the reading of the first A/B: W4A16's T = 1 losses come from the down GEMM "
          "launched early beside the gate/up GEMM, so without the GEMM trigger W4A16 keeps the gains of T = 8 and "
          "64 and loses nothing at T = 1.", (runs.CHAIN_COMMITS[1],), _chain_ab),
    Round("Shipped: chained launches on, the GEMM trigger for NVFP4-activation GEMMs only (W4A4: the layer follows "
          "them with a quantization; W4A16's gate/up GEMM is followed by the down GEMM). One run on an H200 (moe-bench "
          "as shipped, T = 1, 8, 64, uniform)",
          "Each mode as its better arm of the second A/B ran: W4A4 as with every GEMM's trigger, W4A16 as without.",
          (runs.CHAIN_COMMITS[2],), _chain_shipped),
    Round("Chained launches scoped to the single-GPU layer's forward (pdl.scope): the expert-parallel steps and "
          "direct calls of the routing and quantizer launch unchained, as before the chain. One run on an H200 "
          "(Qwen3-like T = 1, both modes and routings)",
          "None written down before the run: the layer's own chain is unchanged, so its times should hold.",
          ("e13c986",), generic(runs.CHAIN_COMMITS[2], "e13c986")),
    Round("A probe, not shipped: moe-bench --timeline, the GEMMs built with per-CTA stamps (clock64 at entry, tile "
          "found, after the wait, first stage landed, mainloop end, epilogue end), read from one graph replay. One run "
          "on an H200 (T = 1 and 8, both modes, uniform)",
          "None as numbers: the split-K fit's ~4 us per CTA (start, pipeline fill, hand-over) should show as the "
          "phases around the mainloop.", (runs.TIMELINE_COMMIT,), _timeline),
    Round("W4A4's two quantizations write the GEMMs' fp16 operand themselves (nn.moe.QUANT_TO_OPERAND; "
          "quant_triton.quantize_to_operand, e2m1 · block scale · 2^-7, the prologue's values) and the GEMMs run "
          "without their prologues (PreparedWeights.call_operand): two launches fewer. An A/B in one run on an H200 "
          "(moe-bench --quant-operand off on, W4A4, T = 1, 8, 64 and prefill T = 4096 Qwen3-like, uniform)",
          "Qwen3-like T = 1 W4A4 ~2-2.5 us faster (34.4 -> ~32 us), every W4A4 decode case by about that; prefill "
          "some 20-40 us faster.", (runs.OPERAND_COMMITS[0],), _operand_ab(runs.OPERAND_COMMITS[0])),
    Round("The operand's 16 values per block stored as one contiguous run (the first form stored even and odd "
          "elements apart, 2-byte stores 4 bytes apart). The A/B again, one run on an H200",
          "The losses of the first A/B past T = 8 gone (the quantization as fast as codes plus prologue or faster); "
          "T = 1 as before.", (runs.OPERAND_COMMITS[1],), _operand_ab(runs.OPERAND_COMMITS[1])),
    Round("Shipped: QUANT_TO_OPERAND on. One run on an H200: the Mixtral-like T = 1 A/B again (the second A/B's one "
          "loss), then the layer as shipped (T = 1, 8, 64, uniform and Zipf, both modes)",
          "Mixtral-like T = 1 within noise of the codes arm.", (runs.OPERAND_COMMITS[2],), _operand_shipped),
    Round("Static activation scales, as ModelOpt and compressed-tensors checkpoints give them (NVFP4MoE(..., "
          "input_scales=), calibrated once per layer on a seeded 64-token batch): W4A4 without its two amax "
          "launches. An A/B in one run on an H200 (moe-bench --input-scales dynamic static, W4A4, T = 1, 8, 64, "
          "uniform); static rows are reported apart from the issue's per-call targets",
          "Qwen3-like T = 1 W4A4 ~4-5 us faster (~29 -> ~25 us: two amax launches of ~2-3 us each in the chain).",
          (runs.STATIC_COMMIT,), split_ab(runs.STATIC_COMMIT, "input_scales", ("dynamic", "static"), keep=None,
                                      names=("per-call scales", "static scales"))),
    Round("The routing launch asking L2 for the packed weights of every expert the step touches (a knob then, "
          "nn.moe.PREFETCH_L2: 64 more programs of bulk L2 prefetches, where the touched experts' bytes fit half the "
          "L2; of the bench's cases only the Qwen3-like layer at T = 1). An A/B in one run on an H200 (moe-bench "
          "--prefetch-l2 off on off on, Qwen3-like T = 1, both modes and routings)",
          "Qwen3-like T = 1 ~2-3.5 us faster in both modes (W4A4 ~29 -> ~26 us, W4A16 ~27 -> ~24): the down GEMM's "
          "first stage from L2 and part of the gate/up GEMM's.", (runs.PREFETCH_COMMIT,), _prefetch_ab),
    Round("Only 2 stages' weights asked for before a GEMM CTA's wait for the kernel before, the other first stages' "
          "weights with their activations after it (hopper_varlen.kernel.PREWAIT_STAGES; a CTA asked for all 8 "
          "first). An A/B in one run on an H200 (moe-bench --prewait-stages 0 2, T = 1, 8, both modes, uniform), and "
          "the timeline probe at 0, 2 and 1",
          "The first stage lands ~1 us sooner after the wait (its activations no longer behind 72 KB of weights in "
          "the copy engine's queue): each decode GEMM ~1 us faster, Qwen3-like T = 1 ~2 us faster in both modes; "
          "no change, or slower, if the copy engine does not take requests in order.", (runs.PREWAIT_COMMITS[0],),
          _prewait_first),
    Round("The A/B again in the other order (2 then 0), T = 1, 8, 64, both modes, uniform, one run on an H200",
          "As the first A/B: W4A16 faster, W4A4 within noise.", (runs.PREWAIT_COMMITS[1],),
          split_ab(runs.PREWAIT_COMMITS[1], "prewait_stages", (0, 2), keep=None,
                    names=("all first stages before the wait", "2"))),
    Round("Shipped: PREWAIT_STAGES = 2 for the W4A16 decode GEMMs only (tilings of at most 32 tokens; the W4A4 "
          "GEMMs, whose wait for their quantization already hides the first stage, and the study tilings as before). "
          "One run on an H200 (the layer as shipped, T = 1, 8, 64, uniform and Zipf, both modes)",
          "W4A16 decode as the A/Bs' faster arm, W4A4 unchanged.", (runs.PREWAIT_COMMITS[2],), _prewait_shipped),
    Round("The eager calls re-measured: in both A/Bs the PREWAIT arm's eager time per call was higher. One run on an "
          "H200 (moe-bench --prewait-stages 0 2 2 0, W4A16, Qwen3- and Mixtral-like T = 1 and 8, uniform), each row "
          "with the host's speed read just after it (calls.host_probe)",
          "Written before the run: a kernel 1-3 us shorter cannot make a host-bound call ~100 us slower, so the eager "
          "times should follow the host's speed, not the arm; if both PREWAIT arms are still slower at the same "
          "host speed, PREWAIT_STAGES goes back to 0.", (runs.PREWAIT_EAGER_COMMIT,), _prewait_eager),
    Round("The single GEMM's study tilings (over 16 rows per expert) with the once-wait (tuning.ONCE_WAIT, shipped "
          "from 819396d; notebook 10's rounds). One run on an H200 (moe-bench --once-wait off on, W4A4, Qwen3- and "
          "DeepSeek-like T = 512 and 4096, uniform)",
          "None written down before the run; the serving rounds' shapes gained 0.9-2.7 us each.",
          (runs.ONCE_WAIT_COMMIT,), arms_in_order(runs.ONCE_WAIT_COMMIT, "once_wait", {False: "off", True: "on"})),
    Round("A rule by K: at 65-128 rows per expert a GEMM of K <= 4096 takes the 96-token tiles (tuning.SHORT_K, "
          "shipped in aca63ef from S2 and S2-dual's A/B; notebook 10's rounds). One run on an H200 (moe-bench "
          "--short-k 0 4096, W4A4, Mixtral-like T = 512 and DeepSeek-like T = 4096, uniform and Zipf); switched off "
          "in c2ab5a1",
          "Mixtral-like T = 512 ~3% faster (its gate/up GEMM, K = 4096, is S2-dual's tiling case), DeepSeek-like "
          "T = 4096 ~1% (its down GEMM is S2's N and K over 256 experts).",
          (runs.SHORT_K_COMMIT,), arms_in_order(runs.SHORT_K_COMMIT, "short_k", {0: "off", 4096: "K <= 4096"})),
    Round("The dual GEMM's tier of 17-128 rows per expert in the 96-token tiles with 32-token steps (tuning.DUAL_96, "
          "from S1-dual and S2-dual's A/B; notebook 10's rounds). One run per layer on an H200 (moe-bench --dual-96 "
          "off on, W4A4, Qwen3- and Mixtral-like T = 512, DeepSeek-like T = 4096, uniform and Zipf); narrowed to "
          "up to 64 rows per expert in 8dda376",
          "Mixtral-like T = 512 and DeepSeek-like T = 4096 1-3% faster (128 rows per expert: two 64-token tiles, the "
          "weights decoded twice, as on S1-dual, which gained 2%), Qwen3-like T = 512 3-8% faster (32 rows per "
          "expert: one tile either way, two CTAs per SM).",
          (runs.DUAL_96_COMMIT,), arms_in_order(runs.DUAL_96_COMMIT, "dual_96", {False: "off", True: "on"})),
    Round("The same tiles for the dual GEMMs of up to 64 rows per expert only (tuning.DUAL_96 = 64: one tile covers "
          "such a group with either tiling, so the weights are decoded once either way). One run per layer on an H200 "
          "(moe-bench --dual-96 0 64, W4A4, Mixtral-like T = 256 and DeepSeek-like T = 2048: 64 rows per expert, "
          "uniform and Zipf)",
          "Both layers 3-8% faster (two CTAs per SM on the gate/up GEMM, as Qwen3-like T = 512 in the round before).",
          (runs.DUAL_64_COMMIT,), arms_in_order(runs.DUAL_64_COMMIT, "dual_96", {0: "none", 64: "up to 64 rows"})),
    Round("The serving GEMM's tile found by warp 0 alone and handed to the other warps in shared memory "
          "(hopper_varlen.kernel.TILE_HANDOFF, from the study shapes' profiles and A/B; notebook 10's rounds). One run "
          "on an H200 (moe-bench --tile-handoff 1 0 1, Qwen3- and Mixtral-like T = 1 and 8, both modes, uniform)",
          "None written down before the run; at decode warp 0's search is as long as before (the warp search above "
          "32 groups), so the layers should move little.",
          runs.HANDOFF_COMMITS, arms_in_order(runs.HANDOFF_COMMITS[1], "tile_handoff", {0: "off", 1: "on"})),
    Round("Dual GEMMs of K <= 2048 in the 96-token tiles with 32-token steps over the whole tier of 65-128 rows per "
          "expert (tuning.DUAL_96_K, from S2-dual; notebook 10's rounds). One run on an H200 (moe-bench --dual-96-k "
          "0 2048, W4A4, Qwen3-like T = 1024 and 2048, uniform and Zipf); shipped at 2048 after it",
          "T = 1024 (64 rows per expert: the tiles already) unchanged; T = 2048 (128 rows per expert: two 64-token "
          "tiles, the weights decoded twice) within +-3%, not known which way.",
          (runs.DUAL_96_K_COMMIT,), arms_in_order(runs.DUAL_96_K_COMMIT, "dual_96_k", {0: "off", 2048: "K <= 2048"})),
    Round("W4A16's weight decode converts the E4M3 block scales in integer arithmetic (hopper_rs.ops.A16_INT_SCALE): "
          "cvt to f16x2, a mask, one mad.hi (LEA.HI in SASS) in place of the route through f32, on weights packed "
          "canonical (negative scales' signs moved into the codes, zero scales' codes zeroed: the same values). One "
          "run on an H200 (moe-bench --a16-int-scale 0 1 0 1, W4A16, Qwen3- and Mixtral-like T = 1, 8, 64, uniform "
          "and Zipf)",
          "W4A16 GEMM mainloops ~8% shorter (issue-bound at decode); Qwen3-like T = 1 ~25.1 -> ~24.2 us; Mixtral-like "
          "T = 1 and 8 5-8% faster (101.9 -> ~95 us, 278 -> ~260); T = 64 alike; W4A4 unchanged.",
          (runs.A16_SCALE_COMMIT,), _a16_scale_ab_at(runs.A16_SCALE_COMMIT),
          "the offline SASS (sm_90a) of the Qwen3-like decode GEMMs, the prediction's basis: the scales' conversion 7 "
          "-> 3 instructions per k16 word, the mainloop body 359 -> 327 instructions per K tile (hopper_rs/ops.py)"),
    Round("The same A/B on the cases the first run left out: DeepSeek-like at decode, and prefill. One run on an H200 "
          "(moe-bench --a16-int-scale 0 1, W4A16: DeepSeek-like T = 1, 8, 64; Qwen3- and Mixtral-like T = 4096 with "
          "the bf16 peer, arms 0 1 0 1)",
          "DeepSeek-like T = 1, 8, 64 3-6% faster (its gate/up GEMM runs 56 K tiles per CTA: mainloop-bound, as "
          "Mixtral-like); prefill T = 4096 3-6% faster on both layers (the decode shares the issue slots with the "
          "MMAs), Qwen3-like still slower than the bf16 peer.",
          (runs.A16_SCALE_MORE_COMMIT,), _a16_scale_ab_at(runs.A16_SCALE_MORE_COMMIT)),
    Round("W4A4's quantizer launches small inputs in smaller tiles (nn.quant_triton.SMALL_TILES: at least 128 "
          "programs, e.g. 2 rows x 4 blocks each for the Qwen3-like input at T = 1 instead of 4 x 32 on 8 programs; "
          "the same bits). From the Qwen3-like T = 1 profile recorded at fbe952b (moe-bench --profile, kernel by "
          "kernel): each W4A4 quantization ends several us after the kernel before it, read as its own work on 8 "
          "programs. One run "
          "on an H200 (moe-bench --quant-small-tiles 0 1 0 1, W4A4, the three layers at T = 1, 8, 64, uniform); off "
          "after it",
          "Each quantize launch's own work ~4.5 -> ~1.5 us at Qwen3-like T = 1; the layer ~29.6 -> ~25-26 us (the "
          "gate/up GEMM's weights then have a shorter head start, so not the whole ~6 us); T = 8 and the other "
          "layers' T = 1 and 8 2-4 us faster; T = 64 1-3 us; W4A16 unchanged.",
          (runs.CHAIN_PROFILE_COMMIT, runs.SMALL_TILES_COMMIT), _small_tiles),
    Round("The tile handoff again at decode, where the GEMMs have more than 32 groups (the warp search): a sanity run "
          "of moe-bench after a refactor had the Qwen3-like W4A16 layer at T = 1 faster with the handoff off. One run "
          "on an H200 "
          "(moe-bench --tile-handoff 0 1 0 1, Qwen3- and DeepSeek-like, T = 1 and 8, both modes, uniform)",
          "No difference beyond ~0.5 us (the first A/B's Qwen3-like T = 1 rows were 25.1, 26.6, 26.5 us on, off, on: "
          "not one way); if the handoff off is faster by 1 us or more in every pair, it should be limited to the "
          "GEMMs that find their tile in a loop (at most 32 groups).",
          (runs.HANDOFF_DECODE_COMMIT,), arm_means_at(runs.HANDOFF_DECODE_COMMIT, "tile_handoff", ("handoff off", "on"),
                                                  "both modes"),
          "the sanity run (10 replays per timing): Qwen3-like W4A16 T = 1 24.6 us with the handoff off against 26.0 "
          "on, two arms each"),
    Round("No change: prefill measured as shipped, the three layers at T = 4096, both modes and routings, beside the "
          "bf16 layer in one run on an H200 (moe-bench --tokens 4096 --routing uniform zipf --mode nvfp4 bf16), for "
          "the H200 view of issue 41's prefill targets",
          "", (runs.PREFILL_H200_COMMIT,), _vs_peer_at(runs.PREFILL_H200_COMMIT)),
    Round("W4A16's weights in their own word layout (hopper_rs.ops.A16_OWN_WORDS): each k16 word's 8 codes moved "
          "once, at prepare, where the bf16 decode takes two of its four registers with one shift and a mask (the "
          "other two: two shifts, a select and a mask): 11 integer instructions per word instead of 15, the same "
          "values. One run on an H200 (moe-bench --a16-own-words 0 1 0 1, W4A16, Qwen3- and Mixtral-like T = 1, 8, "
          "64, uniform and Zipf; then 0 1: DeepSeek-like T = 1, 8, 64 and Qwen3- and Mixtral-like T = 4096 beside "
          "the bf16 layer)",
          "As the scale route's round (the same 32 instructions fewer per K tile), more where the integer pipe binds "
          "(3 of the 4 per word are integer ops, issued at half rate): Mixtral-like T = 1, 8, 64 4-8% faster; "
          "DeepSeek-like T = 1, 8, 64 3-6%; Qwen3-like T = 1 unchanged within 0.5 us (its GEMMs' chains are "
          "latency-bound, as that round showed), T = 8 and 64 1-4%; prefill T = 4096 Mixtral-like 3-6%, Qwen3-like "
          "1-3%; the same bits in both arms.",
          (runs.A16_OWN_COMMIT, runs.A16_OWN_MORE_COMMIT, runs.A16_OWN_PROFILE_COMMIT), _a16_own_ab,
          "the offline SASS (sm_90a) of the Qwen3-like decode GEMMs, the prediction's basis: per k16 word 22 -> 18 "
          "instructions (LOP3 -2, SHF -1, IMAD.SHL -1), the mainloop body 328 -> 296 per K tile (hopper_rs/layout.py)"),
    Round("Split-K rule 'pair' (a knob, SPLIT_RULE): as 'idle', but two CTAs per SM where every slice keeps at least "
          "16 K tiles: the Mixtral-like down GEMM at T = 1 in 4 slices of 28 K tiles (256 CTAs) instead of 2 of 56. "
          "From the Nsight Compute rows of that GEMM (notebook 11's profile table: 2 warps per scheduler, issue slots "
          "under half busy, DRAM under half its peak). One run on an H200 (moe-bench --split-k idle pair idle pair "
          "--profile, Mixtral- and Qwen3-like T = 1, both modes, uniform); shipped after it, then the same A/B at "
          "Mixtral-like T = 1, 2, 8",
          "The Mixtral-like down GEMM ~30 -> ~20-22 us in both modes (a second CTA per SM issuing while the first "
          "waits: ~1.6-1.75x the SM's issue rate over its 56 K tiles), the layer W4A16 ~90 -> ~80-82 us and W4A4 "
          "~106 -> ~96-98; Qwen3-like T = 1 unchanged (its splits stay as they are).",
          (runs.PAIR_COMMIT, runs.PAIR_SHIPPED_COMMIT),
          in_turn([split_ab(c, "split_rule", ("idle", "pair"), keep=None, names=("rule idle", "pair"))
                    for c in (runs.PAIR_COMMIT, runs.PAIR_SHIPPED_COMMIT)], "; then, shipped: ")),
    Round("No change: decode measured as shipped (the own word layout and the 'pair' rule in), the three layers at "
          "T = 1, 8, 64, both modes and routings, beside the bf16 layer in one run on an H200 (moe-bench --tokens 1 8 "
          "64 --routing uniform zipf --mode nvfp4 bf16), for the H200 view of issue 41's decode targets",
          "", (runs.DECODE_H200_COMMIT,), _vs_peer_at(runs.DECODE_H200_COMMIT)),
    Round("Split-K's 'pair' rule with a minimum of 8 K tiles per slice instead of 16 (an A/B of PAIR_MIN_K_TILES): of "
          "the decode cases only the Qwen3-like T = 1 gate/up GEMM changes, 96 CTAs of 16 K tiles -> 192 of 8 (two "
          "per SM on 60 SMs). One run on an H200 (moe-bench --pair-min-k-tiles 16 8 16 8 --profile, both modes; its "
          "W4A16 rows are wrong: the routing+gather launch of the next round, on at that commit, raced the GEMM)",
          "That GEMM ~10.8 -> ~7.5 us (W4A16) and ~11.5 -> ~8.5 (W4A4): its CTAs are latency-bound (issue slots "
          "22-27% busy in the ncu rows), so two per SM run nearly in parallel; the layer ~3 us faster in both modes.",
          (runs.PAIR_MIN_COMMIT,),
          arm_means_at(runs.PAIR_MIN_COMMIT, "pair_min_k_tiles", ("minimum 16", "8"), "W4A4", values=(16, 8),
                       keep=lambda d: d["label"] == W4A4)),
    Round("W4A16's routing and gather of x's rows in one launch (nn.routing_triton.ROUTE_GATHER): each program counts "
          "the copies before its own in (expert, copy) order and copies its row; program 0 writes the offsets and, "
          "launched chained, lets the GEMM launch only after them (the GEMM reads them before its own wait). Its "
          "first form let every program trigger at once: wrong at T <= 8, found by the run's reference check and "
          "the GPU tests. Runs on an H200 (moe-bench --route-gather 0 1 0 1 --profile, W4A16)",
          "W4A16 decode ~0.5-1 us faster on every layer (one chained launch fewer), T = 64 within 1 us.",
          runs.ROUTE_GATHER_COMMITS,
          in_turn([arm_means_at(c, "route_gather", ("two launches", "one"), "W4A16", keep=_profiled)
                    for c in runs.ROUTE_GATHER_COMMITS], "; then, fixed: ")),
    Round("No change: decode measured as shipped (the routing+gather launch in), the three layers at T = 1, 8, 64, "
          "both modes and routings, beside the bf16 layer in one run on an H200",
          "", (runs.DECODE_H200_2_COMMIT,), _vs_peer_at(runs.DECODE_H200_2_COMMIT)),
    Round("W4A16 GEMMs letting the next kernel launch at their mainloop's end (kernels.common.pdl.CHAIN_GEMM_A16, a "
          "build knob): the down GEMM's launch, tile search and first two stages of weights under the gate/up GEMM's "
          "epilogue. One run on an H200 (moe-bench --chain-gemm-a16 0 1 0 1 --profile, W4A16, T = 1 and 8)",
          "Qwen3-like T = 1 W4A16 ~1-1.5 us faster, T = 8 alike; Mixtral-like T = 1 within +-3%.",
          (runs.CHAIN_A16_COMMIT,), arm_means_at(runs.CHAIN_A16_COMMIT, "chain_gemm_a16", ("off", "on"), "W4A16")),
    Round("No change: W4A4 with static activation scales (as NVFP4 checkpoints give them: no amax launches) against "
          "scales computed per call, the three layers at T = 1, 8, 64 as shipped, one run on an H200 (moe-bench "
          "--input-scales dynamic static --mode nvfp4)",
          "", (runs.STATIC_SHIPPED_COMMIT,),
          arm_means_at(runs.STATIC_SHIPPED_COMMIT, "input_scales", ("per call", "static"), "W4A4",
                       values=("dynamic", "static"))),
    Round("W4A4 (scales per call): x's amax found by the routing launch, one program over x as a padded tile of at "
          "most 16384 elements, and no amax launch before the first quantization (nn.routing.AMAX_IN_ROUTE). One run "
          "on an H200 (moe-bench --amax-in-route 0 1 0 1 --profile, W4A4, T = 1 and 8; DeepSeek-like T = 1, 0 1)",
          "W4A4 decode ~1-1.5 us faster where x fits (Qwen3-like T <= 8, Mixtral-like T <= 4, DeepSeek-like T <= 2): "
          "Qwen3-like T = 1 ~29.3 -> ~28; larger steps unchanged.",
          (runs.AMAX_ROUTE_COMMIT,), arm_means_at(runs.AMAX_ROUTE_COMMIT, "amax_in_route", ("amax launch", "in the "
                                                                                            "routing"), "W4A4")),
    Round("The GEMMs' TMA descriptors asked for at entry, before the tile search (hopper_varlen.kernel."
          "EARLY_DESCRIPTORS), after ncu's stall samples by SASS line put the decode GEMMs' warps at the stage-full "
          "wait. One run on an H200 (moe-bench --early-descriptors 0 1 0 1 --profile, T = 1 and 8, both modes)",
          "W4A16 at T = 1 and 8 0.3-0.9 us faster (its down GEMM, which starts after the gate/up GEMM has ended); "
          "the early-launched GEMMs (W4A4's, W4A16's gate/up) unchanged.", (runs.EARLY_DESC_COMMIT,),
          arm_means_at(runs.EARLY_DESC_COMMIT, "early_descriptors", ("after the search", "at entry"), "both modes")),
    Round("Warp 0 waiting at the tile handoff's barrier with the other warps instead of arriving without waiting "
          "(hopper_varlen.kernel.HANDOFF_WAIT), after racecheck's reports on the plain GEMM were found to come with "
          "that non-waiting arrival. One run on an H200 (moe-bench --handoff-wait 0 1 1 0, T = 1 and 8, both modes)",
          "racecheck clean on the plain GEMM; every case within 1%, the same bits.", (runs.HANDOFF_WAIT_COMMIT,),
          arm_means_at(runs.HANDOFF_WAIT_COMMIT, "handoff_wait", ("arrive", "wait"), "both modes")),
    Round("The down GEMM and the weighted un-permute in one launch (nn.moe.COMBINE_IN_GEMM, PreparedWeights.combine, "
          "up to 64 copies): each CTA counts its rows in at its column block's word; the block's last CTA sums every "
          "token's copies over its columns, from L2, in the un-permute's order (the same bits). Two forms, one run "
          "each on an H200 (moe-bench --combine-in-gemm 0 1 0 1 --profile, T = 1 and 8, both modes; the one-launch "
          "arm's down GEMM includes the sum)",
          "T = 1 ~1-1.5 us faster in both modes on every layer (Qwen3-like W4A16 ~24 -> ~22.8 us), T = 8 ~0.5-1 us.",
          runs.COMBINE_COMMITS, in_turn([arm_means_at(c, "combine_in_gemm", ("two launches", "one"), "both modes")
                                          for c in runs.COMBINE_COMMITS], "; then, the copies loaded together: ")),
) + TILE_ROUNDS


def rounds_table(rows: pd.DataFrame, rounds=ROUNDS) -> pd.DataFrame:
    """One line per round (then per commit of the data no round names): :func:`.moe_reader.rounds_table_of`."""
    return rounds_table_of(rows, rounds)
