"""Grouped problems, the study's suites, and seeded input generation.

A :class:`GroupedProblem` is data: per-group (M, N, K) and whether it is the fused dual
GEMM. Suites are named tuples of problems (``BENCHMARK``, ``DUAL``, ``CORRECTNESS``) so
notebooks, tests and data files refer to shapes by name ("S1", "S1-dual", "C3").
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .formats import NVFP4Tensor, quantize

__all__ = [
    "GroupedProblem", "GroupedInputs", "make_inputs", "BENCHMARK", "DUAL", "CORRECTNESS", "TASK",
    "SUITES", "get_problem", "suite",
]

INPUT_MODES = ("uniform", "gaussian", "heavy")
HEAVY_OUTLIERS = 4  # per row, in mode "heavy"
HEAVY_SCALE = 100.0  # outlier magnitude in standard deviations: the tensor's global scale follows them, so the
# other blocks' E4M3 scales sit far below the outliers' (a dynamic range the study's {1, 2} scales never have)


@dataclass(frozen=True)
class GroupedProblem:
    name: str
    m: tuple[int, ...]
    n: tuple[int, ...]
    k: tuple[int, ...]
    dual: bool = False
    b200_target_us: float | None = None  # the study's speed-of-light target, where it set one
    b200_baseline_us: float | None = None  # the study's reported B200 baseline
    tags: tuple[str, ...] = field(default=())

    def __post_init__(self):
        if not (len(self.m) == len(self.n) == len(self.k)) or len(self.m) == 0:
            raise ValueError(f"{self.name}: m, n, k need one entry per group (got {len(self.m)}, "
                             f"{len(self.n)}, {len(self.k)})")
        for what, vals in (("M", self.m), ("N", self.n), ("K", self.k)):
            for v in vals:
                if not isinstance(v, int) or v < 0 or (what != "M" and v == 0):
                    raise ValueError(f"{self.name}: {what}={v!r} is not a valid size "
                                     f"(M >= 0, N > 0, K > 0 integers)")
        for kk in self.k:
            if kk % 16:
                raise ValueError(f"{self.name}: K={kk} is not a multiple of 16 (the NVFP4 block)")

    @classmethod
    def uniform_nk(cls, name, m, n, k, **kw) -> "GroupedProblem":
        m = tuple(int(x) for x in m)
        return cls(name, m, (n,) * len(m), (k,) * len(m), **kw)

    @property
    def groups(self) -> int:
        return len(self.m)

    @property
    def n_b(self) -> int:
        """Number of weight matrices per group (2 for the dual GEMM)."""
        return 2 if self.dual else 1

    def flops(self) -> int:
        return self.n_b * sum(2 * m * n * k for m, n, k in zip(self.m, self.n, self.k))

    def nvfp4_bytes(self) -> int:
        """Bytes a kernel must move at least: NVFP4 operands (0.5 B/elem + 1 B per 16) and fp16 out."""
        def q(rows, k):
            return rows * k // 2 + rows * k // 16
        b = sum(q(m, k) + self.n_b * q(n, k) + 2 * m * n for m, n, k in zip(self.m, self.n, self.k))
        return b

    def bf16_weight_bytes(self) -> int:
        return self.n_b * sum(2 * n * k for n, k in zip(self.n, self.k))

    def with_dual(self, dual: bool = True) -> "GroupedProblem":
        name = self.name.removesuffix("-dual") + ("-dual" if dual else "")
        return GroupedProblem(name, self.m, self.n, self.k, dual, self.b200_target_us,
                              self.b200_baseline_us, self.tags)

    def describe(self) -> str:
        n = set(self.n)
        k = set(self.k)
        ns = str(n.pop()) if len(n) == 1 else str(list(self.n))
        ks = str(k.pop()) if len(k) == 1 else str(list(self.k))
        return f"{self.name}: G={self.groups} M={list(self.m)} N={ns} K={ks}{' dual' if self.dual else ''}"


@dataclass
class GroupedInputs:
    problem: GroupedProblem
    a: list[NVFP4Tensor]
    b: list[NVFP4Tensor]
    b2: list[NVFP4Tensor] | None
    seed: int
    mode: str


# Uniform codes make |A·Bᵀ| ~ 50·sqrt(K): silu(gate)·up then overflows fp16 (~1e7 for K=4096).
# For the dual GEMM the weights therefore carry global scale 2^-8: exact (a power of two), and it
# exercises the global-scale path of every backend. Single GEMMs keep the study's global scale 1.
DUAL_UNIFORM_WEIGHT_GLOBAL_SCALE = 2.0**-8


def _uniform_tensor(rows: int, k: int, gen: torch.Generator, global_scale: float = 1.0) -> NVFP4Tensor:
    # The study's inputs: every code byte equally likely, scales drawn from {1, 2}, global scale 1.
    data = torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8, generator=gen)
    scales = (torch.randint(1, 3, (rows, k // 16), generator=gen).float()).to(torch.float8_e4m3fn)
    return NVFP4Tensor(data, scales, torch.tensor(global_scale))


def _gaussian_tensor(rows: int, k: int, gen: torch.Generator, std: float) -> NVFP4Tensor:
    x = torch.randn((rows, k), generator=gen) * std
    return quantize(x)


def _heavy_tensor(rows: int, k: int, gen: torch.Generator, std: float) -> NVFP4Tensor:
    """Gaussian values with HEAVY_OUTLIERS entries per row at ±HEAVY_SCALE standard deviations."""
    x = torch.randn((rows, k), generator=gen) * std
    if rows and k:
        cols = torch.randint(0, k, (rows, HEAVY_OUTLIERS), generator=gen)
        signs = torch.randint(0, 2, (rows, HEAVY_OUTLIERS), generator=gen).float() * 2 - 1
        x.scatter_(1, cols, signs * HEAVY_SCALE * std)
    return quantize(x)


def make_inputs(problem: GroupedProblem, seed: int = 1111, mode: str = "uniform",
                device: str | torch.device = "cpu") -> GroupedInputs:
    """Seeded NVFP4 inputs for ``problem``: generated on the CPU (reproducible), then moved."""
    if mode not in INPUT_MODES:
        raise ValueError(f"mode must be one of {INPUT_MODES}, got {mode!r}")
    gen = torch.Generator().manual_seed(seed)

    def make(rows, k, std, gs=1.0):
        if mode == "uniform":
            t = _uniform_tensor(rows, k, gen, gs)
        else:
            t = (_gaussian_tensor if mode == "gaussian" else _heavy_tensor)(rows, k, gen, std)
        return t.to(device)

    wgs = DUAL_UNIFORM_WEIGHT_GLOBAL_SCALE if problem.dual else 1.0
    a = [make(m, k, 1.0) for m, k in zip(problem.m, problem.k)]
    b = [make(n, k, 0.02, wgs) for n, k in zip(problem.n, problem.k)]
    b2 = [make(n, k, 0.02, wgs) for n, k in zip(problem.n, problem.k)] if problem.dual else None
    return GroupedInputs(problem, a, b, b2, seed, mode)


_S = GroupedProblem.uniform_nk
BENCHMARK = (
    _S("S1", (80, 176, 128, 72, 64, 248, 96, 160), 4096, 7168, b200_target_us=18.8, b200_baseline_us=373),
    _S("S2", (40, 76, 168, 72, 164, 148, 196, 160), 7168, 2048, b200_target_us=10.7, b200_baseline_us=372),
    _S("S3", (192, 320), 3072, 4096, b200_target_us=2.4, b200_baseline_us=173),
    _S("S4", (128, 384), 4096, 1536, b200_target_us=1.5, b200_baseline_us=156),
)
DUAL = tuple(p.with_dual() for p in BENCHMARK)

# The study's correctness cases (G; M list; N list; K list), seed 1111. N and K vary per group.
_CORRECTNESS_SPEC = (
    ([96, 128], [128, 256], [128, 512]),
    ([256, 72], [512, 384], [256, 256]),
    ([128, 128], [128, 256], [128, 512]),
    ([80, 128, 256], [384, 256, 128], [256, 512, 128]),
    ([64, 72, 96], [128, 384, 512], [384, 512, 128]),
    ([64, 256, 128], [768, 128, 256], [512, 512, 128]),
    ([128, 128, 64], [256, 512, 512], [768, 128, 768]),
    ([128] * 4, [128] * 4, [128] * 4),
    ([40, 56, 384, 512], [512, 384, 256, 128], [256] * 4),
    ([512, 384, 256, 128], [256] * 4, [512, 128, 512, 128]),
)
CORRECTNESS = tuple(
    GroupedProblem(f"C{i + 1}", tuple(m), tuple(n), tuple(k), tags=("correctness",))
    for i, (m, n, k) in enumerate(_CORRECTNESS_SPEC)
)
# Edge cases the study never tried: an empty group, ragged M, a single group, odd tiles.
EDGE = (
    GroupedProblem("E1-empty-group", (0, 100, 0, 37), (256,) * 4, (512,) * 4, tags=("edge",)),
    GroupedProblem("E2-single-row", (1,), (128,), (256,), tags=("edge",)),
    GroupedProblem("E3-ragged", (1, 7, 65, 129, 200), (384,) * 5, (768,) * 5, tags=("edge",)),
    GroupedProblem("E4-2880", (1, 33, 100, 257), (2880,) * 4, (2880,) * 4, tags=("edge",)),
)
# Off the benchmark (issue 6): tokens per group swept for two expert shapes and three group counts.
M_SWEEP = tuple(
    GroupedProblem.uniform_nk(f"M{m}-G{g}-N{n}-K{k}", (m,) * g, n, k, tags=("m-sweep",))
    for n, k in ((4096, 7168), (7168, 2048)) for g in (1, 8, 32) for m in (1, 8, 16, 32, 64, 128, 256, 512, 1024)
)

# The GPU MODE nvfp4_dual_gemm task (reference-kernels, problems/nvidia/nvfp4_dual_gemm/task.yml): one GEMM each, M
# tokens x N weight rows x K (the task keeps M and N multiples of 128, K of 256). Its benchmarks T1-T4, then the
# distinct shapes of its tests T5-T13. Suite "task" holds the benchmarks as the single GEMM and as the dual, side by
# side: the group tuple and the dual tuple at one size (the calls bench's harness form times both).
_TASK_SPEC = (
    (256, 4096, 7168), (512, 4096, 7168), (256, 3072, 4096), (512, 3072, 7168),
    (1536, 512, 7168), (256, 512, 256), (3072, 1024, 1536), (7168, 1024, 256), (7168, 2304, 2048),
    (4608, 384, 7168), (7168, 384, 2304), (512, 768, 7168), (4096, 768, 512),
)
TASK = tuple(GroupedProblem(f"T{i + 1}", (m,), (n,), (k,), tags=("task",)) for i, (m, n, k) in enumerate(_TASK_SPEC))

SUITES: dict[str, tuple[GroupedProblem, ...]] = {
    "benchmark": BENCHMARK,
    "dual": DUAL,
    "correctness": CORRECTNESS,
    "correctness-dual": tuple(p.with_dual() for p in CORRECTNESS),
    "edge": EDGE,
    "m-sweep": M_SWEEP,
    "task": tuple(q for p in TASK[:4] for q in (p, p.with_dual())),
    "task-dual": tuple(p.with_dual() for p in TASK),
}


def suite(name: str) -> tuple[GroupedProblem, ...]:
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; known: {', '.join(SUITES)}")
    return SUITES[name]


def get_problem(name: str) -> GroupedProblem:
    """A problem by name: 'S1', 'S1-dual', 'C3', 'E1-empty-group', ... ('-dual' works after any name)."""
    for probs in SUITES.values():
        for p in probs:
            if p.name == name:
                return p
    if name.endswith("-dual"):
        return get_problem(name.removesuffix("-dual")).with_dual()
    raise ValueError(f"unknown problem {name!r}")
