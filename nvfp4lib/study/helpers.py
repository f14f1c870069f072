"""What the round notebooks (02-05) share: which rows to compare, and each config's recorded resources.

The round notebooks compare configs of one cute-hopper kernel, each pair or sweep from the latest run that measured
all of its configs (so that both sides of a ratio come from one run, one GPU, one clock), next to that run's peer.
They read configs from data too: the variants that lost left the package, but each config's tile, stages, threads,
shared memory, registers, and the rule that refused it are in the compile reports of ``data/compile.jsonl``
(:data:`ALL`, :func:`resources`). The notebooks import these names instead of copying one helper cell four times.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import pandas as pd

from ..bench import store
from ..problems import BENCHMARK, DUAL

__all__ = ["NEW", "PEER", "SHAPES", "DUALS", "ALL", "NOISE", "SM_SMEM", "RecordedConfig", "recorded_configs", "lab",
           "same_run", "medians", "pair", "repeatability", "resources", "register_split", "runs_behind", "sources",
           "filled", "B200_COLS", "b200_compiled", "b200_refusals"]


@dataclass(frozen=True)
class RecordedConfig:
    """A config as its latest sm_90a compile report recorded it (``python -m nvfp4lib compile --record``)."""

    name: str
    tile_m: int
    tile_n: int
    tile_k: int
    ab_stages: int
    warp_spec: str
    epilogue: str | None
    decode: str | None
    dual: bool
    shipped: bool | None  # shipped in the tree that compiled it
    threads: int | None = None
    registers: int | None = None
    smem_bytes: int | None = None
    smem_per_stage: int | None = None
    smem_fp16_ring: int | None = None
    refused: str | None = None  # the rule the kernel's validate() gave, where it refused the config
    git_commit: str | None = None  # the tree that compiled it


def recorded_configs(path=store.COMPILE, arch: str = "sm_90a") -> dict[str, RecordedConfig]:
    """The latest compile report of every config for ``arch``, by name (a ``*_dual`` name: its dual report)."""
    names = {f.name for f in fields(RecordedConfig)}
    best: dict[str, dict] = {}
    for r in store.read_rows(path):
        if r.get("arch") != arch or "config" not in r or "tile_m" not in r:
            continue
        if bool(r.get("dual")) != ("dual" in r["config"]):
            continue
        if r["config"] not in best or r["run_id"] >= best[r["config"]]["run_id"]:
            best[r["config"]] = r
    out = {}
    for n, r in best.items():
        err = r.get("error") or None
        vals = {k: r.get(k) for k in names if k not in ("name", "refused")}
        out[n] = RecordedConfig(name=n, refused=err.removeprefix("refused: ") if err else None, **vals)
    return out


# store.load()'s `kernel` column of the smem-decode kernel ("fp16-decode"); rows of the removed v1 are never mixed in
NEW = store.HOPPER_KERNELS[1]
PEER = "torch-grouped-mm[graph=True]"  # a peer, always from the same run as the cute rows beside it
SHAPES, DUALS = [p.name for p in BENCHMARK], [p.name for p in DUAL]
ALL = recorded_configs()  # name -> RecordedConfig, from data/compile.jsonl
NOISE = 0.03  # ratios within 1 +- 3% are called "no change" (repeatability() measures the run-to-run spread)
SM_SMEM = 233472  # shared memory of one H100 SM (228 KB); each CTA also reserves 1 KB


def lab(cfg):
    return f"cute-hopper[config={cfg},graph=True]"


def same_run(rows, configs, problems=SHAPES, peers=(PEER,), kernel=NEW):
    """`kernel`'s rows of `configs` from the latest run that measured all of them, with that run's peers."""
    want = [lab(c) for c in configs]
    cute = rows[(rows["kernel"] == kernel) & rows["label"].isin(want) & rows["problem"].isin(problems)]
    runs = [r for r, g in cute.groupby("run_id") if g["label"].nunique() == len(want)]
    if not runs:
        return rows.iloc[0:0]
    sel = rows[(rows["run_id"] == max(runs)) & rows["problem"].isin(problems) & rows["label"].isin(want + list(peers))]
    names = dict(zip(want, configs)) | {p: p.split("[")[0] + " (peer)" for p in peers}
    sel = sel.assign(series=sel["label"].map(names), _o=sel["label"].map({k: i for i, k in enumerate(names)}))
    return sel.sort_values(["_o", "problem"]).drop(columns="_o")


def medians(sel):
    """'median (p10-p90)' in us, one column per series."""
    t = sel.assign(v=[f"{m:.1f} ({a:.0f}-{b:.0f})" for m, a, b in zip(sel["median_us"], sel["p10_us"], sel["p90_us"])])
    return t.pivot(index="problem", columns="series", values="v")[list(dict.fromkeys(t["series"]))]


def pair(rows, a, b, problems=SHAPES):
    """Speedup of config b over config a per shape (a's median / b's), from the latest run that has both;
    lo-hi: the same ratio taken from the p10/p90 ends (a conservative spread)."""
    sel = same_run(rows, [a, b], problems, peers=())
    if not len(sel):
        return pd.DataFrame()
    p = {c: sel.pivot(index="problem", columns="series", values=c) for c in ("median_us", "p10_us", "p90_us")}
    return pd.DataFrame({"from": a, "to": b, "from us": p["median_us"][a], "to us": p["median_us"][b],
                         "speedup": p["median_us"][a] / p["median_us"][b], "lo": p["p10_us"][a] / p["p90_us"][b],
                         "hi": p["p90_us"][a] / p["p10_us"][b], "run": sel["run_id"].iloc[0]}).reset_index()


def repeatability(rows):
    """(config, shape) cells of the new kernel measured in more than one run: how far apart their medians are."""
    h = rows[(rows["kernel"] == NEW) & (rows["status"] == "ok")].groupby(["label", "problem"])["median_us"]
    h = h.agg(["min", "max", "count"]).query("count > 1")
    if not len(h):
        return "no config measured twice yet"
    d = h["max"] / h["min"] - 1
    return (f"{len(d)} config x shape cells measured in 2+ runs differ by {d.median():.1%} (median), "
            f"{d.max():.1%} at most ({d.idxmax()[1]})")


def register_split(cfg: RecordedConfig) -> tuple[int, int]:
    """setmaxnreg targets (producer, math) per thread of a producer_consumer config: the kernel's rule (104 for the
    producer; the math warpgroups share the rest of the launch pool, at most 240), from the recorded thread count."""
    nmath = cfg.threads // 128 - 1
    pool = 65536 // cfg.threads // 8 * 8 * (1 + nmath)
    return 104, min(240, (pool - 104) // nmath // 8 * 8)


def resources(names):
    """Shared memory, threads and registers of each config as compiled for sm_90a (data/compile.jsonl; the tree that
    compiled it is in `compiled at`) -> CTAs per SM."""
    out = []
    for n in names:
        c = ALL[n]
        if c.refused:
            raise ValueError(f"{n} was refused by the kernel ({c.refused}): it has no resources")
        r = {"config": n, "tile": f"{c.tile_m}x{c.tile_n}x{c.tile_k}", "stages": c.ab_stages, "warp_spec": c.warp_spec,
             "threads": c.threads, "smem KB": round(c.smem_bytes / 1024, 1),
             "per stage KB": round(c.smem_per_stage / 1024, 1), "CTAs/SM by smem": SM_SMEM // (c.smem_bytes + 1024),
             "registers": c.registers,
             "CTAs/SM by registers": 65536 // (-(-c.registers // 8) * 8 * c.threads), "compiled at": c.git_commit[:7]}
        out.append(r)
    t = pd.DataFrame(out)
    t["CTAs/SM"] = t[["CTAs/SM by smem", "CTAs/SM by registers"]].min(axis=1).astype(int)
    return t.set_index("config")


def runs_behind(rows) -> pd.DataFrame:
    """The runs a verdict rests on, one line per run of ``rows``: its commit (short hash), GPU and date."""
    if rows is None or not len(rows):
        return pd.DataFrame(columns=["commit", "GPU", "date"])
    g = rows.groupby("run_id").agg(commit=("git_commit", "first"), GPU=("gpu", "first"), date=("date", "min"))
    g["commit"] = g["commit"].map(lambda c: str(c)[:7] if isinstance(c, str) and c else "not recorded")
    g["GPU"] = g["GPU"].map(lambda x: x if isinstance(x, str) and x else "GPU not recorded")
    g["date"] = g["date"].map(lambda d: str(d)[:10])
    return g.sort_index()


def sources(rows) -> str:
    """'NVIDIA H100 80GB HBM3: run 20261122T232431Z-0fca2dc7 at commit 10a57fd (2026-11-22); ...': where ``rows`` came
    from, as a verdict names it (the GPU once when every run shares it)."""
    runs = runs_behind(rows)
    if not len(runs):
        return "no recorded rows"
    gpus = list(dict.fromkeys(runs["GPU"]))
    each = [f"run {rid} at commit {r.commit} ({r.date})" + ("" if len(gpus) == 1 else f" on {r.GPU}")
            for rid, r in runs.iterrows()]
    return (f"{gpus[0]}: " if len(gpus) == 1 else "") + "; ".join(each)


def filled(df, missing: str = "—") -> pd.DataFrame:
    """``df`` for display, numbers as they are (:func:`.plots.shown` without rounding): a missing cell as a dash."""
    from .plots import shown

    return shown(df, None, missing=missing)


# what the round notebooks show of the sm_100a compile reports (data/compile.jsonl) of the study's B200 kernel
B200_COLS = ["config", "dual", "tile_m", "tile_n", "ab_stages", "use_2cta", "warp_spec", "threads", "registers",
             "spill_stores", "dynamic_smem", "tmem_cols_allocated", "ctas_per_sm_smem", "ctas_per_sm_tmem",
             "tcgen05.mma kind", "error"]


def _picked(bw, select):
    return bw[select(bw) if callable(select) else select]


def b200_compiled(bw, select) -> pd.DataFrame:
    """The sm_100a compile reports ``bw`` (``store.latest_compile_rows("sm_100a")``) of the configs ``select`` picks (a
    boolean mask or a callable on ``bw``), one line per (config, dual): what compiled with its resources, what was
    refused (a refused config has no resources: a dash; its reason in full from :func:`b200_refusals`)."""
    t = _picked(bw, select)
    t = t[[c for c in B200_COLS if c in t.columns]].set_index(["config", "dual"])
    if "error" in t:
        t = t.assign(outcome=t["error"].map(lambda e: "refused" if isinstance(e, str) and e else "compiled"))
        t = t.drop(columns="error")
    return filled(t)


def b200_refusals(bw, select) -> str:
    """One line per refused (config, dual) of :func:`b200_compiled`'s table: the compiler's or the plan's reason."""
    t = _picked(bw, select)
    if "error" not in t:
        return ""
    t = t[t["error"].map(lambda e: isinstance(e, str) and bool(e))]
    return "\n".join(f"{r.config} (dual={bool(r.dual)}): {r.error}" for r in t.itertuples())
