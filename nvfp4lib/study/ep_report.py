"""Expert parallelism (issue 42): the verdict, tables and figures of notebook 13.

Two parts, both pure pandas and matplotlib (no GPU):

- the measured part reads ``data/ep.jsonl`` (rows of :mod:`nvfp4lib.bench.ep_bench`, ``moe-bench --ep W`` under
  torchrun): the latest run measured on several GPUs (:func:`verdict`), its step split into dispatch, experts and
  combine against one GPU (:func:`phase_table`, :func:`phase_figure`), and the issue's targets checked from its rows
  (:func:`targets`);
- the computed part needs no measurement: from published model configs (:mod:`.ep_models`), the NVFP4 weight bytes
  of real MoE models and how many GPUs of each kind they need with expert parallelism (:func:`fit_table`,
  :func:`fit_figure`).
"""
from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..bench.moe_bench import EP_LAYERS, EP_TOKENS, EP_TRANSPORTS, LABELS, MoELayer
from ..bench.store import dirty_state
from .ep_models import MODELS, ModelConfig
from .plots import caption
from .plots import shown as _shown

__all__ = ["RECORD_COMMAND", "MERGE_COMMAND", "NO_DATA", "DECODE_MAX_T", "PREFILL_T", "TRANSPORT_LIMIT_US",
           "THROUGHPUT_MIN", "PEER_MIN", "GPUS", "RESERVE", "Verdict", "ep_rows", "verdict", "verdict_lines",
           "phase_table", "targets", "target_summary", "miss_table", "phase_figure", "nvfp4_bytes", "fit_table",
           "fit_figure", "shown", "targets_text", "CHANGES", "PHASES_SHOWN", "change_table", "KNOB_ABS", "knob_table"]

RECORD_COMMAND = ("timeout -k 30 480 torchrun --nproc_per_node 2 -m nvfp4lib moe-bench --ep 2 --out ep.jsonl "
                  "--no-record")
MERGE_COMMAND = "python -m nvfp4lib record ep.jsonl --into data/ep.jsonl"
NO_DATA = ("No run of the expert-parallel bench on several GPUs is recorded yet: data/ep.jsonl holds no GPU rows, so "
           "no target below is judged. To make one, on a host with 2 GPUs: `" + RECORD_COMMAND + "`, then here `"
           + MERGE_COMMAND + "` (or `--record` on a checkout that is the commit itself).")

# issue 42's targets (2 GPUs of one host)
DECODE_MAX_T = 64  # decode: T <= 64 tokens per rank
PREFILL_T = 4096
TRANSPORT_LIMIT_US = 40.0  # dispatch + combine per layer step at decode, graphed
THROUGHPUT_MIN = 1.7  # T = 4096: EP throughput over one GPU running the same W·T tokens with all experts
PEER_MIN = 2.0  # at decode: the bf16 EP peer's step over the NVFP4 EP step, same transport
MODES = {"nvfp4": LABELS["nvfp4"], "bf16": LABELS["bf16"]}
SHORT = {"nvfp4": "W4A4", "bf16": "W4A16", "peer": "bf16 peer"}
TRANSPORT_SHORT = {"all-gather": "AG", "symm-mem": "SM"}


def targets_text() -> list[str]:
    """The targets as the page states them (numbers from this module's constants)."""
    return ["exact: every EP row within its tolerance of the single-GPU layer (both transports, both modes, "
            "graphed)",
            f"decode (T <= {DECODE_MAX_T} per rank): dispatch + combine <= {TRANSPORT_LIMIT_US:g} us per layer step",
            f"T = {PREFILL_T} per rank: throughput >= {THROUGHPUT_MIN:g}x one GPU running the same W·T tokens",
            f"decode: >= {PEER_MIN:g}x faster than the bf16 EP peer on the same transport"]


# --- the measured rows ----------------------------------------------------------------------------------------------

def ep_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows measured on GPUs over several ranks (the CPU tests' rows, gpu "none (CPU)", never count)."""
    if rows is None or not len(rows) or "world" not in rows:
        return pd.DataFrame()
    sel = rows[(rows["world"] >= 2) & (rows["gpu"] != "none (CPU)")]
    return sel.reset_index(drop=True)


@dataclass(frozen=True)
class Verdict:
    """The runs the answer rests on: per (layer, T per rank), the latest GPU run with ok EP rows for it; their rows,
    and how many other GPU runs are recorded."""

    run_ids: tuple
    latest: pd.DataFrame
    older_runs: int

    @property
    def run_id(self) -> str:
        """The newest of the runs."""
        return self.run_ids[-1]

    @property
    def commit(self) -> str:
        return ", ".join(dict.fromkeys(str(c)[:7] for c in self.latest["git_commit"]))


def verdict(rows: pd.DataFrame) -> Verdict | None:
    """Per (layer, tokens per rank), the rows of the latest run (run ids start with the UTC time) of :func:`ep_rows`
    holding ok EP rows for it in both NVFP4 modes (:data:`MODES`; the latest with any ok EP row where none holds
    both): a run of a few sizes (e.g. T=4096 alone) does not hide the other sizes' latest measurements, and a knob's
    A/B run of one mode (:data:`KNOB_ABS`) does not hide the other mode's; None without any ok EP row."""
    g = ep_rows(rows)
    if not len(g):
        return None
    ok = g[(g["status"] == "ok") & (g["form"] == "ep")]
    if not len(ok):
        return None
    runs = ok.groupby(["layer", "tokens", "run_id"])["kind"].agg(lambda k: set(MODES) <= set(k)).rename("both")
    runs = runs.reset_index().sort_values(["both", "run_id"])  # both modes last, then newest last
    newest = runs.groupby(["layer", "tokens"]).tail(1).set_index(["layer", "tokens"])["run_id"]
    latest = pd.concat([g[(g["run_id"] == run) & (g["layer"] == layer) & (g["tokens"] == t)]
                        for (layer, t), run in newest.items()])
    runs = tuple(sorted(set(newest)))
    return Verdict(runs, latest.reset_index(drop=True), g["run_id"].nunique() - len(runs))


def _one(df, **match):
    sel = df
    for k, v in match.items():
        sel = sel[sel[k].isna()] if v is None else sel[sel[k] == v]
    return sel.iloc[0] if len(sel) else None


def _val(r, col) -> float:
    if r is None or col not in r or r["status"] != "ok":
        return float("nan")
    v = r[col]
    return float(v) if v is not None and not (isinstance(v, float) and np.isnan(v)) else float("nan")


def phase_table(latest: pd.DataFrame) -> pd.DataFrame:
    """Per (layer, T per rank, transport, form): the step and its phases (us, see ``PHASES`` in the rows), one GPU's
    time on all W·T tokens (NVFP4 modes), one GPU's time over the EP step (the throughput ratio), the error against
    the single-GPU layer and the status."""
    if not len(latest):
        return pd.DataFrame()
    out = []
    ep = latest[latest["form"] == "ep"]
    for r in ep.itertuples():
        row = r._asdict()
        one = _one(latest, form="single", layer=r.layer, tokens=r.tokens, kind=r.kind) if r.kind != "peer" else None
        single = _val(one, "single_us")
        out.append({"layer": r.layer, "T per rank": int(r.tokens), "transport": r.transport,
                    "form": SHORT.get(r.kind, r.kind), "step us": row.get("step_us"),
                    "dispatch us": row.get("dispatch_us"), "experts us": row.get("experts_us"),
                    "combine us": row.get("combine_us"), "dispatch + combine us": row.get("transport_us"),
                    "unaccounted us": row.get("overlap_us"), "one GPU us": single,
                    "one GPU / EP": single / row["step_us"] if row.get("step_us") else float("nan"),
                    "rel err": row.get("rel_err"), "bit-identical": row.get("bit_identical"),
                    "status": str(r.status)[:80]})
    df = pd.DataFrame(out)
    order = {t: i for i, t in enumerate(EP_TRANSPORTS)}
    df = df.assign(_l=df["layer"].map({n: i for i, n in enumerate(EP_LAYERS)}).fillna(9),
                   _t=df["transport"].map(order).fillna(9),
                   _f=df["form"].map({v: i for i, v in enumerate(SHORT.values())}).fillna(9))
    df = df.sort_values(["_l", "T per rank", "_t", "_f"]).drop(columns=["_l", "_t", "_f"])
    return df.set_index(["layer", "T per rank", "transport", "form"])


# Changes to the EP layer measured across two runs (no knob keeps the old form): (what changed, the commits of the
# runs before it, the commit after it, what was predicted before the run after it)
CHANGES = (
    ("the all-gather transport's combine in one pass (routing.weighted_rows: one Triton launch weighs and sums a "
     "token's own copies) instead of a gather to fp32, a product, two selects and a sum over every copy; symm-mem's "
     "lost copies marked through their weights instead of a select over the returned rows",
     ("927593b", "953b0a5"), "647d34e",
     "not written down before the run (the reasoning: the old all-gather combine moved ~15 GB per DeepSeek-like "
     "T=4096 step through HBM; the one-pass form reads each owned copy once)"),
    ("the all-gather transport's decode in fewer launches: the send rows packed in one Triton launch, the gathered "
     "expert ids routed in place by one counting launch (routing.route_local), only this rank's copies gathered (as "
     "32-bit words, W4A4's codes and scales as two parts the GEMM reads in place), the combine's weights read in "
     "place, no drop counting where every copy fits; W4A4's group amax taken inside the quantizer (no separate amax "
     "pass), and the experts phase's intermediate quantized over its valid rows only (no mask or fp32 copy of the "
     "whole receive buffer)",
     ("647d34e",), "7c4a089",
     "all-gather at T = 1 and 64: dispatch W4A16 ~57 -> ~25 us, W4A4 ~93 -> ~40 us (the group's amax all-reduce "
     "stays), combine ~25 -> ~20 us; T = 4096 W4A4: the experts phase ~1600 -> ~900 us (Qwen3-like) and ~8000 -> "
     "~6800 us (DeepSeek-like), dispatch about half (only owned rows gathered); symm-mem unchanged. (The runs before "
     "were on 2x H200, the run after on 2x H100: the table crosses cards)"),
    ("the routing kernel as one sort (tl.sort of (expert, copy) keys, tl.histogram for the offsets) instead of a "
     "one-hot counting loop over blocks of 32 copies; W4A4 with a dynamic scale at decode sizes on the all-gather "
     "transport: x sent as it is and quantized after the gather with the whole batch's scale, no amax all-reduce "
     "(nn.ep.GATHER_QUANTIZE_MAX_TOKENS)",
     ("7c4a089",), "956f53a",
     "the sort ~5-10 us at N = 1024 copies (T = 64 per rank: dispatch down by most of the ~55-85 us the loop took "
     "over T = 1's); all-gather W4A4 dispatch at T = 1 ~43 -> ~25 us, about W4A16's"),
    ("the symm-mem transport's index arithmetic and row writes in four Triton launches a step (nn/ep_symm_triton.py, "
     "nn.ep_symm.PLAN_TRITON) instead of ~40 small torch kernels around its three barriers; the combine's lost "
     "copies marked inside the un-permute's launch. Both runs on 2x H200, the same session",
     ("d11fa4d",), "eef77ba",
     "symm-mem dispatch + combine at T = 1 per rank from ~157-191 us to ~30-45 us, T = 64 about the same plus the "
     "bytes, T = 4096 within 10%; all-gather unchanged"),
)


# Knobs of the EP layer measured as an A/B at one commit (a run per setting; rows carry the knob's value): (what the
# knob does, the row field, (old value, new value), what was predicted before the run). knob_table shows each.
KNOB_ABS = (
    ("the symm-mem transport's put_rows as one Triton launch (nn.ep_symm.PUT_ROWS_TRITON; on since)", "put_rows",
     ("torch", "triton"), "combine at T = 4096 per rank ~3x faster (Qwen3-like W4A16)"),
    ("the all-gather W4A4 decode quantizing each gathered token once, then gathering its copies' codes "
     "(nn.ep.GATHER_QUANTIZE_ONCE_MIN_TOKENS: 257 is off, 32 on; on since)", "gather_quantize_once_min_tokens",
     (257, 32), "T = 64 per rank dispatch DeepSeek-like 61.5 -> ~46 us, Qwen3-like 39.4 -> ~34 us (the baseline from "
     "an earlier 2x H100 run); the experts phase unchanged"),
)


PHASES_SHOWN = ("dispatch", "experts", "combine", "step")  # change_table's columns, per phase


def knob_table(rows: pd.DataFrame, field: str, values) -> pd.DataFrame:
    """Per (layer, T per rank, transport, form): each phase and the whole step in the latest GPU EP row with the knob
    ``field`` at each of ``values`` (old, new), their ratios (new / old: below one, faster) and the GPU."""
    g = ep_rows(rows)
    if not len(g) or field not in g:
        return pd.DataFrame()
    g = g[(g["form"] == "ep") & (g["status"] == "ok")]
    return _side_by_side(g[g[field] == values[0]], g[g[field] == values[1]], values)


def change_table(rows: pd.DataFrame, before, after: str) -> pd.DataFrame:
    """Per (layer, T per rank, transport, form): each phase and the whole step in the latest GPU EP row at one of the
    ``before`` commits and at ``after``, and their ratios (after / before: below one, faster); only cases both hold.
    The runs may be on different machines: ``gpu`` names both."""
    g = ep_rows(rows)
    if not len(g):
        return pd.DataFrame()
    g = g[(g["form"] == "ep") & (g["status"] == "ok")].assign(c=g["git_commit"].astype(str).str[:7])
    return _side_by_side(g[g["c"].isin(list(before))], g[g["c"] == after[:7]], ("before", "after"))


_CASE = ["layer", "tokens", "transport", "kind"]


def _side_by_side(old: pd.DataFrame, new: pd.DataFrame, names) -> pd.DataFrame:
    """The latest row per case of ``old`` and of ``new`` side by side (the cases both hold): each phase as
    ``"{phase} {name} us"`` for the two ``names``, the ratios new / old, and the GPUs."""
    b, a = (x.sort_values("run_id").groupby(_CASE).tail(1).set_index(_CASE) for x in (old, new))
    both = b.index.intersection(a.index)
    if not len(both):
        return pd.DataFrame()
    b, a = b.loc[both], a.loc[both]
    out = pd.DataFrame({f"{p} {w} us": x[f"{p}_us"] for p in PHASES_SHOWN for w, x in zip(names, (b, a))})
    for p in PHASES_SHOWN:
        out[f"{p} {names[1]} / {names[0]}"] = out[f"{p} {names[1]} us"] / out[f"{p} {names[0]} us"]
    out["gpu"] = [f"{x} / {y}" if x != y else x for x, y in zip(b["gpu"], a["gpu"])]
    out = out.rename(index=SHORT, level="kind").rename_axis(["layer", "T per rank", "transport", "form"])
    return out.sort_index()


def targets(latest: pd.DataFrame) -> pd.DataFrame:
    """Each target of issue 42 per (layer, T, transport, NVFP4 mode) where it applies: measured, limit, verdict
    ('holds', 'misses', or 'no data': a time it needs has no ok row)."""
    cols = ["layer", "T", "transport", "mode", "target", "measured", "limit", "verdict"]
    if not len(latest):
        return pd.DataFrame(columns=cols)
    out = []

    def add(r, target, measured, limit, holds_if_below=True):
        if np.isnan(measured) or np.isnan(limit):
            v = "no data"
        else:
            v = "holds" if (measured <= limit if holds_if_below else measured >= limit) else "misses"
        out.append({"layer": r["layer"], "T": int(r["tokens"]), "transport": r["transport"],
                    "mode": SHORT[r["kind"]], "target": target, "measured": measured, "limit": limit, "verdict": v})

    ep = latest[(latest["form"] == "ep") & latest["kind"].isin(list(MODES))]
    for _, r in ep.iterrows():
        err = float(r["rel_err"]) if "rel_err" in r and pd.notna(r.get("rel_err")) else float("nan")
        add(r, "exact: rel err within tolerance, graphed" if r.get("graph") else "exact (eager)", err,
            float(r.get("tol", np.nan)))
        if r["tokens"] <= DECODE_MAX_T:
            add(r, f"decode: dispatch + combine <= {TRANSPORT_LIMIT_US:g} us", _val(r, "transport_us"),
                TRANSPORT_LIMIT_US)
            peer = _one(latest, form="ep", layer=r["layer"], tokens=r["tokens"], transport=r["transport"],
                        kind="peer")
            add(r, f"decode: >= {PEER_MIN:g}x faster than the bf16 EP peer",
                _val(peer, "step_us") / _val(r, "step_us"), PEER_MIN, holds_if_below=False)
        if r["tokens"] == PREFILL_T:
            one = _one(latest, form="single", layer=r["layer"], tokens=r["tokens"], kind=r["kind"])
            add(r, f"T={PREFILL_T}: >= {THROUGHPUT_MIN:g}x one GPU's throughput",
                _val(one, "single_us") / _val(r, "step_us"), THROUGHPUT_MIN, holds_if_below=False)
    return pd.DataFrame(out, columns=cols)


def target_summary(tg: pd.DataFrame) -> pd.DataFrame:
    """Per (target, transport, mode): how many cases hold, miss or lack data, the worst measured value, and where it
    misses."""
    if not len(tg):
        return pd.DataFrame()
    out = []
    for (target, transport, mode), g in tg.groupby(["target", "transport", "mode"], sort=False):
        judged = g[g["verdict"] != "no data"]
        miss = g[g["verdict"] == "misses"]
        higher_is_better = "faster" in target or "throughput" in target
        worst = (judged["measured"].min() if higher_is_better else judged["measured"].max()) if len(judged) \
            else np.nan
        out.append({"target": target, "transport": transport, "mode": mode,
                    "holds": int((g["verdict"] == "holds").sum()), "misses": len(miss),
                    "no data": len(g) - len(judged), "worst measured": worst,
                    "missed on": ", ".join(f"{r.layer} T={r.T}" for r in miss.itertuples()) or "—"})
    return pd.DataFrame(out).set_index(["target", "transport", "mode"])


def miss_table(latest: pd.DataFrame, tg: pd.DataFrame) -> pd.DataFrame:
    """Why each missed check misses, from the same run's phases (us): per miss, the ``ceiling`` its ratio could
    reach were one part free (NaN for the time target) and the reason in numbers:

    - T = PREFILL_T throughput: the EP step pays the transport (dispatch + combine) that one GPU does not; were it
      free, the ratio could reach one GPU's time / (the step - the transport);
    - decode dispatch + combine: each phase, beside the same case's W4A16 transport (no activation quantization) and
      the bf16 EP peer's (bf16 rows on the same transport): where those miss too, the transport itself is the bound;
    - decode against the bf16 EP peer: both pay the transport; were the NVFP4 experts free, the ratio could reach the
      peer's step / the NVFP4 transport; the experts' own ratio says how much of the gap is theirs."""
    cols = ["layer", "T", "transport", "mode", "target", "measured", "limit", "ceiling", "reason"]
    miss = tg[tg["verdict"] == "misses"] if len(tg) else tg
    if not len(miss):
        return pd.DataFrame(columns=cols)
    kind_of = {v: k for k, v in SHORT.items()}
    out = []
    for m in miss.itertuples():
        case = dict(form="ep", layer=m.layer, tokens=m.T, transport=m.transport)
        r = _one(latest, **case, kind=kind_of[m.mode])
        step, tr, ex = _val(r, "step_us"), _val(r, "transport_us"), _val(r, "experts_us")
        ceiling = float("nan")
        if m.target.startswith(f"T={PREFILL_T}"):
            one = _val(_one(latest, form="single", layer=m.layer, tokens=m.T, kind=kind_of[m.mode]), "single_us")
            ceiling = one / (step - tr)
            reason = (f"the transport takes {tr:.0f} us, {tr / step:.0%} of the {step:.0f} us step, which one GPU "
                      f"does not pay; the experts take {ex:.0f} us against one GPU's {one:.0f} us on all tokens "
                      f"({one / ex:.2f}x); were the transport free, the ratio could reach {ceiling:.2f}x"
                      + (": the transport is what misses" if ceiling >= m.limit else ": the experts miss too"))
        elif "dispatch + combine" in m.target:
            w16 = _val(_one(latest, **case, kind="bf16"), "transport_us")
            peer = _val(_one(latest, **case, kind="peer"), "transport_us")
            reason = (f"dispatch {_val(r, 'dispatch_us'):.0f} us + combine {_val(r, 'combine_us'):.0f} us; the same "
                      f"case's W4A16 transport {w16:.0f} us, the bf16 EP peer's {peer:.0f} us"
                      + (": the transport misses without any quantization too" if min(w16, peer) > m.limit else
                         f": {m.mode}'s activation quantization adds {tr - min(w16, peer):.0f} us"))
        else:
            p = _one(latest, **case, kind="peer")
            pstep, pex = _val(p, "step_us"), _val(p, "experts_us")
            ceiling = pstep / tr
            reason = (f"both pay the transport ({tr:.0f} us here, {_val(p, 'transport_us'):.0f} us the peer's); "
                      f"the experts take {ex:.0f} us against the peer's {pex:.0f} us ({pex / ex:.2f}x); were the "
                      f"NVFP4 experts free, the ratio could reach {ceiling:.2f}x"
                      + (": the transport alone caps it" if ceiling < m.limit else ": the experts are the gap"))
        out.append({"layer": m.layer, "T": m.T, "transport": m.transport, "mode": m.mode, "target": m.target,
                    "measured": m.measured, "limit": m.limit, "ceiling": ceiling, "reason": reason})
    return pd.DataFrame(out, columns=cols)


def gpus_of(rows: pd.DataFrame) -> str:
    """The GPUs every rank of ``rows`` ran on."""
    if "gpus_ranks" in rows:
        return ", ".join(sorted(set(str(g) for gs in rows["gpus_ranks"] if isinstance(gs, list) for g in gs)))
    return str(rows["gpu"].iloc[0])


def verdict_lines(v: Verdict | None, tg: pd.DataFrame) -> list[str]:
    """The answer in a few lines: the run (GPUs, commit, date), how many target checks hold, each target's count."""
    if v is None:
        return [NO_DATA]
    lt = v.latest
    ok = lt[lt["status"] == "ok"]
    out = []
    for run in v.run_ids:
        r = lt[lt["run_id"] == run]
        f = r.iloc[0]
        sizes = ", ".join(f"{layer} T={int(t)}" for (layer, t) in dict.fromkeys(zip(r["layer"], r["tokens"])))
        out.append(f"Verdict from run {run}: {int(f['world'])} ranks on {gpus_of(r)}, "
                   f"commit {str(f['git_commit'])[:7]} (dirty tree: {dirty_state(f.get('git_dirty'))}), "
                   f"{str(f['date'])[:10]}, "
                   f"{'CUDA graphs' if bool(f.get('graph')) else 'eager'}; {sizes}")
    judged = tg[tg["verdict"] != "no data"] if len(tg) else tg
    held = int((judged["verdict"] == "holds").sum()) if len(judged) else 0
    out.append(f"Targets of issue 42 ({len(ok)} of {len(lt)} rows ok): {held} of {len(judged)} checks hold"
               + (f", {len(tg) - len(judged)} without data" if len(tg) > len(judged) else "")
               + ("; every one holds" if len(judged) and held == len(judged) else ""))
    for target, g in tg.groupby("target", sort=False) if len(tg) else []:
        j = g[g["verdict"] != "no data"]
        out.append(f"  {target}: {int((j['verdict'] == 'holds').sum())} of {len(j)} hold")
    if v.older_runs:
        out.append(f"({v.older_runs} older GPU run(s) in data/ep.jsonl are not part of this verdict)")
    return out


def shown(df: pd.DataFrame) -> pd.DataFrame:
    """As the page shows it: times to 0.1 us, other floats to 3 significant places' worth, never a NaN."""
    if not len(df):
        return df
    out = df.copy()
    for c in out.columns:
        if str(c).startswith("rel err") or c in ("measured", "worst measured", "limit", "ceiling"):
            out[c] = out[c].map(lambda v: "—" if v is None or (isinstance(v, float) and np.isnan(v))
                                else (f"{v:.3g}" if isinstance(v, float) else v))
    return _shown(out, 2, time_digits=1)


PHASE_COLORS = {"dispatch": "C0", "experts": "C2", "combine": "C1", "one GPU": "0.55"}


def phase_figure(latest: pd.DataFrame, source: str = "data/ep.jsonl"):
    """One panel per (layer, T per rank): per transport and form a stacked bar of dispatch, experts and combine (each
    timed as its own graph), the whole step's time as a black tick, and one GPU's time on all W·T tokens (grey)."""
    ep = latest[(latest["form"] == "ep") & (latest["status"] == "ok")]
    layers = [x for x in EP_LAYERS if x in set(ep["layer"])] + sorted(set(ep["layer"]) - set(EP_LAYERS))
    tokens = sorted(set(int(t) for t in ep["tokens"]))
    fig, axes = plt.subplots(len(layers), len(tokens), figsize=(3.3 * len(tokens) + 1, 3.4 * len(layers)),
                             squeeze=False)
    for i, layer in enumerate(layers):
        for j, t in enumerate(tokens):
            ax = axes[i][j]
            names, x = [], 0
            for transport in [tr for tr in EP_TRANSPORTS if tr in set(ep["transport"])]:
                for kind in ("nvfp4", "bf16", "peer"):
                    r = _one(ep, layer=layer, tokens=t, transport=transport, kind=kind)
                    if r is None:
                        continue
                    bottom = 0.0
                    for phase in ("dispatch", "experts", "combine"):
                        v = max(_val(r, f"{phase}_us"), 0.0)
                        ax.bar(x, v, 0.7, bottom=bottom, color=PHASE_COLORS[phase],
                               label=phase if (i, j, x) == (0, 0, 0) else None)
                        bottom += v
                    ax.hlines(_val(r, "step_us"), x - 0.4, x + 0.4, colors="k", lw=2,
                              label="whole step" if (i, j, x) == (0, 0, 0) else None)
                    form = "peer" if kind == "peer" else SHORT[kind]
                    names.append(f"{TRANSPORT_SHORT.get(transport, transport)}\n{form}")
                    x += 1
            for kind in ("nvfp4", "bf16"):
                r = _one(latest[latest["status"] == "ok"], form="single", layer=layer, tokens=t, kind=kind)
                if r is None:
                    continue
                ax.bar(x, _val(r, "single_us"), 0.7, color=PHASE_COLORS["one GPU"],
                       label="one GPU, all W·T tokens" if (i, j) == (0, 0) and kind == "nvfp4" else None)
                names.append(f"1 GPU\n{SHORT[kind]}")
                x += 1
            ax.set_xticks(range(len(names)), names, fontsize=6)
            ax.set_title(f"{layer}, T={t} per rank", fontsize=9)
            ax.grid(axis="y", alpha=0.2)
            if j == 0:
                ax.set_ylabel("us per layer step (median)")
    world = int(latest["world"].iloc[0]) if len(latest) else 0
    fig.suptitle(f"EP over {world} GPUs: each step's dispatch, experts and combine (separate graphs) against one "
                 "GPU (AG: all-gather, SM: symmetric memory; peer: the bf16 EP peer)", fontsize=10)
    handles = {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(list(handles.values()), list(handles), fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 0.95))
    fig.tight_layout()
    commits = ", ".join(dict.fromkeys(str(c)[:7] for c in latest["git_commit"]))
    fig.text(0.01, -0.02, f"{caption(latest, source)}, commit {commits}", fontsize=7, ha="left", va="top")
    return fig


# --- the computed part: which models fit ---------------------------------------------------------------------------

# GPU memory as nvidia-smi reports it on the machines this project measures on (the device notes' KINDS.md:
# 81559 MiB per H100 80GB HBM3, 143771 MiB per H200)
GPUS = {"H100 80 GB": 81559 * 2**20, "H200 141 GB": 143771 * 2**20}
RESERVE = 0.3  # of each GPU's memory left for the KV cache, activations, CUDA graphs and the runtime
EP_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
HOST_GPUS = 8  # GPUs of one host: EP past it spans hosts


def nvfp4_bytes(m: ModelConfig, experts_fmt: str = "nvfp4") -> dict:
    """Weight bytes as a ModelOpt NVFP4 checkpoint stores them: the routed experts in NVFP4 (codes 0.5 B per weight,
    an E4M3 scale per 16, an fp32 global scale per matrix: :meth:`~nvfp4lib.bench.moe_bench.MoELayer.expert_bytes`),
    everything else in bf16 (attention, shared experts, dense layers, routers, norms, embeddings, LM head).
    ``experts_fmt="bf16"``: the experts in bf16 too, for comparison."""
    layer = MoELayer(m.name, m.experts, m.top_k, m.hidden, m.moe_intermediate)
    p = m.params()
    experts = m.moe_layers * layer.weight_bytes(experts_fmt)
    rest = 2 * (m.total_params() - p["routed experts"])
    return {"experts": experts, "rest": rest, "total": experts + rest}


def gpus_needed(m: ModelConfig, capacity: float, reserve: float = RESERVE, experts_fmt: str = "nvfp4"):
    """The smallest EP size (a divisor of the expert count among :data:`EP_SIZES`) at which each GPU's share — its
    experts plus a full copy of the rest — fits ``(1 - reserve) · capacity``; (size, bytes per GPU), or (None, the
    rest's bytes) when the rest alone does not fit (pure EP cannot serve it: the rest needs tensor parallelism)."""
    b = nvfp4_bytes(m, experts_fmt)
    budget = (1 - reserve) * capacity
    for g in EP_SIZES:
        if g > m.experts or m.experts % g:
            continue
        per = b["experts"] / g + b["rest"]
        if per <= budget:
            return g, per
    return None, b["rest"]


def fit_table(models=MODELS, gpus: dict = GPUS, reserve: float = RESERVE) -> pd.DataFrame:
    """Per model: parameters (computed, and as published), the NVFP4 checkpoint's bytes (experts, and the rest in
    bf16 that every EP rank holds), and per GPU kind the GPUs it needs with expert parallelism (NVFP4 experts; bf16
    experts beside it), the weight bytes each then holds, and how many tokens of KV cache (bf16) the reserved part
    of one GPU holds."""
    out = []
    for m in models:
        b = nvfp4_bytes(m)
        row = {"model": m.name, "params B": m.total_params() / 1e9, "published B": m.published_b,
               "experts E": m.experts, "NVFP4 experts GB": b["experts"] / 1e9, "rest (bf16) GB": b["rest"] / 1e9,
               "NVFP4 checkpoint GB": b["total"] / 1e9}
        for name, cap in gpus.items():
            g, per = gpus_needed(m, cap, reserve)
            gb, _ = gpus_needed(m, cap, reserve, "bf16")
            row[f"{name}: GPUs (NVFP4)"] = g if g is not None else "no fit"
            row[f"{name}: weight GB per GPU"] = per / 1e9 if g is not None else float("nan")
            row[f"{name}: GPUs (bf16 experts)"] = gb if gb is not None else "no fit"
            row[f"{name}: KV tokens per GPU (k)"] = reserve * cap / m.kv_bytes_per_token() / 1e3
        out.append(row)
    return pd.DataFrame(out).set_index("model")


def fit_figure(models=MODELS, gpus: dict = GPUS, reserve: float = RESERVE):
    """Weight GB per GPU against the EP size, per model (NVFP4 experts solid, bf16 experts dotted), with each GPU
    kind's weight budget ``(1 - reserve) · memory`` as a horizontal line."""
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    for i, m in enumerate(models):
        for fmt, style in (("nvfp4", "-"), ("bf16", ":")):
            b = nvfp4_bytes(m, fmt)
            sizes = [g for g in EP_SIZES if g <= m.experts and m.experts % g == 0]
            ax.plot(sizes, [(b["experts"] / g + b["rest"]) / 1e9 for g in sizes], style, marker="o", ms=3,
                    color=f"C{i}", label=f"{m.name}, {'NVFP4' if fmt == 'nvfp4' else 'bf16'} experts")
    for (name, cap), color in zip(gpus.items(), ("k", "0.5")):
        ax.axhline((1 - reserve) * cap / 1e9, color=color, lw=1.2, ls="--",
                   label=f"{name}: {(1 - reserve):.0%} of {cap / 1e9:.1f} GB for weights")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("GPUs (EP size; the rest of the model replicated on each)")
    ax.set_ylabel("weight GB per GPU")
    ax.set_xticks(list(EP_SIZES), [str(g) for g in EP_SIZES])
    ax.grid(which="both", alpha=0.2)
    ax.legend(fontsize=6.5, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("Published MoE configs: weight bytes per GPU under expert parallelism", fontsize=10)
    fig.text(0.01, -0.02, "computed from each model's config.json (nvfp4lib/study/ep_models.py); no measurement",
             fontsize=7, ha="left", va="top")
    return fig


def grid_text() -> str:
    return (f"layers {', '.join(EP_LAYERS)}; T per rank {', '.join(map(str, EP_TOKENS))}; transports "
            f"{', '.join(EP_TRANSPORTS)}; forms W4A4, W4A16, the bf16 EP peer, one GPU")
