"""The README's headline, computed from ``data/bench.jsonl`` (never typed by hand).

The headline compares the kernel users call (``cute-hopper``: prepared weights, the serving kernel, family
``hopper_varlen``; CUDA-graph replay, with the eager call beside it) with the strongest peers a user could pick
instead, over **every recorded run at one commit** (separate processes): ``torch-bf16-predequant`` (both operands
dequantized to bf16 once with their global scales folded in, before timing; one ``torch._grouped_mm`` per product:
the lower bound for "just use bf16") and the fastest Triton backend. A run qualifies when it timed the shipped
kernel (graphed and eager) and both kinds of peer on every headline problem with status ok; the commit chosen is
the latest with at least :data:`MIN_RUNS` qualifying runs (else the latest with any). Per problem: median and
min–max over the runs of each side's median time, the shipped kernel's ratio to both floors (measured in each run,
and the datasheet's), and the speedups (per-run ratios, median and min–max).

``python -m nvfp4lib headline`` prints the block; ``--write README.md`` replaces the text between the README's
markers; a test checks that the README holds what the data give.
"""
from __future__ import annotations

import re
import statistics
from pathlib import Path

from ..bench.roofline import H100_SXM_DATASHEET, add_floors, datasheet_for
from .serving_report import rule_as_shipped

__all__ = ["PROBLEMS", "DEFAULT", "PREDEQUANT", "MIN_RUNS", "qualifying_runs", "headline", "markdown", "write_readme",
           "START", "END", "shapes_markdown"]

PROBLEMS = ("S1", "S2", "S3", "S4", "S1-dual", "S2-dual", "S3-dual", "S4-dual")
DEFAULT = "cute-hopper[graph=True]"
EAGER = "cute-hopper"
PREDEQUANT = "torch-bf16-predequant[graph=True]"
FAMILY = "hopper_varlen"  # the serving kernel: rows of the host-scheduled study kernel under the same label don't count
# the fair peer's rows say so in their notes (rows before it timed a float32 epilogue and an fp16 copy besides)
FAIR_PEER_NOTE = "global scales folded in"
MIN_RUNS = 5
START, END = "<!-- headline:start (python -m nvfp4lib headline --write README.md) -->", "<!-- headline:end -->"


def _is_triton(label: str) -> bool:
    return label.startswith("triton")


def qualifying_runs(df) -> tuple[str | None, list[str]]:
    """(commit, run ids): the runs that timed the default, the predequant peer and a Triton peer on every headline
    problem (status ok), at the latest commit holding at least MIN_RUNS of them (else the latest commit with any). The
    default's rows count where auto took the shape rule as shipped (serving_report.rule_as_shipped)."""
    if df is None or not len(df) or "label" not in df:
        return None, []
    ok = _current(df[(df["status"] == "ok") & df["problem"].isin(PROBLEMS)])
    ok = ok[~ok["label"].isin((DEFAULT, EAGER)) | ok.index.isin(rule_as_shipped(ok, "info_").index)]
    good = []
    for rid, g in ok.groupby("run_id"):
        probs = set(PROBLEMS)
        if (probs <= set(g[g["label"] == DEFAULT]["problem"]) and probs <= set(g[g["label"] == EAGER]["problem"])
                and probs <= set(g[g["label"] == PREDEQUANT]["problem"])
                and probs <= set(g[g["label"].map(_is_triton)]["problem"])):
            good.append((str(g["date"].min()), rid, str(g["git_commit"].iloc[0])))
    if not good:
        return None, []
    by_commit: dict[str, list] = {}
    for date, rid, commit in sorted(good):
        by_commit.setdefault(commit, []).append((date, rid))
    enough = [c for c, runs in by_commit.items() if len(runs) >= MIN_RUNS]
    pool = enough or list(by_commit)
    commit = max(pool, key=lambda c: max(by_commit[c])[0])
    return commit, [rid for _, rid in by_commit[commit]]


def _current(df):
    """The rows that measured what the headline names: the serving kernel under the cute-hopper labels, the fair
    predequant peer under its label; every other row as it is."""
    fam = df["kernel_family"] if "kernel_family" in df else None
    notes = df["notes"].fillna("") if "notes" in df else None
    shipped = df["label"].isin((DEFAULT, EAGER))
    peer = df["label"] == PREDEQUANT
    keep = ~(shipped | peer)
    if fam is not None:
        keep |= shipped & (fam == FAMILY)
    if notes is not None:
        keep |= peer & notes.str.contains(FAIR_PEER_NOTE, regex=False)
    return df[keep]


def _stats(values) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def headline(df) -> dict:
    """{"commit", "runs", "gpu", "rows": [per problem dict]} from the bench table (``store.load()``)."""
    commit, runs = qualifying_runs(df)
    out = {"commit": commit, "runs": runs, "rows": [], "gpu": None}
    if not runs:
        return out
    sel = add_floors(_current(df[df["run_id"].isin(runs) & (df["status"] == "ok") & df["problem"].isin(PROBLEMS)]))
    out["gpu"] = str(sel["gpu"].iloc[0])
    out["iters"] = sorted({int(i) for i in sel["iters"].dropna()}) if "iters" in sel else []
    for prob in PROBLEMS:
        p = sel[sel["problem"] == prob]
        per_run = []
        for rid in runs:
            r = p[p["run_id"] == rid]
            d = r[r["label"] == DEFAULT].iloc[0]
            eager = float(r[r["label"] == EAGER]["median_us"].iloc[0])
            pre = float(r[r["label"] == PREDEQUANT]["median_us"].iloc[0])
            tri = r[r["label"].map(_is_triton)].sort_values("median_us").iloc[0]
            per_run.append({"us": float(d["median_us"]), "eager": eager, "xm": float(d["x_floor_measured"]),
                            "xd": float(d["x_floor_datasheet"]), "pre": pre, "tri": float(tri["median_us"]),
                            "tri_label": str(tri["label"]), "config": str(d.get("info_config", d.get("config", "")))})
        row = {"problem": prob, "runs": len(per_run)}
        for key in ("us", "eager", "xm", "xd", "pre", "tri"):
            row[key] = _stats([r[key] for r in per_run])
        row["vs_pre"] = _stats([r["pre"] / r["us"] for r in per_run])
        row["vs_tri"] = _stats([r["tri"] / r["us"] for r in per_run])
        row["tri_labels"] = sorted({r["tri_label"] for r in per_run})
        row["configs"] = sorted({r["config"] for r in per_run if r["config"] not in ("", "nan")})
        out["rows"].append(row)
    return out


def _f(s, fmt: str, unit: str = "") -> str:
    med, lo, hi = s
    return f"{med:{fmt}}{unit} ({lo:{fmt}}–{hi:{fmt}})"


def markdown(h: dict) -> str:
    """The README block for :func:`headline`'s result."""
    if not h["runs"]:
        return ("No qualifying run is recorded yet: the headline needs runs of `python -m nvfp4lib bench` (the "
                "shipped kernel eager and graphed, the fair bf16 peer, Triton) on S1–S4 and the dual forms "
                "(`python -m nvfp4lib bench --record` on an H100, five times).")
    n = len(h["runs"])
    ds = datasheet_for(h["gpu"]) or H100_SXM_DATASHEET  # (the run's GPU's; rows without one: NaN ratios)
    lines = [
        f"{n} separate runs of `python -m nvfp4lib bench` at commit `{h['commit'][:7]}` on one {h['gpu']} "
        "(each a separate process); every cell is the median over the runs, (min–max) in brackets. Times are each "
        f"run's median of {'/'.join(map(str, h.get('iters') or ['?']))} calls with the L2 flushed before each, every "
        "backend checked against the exact reference first. "
        "**shipped** is `prepare_weights(...)` called as `w(a, offsets)`: graph = CUDA-graph replay, eager = a plain "
        "call. Floors: **measured** = max(FLOPs / bf16 MMA rate, NVFP4 bytes / copy bandwidth), both rates measured "
        f"in the same run; **datasheet** = the same with the {ds['part']} datasheet's "
        f"{ds['bf16_tflops']:g} TFLOP/s and {ds['copy_gbps'] / 1000:g} TB/s.",
        "",
        "| shape | shipped, graph, us | shipped, eager, us | × measured floor | × datasheet floor "
        "| bf16 peer, us | shipped vs it | best Triton, us | shipped vs it |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in h["rows"]:
        lines.append(f"| {r['problem']} | **{_f(r['us'], '.1f')}** | {_f(r['eager'], '.1f')} | {_f(r['xm'], '.2f')} | "
                     f"{_f(r['xd'], '.2f')} | {_f(r['pre'], '.1f')} | {_f(r['vs_pre'], '.2f', '×')} | "
                     f"{_f(r['tri'], '.1f')} | {_f(r['vs_tri'], '.2f', '×')} |")
    xm = [r["xm"][0] for r in h["rows"]]
    vs = [r["vs_pre"][0] for r in h["rows"]]
    tri = sorted({t for r in h["rows"] for t in r["tri_labels"]})
    lines += ["", f"Graph-replayed, the shipped kernel runs at {min(xm):.2f}–{max(xm):.2f}× the measured floor and "
              f"{min(vs):.2f}–{max(vs):.2f}× faster than the bf16 peer (`torch-bf16-predequant`: both operands "
              "dequantized to bf16 once, global scales folded in, one `torch._grouped_mm` per product, bf16 result; it "
              f"holds the weights in bf16, {16 / 4.5:.1f}× the NVFP4 bytes). Triton: `" + "`, `".join(tri) + "`."]
    return "\n".join(lines)


SHAPES_START = "<!-- shapes:start (python -m nvfp4lib headline --write README.md) -->"
SHAPES_END = "<!-- shapes:end -->"


def shapes_markdown() -> str:
    """The study's benchmark shapes as a table, from :mod:`nvfp4lib.problems` (the dual form of each shares them)."""
    from ..problems import BENCHMARK

    lines = ["| shape | groups | rows per group (M) | N | K | FLOPs (single / dual) |", "|---|---|---|---|---|---|"]
    for p in BENCHMARK:
        lines.append(f"| {p.name} | {p.groups} | {', '.join(map(str, p.m))} | {p.n[0]} | {p.k[0]} | "
                     f"{p.flops() / 1e9:.1f} G / {p.with_dual().flops() / 1e9:.1f} G |")
    return "\n".join(lines)


def _pattern(start: str, end: str):
    return re.compile(re.escape(start) + r"\n(?:(.*?)\n)?" + re.escape(end), re.S)


def write_readme(path: Path, block: str, shapes: str | None = None) -> bool:
    """Replace the text between START and END in ``path`` (and between the shapes markers, if given and present);
    True if the file changed."""
    text = Path(path).read_text()
    new = text
    for (start, end), body in (((START, END), block), ((SHAPES_START, SHAPES_END), shapes)):
        if body is None:
            continue
        pat = _pattern(start, end)
        if not pat.search(new):
            if start == START:
                raise ValueError(f"{path} has no headline markers ({START} … {END})")
            continue
        new = pat.sub(lambda _, s=start, e=end, b=body: f"{s}\n{b}\n{e}", new)
    if new != text:
        Path(path).write_text(new)
    return new != text


def readme_block(path: Path, start: str = START, end: str = END) -> str | None:
    m = _pattern(start, end).search(Path(path).read_text())
    return (m.group(1) or "") if m else None
