"""The original study's pitches and claims, as data: what was predicted, and what the B200 reported.

Numbers are the study's own (see the brief); the notebooks put our measurements beside them.
Speedups are "old time / new time" (>1 is faster). ``experiment`` names the pair of our
configurations or backends whose measured ratio tests the pitch on Hopper.
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Pitch", "PITCHES", "BY_KEY", "FACT_CLAIMS", "B200_BASELINE_US", "B200_TARGET_US", "measured_pairs",
           "measured_speedups", "judge", "pitch_table", "pitch_verdict"]

B200_BASELINE_US = {"S1": 373, "S2": 372, "S3": 173, "S4": 156}
B200_TARGET_US = {"S1": 18.8, "S2": 10.7, "S3": 2.4, "S4": 1.5}


@dataclass(frozen=True)
class Pitch:
    round: str
    key: str
    title: str
    claimed: tuple[float, float]  # predicted speedup range
    panel: tuple[float, float] | None  # the panel's range, where it gave one
    reported: str  # what the study reported on B200
    reported_us: dict = field(default_factory=dict)  # per-shape time after the change, where reported
    experiment: tuple[str, str] = ("", "")  # (before, after) as backend specs on our GPU
    said: str = ""  # the pitch's own words, where its claim was not a speedup (times, savings)

    def reported_speedup(self) -> dict:
        return {s: B200_BASELINE_US[s] / t for s, t in self.reported_us.items()}


PITCHES = (
    # Each experiment is read from one run that measured both sides (so both come from one kernel); the
    # cute-hopper rows of the current fp16-decode kernel are the later ones (store.HOPPER_FP16_SINCE).
    Pitch("1", "stages", "Pipeline stages: num_ab_stage 1 → 3", (1.5, 1.8), None,
          "regression on every shape", {"S1": 488, "S2": 462, "S3": 249, "S4": 228},
          ("cute-hopper:config=baseline,graph=1", "cute-hopper:config=stages3,graph=1")),
    Pitch("2", "tile", "Tile size (128,128,256) → (64,128,256) (+ heuristic)", (2.0, 4.0), (1.3, 3.0),
          "did not compile: hardware MMA shape constraints", {},
          ("cute-hopper:config=baseline,graph=1", "cute-hopper:config=tile64x64,graph=1")),
    Pitch("2", "tma_epilogue", "TMA store epilogue instead of SIMT stores", (1.12, 1.15), (1.03, 1.06),
          "queued behind tile tuning (never measured)", {},
          ("cute-hopper:config=baseline,graph=1", "cute-hopper:config=tma_epilogue,graph=1")),
    Pitch("2", "warp_spec", "Warp specialization (producer/consumer, ping-pong)", (1.25, 1.40), (1.15, 1.35),
          "withdrawn pending tile tuning", {},
          ("cute-hopper:config=baseline,graph=1", "cute-hopper:config=producer_consumer,graph=1")),
    # the same pitch's other half, on the v3 (swap-AB) kernel, the one with ping-pong; same tile, same epilogue
    Pitch("2", "pingpong", "Warp specialization: ping-pong (v3 kernel, same tile)", (1.25, 1.40), (1.15, 1.35),
          "withdrawn pending tile tuning", {},
          ("cute-hopper:config=rs_m128_t128_k128_s4,graph=1", "cute-hopper:config=rs_m128_t128_k128_s4_pp,graph=1")),
    Pitch("5A", "triton", "Full Triton kernel", (373 / 500, 373 / 160), None,
          "Triton has no native FP4 MMA path there", {},
          ("cute-hopper:config=baseline,graph=1", "triton:graph=1"),
          "~160–500 us for a full kernel; 10–30 us saved by a Triton epilogue fusion"),
    Pitch("5B", "compile_graphs", "torch.compile + CUDA graphs (+ _scaled_mm FP4)", (10.0, 50.0), (1.0, 2.0),
          "hinges on _scaled_mm FP4 support (unverified)", {},
          ("cute-hopper:config=baseline", "torch-compile:graph=1"), "10–50 us (10–50×)"),
    Pitch("5C", "streams", "One CUDA stream per group (+ graphs)", (4.0, 7.0), (2.0, 4.0),
          "won the vote (skeptic: ~150–200 us)", {},
          ("cute-hopper:config=baseline", "cute-hopper:config=baseline,strategy=streams"), "4–7×"),
)
BY_KEY = {p.key: p for p in PITCHES}

# The panel's factual claims, each testable (the notebooks test them).
FACT_CLAIMS = {
    "compute_bound": "NVFP4 is compute-bound, not memory bound",
    "register_pressure": "register pressure from 3x buffer state",
    "smem_per_stage": "SMEM ~36 KB per stage, 108 KB for 2 CTAs/SM",
    "steady_state": "pipeline never reaches steady state with 6-28 K iterations",
    "mma_waste": "M=64 on 128-row tiles wastes 50% of the MMA, M=40 wastes 69%",
    "sm_utilization": "16-64 CTAs on 144 SMs = 11-44% SM utilization",
    "epilogue_share": "epilogue is 5-10% of runtime, not 15-25%",
}


def measured_pairs(rows, pitch: Pitch, problems=("S1", "S2", "S3", "S4")):
    """The pitch's experiment on our GPU, one line per problem: before/after medians and their ratio, from the latest
    run that measured both sides, with that run's id, commit (short hash), GPU and the kernel of the "before" side."""
    import pandas as pd

    from ..bench.harness import BackendSpec

    before, after = (BackendSpec.parse(x).name for x in pitch.experiment)
    cols = ["problem", "run_id", "commit", "gpu", "kernel", "before us", "after us", "speedup"]
    if rows is None or not len(rows):
        return pd.DataFrame(columns=cols)
    ok = rows[(rows["status"] == "ok") & rows["problem"].isin(problems)]
    out = []
    for prob in problems:
        r = ok[ok["problem"] == prob]
        runs = [rid for rid, g in r.groupby("run_id") if {before, after} <= set(g["label"])]
        if not runs:
            continue
        g = r[r["run_id"] == sorted(runs)[-1]]
        b, a = g[g["label"] == before].iloc[0], g[g["label"] == after].iloc[0]
        t_before, t_after = float(b["median_us"]), float(a["median_us"])
        out.append({"problem": prob, "run_id": b["run_id"], "commit": str(b["git_commit"])[:7], "gpu": b["gpu"],
                    "kernel": b.get("kernel"), "before us": t_before, "after us": t_after,
                    "speedup": t_before / t_after})
    return pd.DataFrame(out, columns=cols)


def measured_speedups(rows, pitch: Pitch, problems=("S1", "S2", "S3", "S4")) -> dict:
    """before/after time per problem, from the latest run that measured both sides of the pitch's experiment."""
    m = measured_pairs(rows, pitch, problems)
    return dict(zip(m["problem"], m["speedup"]))


def judge(pitch: Pitch, values) -> str:
    """Where measured speedups ``values`` fall against the pitch's claimed range (and the panel's, if it gave one)."""
    values = list(values)
    if not values:
        return "open: not measured"
    lo, hi = min(values), max(values)
    c = pitch.claimed
    verdict = ("inside the claimed range" if c[0] <= lo and hi <= c[1] else
               "below the claim" if hi < c[0] else "above the claim" if lo > c[1] else "partly inside")
    if pitch.panel:
        verdict += "; the panel/skeptic range " + ("held" if pitch.panel[0] <= lo and hi <= pitch.panel[1]
                                                   else "missed too")
    return verdict


def pitch_table(rows, pitch: Pitch, problems=("S1", "S2", "S3", "S4")):
    """Per problem: what the study reported on B200 (its baseline, and the time after the change where it reported
    one) beside our measurement of the pitch's experiment on this GPU (before, after, speedup), as text (times to
    0.1 us, speedups to 0.01); a dash where a side has no number."""
    import pandas as pd

    m = measured_pairs(rows, pitch, problems).set_index("problem")
    t = pd.DataFrame(index=pd.Index(list(problems), name="problem"))
    t["B200 baseline us (study)"] = [B200_BASELINE_US.get(p) for p in problems]
    t["B200 after us (study)"] = [pitch.reported_us.get(p) for p in problems]
    t["B200 speedup (study)"] = [pitch.reported_speedup().get(p) for p in problems]
    t["H100 before us"] = m["before us"]
    t["H100 after us"] = m["after us"]
    t["H100 speedup"] = m["speedup"]
    t = t.astype(float)
    shown = {c: t[c].map(lambda v, d=2 if "speedup" in c else 1: "—" if pd.isna(v) else f"{v:.{d}f}") for c in t}
    return pd.DataFrame(shown, index=t.index)


def pitch_verdict(rows, pitch: Pitch, problems=("S1", "S2", "S3", "S4")) -> str:
    """Two lines: the pitch (claimed range, the panel's, what the study reported on B200), and our measurement of its
    experiment (range over the problems, where it falls, the runs behind it)."""
    m = measured_pairs(rows, pitch, problems)
    panel = f" (panel {pitch.panel[0]:.2f}-{pitch.panel[1]:.2f}x)" if pitch.panel else ""
    head = (f"pitch {pitch.round} ({pitch.key}): {pitch.title}: claimed {pitch.claimed[0]:.2f}-{pitch.claimed[1]:.2f}x"
            f"{panel}; on B200 the study reported: {pitch.reported}")
    if not len(m):
        return head + "\nour measurement: none recorded (" + " -> ".join(pitch.experiment) + ")"
    runs = m.drop_duplicates("run_id")
    where = "; ".join(f"run {r.run_id} at commit {r.commit}" for r in runs.itertuples())
    return (head + f"\nour measurement ({' -> '.join(pitch.experiment)}): {m['speedup'].min():.2f}-"
            f"{m['speedup'].max():.2f}x on {', '.join(m['problem'])} -> {judge(pitch, m['speedup'])} "
            f"[{', '.join(sorted(set(m['gpu'].astype(str))))}; {where}]")
