"""NVFP4 checkpoints decoded end to end against the same model in bf16: the tables, targets and figure of notebook 12.

Reads rows of ``data/generate.jsonl`` (written by :mod:`nvfp4lib.bench.generate_bench`: one row per model, loop and
batch). The answer rests on one run, the latest of the preset asked for (:func:`latest_run`); every ratio is taken
within it (one GPU, one commit). Issue 40's targets (:data:`TARGETS`) compare the NVFP4 model, graphed, with the bf16
peer model, graphed: batch-1 and batch-32 decode tokens/s, and the GPU memory the loaded model holds. A run made with
``--profile-step`` (its rows carry ``profile_steps``) is never the answer's run: it is the latest such run that
:func:`profile_run` finds, for the section on where a decode step's time goes (:func:`step_table`,
:func:`step_delta`, :func:`module_table`). Pure pandas and matplotlib: no GPU.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import NullLocator

from ..bench.generate_bench import COMPILED, HF_GENERATE, LABELS, PROFILE_COMMAND
from ..bench.kernel_profile import CATEGORIES
from ..bench.store import dirty_state
from .plots import caption, shown

__all__ = ["SOURCE", "RECORD_COMMAND", "TIMED_COMMANDS", "no_data", "TARGETS", "latest_run", "series", "run_summary",
           "completeness", "profile_run", "no_profile", "step_table", "step_delta", "format_ceiling",
           "CEILING_PREDICTION", "module_table", "tokens_table", "speedup_table", "memory_table", "not_ok", "targets",
           "targets_history", "COMPILE_PREDICTION", "compile_table", "figure"]

SOURCE = "data/generate.jsonl"
RECORD_COMMAND = "python -m nvfp4lib generate-bench --record"
# On a machine that limits a command to 10 minutes: the targets first, then what the budget leaves time for, every row
# written to the --out file as it is made; then the rows merged into data/ where the repository lives
TIMED_COMMANDS = ("timeout -k 30 560 python -m nvfp4lib generate-bench --budget-s 480 --out generate.jsonl --no-record",
                  f"python -m nvfp4lib record generate.jsonl --into {SOURCE}")


def no_data(preset: str = "qwen3-30b-a3b") -> str:
    """What the notebook prints where no GPU run of ``preset`` is recorded."""
    return (f"No GPU run of generate-bench for the {preset} preset is recorded yet ({SOURCE} holds none). To make "
            f"one, on the H100: `{RECORD_COMMAND}` (both checkpoint formats, W4A4 and W4A16, the bf16 peer model and "
            "transformers' own, batch 1 and 32; most of its time goes to compiling the kernels and writing the two "
            "checkpoints); on a machine that limits a command to 10 minutes, `" + "`, then `".join(TIMED_COMMANDS)
            + "` (the targets' rows first, the rest as the budget allows).")

PEER = LABELS[("bf16-peer", "bf16")]
TRANSFORMERS = LABELS[("transformers-bf16", "bf16")]
# Issue 40's targets, the NVFP4 model against the bf16 peer, both graphed: (what, batch or None for memory, the
# threshold, "min" for a speed-up, "max" for a memory ratio)
TARGETS = (
    ("batch-1 decode tokens/s over bf16 peer", 1, 2.0, "min"),
    ("batch-32 decode tokens/s over bf16 peer", 32, 1.5, "min"),
    ("loaded GPU memory over bf16 peer", None, 0.35, "max"),
)


def _profiled(rows: pd.DataFrame) -> pd.Series:
    """Whether each row comes from a ``--profile-step`` run."""
    return rows["profile_steps"].notna() if "profile_steps" in rows else pd.Series(False, index=rows.index)


def latest_run(rows: pd.DataFrame, preset: str = "qwen3-30b-a3b", gpu_only: bool = True,
               profiled: bool = False) -> pd.DataFrame:
    """The rows of the latest run (largest ``run_id``: it starts with the run's UTC time) of ``preset``, measured on
    a GPU unless ``gpu_only=False``, made without ``--profile-step`` (with it, if ``profiled``); empty if there is
    none."""
    if rows is None or not len(rows) or not {"preset", "run_id", "device_type"} <= set(rows.columns):
        return pd.DataFrame()
    sel = rows[(rows["preset"] == preset) & ((rows["device_type"] == "cuda") | (not gpu_only))
               & (_profiled(rows) == profiled)]
    if not len(sel):
        return pd.DataFrame()
    return sel[sel["run_id"] == sorted(sel["run_id"].unique())[-1]].reset_index(drop=True)


COMPILED_SUFFIX = " + torch.compile"  # a series decoded with its step through torch.compile (loop COMPILED)


def series(r) -> str:
    """The name of a row's line in the tables and the figure: the NVFP4 model per activations and format, the bf16
    peer, transformers' model per loop; the NVFP4 models' and the peer's compiled decode as series of their own."""
    if r["loop"] == COMPILED:
        return series({**dict(r), "loop": None}) + COMPILED_SUFFIX
    if r["model_kind"] == "nvfp4":
        return f"{r['label']} ({r['format']})"
    if r["model_kind"] == "transformers-bf16":
        if r["loop"] == HF_GENERATE:
            return f"{TRANSFORMERS}, its generate()"
        return f"{TRANSFORMERS}, {'graphed' if r['cuda_graph'] else 'eager'}"
    return r["label"]


def _with_series(run: pd.DataFrame) -> pd.DataFrame:
    run = run.assign(series=[series(r) for _, r in run.iterrows()])
    kinds = {"nvfp4": 0, "bf16-peer": 1, "transformers-bf16": 2}
    formats = {f: i for i, f in enumerate(dict.fromkeys(run["format"]))}  # as the run measured them
    order = run.assign(_k=run["model_kind"].map(kinds), _a=run["activations"].map({"nvfp4": 0, "bf16": 1}),
                       _f=run["format"].map(formats), _g=~run["cuda_graph"].astype(bool),
                       _l=run["loop"] == HF_GENERATE, _c=run["loop"] == COMPILED)
    return order.sort_values(["_k", "_a", "_f", "_c", "_l", "_g", "batch"], kind="stable").drop(
        columns=["_k", "_a", "_f", "_g", "_l", "_c"])


def _ok(run: pd.DataFrame) -> pd.DataFrame:
    return _with_series(run[run["status"] == "ok"]) if len(run) else run


def run_summary(run: pd.DataFrame) -> pd.DataFrame:
    """One line: the run's id, GPU, commit, date, what it decoded, whether it ran to the end."""
    if not len(run):
        return pd.DataFrame()
    r = run.iloc[0]
    knobs = {k.removeprefix("kernel_"): r[k] for k in run.columns if k.startswith("kernel_") and pd.notna(r[k])}
    out = {"run_id": r["run_id"], "gpu": r["gpu"], "git_commit": str(r["git_commit"])[:7],
           "dirty tree": dirty_state(r.get("git_dirty")), "date": str(r["date"])[:16],
           "torch": r.get("torch"), "transformers": r.get("transformers"),
           "model": f"{r['preset']}: {int(r['model_layers'])} layers, hidden {int(r['model_hidden'])}, "
                    f"{int(r['model_experts'])} experts top-{int(r['model_top_k'])}, expert intermediate "
                    f"{int(r['model_moe_intermediate'])}",
           "prompt tokens": int(r["prompt_tokens"]), "new tokens": int(r["new_tokens"]),
           "kernel knobs": ", ".join(f"{k}={int(v)}" for k, v in knobs.items()) or "n/a",
           "complete": completeness(run)}
    return pd.DataFrame([out]).set_index("run_id")


def completeness(run: pd.DataFrame) -> str:
    """"yes" when every row the run planned was measured; else how many were, and why the others were not (their
    rows' status: a time budget, a stop; none where the process was killed before it could write them)."""
    planned = int(run["planned_rows"].iloc[0])
    if "profile" in run:  # a profile's rows are extra to the planned ones
        run = run[run["profile"].isna()]
    measured = ~run["status"].str.startswith(("skipped", "not reached"))
    if len(run) == planned and bool(measured.all()):
        return "yes"
    why = sorted({s.split(";")[0] for s in run.loc[~measured, "status"]})
    if len(run) < planned:
        why.append(f"{planned - len(run)} rows never written (the process was killed)")
    return f"no: {int(measured.sum())} of {planned} planned rows measured ({'; '.join(why)})"


def profile_run(rows: pd.DataFrame, preset: str = "qwen3-30b-a3b") -> pd.DataFrame:
    """The latest GPU run of ``preset`` made with ``--profile-step`` (all its rows), or an empty frame."""
    return latest_run(rows, preset, profiled=True)


def no_profile(preset: str = "qwen3-30b-a3b") -> str:
    """What the notebook prints where no profile of ``preset`` is recorded."""
    return (f"Not recorded yet: no GPU run of generate-bench --profile-step for the {preset} preset in {SOURCE}. To "
            f"make one on the H100: `{PROFILE_COMMAND}`, then `{TIMED_COMMANDS[1]}`.")


def _profile_rows(run: pd.DataFrame, kind: str) -> pd.DataFrame:
    if not len(run) or "profile" not in run:
        return pd.DataFrame()
    sel = run[(run["profile"] == kind) & (run["status"] == "ok")]
    return sel.assign(model=[f"{r['label']}{COMPILED_SUFFIX if r['loop'] == COMPILED else ''}, batch {int(r['batch'])}"
                             for _, r in sel.iterrows()], _compiled=sel["loop"] == COMPILED)


def _models(sel: pd.DataFrame) -> list[str]:
    """The profiled models' column names in the run's order: batch by batch, plain before compiled, the bf16 peer last
    within each."""
    keys = sel.assign(_p=sel["model_kind"] == "bf16-peer").sort_values(["batch", "_compiled", "_p"], kind="stable")
    return list(dict.fromkeys(keys["model"]))


_ORDER = [c for c, _ in CATEGORIES]


def _step_us(run: pd.DataFrame) -> pd.DataFrame:
    sel = _profile_rows(run, "graph")
    if not len(sel):
        return pd.DataFrame()
    cols = _models(sel)
    t = sel.pivot_table(index="category", columns="model", values="us_per_step", aggfunc="sum")
    t = t.reindex([c for c in _ORDER if c in t.index])[cols]
    first = sel.groupby("model").first()
    totals = pd.DataFrame({
        "all kernels (sum)": first["step_sum_us"], "step span": first["step_span_us"],
        "gaps (span - sum)": first["step_gap_us"], "timed step (decode)": first["decode_ms_per_token"] * 1e3,
        "kernels per step": first["step_kernels"]}).T[cols]
    return pd.concat([t, totals]).fillna(0.0)


def step_table(run: pd.DataFrame) -> pd.DataFrame:
    """GPU time per decode step (us; what ms per token calls a token) per kernel category, one column per profiled
    model and batch (the graph's replays: the median time of each kernel of the step, added up per category), then
    the step's totals: the kernels' sum, the span from its first kernel's start to its last one's end, the gaps
    between (span - sum), the step time the decode timed, and the kernels per step."""
    t = _step_us(run)
    t.index.name = "us per step"
    return shown(t, 1)


def _against_peer(run: pd.DataFrame):
    """(batch, the bf16 peer's column, an NVFP4 model's column) of the graph profile, each NVFP4 model paired with the
    peer of its batch and loop (plain or compiled; none where the peer was not profiled)."""
    sel = _profile_rows(run, "graph")
    if not len(sel):
        return
    for (batch, _), g in sel.groupby(["batch", "_compiled"]):
        peer = g[g["model_kind"] == "bf16-peer"]["model"]
        if len(peer):
            for m in dict.fromkeys(g[g["model_kind"] == "nvfp4"]["model"]):
                yield batch, peer.iloc[0], m


def step_delta(run: pd.DataFrame) -> pd.DataFrame:
    """Each NVFP4 model's GPU time per step per category minus the bf16 peer's at the same batch and loop (us;
    negative: the NVFP4 model spends less), from :func:`step_table`."""
    t = _step_us(run)
    if not len(t):
        return pd.DataFrame()
    out = {f"{m} - bf16 peer": t[m] - t[peer] for _, peer, m in _against_peer(run)}
    if not out:
        return pd.DataFrame()
    df = pd.DataFrame(out).drop(index=["kernels per step"])
    df.index.name = "us per step"
    return shown(df, 1)


# Prediction, written before the first 48-layer profile (notebook 12): the share of the bf16 peer's batch-1 step that
# its weight GEMMs take (experts and attention projections; format_ceiling), per loop. From the bytes: ~113 MB of bf16
# weights a layer read at ~3 TB/s is ~38 us, 48 layers ~1.8 ms, against the recorded 11.25 ms plain and 6.73 ms
# compiled steps: the rest is transformers' small kernels (norms, rotary, router, cache updates), which the format
# leaves as they are. So the format alone caps batch 1 near 1.2x plain and 1.4x compiled, short of the 2x target.
# Outcome (the first 48-layer profile, H100; notebook 12 computes it): above the range in both loops, the peer's bf16
# GEMMs at one token running well below the bandwidth assumed; the plain ceiling still short of the target.
CEILING_PREDICTION = {"plain": (0.12, 0.25), "compiled": (0.2, 0.4)}


def format_ceiling(run: pd.DataFrame) -> pd.DataFrame:
    """Per profiled batch and loop, how far the NVFP4 format alone can speed a decode step up (Amdahl's law): the bf16
    peer's timed step; the GPU time of the weight GEMMs that the NVFP4 model replaces (the peer's torch grouped and
    plain GEMMs less what the NVFP4 model still spends on torch GEMMs: ``lm_head`` and the router's gate stay bf16);
    their share of the step; what the NVFP4 model spends on them instead (the serving kernel and nvfp4lib's Triton
    kernels: routing, activation quantization); the speed-up ceiling = peer step / (peer step - replaced GEMMs), were
    the NVFP4 GEMMs free and nothing else changed; the measured speed-up (peer step over the NVFP4 model's); and,
    where the batch has a target (:data:`TARGETS`), the most GPU time the NVFP4 kernels may take for the step to meet
    it (negative: out of reach even were they free)."""
    t = _step_us(run)
    if not len(t):
        return pd.DataFrame()
    out = {}
    for batch, peer, m in _against_peer(run):
        p, n = t[peer], t[m]
        step_p = p["timed step (decode)"]
        replaced = (p.get("torch grouped GEMM", 0.0) + p.get("torch GEMM", 0.0)
                    - n.get("torch grouped GEMM", 0.0) - n.get("torch GEMM", 0.0))
        out[m] = {"bf16 peer step, us": step_p, "peer's weight GEMMs replaced, us": replaced,
                  "their share of the peer's step": replaced / step_p,
                  "NVFP4 kernels instead, us": n.get("serving kernel", 0.0) + n.get("nvfp4lib Triton", 0.0),
                  "ceiling (NVFP4 GEMMs free)": step_p / (step_p - replaced),
                  "measured speed-up": step_p / n["timed step (decode)"]}
        need = next((need for _, b, need, _ in TARGETS if b == batch), None)
        if need is not None:  # the most the NVFP4 kernels may take for the batch's target (< 0: out of reach)
            out[m][f"NVFP4 kernels' budget for {need:g}x, us"] = step_p / need - (step_p - replaced)
    if not out:
        return pd.DataFrame()
    df = pd.DataFrame.from_dict(out, orient="index")
    df.index.name = "NVFP4 model"
    return shown(df, 2, time_digits=1)


def module_table(run: pd.DataFrame) -> pd.DataFrame:
    """GPU time per decode step (us) per innermost module class that launched the kernels (the eager steps: a
    graph's replay keeps no module ranges), one column per profiled model and batch, largest first."""
    sel = _profile_rows(run, "eager-modules")
    if not len(sel):
        return pd.DataFrame()
    t = sel.pivot_table(index="module", columns="model", values="us_per_step", aggfunc="sum")[_models(sel)]
    t = t.loc[t.max(axis=1).sort_values(ascending=False).index]
    t.index.name = "us per step, by module"
    return shown(t.fillna(0.0), 1)


def tokens_table(run: pd.DataFrame) -> pd.DataFrame:
    """Per series: tokens/s and ms per token (steady-state decode steps) at each batch."""
    ok = _ok(run)
    if not len(ok):
        return pd.DataFrame()
    out = {}
    for s, g in ok.groupby("series", sort=False):
        row = out.setdefault(s, {})
        for b, r in g.groupby("batch"):
            row[f"tokens/s, batch {b}"] = float(r["tokens_per_s"].iloc[0])
            row[f"ms per token, batch {b}"] = float(r["ms_per_token"].iloc[0])
    df = pd.DataFrame.from_dict(out, orient="index")
    batches = sorted(ok["batch"].unique())
    cols = [f"tokens/s, batch {b}" for b in batches] + [f"ms per token, batch {b}" for b in batches]
    df.index.name = "model"
    return shown(df[[c for c in cols if c in df.columns]])


def _tps(ok: pd.DataFrame, name: str, batch: int) -> float:
    r = ok[(ok["series"] == name) & (ok["batch"] == batch)]
    return float(r["tokens_per_s"].iloc[0]) if len(r) else float("nan")


def speedup_table(run: pd.DataFrame) -> pd.DataFrame:
    """Per NVFP4 series and batch: its tokens/s over the bf16 peer's and over transformers' model's (graphed, eager,
    its own generate())."""
    ok = _ok(run)
    if not len(ok):
        return pd.DataFrame()
    others = [PEER, PEER + COMPILED_SUFFIX] + [f"{TRANSFORMERS}, {x}" for x in ("graphed", "eager", "its generate()")]
    out = []
    for s in dict.fromkeys(ok[ok["model_kind"] == "nvfp4"]["series"]):
        for b in sorted(ok["batch"].unique()):
            mine = _tps(ok, s, b)
            out.append({"model": s, "batch": b, "tokens/s": mine,
                        **{f"over {o}": mine / _tps(ok, o, b) for o in others}})
    df = pd.DataFrame(out)
    if not len(df):
        return df
    df = df.set_index(["model", "batch"])
    return shown(df.dropna(axis=1, how="all"))


def memory_table(run: pd.DataFrame) -> pd.DataFrame:
    """Per model (named with the format of the checkpoint it was loaded from): GPU memory held after loading and the
    peak while loading (GiB), the loaded memory over the bf16 peer's, the load time, the checkpoint's size on disk,
    and the check of its logits against the peer's."""
    if not len(run) or "loaded_gib" not in run:
        return pd.DataFrame()
    loaded = _with_series(run[run["loaded_gib"].notna()])
    if not len(loaded):
        return pd.DataFrame()
    peer = loaded[loaded["model_kind"] == "bf16-peer"]["loaded_gib"]
    peer_gib = float(peer.iloc[0]) if len(peer) else float("nan")
    out = []
    for (kind, _, fmt), g in loaded.groupby(["model_kind", "activations", "format"], sort=False):
        r = g.iloc[0]
        out.append({"model": f"{r['label']} ({fmt})",
                    "loaded GiB": r["loaded_gib"], "peak while loading GiB": r["load_peak_gib"],
                    "loaded / bf16 peer": r["loaded_gib"] / peer_gib, "load s": r["load_s"],
                    "checkpoint GiB": r["checkpoint_gib"] if kind == "nvfp4" else float("nan"),
                    "logits rel err vs peer": r.get("logits_rel_err", float("nan")),
                    "check": r.get("check", "n/a")})
    return shown(pd.DataFrame(out).set_index("model"), 3)


def not_ok(run: pd.DataFrame) -> pd.DataFrame:
    """The rows that did not measure (or whose check failed): series, batch and why."""
    if not len(run):
        return pd.DataFrame(columns=["model", "batch", "status"])
    run = _with_series(run)
    check = run["check"] if "check" in run else pd.Series("ok", index=run.index)
    bad = run[(run["status"] != "ok") | ~check.isin(["ok", "reference"])]
    return pd.DataFrame({"model": bad["series"], "batch": bad["batch"],
                         "status": [s[:160] if s != "ok" else f"check: {c}"[:160]
                                    for s, c in zip(bad["status"], check[bad.index])]}).reset_index(drop=True)


def targets(run: pd.DataFrame) -> pd.DataFrame:
    """Issue 40's targets (:data:`TARGETS`) per NVFP4 model (format, activations) of the run: the measured ratio,
    the threshold and the verdict ("held", "missed", or "not measured" where a row it needs is missing)."""
    cols = ["target", "NVFP4 model", "measured", "needed", "verdict"]
    if not len(run):
        return pd.DataFrame(columns=cols)
    ok = _ok(run)
    nv = [s for s in dict.fromkeys(run[run["model_kind"] == "nvfp4"].pipe(_with_series)["series"])]
    mem = {}
    if "loaded_gib" in run:
        for _, r in run[run["loaded_gib"].notna()].pipe(_with_series).iterrows():
            mem.setdefault(r["series"], r["loaded_gib"])
    out = []
    for what, batch, need, sense in TARGETS:
        for s in nv:
            peer = PEER + COMPILED_SUFFIX if s.endswith(COMPILED_SUFFIX) else PEER  # like against like
            if batch is None:
                got = mem.get(s, np.nan) / mem.get(peer, np.nan)
            else:
                got = _tps(ok, s, batch) / _tps(ok, peer, batch)
            verdict = ("not measured" if np.isnan(got) else
                       "held" if (got >= need if sense == "min" else got <= need) else "missed")
            out.append({"target": what, "NVFP4 model": s, "measured": f"{got:.2f}x" if not np.isnan(got) else "n/a",
                        "needed": f"{'>=' if sense == 'min' else '<='} {need:.2f}x", "verdict": verdict})
    return pd.DataFrame(out, columns=cols)


def targets_history(rows: pd.DataFrame, preset: str = "qwen3-30b-a3b") -> pd.DataFrame:
    """:func:`targets` of every recorded GPU run of ``preset`` (not the profiles), oldest first: one line per run and
    NVFP4 model, one column per target ("measured (verdict)"); the formats and modes a later run left out stay in
    view."""
    if rows is None or not len(rows) or "preset" not in rows:
        return pd.DataFrame()
    sel = rows[(rows["preset"] == preset) & (rows["device_type"] == "cuda") & ~_profiled(rows)]
    out = []
    for rid in sorted(sel["run_id"].unique()):
        run = sel[sel["run_id"] == rid].reset_index(drop=True)
        r = run.iloc[0]
        t = targets(run)
        t = t[t["verdict"] != "not measured"]
        for _, x in t.iterrows():
            out.append({"date": str(r["date"])[:16], "gpu": r["gpu"], "commit": str(r["git_commit"])[:7],
                        "NVFP4 model": x["NVFP4 model"], "target": x["target"],
                        "cell": f"{x['measured']} ({x['verdict']})"})
    if not out:
        return pd.DataFrame()
    df = pd.DataFrame(out)
    keys = ["date", "gpu", "commit", "NVFP4 model"]
    return df.pivot_table(index=keys, columns="target", values="cell", aggfunc="first", sort=False).reindex(
        columns=[w for w, *_ in TARGETS if w in set(df["target"])])


# What was predicted (2026-11-28, before the first GPU run; the prediction is written beside nvfp4lib.nn.compiled's
# OPAQUE knob) for the NVFP4 W4A4 model decoding through torch.compile with its modules as opaque ops: tokens/s over
# the compiled bf16 peer, per batch, as a (low, high) range
COMPILE_PREDICTION = {1: (1.1, 1.2)}


def compile_table(run: pd.DataFrame) -> pd.DataFrame:
    """Per NVFP4 model decoded through torch.compile and batch: its tokens/s compiled and plain (both graphed), the
    compiled bf16 peer's, compiled over plain, over the compiled peer beside :data:`COMPILE_PREDICTION`, the form
    torch.compile saw its modules in (``compile_form``), and whether its greedy tokens equal its plain loop's (the
    first eight; Inductor fuses the norms around the NVFP4 modules and rounds them otherwise in bf16, and W4A4 turns
    a one-ulp change of its input into other E2M1 codes)."""
    ok = _ok(run)
    if not len(ok) or not (ok["loop"] == COMPILED).any():
        return pd.DataFrame()
    out = []
    for _, r in ok[(ok["loop"] == COMPILED) & (ok["model_kind"] == "nvfp4")].iterrows():
        b, plain = r["batch"], series({**dict(r), "loop": None})
        base = ok[(ok["series"] == plain) & (ok["batch"] == b)]
        peer = _tps(ok, PEER + COMPILED_SUFFIX, b)
        lo_hi = COMPILE_PREDICTION.get(int(b))
        out.append({"model": r["series"], "batch": int(b), "tokens/s": r["tokens_per_s"],
                    "plain, graphed": _tps(ok, plain, b), "compiled peer": peer,
                    "over plain": r["tokens_per_s"] / _tps(ok, plain, b),
                    "over compiled peer": r["tokens_per_s"] / peer,
                    "predicted over compiled peer": f"{lo_hi[0]:.1f}-{lo_hi[1]:.1f}x" if lo_hi else "none written",
                    "form": (r.get("compile_form") if pd.notna(r.get("compile_form")) else "traced (before the knob)")
                    + (", exact casts" if r.get("compile_exact_casts") is True else ""),
                    "tokens equal plain": ("n/a" if not len(base) else
                                           "yes" if list(base["first_tokens"].iloc[0]) == list(r["first_tokens"])
                                           else "no")})
    return shown(pd.DataFrame(out).set_index(["model", "batch"]), 2)


_COLOR = {"NVFP4 W4A4": "C0", "NVFP4 W4A16": "C2", PEER: "C3", f"{TRANSFORMERS}, graphed": "C1",
          f"{TRANSFORMERS}, eager": "C5", f"{TRANSFORMERS}, its generate()": "C7"}


def figure(run: pd.DataFrame, source: str = SOURCE):
    """Decode tokens/s against batch (log-log), one line per series (solid: graphed; dashed: eager; dotted: the step
    through torch.compile), the NVFP4 models' formats as markers. Without rows, an empty panel that says so."""
    fig, ax = plt.subplots(figsize=(8.5, 4.8))
    ok = _ok(run)
    if not len(ok):
        ax.text(0.5, 0.5, "no recorded GPU run yet\n(" + RECORD_COMMAND + ")", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title("decode tokens/s against batch: NVFP4 checkpoints against bf16")
        return fig
    markers = {"modelopt": "o", "compressed-tensors": "s"}
    for s, g in ok.groupby("series", sort=False):
        g = g.sort_values("batch")
        r = g.iloc[0]
        color = _COLOR.get(r["label"] if r["model_kind"] in ("nvfp4", "bf16-peer") else s, "C8")
        style = ":" if r["loop"] == COMPILED else "-" if bool(r["cuda_graph"]) else "--"
        ax.plot(g["batch"], g["tokens_per_s"], style,
                marker=markers.get(r["format"], "^") if r["model_kind"] == "nvfp4" else "x", ms=5, color=color,
                label=s)
    batches = sorted(ok["batch"].unique())
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("batch (sequences decoded together)")
    ax.set_ylabel("decode tokens/s (steady-state steps; log)")
    ax.grid(which="both", alpha=0.2)
    first = ok.iloc[0]
    ax.set_title(f"{first['preset']} ({int(first['model_layers'])} layers, random weights): greedy decode, "
                 f"{int(first['new_tokens'])} new tokens", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.text(0.01, -0.02, f"{caption(run, source)}, commit {str(first['git_commit'])[:7]}", fontsize=7, ha="left",
             va="top")
    return fig
