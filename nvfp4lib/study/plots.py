"""Figures for the notebooks: every figure names the GPU, its clocks and the data it came from."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
matplotlib.rcParams["svg.hashsalt"] = "nvfp4lib"  # stable element ids: re-running a notebook on the same data
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from ..bench.roofline import B200_DATASHEET, datasheet_for  # noqa: E402
from ..bench.store import DATA_DIR  # noqa: E402

FIG_DIR = DATA_DIR.parent / "figures"

# the notebooks show whole tables: a verdict rests on what is shown (pandas would elide rows and columns past 60/20)
pd.set_option("display.max_rows", 500)
pd.set_option("display.max_columns", 60)
pd.set_option("display.width", 250)

__all__ = ["save", "caption", "latest_rows", "bar_chart", "FIG_DIR"]


def save(fig, name: str, fig_dir: Path | str = FIG_DIR) -> None:
    """Write ``name``.png and ``name``.svg under figures/ (stable names: notebooks overwrite their own) and, in a
    notebook, show the figure in the cell's output (once: the figure is closed after, so that the inline backend does
    not show it again)."""
    fig_dir = Path(fig_dir)
    fig_dir.mkdir(parents=True, exist_ok=True)
    png = fig_dir / f"{name}.png"
    fig.savefig(png, dpi=120, bbox_inches="tight", metadata={"Software": None})
    fig.savefig(fig_dir / f"{name}.svg", bbox_inches="tight", metadata={"Date": None})  # no timestamp: no churn
    try:
        from IPython import get_ipython
        from IPython.display import Image, display
    except ImportError:
        return
    if get_ipython() is not None:  # (the PNG just written: this module draws with Agg, which displays nothing itself)
        display(Image(data=png.read_bytes(), format="png"))
        plt.close(fig)


def shown(df, digits: int | None = 2, *, time_digits: int | None = None, missing: str = "—"):
    """``df`` as a page shows it, never with a NaN: a missing cell (not measured, not applicable) as ``missing``;
    floats rounded to ``digits`` (``time_digits`` for columns whose name ends in "us"; None: as they are), and a float
    column holding only whole numbers (an integer column pandas widened for its gaps) as integers."""
    if not len(df):
        return df
    out = df.copy()
    for c in out.columns:
        s = out[c]
        if not pd.api.types.is_float_dtype(s):
            continue
        if s.notna().any() and (s.dropna() % 1 == 0).all():
            out[c] = s.astype("Int64")
            continue
        d = time_digits if time_digits is not None and str(c).endswith("us") else digits
        if d is not None:
            out[c] = s.round(d)
    return out.astype(object).where(out.notna(), missing)


def caption(rows, source: str = "data/bench.jsonl") -> str:
    """'NVIDIA H100 80GB HBM3 (SM 1980/1980 MHz, driver 580.159.04), 2026-11-22, run …, data/bench.jsonl'."""
    if rows is None or len(rows) == 0:
        return f"no recorded rows ({source})"
    first = rows.iloc[0]
    gpus = sorted(set(rows["gpu"]))
    runs = sorted(set(rows["run_id"]))
    clocks = f"SM {first.get('smi_clocks_sm', '?')} of max {first.get('smi_clocks_max_sm', '?')}"
    run = runs[0] if len(runs) == 1 else f"{len(runs)} runs"
    return (f"{' + '.join(gpus)} ({clocks}, driver {first.get('smi_driver_version', '?')}), "
            f"{str(first.get('date', '?'))[:10]}, {run}, {source}")


def latest_rows(df, **match):
    """Rows of the most recent run that has rows matching ``match`` (column=value or column=callable)."""
    if df is None or len(df) == 0:
        return df
    sel = df
    for col, want in match.items():
        if col not in sel.columns:
            return sel.iloc[0:0]
        sel = sel[sel[col].map(want)] if callable(want) else sel[sel[col] == want]
    if len(sel) == 0:
        return sel
    last = sorted(sel["run_id"].unique())[-1]
    return sel[sel["run_id"] == last]


def bar_chart(rows, *, value="median_us", group="problem", series="label", floor_col="floor_us",
              title="", ylabel="time (us, median; log scale)", log=True, source="data/bench.jsonl"):
    """Grouped bars (one group per problem, one bar per series), the floor as a black tick, p10–p90 whiskers."""
    problems = list(dict.fromkeys(rows[group]))
    labels = list(dict.fromkeys(rows[series]))
    width = 0.8 / max(len(labels), 1)
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(problems) + 0.25 * len(labels) + 2), 4.6))
    colors = plt.get_cmap("tab20").colors
    x = np.arange(len(problems))
    for i, lab in enumerate(labels):
        vals, lo, hi = [], [], []
        for p in problems:
            r = rows[(rows[group] == p) & (rows[series] == lab)]
            v = float(r[value].iloc[0]) if len(r) and value in r and r[value].notna().iloc[0] else np.nan
            vals.append(v)
            lo.append(v - float(r["p10_us"].iloc[0]) if len(r) and "p10_us" in r and not np.isnan(v) else 0)
            hi.append(float(r["p90_us"].iloc[0]) - v if len(r) and "p90_us" in r and not np.isnan(v) else 0)
        ax.bar(x + (i - (len(labels) - 1) / 2) * width, vals, width, label=lab, color=colors[i % len(colors)],
               yerr=[lo, hi] if value == "median_us" else None, capsize=2)
    if floor_col and floor_col in rows:
        for j, p in enumerate(problems):
            f = float(rows[rows[group] == p][floor_col].iloc[0])
            ax.hlines(f, j - 0.45, j + 0.45, colors="k", linewidth=2, label="floor" if j == 0 else None)
    ax.set_xticks(x, problems)
    if log:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.text(0.01, -0.02, caption(rows, source), fontsize=7, ha="left", va="top")
    return fig


# The modelled panel's B200 figures (the datasheet is cited in roofline.py). Labelled "modelled" wherever
# used: no B200 measurement exists in this repo.
B200_SPEC = B200_DATASHEET


def roofline_axes(ax, peak_tflops: float, bw_gbps: float, label: str, xlim=(1, 4096), style="k-"):
    """Draw a roof: min(peak, intensity × bandwidth) over flop/byte, log-log."""
    x = np.logspace(np.log10(xlim[0]), np.log10(xlim[1]), 200)
    ax.plot(x, np.minimum(peak_tflops, x * bw_gbps * 1e-3), style, lw=1.5, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (flop per NVFP4 byte)")
    ax.set_ylabel("TFLOP/s")
    ax.grid(True, which="both", alpha=0.2)


def roofline_figure(rows, study=None, source="data/bench.jsonl"):
    """Left: every measured point on this GPU's roofline. Right: the study's B200 numbers, modelled roof."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    if rows is not None and len(rows):
        ceil_mma = float(rows["ceil_bf16_tflops"].median())
        ceil_bw = float(rows["ceil_copy_gbps"].median())
        roofline_axes(ax1, ceil_mma, ceil_bw, f"measured: bf16 MMA {ceil_mma:.0f} TFLOP/s, copy {ceil_bw:.0f} GB/s")
        sheets = {g: datasheet_for(g) for g in sorted(set(rows["gpu"]))}
        if len(sheets) == 1 and all(sheets.values()):  # one GPU with a datasheet: its roof above the measured one
            d = next(iter(sheets.values()))
            roofline_axes(ax1, d["bf16_tflops"], d["copy_gbps"],
                          f"datasheet: bf16 {d['bf16_tflops']:.0f} TFLOP/s, HBM {d['copy_gbps']:.0f} GB/s", style="k--")
        ok = rows[rows["status"] == "ok"]
        for backend, r in ok.groupby("backend"):
            ax1.scatter(r["flops"] / r["nvfp4_bytes"], r["tflops"], s=18, label=backend)
        ax1.set_title("measured on " + " + ".join(sorted(set(rows["gpu"]))))
        ax1.legend(fontsize=7)
        fig.text(0.01, -0.02, caption(rows, source), fontsize=7, ha="left", va="top")
    else:
        ax1.text(0.5, 0.5, "no recorded measurements yet", ha="center", transform=ax1.transAxes)
    roofline_axes(ax2, B200_SPEC["fp4_tflops"], B200_SPEC["hbm_gbps"], "B200 FP4 roof (modelled, datasheet)")
    if study:
        for name, (intensity, t_base, t_target, flops) in study.items():
            ax2.scatter([intensity], [flops / t_base * 1e-6], marker="x", c="r",
                        label="study baseline (B200, reported)" if name == "S1" else None)
            ax2.scatter([intensity], [flops / t_target * 1e-6], marker="o", c="g",
                        label="study target (B200)" if name == "S1" else None)
            ax2.annotate(name, (intensity, flops / t_base * 1e-6), fontsize=7)
    ax2.set_title("the study's B200 numbers (a different GPU: not comparable point by point)")
    ax2.legend(fontsize=7)
    return fig
