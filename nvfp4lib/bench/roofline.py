"""The roofline of the GPU at hand, and the floors a measurement is compared with.

floor(problem) = max(FLOPs / bf16 MMA rate, NVFP4 bytes / memory bandwidth). On Hopper the exact
NVFP4 path runs on the bf16 tensor cores, so bf16 is the compute roof; the bytes are the
packed NVFP4 operands, their scales and the fp16 output (what a kernel must at least move).

Two floors, from two sets of ceilings:

- **measured**: the bf16 matmul rate and device copy bandwidth measured in the same run as the
  kernels (``measure_ceilings``; stored on every bench row as ``ceil_*`` and ``floor_us``). What this
  GPU reaches with cuBLAS and a copy; it moves a few % between runs.
- **datasheet**: the vendor's peak figures of the row's GPU (``DATASHEETS``: H100 SXM, H200 SXM), fixed. Lower
  than the measured floor (no cuBLAS reaches the dense peak), so a ratio to it is the larger, stricter one.

A ratio to a floor must say which one it uses: ``FLOORS`` names both for captions.
"""
from __future__ import annotations

import statistics

import torch

from ..problems import GroupedProblem

__all__ = ["measure_ceilings", "floor_us", "ridge_flop_per_byte", "floors_us", "add_floors", "against_floors",
           "datasheet_for", "b200_model", "FLOORS", "H100_SXM_DATASHEET", "H200_SXM_DATASHEET", "B200_DATASHEET"]

# NVIDIA H100 Tensor Core GPU datasheet, "H100 SXM" column (nvidia.com/en-us/data-center/h100): BF16 Tensor Core
# 1,979 TFLOPS, footnoted "with sparsity" (dense is half: 989.4), GPU memory bandwidth 3.35 TB/s (HBM3). Our GPU,
# "NVIDIA H100 80GB HBM3", is the SXM5 part (the PCIe card has HBM2e). Keys match measure_ceilings' so either
# dict goes to floor_us; the HBM figure counts reads and writes together, as the measured copy bandwidth does.
H100_SXM_DATASHEET = {"bf16_tflops": 989.4, "copy_gbps": 3350.0, "part": "H100 SXM",
                      "source": "NVIDIA H100 datasheet, H100 SXM: dense BF16 989.4 TFLOP/s, HBM3 3.35 TB/s"}

# NVIDIA H200 Tensor Core GPU datasheet, "H200 SXM" column: the same GH100 and the same BF16 Tensor Core 1,979 TFLOPS
# "with sparsity" (dense: 989.4), GPU memory bandwidth 4.8 TB/s (HBM3e, 141 GB). torch names it "NVIDIA H200".
H200_SXM_DATASHEET = {"bf16_tflops": 989.4, "copy_gbps": 4800.0, "part": "H200 SXM",
                      "source": "NVIDIA H200 datasheet, H200 SXM: dense BF16 989.4 TFLOP/s, HBM3e 4.8 TB/s"}

# NVIDIA HGX B200 / DGX B200 datasheet, per GPU: FP4 Tensor Core 18 PFLOPS "with sparsity" (dense: 9), HBM3e
# 8 TB/s. No B200 has run anything of ours: these only model the study's GPU (notebook 07).
B200_DATASHEET = {"fp4_tflops": 9000.0, "hbm_gbps": 8000.0,
                  "source": "NVIDIA HGX B200 datasheet, per GPU: dense FP4 9 PFLOP/s, HBM3e 8 TB/s"}

# the GPU names torch reports, for the rows whose datasheet we hold; other GPUs get no datasheet floor
DATASHEETS = {"NVIDIA H100 80GB HBM3": H100_SXM_DATASHEET, "NVIDIA H200": H200_SXM_DATASHEET}

FLOORS = {
    "measured": "measured floor: bf16 matmul rate and copy bandwidth measured in the same run",
    "datasheet": "datasheet floor: the run's GPU's datasheet, "
                 + "; ".join(d["source"].split(", ", 1)[1] for d in DATASHEETS.values()),
}


def _median_ms(fn, iters=10, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    return statistics.median(ts)


def measure_ceilings(n: int = 8192, copy_bytes: int = 1 << 30) -> dict:
    """bf16 dense matmul rate (TFLOP/s, random data) and device copy bandwidth (GB/s, read+write)."""
    if not torch.cuda.is_available():
        raise RuntimeError("measuring ceilings needs a CUDA GPU")
    mma = 2 * n**3 / _time_matmul(n) * 1e-9
    bw = 2 * copy_bytes / _time_copy(copy_bytes) * 1e-6
    torch.cuda.empty_cache()  # the operands are gone with their functions' frames
    return {"bf16_tflops": mma, "copy_gbps": bw}


def _time_matmul(n: int) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    return _median_ms(lambda: a @ b)


def _time_copy(nbytes: int) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return _median_ms(lambda: dst.copy_(src))


def floor_us(problem: GroupedProblem, ceilings: dict) -> float:
    t_mma = problem.flops() / (ceilings["bf16_tflops"] * 1e12)
    t_mem = problem.nvfp4_bytes() / (ceilings["copy_gbps"] * 1e9)
    return max(t_mma, t_mem) * 1e6


def ridge_flop_per_byte(ceilings: dict) -> float:
    return ceilings["bf16_tflops"] * 1e12 / (ceilings["copy_gbps"] * 1e9)


def _floor_from_counts(flops: float, nbytes: float, ceilings: dict) -> float:
    return max(flops / (ceilings["bf16_tflops"] * 1e12), nbytes / (ceilings["copy_gbps"] * 1e9)) * 1e6


def datasheet_for(gpu: str) -> dict | None:
    """The datasheet ceilings of ``gpu`` (torch's device name), or None where we hold no datasheet for it."""
    return DATASHEETS.get(gpu)


def floors_us(problem: GroupedProblem, measured: dict | None = None,
              datasheet: dict = H100_SXM_DATASHEET) -> dict[str, float]:
    """Both floors of ``problem`` in us, keyed as ``FLOORS``: 'datasheet' always, 'measured' when the measured
    ceilings (``measure_ceilings()``, or a bench row's ``ceil_*`` values) are given."""
    out = {"datasheet": floor_us(problem, datasheet)}
    if measured is not None:
        out["measured"] = floor_us(problem, measured)
    return out


def add_floors(rows):
    """Bench rows (a DataFrame from ``store.load``) with both floors and both ratios beside each other:
    ``floor_measured_us`` (the row's own ``floor_us``), ``floor_datasheet_us`` (from its FLOPs and bytes and the
    datasheet of its GPU; NaN for a GPU without one), ``x_floor_measured`` and ``x_floor_datasheet``."""
    out = rows.copy()
    out["floor_measured_us"] = rows["floor_us"]
    sheets = [datasheet_for(g) for g in rows["gpu"]]
    out["floor_datasheet_us"] = [_floor_from_counts(f, b, d) if d else float("nan")
                                 for f, b, d in zip(rows["flops"], rows["nvfp4_bytes"], sheets)]
    out["x_floor_measured"] = rows["median_us"] / out["floor_measured_us"]
    out["x_floor_datasheet"] = rows["median_us"] / out["floor_datasheet_us"]
    return out


def against_floors(rows, label: str = "cute-hopper[graph=True]", problems=None):
    """One backend's times against both floors, per problem: the latest run that timed ``label`` (status ok) on
    every one of ``problems`` (all it timed, if None), one row per problem with its time, both floors and both
    ratios. Empty if no run qualifies."""
    import pandas as pd

    if rows is None or not len(rows):
        return pd.DataFrame()
    sel = rows[(rows["label"] == label) & (rows["status"] == "ok")]
    want = set(problems) if problems is not None else None
    if want is not None:
        sel = sel[sel["problem"].isin(want)]
    runs = [r for r, g in sel.groupby("run_id") if want is None or want <= set(g["problem"])]
    if not runs:
        return pd.DataFrame()
    run = add_floors(sel[sel["run_id"] == max(runs)])
    order = list(problems) if problems is not None else list(dict.fromkeys(run["problem"]))
    out = run.set_index("problem").loc[order, ["median_us", "floor_measured_us", "x_floor_measured",
                                               "floor_datasheet_us", "x_floor_datasheet", "run_id", "git_commit"]]
    return out.rename(columns={"median_us": "us", "floor_measured_us": "measured floor us",
                               "x_floor_measured": "x measured floor", "floor_datasheet_us": "datasheet floor us",
                               "x_floor_datasheet": "x datasheet floor"})


def b200_model(problem: GroupedProblem, spec: dict = B200_DATASHEET) -> dict:
    """``problem`` on a B200, modelled from its datasheet: time at the dense FP4 peak, time at HBM bandwidth, the
    larger of the two (the modelled floor), and which one bounds it (intensity against the ridge point)."""
    t_fp4 = problem.flops() / (spec["fp4_tflops"] * 1e12) * 1e6
    t_hbm = problem.nvfp4_bytes() / (spec["hbm_gbps"] * 1e9) * 1e6
    intensity = problem.flops() / problem.nvfp4_bytes()
    ridge = spec["fp4_tflops"] * 1e12 / (spec["hbm_gbps"] * 1e9)
    return {"t_fp4_us": t_fp4, "t_hbm_us": t_hbm, "floor_us": max(t_fp4, t_hbm), "flop_per_byte": intensity,
            "ridge_flop_per_byte": ridge, "bound": "memory" if intensity < ridge else "compute"}
