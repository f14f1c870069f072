"""``backend="cute-blackwell"``: the study's NVFP4 block-scaled grouped GEMM for sm_100a (B200), in CuTe DSL.

**Compiled for sm_100a, not run.** No Blackwell GPU was available to this project: every fact
this module reports (registers, spills, shared and tensor memory, PTX instruction counts) comes
from compiling with fake operands for ``sm_100a`` on a machine without a GPU. Nothing here has
executed, and nothing here claims a result computed by the kernel. :func:`prepare` refuses to
launch on anything but an sm_100 GPU.

What the kernel computes, per group g of a grouped problem (one launch for all groups):
``C_g = alpha_g * (A_g · B_gᵀ)`` in fp16, or for the dual variant
``C_g = silu(alpha1_g * A_g·B1_gᵀ) * (alpha2_g * A_g·B2_gᵀ)``, where A/B are NVFP4 (packed E2M1,
K-major, one E4M3 scale per 16 K elements in the blocked 128×4 layout of
:func:`nvfp4lib.formats.swizzle_scales`) and ``alpha`` is the product of the FP32 global scales.
The data path is NVIDIA's (``examples/python/CuTeDSL/blackwell/grouped_blockscaled_gemm.py`` and
``dense_blockscaled_gemm_persistent.py`` at tag v4.3.5, whose structure this follows): TMA loads
of A, B and both scale tensors; scales copied from shared to tensor memory (``tcgen05.cp``);
``tcgen05.mma.kind::mxf4nvf4.block_scale`` with fp32 accumulators in tensor memory; tensor memory
read back with ``tcgen05.ld``; alpha (and SiLU·up) applied in fp32; one rounding to fp16. Groups
are found on the device from a (G, 4) table of (M, N, K, 1); per-group addresses live in a device
table and each CTA rewrites its own copies of the TMA descriptors in a global workspace.

Two kernel structures, selected by ``KernelConfig.warp_spec``:

* ``"none"`` -- the study's kernel (config ``baseline``): 128 threads, one CTA per output tile
  (grid = number of tiles, not persistent), warp 0 rewrites the descriptors, issues the TMA loads
  *and* the MMAs, all four warps run a SIMT epilogue (``tcgen05.ld``, then per-thread scalar
  ``st.global.b16`` stores). Warp 0 issues k-tile k's load, waits for it, issues its MMAs, and
  moves on; the MMAs are asynchronous, so with ``ab_stages >= 2`` load k+1 overlaps MMAs k. The
  prefetch distance is one k-tile whatever the stage count: a third or fourth stage adds shared
  memory and no overlap (the study's round 1).
* ``"producer_consumer"`` -- NVIDIA's warp-specialized persistent structure (config
  ``ws_pipelined``): 192 threads; warp 5 loads (TMA), warp 4 issues MMAs, warps 0-3 run the
  epilogue (TMA store); an ``ab_stages``-deep shared-memory pipeline and ``acc_stages`` accumulator
  buffers in tensor memory; one CTA (or 2-CTA cluster) per SM walking the tiles of all groups.

Both allocate all 512 tensor-memory columns, as NVIDIA's examples and the study's kernel do, so
tensor memory alone allows one CTA per SM (:func:`compile_report` also gives the count a minimal
allocation would permit).

Deviations from the study's kernel as the brief describes it (which matches the CuTe DSL
template of gpu-mode's ``nvfp4_group_gemm`` problem) in ``baseline``, all deliberate:

* Group sizes are read on the device, so one compile serves every problem with the same group
  count (the template baked the per-group tile counts into the compiled kernel).
* The SIMT epilogue predicates rows (M is ragged: 40..384) and row slices past N; the template
  stores whole 128x128 tiles unpredicated. The single-product epilogue keeps the template's one
  ``tcgen05.ld.32x32b.x128`` per thread; the dual one reads 32-column slices (two 128-column
  fp32 accumulators would not fit in 255 registers).
* The FP32 global-scale product (alpha) is applied in the epilogue (the template had none).

Configs refused by :func:`validate` name the rule; where the rule is the MMA instruction's
(checked by CuTe DSL's ``MmaMXF4NVF4Op`` exactly as ``cute.compile`` would), the message quotes
the compiler's own error text. :func:`study_round2_tile128x64_error` reproduces the compiler's
error for the study's round-2 edit at tile (128, 64).
"""

import math
import re
import time
from dataclasses import dataclass
from typing import Optional

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.blackwell_helpers as sm100_utils
import cutlass.utils.blockscaled_layout as blockscaled_utils
import torch
from cutlass.cute.nvgpu import cpasync, tcgen05
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait

from ..backends import Runner
from .config import KernelConfig

__all__ = [
    "LABEL", "ARCH", "CONFIGS", "SWEEP_CONFIGS", "validate", "prepare", "require_sm100", "compile_report",
    "CompilerError", "study_round2_tile128x64_error", "StoragePlan", "storage_plan", "tmem_columns",
    "threads_per_cta", "num_tensormaps", "mma_shape", "epilogue_columns", "problem_tables", "tile_counts",
    "grid_ctas", "shape_tile_table", "tensormap_workspace_bytes", "cutlass_scale_offsets", "ctas_per_sm",
    "fake_arguments", "Sm100NvFp4GroupedGemm",
]


LABEL = "compiled for sm_100a, not run"
ARCH = "sm_100a"

# ---------------------------------------------------------------------------------------------
# sm_100 (B200) limits. CUDA C Programming Guide, "Technical Specifications per Compute
# Capability" (compute capability 10.0), and the PTX ISA for tensor memory.
# ---------------------------------------------------------------------------------------------
SMEM_PER_BLOCK_MAX = 232448  # 227 KB: max dynamic shared memory per block (opt-in)
SMEM_PER_SM = 233472  # 228 KB of shared memory per SM
SMEM_RESERVED_PER_BLOCK = 1024  # the driver reserves 1 KB per resident block
REGS_PER_SM = 65536
REG_ALLOC_UNIT_PER_WARP = 256  # registers are allocated per warp in units of 256
MAX_THREADS_PER_SM = 2048
MAX_CTAS_PER_SM = 32
TMEM_COLUMNS = 512  # 128 lanes x 512 columns x 32 bit per SM
B200_SMS = 148

SF_VEC = 16  # NVFP4: one E4M3 scale per 16 K elements
MMA_K = 64  # K of one tcgen05.mma.kind::mxf4nvf4 (FP4 elements)
MMA_K_BLOCKS = 4  # NVIDIA's layout helpers (make_smem_layout_sfa/sfb) fix 4 MMAs per k-tile
BYTES_PER_TENSORMAP = 128
TMEM_ALLOC_COLUMNS = TMEM_COLUMNS  # NVIDIA's examples and the study allocate all 512 columns
EPI_COLS = 32  # tensor-memory columns the epilogue reads per slice when not reading a whole row
C_STAGES = 2  # shared-memory buffers of the TMA-store epilogue
MBAR_BYTES = 8

# Device address table: one row per group, these columns (int64 addresses).
ADDR_A, ADDR_B, ADDR_C, ADDR_SFA, ADDR_SFB, ADDR_B2, ADDR_SFB2 = range(7)
NUM_ADDR = 7

# ---------------------------------------------------------------------------------------------
# Configs
# ---------------------------------------------------------------------------------------------
_BASE = KernelConfig("baseline", tile_m=128, tile_n=128, tile_k=256, ab_stages=1, epilogue="simt",
                     warp_spec="none", acc_stages=1)
# What the study should have ended with: warp specialization, a multi-stage pipeline, a TMA
# store epilogue. Three stages so that the dual variant (54 KB/stage: A, B1, B2 and their scales)
# fits in shared memory; one accumulator stage so that the dual variant's two 128-column
# accumulators plus scales fit in the 512 tensor-memory columns.
_WS = _BASE.with_(name="ws_pipelined", ab_stages=3, epilogue="tma", warp_spec="producer_consumer")

CONFIGS: dict[str, KernelConfig] = {c.name: c for c in (_BASE, _WS)}

SWEEP_CONFIGS: dict[str, KernelConfig] = {c.name: c for c in (
    # Round 1: the study's stage counts, in the study's kernel.
    *(_BASE.with_(name=f"r1_stages{s}", ab_stages=s) for s in (1, 2, 3, 4)),
    # Round 2: the study's tile candidates in the study's kernel (one CTA per MMA) ...
    *(_BASE.with_(name=f"r2_tile{m}x{n}", tile_m=m, tile_n=n)
      for m, n in ((64, 128), (64, 64), (128, 64), (128, 256))),
    # ... and with the 2-CTA MMA (a CTA pair shares one MMA of 2*tile_m rows). The study's kernel
    # has no cluster support, so these use the warp-specialized structure.
    *(_WS.with_(name=f"r2_tile{m}x{n}_2cta", tile_m=m, tile_n=n, use_2cta=True, cluster_m=2)
      for m, n in ((64, 128), (64, 64), (128, 64), (128, 256))),
    # Beyond the study: the warp-specialized kernel with more stages / double-buffered accumulators.
    _WS.with_(name="ws_stages5", ab_stages=5),
    _WS.with_(name="ws_acc2", acc_stages=2),
)}


def _get_config(config) -> KernelConfig:
    if isinstance(config, KernelConfig):
        return config
    table = {**CONFIGS, **SWEEP_CONFIGS}
    if config not in table:
        raise ValueError(f"unknown cute-blackwell config {config!r}; known: {', '.join(table)}")
    return table[config]


# ---------------------------------------------------------------------------------------------
# Plans computed in Python (checked against the kernel's own numbers at trace time)
# ---------------------------------------------------------------------------------------------
def num_products(cfg: KernelConfig) -> int:
    return 2 if cfg.dual else 1


def threads_per_cta(cfg: KernelConfig) -> int:
    """128 for the study's structure; 4 epilogue + 1 MMA + 1 TMA warps when warp-specialized."""
    return 128 if cfg.warp_spec == "none" else 192


def num_tensormaps(cfg: KernelConfig) -> int:
    """TMA descriptors each CTA rewrites per group: A, B, SFA, SFB (+ B2, SFB2) (+ C for TMA stores)."""
    return 4 + 2 * cfg.dual + (cfg.epilogue == "tma")


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def mma_shape(cfg: KernelConfig) -> tuple[int, int, int]:
    """(M, N, K) of one tcgen05.mma: the 2-CTA MMA spans the rows of both CTAs of a pair."""
    return (cfg.tile_m * (2 if cfg.use_2cta else 1), cfg.tile_n, MMA_K)


def epilogue_columns(cfg: KernelConfig) -> int:
    """Accumulator columns a thread reads from tensor memory at once.

    The study's SIMT epilogue read a whole 128-column row per thread (128 fp32 registers); we keep
    that for the single product. The dual epilogue holds two accumulators, so it reads slices.
    The TMA-store epilogue uses NVIDIA's sub-tile.
    """
    if cfg.epilogue == "simt" and not cfg.dual and cfg.tile_n <= 128:
        return cfg.tile_n
    return min(EPI_COLS, cfg.tile_n)


@dataclass(frozen=True)
class StoragePlan:
    """Bytes of dynamic shared memory, member by member, in the order of the kernel's struct."""

    tensormaps: int
    barriers: int
    tmem_holder: int
    c_buffer: int
    a: int
    b: int
    sfa: int
    sfb: int
    b2: int
    sfb2: int
    total: int
    per_stage: int

    def as_dict(self) -> dict:
        return dict(self.__dict__)


_ALIGN = 1024  # the operand buffers are 1024-byte aligned (128B swizzle atoms)


def storage_plan(cfg: KernelConfig) -> StoragePlan:
    """The kernel's shared-memory struct, computed without CuTe (the kernel checks it agrees)."""
    s = cfg.ab_stages
    rows_a = cfg.tile_m  # rows of A per CTA (the 2-CTA MMA splits its M over the pair)
    k_bytes = cfg.tile_k // 2
    a = rows_a * k_bytes * s
    # B: the 2-CTA MMA splits N over the pair too (each CTA loads half of B).
    rows_b = cfg.tile_n // (2 if cfg.use_2cta else 1)
    b = rows_b * k_bytes * s
    sf_k = cfg.tile_k // SF_VEC
    sfa = rows_a * sf_k * s
    sfb = _round_up(cfg.tile_n, 128) * sf_k * s  # the scale atom covers 128 rows
    b2 = b if cfg.dual else 0
    sfb2 = sfb if cfg.dual else 0
    tmaps = num_tensormaps(cfg) * BYTES_PER_TENSORMAP
    barriers = MBAR_BYTES * (2 * s + 2 * cfg.acc_stages + 1)
    holder = 4
    c = C_STAGES * cfg.tile_m * min(EPI_COLS, cfg.tile_n) * 2 if cfg.epilogue == "tma" else 0
    off = tmaps + barriers + holder
    for size in (c, a, b, sfa, sfb, b2, sfb2):
        if size:
            off = _round_up(off, _ALIGN) + size
    per_stage = (a + b + sfa + sfb + b2 + sfb2) // s
    return StoragePlan(tmaps, barriers, holder, c, a, b, sfa, sfb, b2, sfb2, off, per_stage)


def tmem_columns(cfg: KernelConfig) -> dict:
    """Tensor-memory columns: accumulators (fp32, one column per output column per product and
    stage) and the scale factors of one k-tile (4 columns per 32 rows of A / of 128-padded B)."""
    acc = cfg.tile_n * cfg.acc_stages * num_products(cfg)
    sfa = (max(cfg.tile_m, 128) // 32) * MMA_K_BLOCKS  # the scale atom spans 128 rows
    sfb = (_round_up(cfg.tile_n, 128) // 32) * MMA_K_BLOCKS * num_products(cfg)
    used = acc + sfa + sfb
    return {"acc": acc, "sf": sfa + sfb, "used": used, "allocated": TMEM_ALLOC_COLUMNS,
            "minimal_alloc": max(32, 1 << math.ceil(math.log2(used)))}


def ctas_per_sm(*, smem_bytes: int, registers: Optional[int], threads: int, tmem_alloc: int) -> dict:
    """CTAs one SM can hold, limited by shared memory, registers, tensor memory and threads."""
    out = {"by_smem": SMEM_PER_SM // (smem_bytes + SMEM_RESERVED_PER_BLOCK),
           "by_threads": min(MAX_CTAS_PER_SM, MAX_THREADS_PER_SM // threads),
           "by_tmem": TMEM_COLUMNS // tmem_alloc}
    if registers:
        warps = threads // 32
        per_warp = _round_up(registers * 32, REG_ALLOC_UNIT_PER_WARP)
        out["by_registers"] = REGS_PER_SM // (per_warp * warps)
    out["ctas_per_sm"] = min(out.values())
    return out


# ---------------------------------------------------------------------------------------------
# validate
# ---------------------------------------------------------------------------------------------
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _clean(e: Exception) -> str:
    """CuTe DSL's message without colour codes and suggestions: 'OpError: ... (MmaMXF4NVF4Op error)'."""
    text = " ".join(_ANSI.sub("", str(e)).split())
    head, _, rest = text.partition(" Error Code: ")
    code = rest.split(" 💡")[0].split(" Suggestions:")[0].strip()
    return f"{head} ({code})" if code else head


def _mma_compiler_error(cfg: KernelConfig) -> Optional[tuple[str, str]]:
    """(which MMA, CuTe DSL's error) if building this config's MMAs fails, as ``cute.compile`` would.

    Two MMAs are built: the block-scaled MMA itself, and the 1-CTA MMA over 128-row-padded N tiles
    that CUTLASS uses to lay out B's scale factors (per CTA: M = tile_m).
    """
    m, n, k = mma_shape(cfg)
    group = tcgen05.CtaGroup.TWO if cfg.use_2cta else tcgen05.CtaGroup.ONE
    try:
        tcgen05.MmaMXF4NVF4Op(cutlass.Float8E4M3FN, (m, n, k), group, tcgen05.OperandSource.SMEM)
    except Exception as e:  # OpError: the instruction-shape rule
        return "mma", _clean(e)
    try:
        tcgen05.MmaMXF4NVF4Op(cutlass.Float8E4M3FN, (cfg.tile_m, _round_up(n, 128), k), tcgen05.CtaGroup.ONE,
                              tcgen05.OperandSource.SMEM)
    except Exception as e:
        return "sfb", _clean(e)
    return None


def validate(cfg: KernelConfig, arch: str = ARCH) -> KernelConfig:
    """Return ``cfg`` if this kernel can be compiled for it; else raise ValueError naming the rule."""
    name = cfg.name
    if arch != ARCH:
        raise ValueError(f"{name}: the Blackwell kernel targets {ARCH} (tcgen05 FP4 MMA); got arch={arch!r}")
    if cfg.tile_k != MMA_K * MMA_K_BLOCKS:
        raise ValueError(f"{name}: tile_k={cfg.tile_k}: CUTLASS's scale-factor layouts fix a k-tile at "
                         f"{MMA_K_BLOCKS} MMAs of K={MMA_K}, so tile_k must be {MMA_K * MMA_K_BLOCKS}")
    if cfg.swap_ab:
        raise ValueError(f"{name}: swap_ab is not implemented in this kernel")
    if cfg.warp_spec not in ("none", "producer_consumer"):
        raise ValueError(f"{name}: warp_spec={cfg.warp_spec!r} is not implemented "
                         "(this kernel has 'none' and 'producer_consumer')")
    if cfg.ab_stages < 1 or cfg.acc_stages < 1:
        raise ValueError(f"{name}: ab_stages={cfg.ab_stages}, acc_stages={cfg.acc_stages} must be >= 1")
    # The instruction's shape rule, in the compiler's words.
    err = _mma_compiler_error(cfg)
    if err is not None:
        which, text = err
        m, n, _ = mma_shape(cfg)
        tile = f"tile {cfg.tile_m}x{cfg.tile_n}{' (2-CTA)' if cfg.use_2cta else ''}"
        if which == "mma":
            rule = ("cta_group::2 block-scaled MMA: M in {128, 256} (2*tile_m), N a multiple of 16 in [16, 256]"
                    if cfg.use_2cta else
                    "cta_group::1 block-scaled MMA: M = 128, N a multiple of 8 in [8, 256]")
            raise ValueError(f"{name}: {tile} needs a {m}x{n} tcgen05.mma.kind::mxf4nvf4, which the hardware "
                             f"does not have ({rule}); CuTe DSL: {text}")
        raise ValueError(f"{name}: {tile}: the {m}x{n} cta_group::2 MMA exists, but CuTe DSL 4.3.5 lays out B's "
                         f"scale factors through a 1-CTA MMA of M = tile_m = {cfg.tile_m} per CTA, which does not "
                         f"(NVIDIA's examples use the 2-CTA MMA only with M = 256); CuTe DSL: {text}")
    if cfg.warp_spec == "none":
        if cfg.use_2cta or cfg.cluster_m != 1 or cfg.cluster_n != 1:
            raise ValueError(f"{name}: the study's structure (warp_spec='none') runs one CTA per tile with no "
                             "cluster; 2-CTA MMA and clusters need warp_spec='producer_consumer'")
        if cfg.acc_stages != 1:
            raise ValueError(f"{name}: acc_stages={cfg.acc_stages}: with one tile per CTA (warp_spec='none') "
                             "there is nothing to double-buffer; use 1")
    for what, v in (("cluster_m", cfg.cluster_m), ("cluster_n", cfg.cluster_n)):
        if v < 1 or v > 4 or v & (v - 1):
            raise ValueError(f"{name}: {what}={v}: must be a power of two <= 4 (scale-factor multicast)")
    if cfg.use_2cta and cfg.cluster_m % 2:
        raise ValueError(f"{name}: use_2cta needs cluster_m even (the CTA pair lies along M), got {cfg.cluster_m}")
    if cfg.tile_n not in (64, 128, 256):
        raise ValueError(f"{name}: tile_n={cfg.tile_n}: B's scale factors are loaded in 128-row tiles; this kernel "
                         "handles tile_n in {64, 128, 256} (64 by offsetting into a 128-row tile, as NVIDIA's dense "
                         "block-scaled example does)")
    tm = tmem_columns(cfg)
    if tm["used"] > TMEM_COLUMNS:
        raise ValueError(f"{name}: needs {tm['used']} tensor-memory columns ({tm['acc']} for "
                         f"{cfg.acc_stages} stage(s) x {num_products(cfg)} fp32 accumulator(s) of {cfg.tile_n} "
                         f"columns + {tm['sf']} for scales) > the {TMEM_COLUMNS} an SM has")
    plan = storage_plan(cfg)
    if plan.total > SMEM_PER_BLOCK_MAX:
        raise ValueError(f"{name}: needs {plan.total} bytes of shared memory ({cfg.ab_stages} stage(s) x "
                         f"{plan.per_stage} B + {plan.total - plan.per_stage * cfg.ab_stages} B) > the sm_100 "
                         f"limit of {SMEM_PER_BLOCK_MAX} bytes per block")
    return cfg


# ---------------------------------------------------------------------------------------------
# Host-side helpers (run on the CPU; tested there)
# ---------------------------------------------------------------------------------------------
def tile_counts(problem_sizes, cfg: KernelConfig) -> dict:
    """Per group (m_tiles, n_tiles, k_tiles) and totals for ``problem_sizes`` [(M, N, K), ...].

    A *cluster tile* is what one cluster computes: (tile_m * cluster_m) x (tile_n * cluster_n);
    the kernel's device-side group search counts in these units, as NVIDIA's scheduler does.
    """
    cm = cfg.tile_m * cfg.cluster_m
    cn = cfg.tile_n * cfg.cluster_n
    groups = []
    for m, n, k in problem_sizes:
        groups.append((-(-m // cm), -(-n // cn), -(-k // cfg.tile_k)))
    clusters = sum(a * b for a, b, _ in groups)
    ctas = clusters * cfg.cluster_m * cfg.cluster_n
    mma_rows = sum(a * cm * (-(-n // cn)) * cn for (a, _, _), (m, n, _) in zip(groups, problem_sizes))
    useful = sum(m * n for m, n, _ in problem_sizes)
    return {"groups": groups, "clusters": clusters, "ctas": ctas,
            "k_tiles": [g[2] for g in groups],
            "wasted_mma_fraction": (1 - useful / mma_rows) if mma_rows else 0.0}


def grid_ctas(cfg: KernelConfig, total_clusters: int, sm_count: int = B200_SMS) -> int:
    """CTAs launched: one per tile for the study's structure, at most one per SM when persistent."""
    per_cluster = cfg.cluster_m * cfg.cluster_n
    if cfg.warp_spec == "none":
        return total_clusters * per_cluster
    return min(total_clusters, sm_count // per_cluster) * per_cluster


def tensormap_workspace_bytes(cfg: KernelConfig, total_clusters: int, sm_count: int = B200_SMS) -> int:
    """Global workspace for the per-CTA TMA descriptors (128 B each) the kernel rewrites per group."""
    return grid_ctas(cfg, total_clusters, sm_count) * num_tensormaps(cfg) * BYTES_PER_TENSORMAP


def shape_tile_table(cfg: KernelConfig, names=("S1", "S2", "S3", "S4"), sm_count: int = B200_SMS) -> list[dict]:
    """For each benchmark shape: CTAs, waves, k-tiles per tile, wasted MMA rows, workspace."""
    from ..problems import get_problem

    rows = []
    for nm in names:
        p = get_problem(nm)
        t = tile_counts(list(zip(p.m, p.n, p.k)), cfg)
        ctas = grid_ctas(cfg, t["clusters"], sm_count)
        rows.append({"shape": nm, "groups": p.groups, "tiles": t["ctas"], "ctas_launched": ctas,
                     "sm_fraction": min(1.0, t["ctas"] / sm_count), "k_tiles_per_tile": max(t["k_tiles"]),
                     "wasted_mma_fraction": round(t["wasted_mma_fraction"], 4),
                     "tensormap_workspace_bytes": tensormap_workspace_bytes(cfg, t["clusters"], sm_count)})
    return rows


def problem_tables(a, b, c, b2=None, *, device=None) -> dict:
    """The device tables the kernel reads: sizes (G, 4) int32 = (M, N, K, 1), addresses (G, 7) int64
    = (A, B, C, SFA, SFB, B2, SFB2) and alphas (G, 2) float32 = (gA*gB, gA*gB2).

    ``a``, ``b``, ``b2`` are per-group dicts/objects with ``data`` (uint8 [rows, K/2]), ``sf``
    (blocked E4M3 scales, 1-D) and ``global_scale``; ``c`` are the fp16 outputs [M, N].
    Addresses are ``data_ptr()`` values, so the tables are only meaningful for tensors that stay
    alive (the runner holds them).
    """
    g_count = len(a)
    sizes = torch.zeros((g_count, 4), dtype=torch.int32)
    addrs = torch.zeros((g_count, NUM_ADDR), dtype=torch.int64)
    alphas = torch.zeros((g_count, 2), dtype=torch.float32)
    for g in range(g_count):
        m, k = a[g]["data"].shape[0], a[g]["data"].shape[1] * 2
        n = b[g]["data"].shape[0]
        sizes[g] = torch.tensor([m, n, k, 1], dtype=torch.int32)
        w2 = b2[g] if b2 is not None else b[g]
        addrs[g] = torch.tensor([a[g]["data"].data_ptr(), b[g]["data"].data_ptr(), c[g].data_ptr(),
                                 a[g]["sf"].data_ptr(), b[g]["sf"].data_ptr(), w2["data"].data_ptr(),
                                 w2["sf"].data_ptr()], dtype=torch.int64)
        ga = float(a[g]["global_scale"])
        alphas[g] = torch.tensor([ga * float(b[g]["global_scale"]), ga * float(w2["global_scale"])])
    if device is not None:
        sizes, addrs, alphas = sizes.to(device), addrs.to(device), alphas.to(device)
    return {"sizes": sizes, "addresses": addrs, "alphas": alphas}


def cutlass_scale_offsets(rows: int, k: int) -> torch.Tensor:
    """Element offsets [rows, k // 16] of each scale in CUTLASS's scale layout for a (rows, k) operand.

    Evaluates ``blockscaled_layout.tile_atom_to_shape_SF`` -- the layout the kernel's TMA descriptors
    are built from -- while tracing (nothing runs on a device), so tests can check it against
    :func:`nvfp4lib.formats.swizzle_scales`.
    """
    found = {}

    @cute.jit
    def probe(r: cutlass.Constexpr, kk: cutlass.Constexpr):
        layout = blockscaled_utils.tile_atom_to_shape_SF((r, kk, 1), SF_VEC)
        # A comprehension is plain Python to the DSL's preprocessor: evaluated while tracing.
        found["offsets"] = [[layout((i, j * SF_VEC, 0)) for j in range(kk // SF_VEC)] for i in range(r)]

    try:
        with _CapturedStderr():
            cute.compile(probe, rows, k)
    except Exception as e:  # no driver to load the (empty) host module: expected, the layout is traced
        if "offsets" not in found:
            raise RuntimeError(f"tracing tile_atom_to_shape_SF({rows}, {k}) failed: {_clean(e)}") from e
    return torch.tensor(found["offsets"], dtype=torch.int64)


# ---------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------
class Sm100NvFp4GroupedGemm:
    """NVFP4 block-scaled grouped GEMM for sm_100a (compiled for sm_100a, not run).

    ``__init__`` takes a validated :class:`KernelConfig`; ``_setup_attributes`` derives the MMA,
    layouts and shared-memory plan (inside the trace); ``__call__`` is the host side (TMA atoms,
    grid, launch); ``kernel_study`` and ``kernel_ws`` are the two device structures.

    While tracing, the kernel records what CuTe computed (``self.facts``: shared-memory struct
    size, tensor-memory column offsets) so that :func:`compile_report` can check them against the
    Python plans :func:`storage_plan` and :func:`tmem_columns`.
    """

    bytes_per_tensormap = BYTES_PER_TENSORMAP
    # B's scale factors are loaded in 128-row tiles (the scale atom's rows). False reproduces the
    # study's round-2 edit (only mma_tiler changed), which the compiler rejects for tile_n=64.
    pad_sfb_tile = True

    def __init__(self, cfg: KernelConfig):
        self.cfg = validate(cfg)
        self.dual = cfg.dual
        self.n_prod = num_products(cfg)
        self.use_2cta_instrs = cfg.use_2cta
        self.cluster_shape_mn = (cfg.cluster_m, cfg.cluster_n)
        self.mma_inst_shape_mn = mma_shape(cfg)[:2]
        self.cta_group = tcgen05.CtaGroup.TWO if cfg.use_2cta else tcgen05.CtaGroup.ONE
        self.num_ab_stage = cfg.ab_stages
        self.num_acc_stage = cfg.acc_stages
        self.num_c_stage = C_STAGES
        self.warp_specialized = cfg.warp_spec != "none"
        self.tma_store = cfg.epilogue == "tma"
        self.threads_per_cta = threads_per_cta(cfg)
        self.epilog_warp_id = (0, 1, 2, 3)
        self.mma_warp_id = 4 if self.warp_specialized else 0
        self.tma_warp_id = 5 if self.warp_specialized else 0
        self.num_tmem_alloc_cols = TMEM_ALLOC_COLUMNS
        self.epi_cols = epilogue_columns(cfg)
        # Tensormap slots in each CTA's workspace row.
        self.num_tensormaps = num_tensormaps(cfg)
        self.tm_a, self.tm_b, self.tm_sfa, self.tm_sfb = 0, 1, 2, 3
        self.tm_b2, self.tm_sfb2 = (4, 5) if self.dual else (1, 3)
        self.tm_c = self.num_tensormaps - 1
        self.epilog_sync_barrier = pipeline.NamedBarrier(barrier_id=1, num_threads=32 * len(self.epilog_warp_id))
        self.tmem_alloc_barrier = pipeline.NamedBarrier(
            barrier_id=2,
            num_threads=32 * (len(self.epilog_warp_id) + 1) if self.warp_specialized else self.threads_per_cta,
        )
        # The MMA warp writes the initial descriptors to shared memory; the TMA warp then edits them.
        self.tensormap_init_barrier = pipeline.NamedBarrier(barrier_id=3, num_threads=64)
        self.a_dtype = cutlass.Float4E2M1FN
        self.b_dtype = cutlass.Float4E2M1FN
        self.sf_dtype = cutlass.Float8E4M3FN
        self.c_dtype = cutlass.Float16
        self.acc_dtype = cutlass.Float32
        self.sf_vec_size = SF_VEC
        self.a_major_mode = tcgen05.OperandMajorMode.K
        self.b_major_mode = tcgen05.OperandMajorMode.K
        self.c_layout = utils.LayoutEnum.ROW_MAJOR
        self.facts: dict = {}

    def __str__(self) -> str:
        # CuTe DSL names the compiled function after str(self): one name per config, or a second
        # config compiled in the same process is looked up under the first one's name.
        c = self.cfg
        return (f"Sm100NvFp4_{c.name}_{'dual' if c.dual else 'single'}_{c.tile_m}x{c.tile_n}x{c.tile_k}"
                f"_s{c.ab_stages}a{c.acc_stages}_{c.epilogue}_{c.warp_spec}_c{c.cluster_m}x{c.cluster_n}"
                f"{'_2cta' if c.use_2cta else ''}")

    # ---- derived attributes (inside the trace) ----------------------------------------------
    def _setup_attributes(self):
        self.mma_inst_shape_mn_sfb = (
            self.mma_inst_shape_mn[0] // (2 if self.use_2cta_instrs else 1),
            _round_up(self.mma_inst_shape_mn[1], 128) if self.pad_sfb_tile else self.mma_inst_shape_mn[1],
        )
        tiled_mma, tiled_mma_sfb = self._make_tiled_mmas()
        self.mma_tiler = (*self.mma_inst_shape_mn, self.cfg.tile_k)
        self.mma_tiler_sfb = (*self.mma_inst_shape_mn_sfb, self.cfg.tile_k)
        atom_thr = cute.size(tiled_mma.thr_id.shape)
        self.cta_tile_shape_mnk = (self.mma_tiler[0] // atom_thr, self.mma_tiler[1], self.mma_tiler[2])
        self.cluster_tile_shape_mnk = tuple(
            x * y for x, y in zip(self.cta_tile_shape_mnk, (*self.cluster_shape_mn, 1)))
        self.cluster_layout_vmnk = cute.tiled_divide(
            cute.make_layout((*self.cluster_shape_mn, 1)), (tiled_mma.thr_id.shape,))
        self.cluster_layout_sfb_vmnk = cute.tiled_divide(
            cute.make_layout((*self.cluster_shape_mn, 1)), (tiled_mma_sfb.thr_id.shape,))
        self.num_mcast_ctas_a = cute.size(self.cluster_layout_vmnk.shape[2])
        self.num_mcast_ctas_b = cute.size(self.cluster_layout_vmnk.shape[1])
        self.is_a_mcast = self.num_mcast_ctas_a > 1
        self.is_b_mcast = self.num_mcast_ctas_b > 1
        if self.tma_store:
            self.epi_tile = sm100_utils.compute_epilogue_tile_shape(
                self.cta_tile_shape_mnk, self.use_2cta_instrs, self.c_layout, self.c_dtype)
        else:
            self.epi_tile = (self.cta_tile_shape_mnk[0], self.epi_cols)
        stages = self.num_ab_stage
        self.a_smem_layout_staged = sm100_utils.make_smem_layout_a(tiled_mma, self.mma_tiler, self.a_dtype, stages)
        self.b_smem_layout_staged = sm100_utils.make_smem_layout_b(tiled_mma, self.mma_tiler, self.b_dtype, stages)
        self.sfa_smem_layout_staged = blockscaled_utils.make_smem_layout_sfa(
            tiled_mma, self.mma_tiler, self.sf_vec_size, stages)
        self.sfb_smem_layout_staged = blockscaled_utils.make_smem_layout_sfb(
            tiled_mma, self.mma_tiler, self.sf_vec_size, stages)
        self.c_smem_layout_staged = None
        if self.tma_store:
            self.c_smem_layout_staged = sm100_utils.make_smem_layout_epi(
                self.c_dtype, self.c_layout, self.epi_tile, self.num_c_stage)
        return tiled_mma, tiled_mma_sfb

    def _make_tiled_mmas(self):
        tiled_mma = sm100_utils.make_blockscaled_trivial_tiled_mma(
            self.a_dtype, self.a_major_mode, self.b_major_mode, self.sf_dtype, self.sf_vec_size,
            self.cta_group, self.mma_inst_shape_mn)
        # The scale-factor tile of B is loaded for 128-row (rounded) N tiles, one CTA at a time.
        tiled_mma_sfb = sm100_utils.make_blockscaled_trivial_tiled_mma(
            self.a_dtype, self.a_major_mode, self.b_major_mode, self.sf_dtype, self.sf_vec_size,
            tcgen05.CtaGroup.ONE, self.mma_inst_shape_mn_sfb)
        return tiled_mma, tiled_mma_sfb

    def _make_shared_storage(self):
        """One struct: descriptors, barriers, TMEM address, epilogue buffer, then the operand stages."""
        n_tmap_i64 = self.num_tensormaps * self.bytes_per_tensormap // 8
        ab, acc = self.num_ab_stage, self.num_acc_stage
        align = _ALIGN
        fields = {
            "tensormap_buffer": cute.struct.MemRange[cutlass.Int64, n_tmap_i64],
            "ab_full_mbar_ptr": cute.struct.MemRange[cutlass.Int64, ab],
            "ab_empty_mbar_ptr": cute.struct.MemRange[cutlass.Int64, ab],
            "acc_full_mbar_ptr": cute.struct.MemRange[cutlass.Int64, acc],
            "acc_empty_mbar_ptr": cute.struct.MemRange[cutlass.Int64, acc],
            "tmem_dealloc_mbar_ptr": cutlass.Int64,
            "tmem_holding_buf": cutlass.Int32,
        }
        if self.tma_store:
            fields["sC"] = cute.struct.Align[cute.struct.MemRange[
                self.c_dtype, cute.cosize(self.c_smem_layout_staged.outer)], align]
        fields["sA"] = cute.struct.Align[cute.struct.MemRange[
            self.a_dtype, cute.cosize(self.a_smem_layout_staged.outer)], align]
        fields["sB"] = cute.struct.Align[cute.struct.MemRange[
            self.b_dtype, cute.cosize(self.b_smem_layout_staged.outer)], align]
        fields["sSFA"] = cute.struct.Align[cute.struct.MemRange[
            self.sf_dtype, cute.cosize(self.sfa_smem_layout_staged)], align]
        fields["sSFB"] = cute.struct.Align[cute.struct.MemRange[
            self.sf_dtype, cute.cosize(self.sfb_smem_layout_staged)], align]
        if self.dual:
            fields["sB2"] = cute.struct.Align[cute.struct.MemRange[
                self.b_dtype, cute.cosize(self.b_smem_layout_staged.outer)], align]
            fields["sSFB2"] = cute.struct.Align[cute.struct.MemRange[
                self.sf_dtype, cute.cosize(self.sfb_smem_layout_staged)], align]
        storage = cute.struct(type("SharedStorage", (), {"__annotations__": fields}))
        self.facts["smem_struct_bytes"] = storage.size_in_bytes()
        return storage

    # ---- host side ----------------------------------------------------------------------------
    @cute.jit
    def __call__(
        self,
        ptr_a: cute.Pointer,
        ptr_b: cute.Pointer,
        ptr_c: cute.Pointer,
        ptr_sfa: cute.Pointer,
        ptr_sfb: cute.Pointer,
        init_m: cutlass.Int32,
        init_n: cutlass.Int32,
        init_k: cutlass.Int32,
        ptr_sizes: cute.Pointer,
        ptr_addresses: cute.Pointer,
        ptr_alphas: cute.Pointer,
        ptr_tensormaps: cute.Pointer,
        tensormap_slots: cutlass.Int32,
        total_clusters: cutlass.Int32,
        group_count: cutlass.Constexpr[int],
        max_active_clusters: cutlass.Constexpr[int],
        stream: cuda.CUstream,
    ):
        """Build the TMA atoms from one group's operands (the device re-points them per group),
        wrap the device tables, and launch one grid for all groups."""
        tiled_mma, tiled_mma_sfb = self._setup_attributes()
        # Operands of the group the host descriptors are made from (K-major A/B, row-major C).
        k32 = cute.assume(init_k, divby=32)
        n8 = cute.assume(init_n, divby=8)
        a = cute.make_tensor(ptr_a, cute.make_layout((init_m, k32, 1), stride=(k32, 1, init_m * k32)))
        b = cute.make_tensor(ptr_b, cute.make_layout((init_n, k32, 1), stride=(k32, 1, init_n * k32)))
        c = cute.make_tensor(ptr_c, cute.make_layout((init_m, n8, 1), stride=(n8, 1, init_m * n8)))
        sfa = cute.make_tensor(ptr_sfa, blockscaled_utils.tile_atom_to_shape_SF(a.shape, self.sf_vec_size))
        sfb = cute.make_tensor(ptr_sfb, blockscaled_utils.tile_atom_to_shape_SF(b.shape, self.sf_vec_size))
        sizes = cute.make_tensor(ptr_sizes, cute.make_layout((group_count, 4), stride=(4, 1)))
        addresses = cute.make_tensor(ptr_addresses, cute.make_layout((group_count, NUM_ADDR), stride=(NUM_ADDR, 1)))
        alphas = cute.make_tensor(ptr_alphas, cute.make_layout((group_count, 2), stride=(2, 1)))
        tensormaps = cute.make_tensor(
            ptr_tensormaps,
            cute.make_layout((tensormap_slots, self.num_tensormaps, self.bytes_per_tensormap // 8),
                             stride=(self.num_tensormaps * self.bytes_per_tensormap // 8,
                                     self.bytes_per_tensormap // 8, 1)))

        atom_thr_size = cute.size(tiled_mma.thr_id.shape)
        cluster_shape = self.cluster_layout_vmnk.shape
        a_smem_layout = cute.slice_(self.a_smem_layout_staged, (None, None, None, 0))
        b_smem_layout = cute.slice_(self.b_smem_layout_staged, (None, None, None, 0))
        sfa_smem_layout = cute.slice_(self.sfa_smem_layout_staged, (None, None, None, 0))
        sfb_smem_layout = cute.slice_(self.sfb_smem_layout_staged, (None, None, None, 0))
        a_op = sm100_utils.cluster_shape_to_tma_atom_A(self.cluster_shape_mn, tiled_mma.thr_id)
        b_op = sm100_utils.cluster_shape_to_tma_atom_B(self.cluster_shape_mn, tiled_mma.thr_id)
        sfb_op = sm100_utils.cluster_shape_to_tma_atom_SFB(self.cluster_shape_mn, tiled_mma.thr_id)
        tma_atom_a, tma_tensor_a = cute.nvgpu.make_tiled_tma_atom_A(
            a_op, a, a_smem_layout, self.mma_tiler, tiled_mma, cluster_shape)
        tma_atom_b, tma_tensor_b = cute.nvgpu.make_tiled_tma_atom_B(
            b_op, b, b_smem_layout, self.mma_tiler, tiled_mma, cluster_shape)
        tma_atom_sfa, tma_tensor_sfa = cute.nvgpu.make_tiled_tma_atom_A(
            a_op, sfa, sfa_smem_layout, self.mma_tiler, tiled_mma, cluster_shape, internal_type=cutlass.Int16)
        tma_atom_sfb, tma_tensor_sfb = cute.nvgpu.make_tiled_tma_atom_B(
            sfb_op, sfb, sfb_smem_layout, self.mma_tiler_sfb, tiled_mma_sfb,
            self.cluster_layout_sfb_vmnk.shape, internal_type=cutlass.Int16)
        # The up projection's descriptors start as copies of B's; the device points them at B2.
        tma_atom_b2, tma_atom_sfb2 = tma_atom_b, tma_atom_sfb
        if cutlass.const_expr(self.dual):
            tma_atom_b2, _ = cute.nvgpu.make_tiled_tma_atom_B(
                b_op, b, b_smem_layout, self.mma_tiler, tiled_mma, cluster_shape)
            tma_atom_sfb2, _ = cute.nvgpu.make_tiled_tma_atom_B(
                sfb_op, sfb, sfb_smem_layout, self.mma_tiler_sfb, tiled_mma_sfb,
                self.cluster_layout_sfb_vmnk.shape, internal_type=cutlass.Int16)
        per_b = cute.size_in_bytes(self.b_dtype, b_smem_layout) + cute.size_in_bytes(self.sf_dtype, sfb_smem_layout)
        self.num_tma_load_bytes = (
            cute.size_in_bytes(self.a_dtype, a_smem_layout) + cute.size_in_bytes(self.sf_dtype, sfa_smem_layout)
            + self.n_prod * per_b) * atom_thr_size
        self.facts["tma_bytes_per_stage"] = self.num_tma_load_bytes

        tma_atom_c, tma_tensor_c = tma_atom_a, c
        if cutlass.const_expr(self.tma_store):
            epi_smem_layout = cute.slice_(self.c_smem_layout_staged, (None, None, 0))
            tma_atom_c, tma_tensor_c = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileS2GOp(), c, epi_smem_layout, self.epi_tile)

        tile_sched_params = utils.PersistentTileSchedulerParams(
            (*self.cluster_shape_mn, total_clusters), (*self.cluster_shape_mn, 1))
        if cutlass.const_expr(self.warp_specialized):
            grid = utils.StaticPersistentTileScheduler.get_grid_shape(tile_sched_params, max_active_clusters)
        else:
            grid = (1, 1, total_clusters)

        self.shared_storage = self._make_shared_storage()
        kernel = self.kernel_ws if cutlass.const_expr(self.warp_specialized) else self.kernel_study
        kernel(
            tiled_mma, tiled_mma_sfb,
            tma_atom_a, tma_tensor_a, tma_atom_b, tma_tensor_b,
            tma_atom_sfa, tma_tensor_sfa, tma_atom_sfb, tma_tensor_sfb,
            tma_atom_b2, tma_atom_sfb2, tma_atom_c, tma_tensor_c,
            self.cluster_layout_vmnk, self.cluster_layout_sfb_vmnk,
            self.a_smem_layout_staged, self.b_smem_layout_staged,
            self.sfa_smem_layout_staged, self.sfb_smem_layout_staged,
            self.c_smem_layout_staged if self.tma_store else self.sfa_smem_layout_staged,
            tile_sched_params, group_count, sizes, addresses, alphas, tensormaps,
        ).launch(
            grid=grid,
            block=[self.threads_per_cta, 1, 1],
            cluster=(*self.cluster_shape_mn, 1),
            smem=self.shared_storage.size_in_bytes(),
            stream=stream,
            min_blocks_per_mp=1,
        )
        return

    # ---- device-side helpers --------------------------------------------------------------------
    @cute.jit
    def _group_operands(self, group_idx: cutlass.Int32, m: cutlass.Int32, n: cutlass.Int32, k: cutlass.Int32,
                        addresses: cute.Tensor):
        """The real A, B, SFA, SFB (B2, SFB2) global tensors of one group, for descriptor updates."""
        c1 = cutlass.Int32(1)
        c0 = cutlass.Int32(0)

        def gmem(dtype, col):
            return cute.make_ptr(dtype, addresses[(group_idx, col)], cute.AddressSpace.gmem, assumed_align=16)

        a = cute.make_tensor(gmem(self.a_dtype, ADDR_A), cute.make_layout((m, k, c1), stride=(k, c1, c0)))
        b = cute.make_tensor(gmem(self.b_dtype, ADDR_B), cute.make_layout((n, k, c1), stride=(k, c1, c0)))
        sfa = cute.make_tensor(gmem(self.sf_dtype, ADDR_SFA),
                               blockscaled_utils.tile_atom_to_shape_SF((m, k, c1), self.sf_vec_size))
        sfb = cute.make_tensor(gmem(self.sf_dtype, ADDR_SFB),
                               blockscaled_utils.tile_atom_to_shape_SF((n, k, c1), self.sf_vec_size))
        b2 = cute.make_tensor(gmem(self.b_dtype, ADDR_B2), cute.make_layout((n, k, c1), stride=(k, c1, c0)))
        sfb2 = cute.make_tensor(gmem(self.sf_dtype, ADDR_SFB2),
                                blockscaled_utils.tile_atom_to_shape_SF((n, k, c1), self.sf_vec_size))
        return a, b, sfa, sfb, b2, sfb2

    @cute.jit
    def _group_output(self, group_idx: cutlass.Int32, m: cutlass.Int32, n: cutlass.Int32, addresses: cute.Tensor):
        c1 = cutlass.Int32(1)
        c0 = cutlass.Int32(0)
        ptr = cute.make_ptr(self.c_dtype, addresses[(group_idx, ADDR_C)], cute.AddressSpace.gmem, assumed_align=16)
        return cute.make_tensor(ptr, cute.make_layout((m, n, c1), stride=(n, c1, c0)))

    def _load_descriptors(self, tensormap_manager, atoms, smem_ptrs, warp_id):
        for atom, ptr in zip(atoms, smem_ptrs):
            tensormap_manager.init_tensormap_from_atom(atom, ptr, warp_id)

    def _s2t_copy_and_partition(self, sSF: cute.Tensor, tSF: cute.Tensor):
        """tcgen05.cp of one k-tile of scale factors from shared to tensor memory."""
        tCsSF_compact = cute.filter_zeros(sSF)
        tCtSF_compact = cute.filter_zeros(tSF)
        copy_atom_s2t = cute.make_copy_atom(tcgen05.Cp4x32x128bOp(self.cta_group), self.sf_dtype)
        tiled_copy_s2t = tcgen05.make_s2t_copy(copy_atom_s2t, tCtSF_compact)
        thr_copy_s2t = tiled_copy_s2t.get_slice(0)
        tCsSF_compact_s2t_ = thr_copy_s2t.partition_S(tCsSF_compact)
        tCsSF_compact_s2t = tcgen05.get_s2t_smem_desc_tensor(tiled_copy_s2t, tCsSF_compact_s2t_)
        tCtSF_compact_s2t = thr_copy_s2t.partition_D(tCtSF_compact)
        return tiled_copy_s2t, tCsSF_compact_s2t, tCtSF_compact_s2t

    def _tmem_tensors(self, tiled_mma, acc_tmem_ptr, tCtAcc_fake, sfa_smem_layout_staged, sfb_smem_layout_staged):
        """Accumulators (all stages and products), then SFA, SFB (and SFB2) columns of one k-tile."""
        tCtAcc_base = cute.make_tensor(acc_tmem_ptr, tCtAcc_fake.layout)
        acc_cols = tcgen05.find_tmem_tensor_col_offset(tCtAcc_base)
        tCtSFA_layout = blockscaled_utils.make_tmem_layout_sfa(
            tiled_mma, self.mma_tiler, self.sf_vec_size, cute.slice_(sfa_smem_layout_staged, (None, None, None, 0)))
        tCtSFA = cute.make_tensor(cute.recast_ptr(acc_tmem_ptr + acc_cols, dtype=self.sf_dtype), tCtSFA_layout)
        sfa_cols = tcgen05.find_tmem_tensor_col_offset(tCtSFA)
        tCtSFB_layout = blockscaled_utils.make_tmem_layout_sfb(
            tiled_mma, self.mma_tiler, self.sf_vec_size, cute.slice_(sfb_smem_layout_staged, (None, None, None, 0)))
        sfb_col0 = acc_cols + sfa_cols
        tCtSFB = cute.make_tensor(cute.recast_ptr(acc_tmem_ptr + sfb_col0, dtype=self.sf_dtype), tCtSFB_layout)
        sfb_cols = tcgen05.find_tmem_tensor_col_offset(tCtSFB)
        sfb2_col0 = sfb_col0 + sfb_cols
        tCtSFB2 = cute.make_tensor(cute.recast_ptr(acc_tmem_ptr + sfb2_col0, dtype=self.sf_dtype), tCtSFB_layout)
        self.facts["tmem_acc_cols"] = acc_cols
        self.facts["tmem_sf_cols"] = sfa_cols + self.n_prod * sfb_cols
        return tCtAcc_base, tCtSFA, (tCtSFB, tCtSFB2), (sfb_col0, sfb2_col0), tCtSFB_layout

    def _sfb_for_tile(self, acc_tmem_ptr, sfb_col0, tCtSFB, tCtSFB_layout, n_tile_idx):
        """With tile_n=64 a 128-row scale tile serves two N tiles: odd tiles start 2 columns in."""
        if cutlass.const_expr(self.cta_tile_shape_mnk[1] == 64 and self.pad_sfb_tile):
            offset = cutlass.Int32((n_tile_idx % 2) * 2)
            return cute.make_tensor(
                cute.recast_ptr(acc_tmem_ptr + sfb_col0 + offset, dtype=self.sf_dtype), tCtSFB_layout)
        return tCtSFB

    def _sfb_n_slice(self, n_tile_idx):
        if cutlass.const_expr(self.cta_tile_shape_mnk[1] == 64 and self.pad_sfb_tile):
            return n_tile_idx // 2
        return n_tile_idx

    def _epilog_t2r(self, tidx, tCtAcc_base, tCgC_or_coord, epi_tile):
        """tcgen05.ld partition of the accumulators: (T2R, T2R_M, T2R_N, EPI_M, EPI_N, STAGE*PRODUCT)."""
        copy_atom_t2r = sm100_utils.get_tmem_load_op(
            self.cta_tile_shape_mnk, self.c_layout, self.c_dtype, self.acc_dtype, epi_tile, self.use_2cta_instrs)
        tAcc_epi = cute.flat_divide(tCtAcc_base[((None, None), 0, 0, None)], epi_tile)
        tiled_copy_t2r = tcgen05.make_tmem_copy(copy_atom_t2r, tAcc_epi[(None, None, 0, 0, 0)])
        thr_copy_t2r = tiled_copy_t2r.get_slice(tidx)
        tTR_tAcc = thr_copy_t2r.partition_S(tAcc_epi)
        gC_epi = cute.flat_divide(tCgC_or_coord[((None, None), 0, 0, None, None, None)], epi_tile)
        tTR_gC = thr_copy_t2r.partition_D(gC_epi)
        tTR_rAcc = cute.make_rmem_tensor(tTR_gC[(None, None, None, 0, 0, 0, 0, 0)].shape, self.acc_dtype)
        return tiled_copy_t2r, thr_copy_t2r, tTR_tAcc, tTR_rAcc

    def _epilogue_values(self, acc_vecs, alpha1, alpha2):
        """fp32 epilogue math: alpha * acc, or silu(alpha1 * acc1) * (alpha2 * acc2)."""
        if cutlass.const_expr(self.dual):
            gate = acc_vecs[0] * alpha1
            up = acc_vecs[1] * alpha2
            return gate * up / (cute.math.exp(-gate, fastmath=True) + 1.0)
        return acc_vecs[0] * alpha1

    # ---- device: the study's structure ----------------------------------------------------------
    @cute.kernel
    def kernel_study(
        self,
        tiled_mma: cute.TiledMma,
        tiled_mma_sfb: cute.TiledMma,
        tma_atom_a: cute.CopyAtom,
        mA_mkl: cute.Tensor,
        tma_atom_b: cute.CopyAtom,
        mB_nkl: cute.Tensor,
        tma_atom_sfa: cute.CopyAtom,
        mSFA_mkl: cute.Tensor,
        tma_atom_sfb: cute.CopyAtom,
        mSFB_nkl: cute.Tensor,
        tma_atom_b2: cute.CopyAtom,
        tma_atom_sfb2: cute.CopyAtom,
        tma_atom_c: cute.CopyAtom,
        mC_mnl: cute.Tensor,
        cluster_layout_vmnk: cute.Layout,
        cluster_layout_sfb_vmnk: cute.Layout,
        a_smem_layout_staged: cute.ComposedLayout,
        b_smem_layout_staged: cute.ComposedLayout,
        sfa_smem_layout_staged: cute.Layout,
        sfb_smem_layout_staged: cute.Layout,
        c_smem_layout_staged: cute.Layout,
        tile_sched_params: utils.PersistentTileSchedulerParams,
        group_count: cutlass.Constexpr,
        problem_sizes: cute.Tensor,
        addresses: cute.Tensor,
        alphas: cute.Tensor,
        tensormaps: cute.Tensor,
    ):
        """One CTA per output tile, 128 threads; warp 0 rewrites descriptors, loads and multiplies;
        all four warps run the SIMT epilogue (the study's kernel)."""
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        bidx, bidy, bidz = cute.arch.block_idx()

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        tmap_smem = storage.tensormap_buffer.data_ptr()
        tmap_i64 = self.bytes_per_tensormap // 8

        ab_pipeline = pipeline.PipelineTmaUmma.create(
            barrier_storage=storage.ab_full_mbar_ptr.data_ptr(),
            num_stages=self.num_ab_stage,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1),
            tx_count=self.num_tma_load_bytes,
            cta_layout_vmnk=cluster_layout_vmnk,
            defer_sync=True,
        )
        acc_pipeline = pipeline.PipelineUmmaAsync.create(
            barrier_storage=storage.acc_full_mbar_ptr.data_ptr(),
            num_stages=self.num_acc_stage,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, len(self.epilog_warp_id)),
            cta_layout_vmnk=cluster_layout_vmnk,
            defer_sync=True,
        )
        tmem = utils.TmemAllocator(
            storage.tmem_holding_buf, barrier_for_retrieve=self.tmem_alloc_barrier, allocator_warp_id=0)
        pipeline_init_arrive(cluster_shape_mn=self.cluster_shape_mn, is_relaxed=True)

        sA = storage.sA.get_tensor(a_smem_layout_staged.outer, swizzle=a_smem_layout_staged.inner)
        sB = storage.sB.get_tensor(b_smem_layout_staged.outer, swizzle=b_smem_layout_staged.inner)
        sSFA = storage.sSFA.get_tensor(sfa_smem_layout_staged)
        sSFB = storage.sSFB.get_tensor(sfb_smem_layout_staged)
        sB2, sSFB2 = sB, sSFB
        if cutlass.const_expr(self.dual):
            sB2 = storage.sB2.get_tensor(b_smem_layout_staged.outer, swizzle=b_smem_layout_staged.inner)
            sSFB2 = storage.sSFB2.get_tensor(sfb_smem_layout_staged)

        # (bM, bK, RestM, RestK, RestL) etc. over the coordinate tensors of the TMA atoms
        gA_mkl = cute.local_tile(mA_mkl, cute.slice_(self.mma_tiler, (None, 0, None)), (None, None, None))
        gB_nkl = cute.local_tile(mB_nkl, cute.slice_(self.mma_tiler, (0, None, None)), (None, None, None))
        gSFA_mkl = cute.local_tile(mSFA_mkl, cute.slice_(self.mma_tiler, (None, 0, None)), (None, None, None))
        gSFB_nkl = cute.local_tile(mSFB_nkl, cute.slice_(self.mma_tiler_sfb, (0, None, None)), (None, None, None))
        thr_mma = tiled_mma.get_slice(0)
        thr_mma_sfb = tiled_mma_sfb.get_slice(0)
        tCgA = thr_mma.partition_A(gA_mkl)
        tCgB = thr_mma.partition_B(gB_nkl)
        tCgSFA = thr_mma.partition_A(gSFA_mkl)
        tCgSFB = thr_mma_sfb.partition_B(gSFB_nkl)

        one = cute.make_layout(1)
        tAsA, tAgA = cpasync.tma_partition(tma_atom_a, 0, one, cute.group_modes(sA, 0, 3), cute.group_modes(tCgA, 0, 3))
        tBsB, tBgB = cpasync.tma_partition(tma_atom_b, 0, one, cute.group_modes(sB, 0, 3), cute.group_modes(tCgB, 0, 3))
        tBsB2, tBgB2 = cpasync.tma_partition(tma_atom_b2, 0, one, cute.group_modes(sB2, 0, 3),
                                             cute.group_modes(tCgB, 0, 3))
        tAsSFA, tAgSFA = cpasync.tma_partition(tma_atom_sfa, 0, one, cute.group_modes(sSFA, 0, 3),
                                               cute.group_modes(tCgSFA, 0, 3))
        tAsSFA = cute.filter_zeros(tAsSFA)
        tAgSFA = cute.filter_zeros(tAgSFA)
        tBsSFB, tBgSFB = cpasync.tma_partition(tma_atom_sfb, 0, one, cute.group_modes(sSFB, 0, 3),
                                               cute.group_modes(tCgSFB, 0, 3))
        tBsSFB = cute.filter_zeros(tBsSFB)
        tBgSFB = cute.filter_zeros(tBgSFB)
        tBsSFB2, tBgSFB2 = cpasync.tma_partition(tma_atom_sfb2, 0, one, cute.group_modes(sSFB2, 0, 3),
                                                 cute.group_modes(tCgSFB, 0, 3))
        tBsSFB2 = cute.filter_zeros(tBsSFB2)
        tBgSFB2 = cute.filter_zeros(tBgSFB2)

        tCrA = tiled_mma.make_fragment_A(sA)
        tCrB = tiled_mma.make_fragment_B(sB)
        tCrB2 = tiled_mma.make_fragment_B(sB2)
        acc_shape = tiled_mma.partition_shape_C(self.mma_tiler[:2])
        tCtAcc_fake = tiled_mma.make_fragment_C(cute.append(acc_shape, self.num_acc_stage * self.n_prod))

        pipeline_init_wait(cluster_shape_mn=self.cluster_shape_mn)

        # This CTA's tile: find its group from the device table of problem sizes.
        group_helper = utils.GroupedGemmTileSchedulerHelper(
            group_count, tile_sched_params, self.cluster_tile_shape_mnk, utils.create_initial_search_state())
        tile_info = group_helper.delinearize_z((bidx, bidy, bidz), problem_sizes)
        group_idx = tile_info.group_idx
        m = tile_info.problem_shape_m
        n = tile_info.problem_shape_n
        k = tile_info.problem_shape_k
        k_tile_cnt = tile_info.cta_tile_count_k
        mma_tile_m = tile_info.cta_tile_idx_m
        mma_tile_n = tile_info.cta_tile_idx_n

        tensormap_manager = utils.TensorMapManager(utils.TensorMapUpdateMode.SMEM, self.bytes_per_tensormap)
        tmap_gmem = [tensormap_manager.get_tensormap_ptr(tensormaps[(bidz, i, None)].iterator)
                     for i in range(self.num_tensormaps)]
        tmap_smem_ptrs = [tmap_smem + i * tmap_i64 for i in range(self.num_tensormaps)]
        load_atoms = [tma_atom_a, tma_atom_b, tma_atom_sfa, tma_atom_sfb]
        slots = [self.tm_a, self.tm_b, self.tm_sfa, self.tm_sfb]
        if cutlass.const_expr(self.dual):
            load_atoms += [tma_atom_b2, tma_atom_sfb2]
            slots += [self.tm_b2, self.tm_sfb2]

        if warp_idx == 0:
            # Point this CTA's descriptors at its group (in shared memory), publish them to its slot.
            self._load_descriptors(tensormap_manager, load_atoms, [tmap_smem_ptrs[s] for s in slots], 0)
            ga, gb, gsfa, gsfb, gb2, gsfb2 = self._group_operands(group_idx, m, n, k, addresses)
            tensors = [ga, gb, gsfa, gsfb]
            if cutlass.const_expr(self.dual):
                tensors += [gb2, gsfb2]
            tensormap_manager.update_tensormap(
                tuple(tensors), tuple(load_atoms), tuple(tmap_gmem[s] for s in slots), 0,
                tuple(tmap_smem_ptrs[s] for s in slots))
            for s in slots:
                tensormap_manager.fence_tensormap_update(tmap_gmem[s])

        tmem.allocate(self.num_tmem_alloc_cols)
        tmem.wait_for_alloc()
        acc_tmem_ptr = tmem.retrieve_ptr(self.acc_dtype)
        tCtAcc_base, tCtSFA, (tCtSFB, tCtSFB2), (sfb_col0, sfb2_col0), tCtSFB_layout = self._tmem_tensors(
            tiled_mma, acc_tmem_ptr, tCtAcc_fake, sfa_smem_layout_staged, sfb_smem_layout_staged)

        if warp_idx == 0:
            tiled_copy_s2t_sfa, tCsSFA_s2t, tCtSFA_s2t = self._s2t_copy_and_partition(sSFA, tCtSFA)
            tiled_copy_s2t_sfb, tCsSFB_s2t, tCtSFB_s2t = self._s2t_copy_and_partition(sSFB, tCtSFB)
            tiled_copy_s2t_sfb2, tCsSFB2_s2t, tCtSFB2_s2t = self._s2t_copy_and_partition(sSFB2, tCtSFB2)
            tCtSFB_mma = self._sfb_for_tile(acc_tmem_ptr, sfb_col0, tCtSFB, tCtSFB_layout, mma_tile_n)
            tCtSFB2_mma = self._sfb_for_tile(acc_tmem_ptr, sfb2_col0, tCtSFB2, tCtSFB_layout, mma_tile_n)

            sfb_n = self._sfb_n_slice(mma_tile_n)
            tAgA_slice = tAgA[(None, mma_tile_m, None, 0)]
            tBgB_slice = tBgB[(None, mma_tile_n, None, 0)]
            tBgB2_slice = tBgB2[(None, mma_tile_n, None, 0)]
            tAgSFA_slice = tAgSFA[(None, mma_tile_m, None, 0)]
            tBgSFB_slice = tBgSFB[(None, sfb_n, None, 0)]
            tBgSFB2_slice = tBgSFB2[(None, sfb_n, None, 0)]

            desc = [tensormap_manager.get_tensormap_ptr(t, cute.AddressSpace.generic) for t in tmap_gmem]
            ab_producer_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_ab_stage)
            ab_consumer_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_ab_stage)
            acc_producer_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_acc_stage)
            acc_pipeline.producer_acquire(acc_producer_state)
            tiled_mma.set(tcgen05.Field.ACCUMULATE, False)

            for _k_tile in cutlass.range(0, k_tile_cnt, 1, unroll=1):
                # Load k-tile: wait until its buffer is free (its previous MMAs are done) ...
                ab_pipeline.producer_acquire(ab_producer_state)
                bar = ab_pipeline.producer_get_barrier(ab_producer_state)
                kc = ab_producer_state.count
                ks = ab_producer_state.index
                cute.copy(tma_atom_a, tAgA_slice[(None, kc)], tAsA[(None, ks)],
                          tma_bar_ptr=bar, tma_desc_ptr=desc[self.tm_a])
                cute.copy(tma_atom_b, tBgB_slice[(None, kc)], tBsB[(None, ks)],
                          tma_bar_ptr=bar, tma_desc_ptr=desc[self.tm_b])
                cute.copy(tma_atom_sfa, tAgSFA_slice[(None, kc)], tAsSFA[(None, ks)],
                          tma_bar_ptr=bar, tma_desc_ptr=desc[self.tm_sfa])
                cute.copy(tma_atom_sfb, tBgSFB_slice[(None, kc)], tBsSFB[(None, ks)],
                          tma_bar_ptr=bar, tma_desc_ptr=desc[self.tm_sfb])
                if cutlass.const_expr(self.dual):
                    cute.copy(tma_atom_b2, tBgB2_slice[(None, kc)], tBsB2[(None, ks)],
                              tma_bar_ptr=bar, tma_desc_ptr=desc[self.tm_b2])
                    cute.copy(tma_atom_sfb2, tBgSFB2_slice[(None, kc)], tBsSFB2[(None, ks)],
                              tma_bar_ptr=bar, tma_desc_ptr=desc[self.tm_sfb2])
                ab_producer_state.advance()

                # ... then wait for it to land and multiply (the same warp: nothing else overlaps).
                ab_pipeline.consumer_wait(ab_consumer_state)
                cs = ab_consumer_state.index
                cute.copy(tiled_copy_s2t_sfa, tCsSFA_s2t[(None, None, None, None, cs)], tCtSFA_s2t)
                cute.copy(tiled_copy_s2t_sfb, tCsSFB_s2t[(None, None, None, None, cs)], tCtSFB_s2t)
                if cutlass.const_expr(self.dual):
                    cute.copy(tiled_copy_s2t_sfb2, tCsSFB2_s2t[(None, None, None, None, cs)], tCtSFB2_s2t)
                num_kblocks = cute.size(tCrA, mode=[2])
                for kblock_idx in cutlass.range(num_kblocks, unroll_full=True):
                    kblock_coord = (None, None, kblock_idx, cs)
                    tiled_mma.set(tcgen05.Field.SFA, tCtSFA[(None, None, kblock_idx)].iterator)
                    tiled_mma.set(tcgen05.Field.SFB, tCtSFB_mma[(None, None, kblock_idx)].iterator)
                    tCtAcc = tCtAcc_base[(None, None, None, 0)]
                    cute.gemm(tiled_mma, tCtAcc, tCrA[kblock_coord], tCrB[kblock_coord], tCtAcc)
                    if cutlass.const_expr(self.dual):
                        tiled_mma.set(tcgen05.Field.SFB, tCtSFB2_mma[(None, None, kblock_idx)].iterator)
                        tCtAcc2 = tCtAcc_base[(None, None, None, 1)]
                        cute.gemm(tiled_mma, tCtAcc2, tCrA[kblock_coord], tCrB2[kblock_coord], tCtAcc2)
                    tiled_mma.set(tcgen05.Field.ACCUMULATE, True)
                ab_pipeline.consumer_release(ab_consumer_state)
                ab_consumer_state.advance()

            acc_pipeline.producer_commit(acc_producer_state)
            ab_pipeline.producer_tail(ab_producer_state)

        # SIMT epilogue, all four warps: thread t owns accumulator row t (tensor-memory lane t).
        mC = self._group_output(group_idx, m, n, addresses)
        gC_mnl = cute.local_tile(mC, cute.slice_(self.mma_tiler, (None, None, 0)), (None, None, None))
        tCgC = thr_mma.partition_C(gC_mnl)
        # Coordinates inside one MMA tile (static), offset by the tile's origin below.
        tCcC = thr_mma.partition_C(cute.make_identity_tensor(cute.slice_(self.mma_tiler, (None, None, 0))))
        acc_consumer_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_acc_stage)
        self._simt_epilogue(tidx, tCtAcc_base, tCgC, tCcC, acc_pipeline, acc_consumer_state,
                            (mma_tile_m, mma_tile_n, 0), m, n, alphas[(group_idx, 0)], alphas[(group_idx, 1)])

        tmem.relinquish_alloc_permit()
        self.epilog_sync_barrier.arrive_and_wait()
        tmem.free(acc_tmem_ptr)

    @cute.jit
    def _simt_epilogue(self, tidx: cutlass.Int32, tCtAcc_base: cute.Tensor, tCgC: cute.Tensor, tCcC: cute.Tensor,
                       acc_pipeline, acc_consumer_state, mma_tile_coord_mnl,
                       m: cutlass.Int32, n: cutlass.Int32, alpha1: cutlass.Float32, alpha2: cutlass.Float32):
        """tcgen05.ld a slice of the accumulator row(s), scale (and SiLU·up) in fp32, round to fp16,
        store the row slice to global memory if it lies inside C."""
        epi_tile = self.epi_tile
        tiled_copy_t2r, thr_copy_t2r, tTR_tAcc_base, tTR_rAcc = self._epilog_t2r(tidx, tCtAcc_base, tCgC, epi_tile)
        tTR_rAcc2 = cute.make_rmem_tensor(tTR_rAcc.shape, self.acc_dtype)
        tTR_rC = cute.make_rmem_tensor(tTR_rAcc.shape, self.c_dtype)
        simt_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.c_dtype)
        gC_epi = cute.flat_divide(tCgC[((None, None), 0, 0, None, None, None)], epi_tile)
        cC_epi = cute.flat_divide(tCcC[((None, None), 0, 0)], epi_tile)
        tTR_gC = thr_copy_t2r.partition_D(gC_epi)[(None, None, None, None, None, *mma_tile_coord_mnl)]
        tTR_cC = thr_copy_t2r.partition_D(cC_epi)
        tTR_gC = cute.group_modes(tTR_gC, 3, cute.rank(tTR_gC))
        tTR_cC = cute.group_modes(tTR_cC, 3, cute.rank(tTR_cC))

        stage = acc_consumer_state.index
        tTR_tAcc = tTR_tAcc_base[(None, None, None, None, None, stage * self.n_prod)]
        tTR_tAcc = cute.group_modes(tTR_tAcc, 3, cute.rank(tTR_tAcc))
        tTR_tAcc2 = tTR_tAcc_base[(None, None, None, None, None, stage * self.n_prod + self.n_prod - 1)]
        tTR_tAcc2 = cute.group_modes(tTR_tAcc2, 3, cute.rank(tTR_tAcc2))

        acc_pipeline.consumer_wait(acc_consumer_state)
        subtile_cnt = cute.size(tTR_tAcc.shape, mode=[3])
        for subtile_idx in cutlass.range(subtile_cnt):
            cute.copy(tiled_copy_t2r, tTR_tAcc[(None, None, None, subtile_idx)], tTR_rAcc)
            vals = [tTR_rAcc.load()]
            if cutlass.const_expr(self.dual):
                cute.copy(tiled_copy_t2r, tTR_tAcc2[(None, None, None, subtile_idx)], tTR_rAcc2)
                vals.append(tTR_rAcc2.load())
            tTR_rC.store(self._epilogue_values(vals, alpha1, alpha2).to(self.c_dtype))
            # Rows past M (and slices past N) belong to no one: M is ragged and C is exactly [M, N].
            # (A coordinate tensor over the whole dynamic-shaped C crashes CuTe DSL 4.3.5's compiler;
            # coordinates inside the static MMA tile plus the tile origin do not.)
            coord = tTR_cC[(None, None, None, subtile_idx)][0]
            row = mma_tile_coord_mnl[0] * self.mma_tiler[0] + coord[0]
            col = mma_tile_coord_mnl[1] * self.mma_tiler[1] + coord[1]
            if row < m and col < n:
                cute.copy(simt_atom, tTR_rC, tTR_gC[(None, None, None, subtile_idx)])
        cute.arch.fence_view_async_tmem_load()
        with cute.arch.elect_one():
            acc_pipeline.consumer_release(acc_consumer_state)


    # ---- device: warp-specialized, pipelined, persistent --------------------------------------
    @cute.kernel
    def kernel_ws(
        self,
        tiled_mma: cute.TiledMma,
        tiled_mma_sfb: cute.TiledMma,
        tma_atom_a: cute.CopyAtom,
        mA_mkl: cute.Tensor,
        tma_atom_b: cute.CopyAtom,
        mB_nkl: cute.Tensor,
        tma_atom_sfa: cute.CopyAtom,
        mSFA_mkl: cute.Tensor,
        tma_atom_sfb: cute.CopyAtom,
        mSFB_nkl: cute.Tensor,
        tma_atom_b2: cute.CopyAtom,
        tma_atom_sfb2: cute.CopyAtom,
        tma_atom_c: cute.CopyAtom,
        mC_mnl: cute.Tensor,
        cluster_layout_vmnk: cute.Layout,
        cluster_layout_sfb_vmnk: cute.Layout,
        a_smem_layout_staged: cute.ComposedLayout,
        b_smem_layout_staged: cute.ComposedLayout,
        sfa_smem_layout_staged: cute.Layout,
        sfb_smem_layout_staged: cute.Layout,
        c_smem_layout_staged: cute.ComposedLayout,
        tile_sched_params: utils.PersistentTileSchedulerParams,
        group_count: cutlass.Constexpr,
        problem_sizes: cute.Tensor,
        addresses: cute.Tensor,
        alphas: cute.Tensor,
        tensormaps: cute.Tensor,
    ):
        """Warp 5 loads, warp 4 multiplies, warps 0-3 drain the accumulators (NVIDIA's structure)."""
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        use_2cta_instrs = cute.size(tiled_mma.thr_id.shape) == 2
        bidx, bidy, bidz = cute.arch.block_idx()
        mma_tile_coord_v = bidx % cute.size(tiled_mma.thr_id.shape)
        is_leader_cta = mma_tile_coord_v == 0
        cta_rank_in_cluster = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        block_in_cluster_coord_vmnk = cluster_layout_vmnk.get_flat_coord(cta_rank_in_cluster)
        block_in_cluster_coord_sfb_vmnk = cluster_layout_sfb_vmnk.get_flat_coord(cta_rank_in_cluster)
        tidx, _, _ = cute.arch.thread_idx()

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        tmap_smem = storage.tensormap_buffer.data_ptr()
        tmap_i64 = self.bytes_per_tensormap // 8

        num_tma_producer = self.num_mcast_ctas_a + self.num_mcast_ctas_b - 1
        ab_pipeline = pipeline.PipelineTmaUmma.create(
            barrier_storage=storage.ab_full_mbar_ptr.data_ptr(),
            num_stages=self.num_ab_stage,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, num_tma_producer),
            tx_count=self.num_tma_load_bytes,
            cta_layout_vmnk=cluster_layout_vmnk,
            defer_sync=True,
        )
        acc_pipeline = pipeline.PipelineUmmaAsync.create(
            barrier_storage=storage.acc_full_mbar_ptr.data_ptr(),
            num_stages=self.num_acc_stage,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread, len(self.epilog_warp_id) * (2 if use_2cta_instrs else 1)),
            cta_layout_vmnk=cluster_layout_vmnk,
            defer_sync=True,
        )
        tmem = utils.TmemAllocator(
            storage.tmem_holding_buf,
            barrier_for_retrieve=self.tmem_alloc_barrier,
            allocator_warp_id=self.epilog_warp_id[0],
            is_two_cta=use_2cta_instrs,
            two_cta_tmem_dealloc_mbar_ptr=storage.tmem_dealloc_mbar_ptr,
        )
        pipeline_init_arrive(cluster_shape_mn=self.cluster_shape_mn, is_relaxed=True)

        sA = storage.sA.get_tensor(a_smem_layout_staged.outer, swizzle=a_smem_layout_staged.inner)
        sB = storage.sB.get_tensor(b_smem_layout_staged.outer, swizzle=b_smem_layout_staged.inner)
        sSFA = storage.sSFA.get_tensor(sfa_smem_layout_staged)
        sSFB = storage.sSFB.get_tensor(sfb_smem_layout_staged)
        sB2, sSFB2 = sB, sSFB
        if cutlass.const_expr(self.dual):
            sB2 = storage.sB2.get_tensor(b_smem_layout_staged.outer, swizzle=b_smem_layout_staged.inner)
            sSFB2 = storage.sSFB2.get_tensor(sfb_smem_layout_staged)

        a_mcast = b_mcast = sfa_mcast = sfb_mcast = None
        if cutlass.const_expr(self.is_a_mcast or self.is_b_mcast or use_2cta_instrs):
            a_mcast = cpasync.create_tma_multicast_mask(cluster_layout_vmnk, block_in_cluster_coord_vmnk, mcast_mode=2)
            b_mcast = cpasync.create_tma_multicast_mask(cluster_layout_vmnk, block_in_cluster_coord_vmnk, mcast_mode=1)
            sfa_mcast = cpasync.create_tma_multicast_mask(
                cluster_layout_vmnk, block_in_cluster_coord_vmnk, mcast_mode=2)
            sfb_mcast = cpasync.create_tma_multicast_mask(
                cluster_layout_sfb_vmnk, block_in_cluster_coord_sfb_vmnk, mcast_mode=1)

        gA_mkl = cute.local_tile(mA_mkl, cute.slice_(self.mma_tiler, (None, 0, None)), (None, None, None))
        gB_nkl = cute.local_tile(mB_nkl, cute.slice_(self.mma_tiler, (0, None, None)), (None, None, None))
        gSFA_mkl = cute.local_tile(mSFA_mkl, cute.slice_(self.mma_tiler, (None, 0, None)), (None, None, None))
        gSFB_nkl = cute.local_tile(mSFB_nkl, cute.slice_(self.mma_tiler_sfb, (0, None, None)), (None, None, None))
        thr_mma = tiled_mma.get_slice(mma_tile_coord_v)
        thr_mma_sfb = tiled_mma_sfb.get_slice(mma_tile_coord_v)
        tCgA = thr_mma.partition_A(gA_mkl)
        tCgB = thr_mma.partition_B(gB_nkl)
        tCgSFA = thr_mma.partition_A(gSFA_mkl)
        tCgSFB = thr_mma_sfb.partition_B(gSFB_nkl)

        a_cta_layout = cute.make_layout(cute.slice_(cluster_layout_vmnk, (0, 0, None, 0)).shape)
        b_cta_layout = cute.make_layout(cute.slice_(cluster_layout_vmnk, (0, None, 0, 0)).shape)
        sfb_cta_layout = cute.make_layout(cute.slice_(cluster_layout_sfb_vmnk, (0, None, 0, 0)).shape)
        cm_coord = block_in_cluster_coord_vmnk[2]
        cn_coord = block_in_cluster_coord_vmnk[1]
        cn_sfb_coord = block_in_cluster_coord_sfb_vmnk[1]
        tAsA, tAgA = cpasync.tma_partition(
            tma_atom_a, cm_coord, a_cta_layout, cute.group_modes(sA, 0, 3), cute.group_modes(tCgA, 0, 3))
        tBsB, tBgB = cpasync.tma_partition(
            tma_atom_b, cn_coord, b_cta_layout, cute.group_modes(sB, 0, 3), cute.group_modes(tCgB, 0, 3))
        tBsB2, tBgB2 = cpasync.tma_partition(
            tma_atom_b2, cn_coord, b_cta_layout, cute.group_modes(sB2, 0, 3), cute.group_modes(tCgB, 0, 3))
        tAsSFA, tAgSFA = cpasync.tma_partition(
            tma_atom_sfa, cm_coord, a_cta_layout, cute.group_modes(sSFA, 0, 3), cute.group_modes(tCgSFA, 0, 3))
        tAsSFA = cute.filter_zeros(tAsSFA)
        tAgSFA = cute.filter_zeros(tAgSFA)
        tBsSFB, tBgSFB = cpasync.tma_partition(
            tma_atom_sfb, cn_sfb_coord, sfb_cta_layout, cute.group_modes(sSFB, 0, 3), cute.group_modes(tCgSFB, 0, 3))
        tBsSFB = cute.filter_zeros(tBsSFB)
        tBgSFB = cute.filter_zeros(tBgSFB)
        tBsSFB2, tBgSFB2 = cpasync.tma_partition(
            tma_atom_sfb2, cn_sfb_coord, sfb_cta_layout, cute.group_modes(sSFB2, 0, 3),
            cute.group_modes(tCgSFB, 0, 3))
        tBsSFB2 = cute.filter_zeros(tBsSFB2)
        tBgSFB2 = cute.filter_zeros(tBgSFB2)

        tCrA = tiled_mma.make_fragment_A(sA)
        tCrB = tiled_mma.make_fragment_B(sB)
        tCrB2 = tiled_mma.make_fragment_B(sB2)
        acc_shape = tiled_mma.partition_shape_C(self.mma_tiler[:2])
        tCtAcc_fake = tiled_mma.make_fragment_C(cute.append(acc_shape, self.num_acc_stage * self.n_prod))

        pipeline_init_wait(cluster_shape_mn=self.cluster_shape_mn)

        grid_dim = cute.arch.grid_dim()
        slot = bidz * grid_dim[1] * grid_dim[0] + bidy * grid_dim[0] + bidx
        tensormap_manager = utils.TensorMapManager(utils.TensorMapUpdateMode.SMEM, self.bytes_per_tensormap)
        tmap_gmem = [tensormap_manager.get_tensormap_ptr(tensormaps[(slot, i, None)].iterator)
                     for i in range(self.num_tensormaps)]
        tmap_smem_ptrs = [tmap_smem + i * tmap_i64 for i in range(self.num_tensormaps)]
        load_atoms = [tma_atom_a, tma_atom_b, tma_atom_sfa, tma_atom_sfb]
        load_slots = [self.tm_a, self.tm_b, self.tm_sfa, self.tm_sfb]
        if cutlass.const_expr(self.dual):
            load_atoms += [tma_atom_b2, tma_atom_sfb2]
            load_slots += [self.tm_b2, self.tm_sfb2]

        #
        # TMA warp: per tile, re-point the descriptors when the group changes, then stream k-tiles.
        #
        if warp_idx == self.tma_warp_id:
            tile_sched = utils.StaticPersistentTileScheduler.create(tile_sched_params, cute.arch.block_idx(), grid_dim)
            group_helper = utils.GroupedGemmTileSchedulerHelper(
                group_count, tile_sched_params, self.cluster_tile_shape_mnk, utils.create_initial_search_state())
            tensormap_init_done = cutlass.Boolean(False)
            last_group_idx = cutlass.Int32(-1)
            work_tile = tile_sched.initial_work_tile_info()
            ab_producer_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_ab_stage)
            while work_tile.is_valid_tile:
                info = group_helper.delinearize_z(work_tile.tile_idx, problem_sizes)
                k_tile_cnt = info.cta_tile_count_k
                cur_group_idx = info.group_idx
                is_group_changed = cur_group_idx != last_group_idx
                if is_group_changed:
                    ga, gb, gsfa, gsfb, gb2, gsfb2 = self._group_operands(
                        cur_group_idx, info.problem_shape_m, info.problem_shape_n, info.problem_shape_k, addresses)
                    if tensormap_init_done == False:  # noqa: E712 (a DSL Boolean)
                        self.tensormap_init_barrier.arrive_and_wait()
                        tensormap_init_done = True
                    tensors = [ga, gb, gsfa, gsfb]
                    if cutlass.const_expr(self.dual):
                        tensors += [gb2, gsfb2]
                    tensormap_manager.update_tensormap(
                        tuple(tensors), tuple(load_atoms), tuple(tmap_gmem[s] for s in load_slots),
                        self.tma_warp_id, tuple(tmap_smem_ptrs[s] for s in load_slots))

                mma_tile_m = info.cta_tile_idx_m // cute.size(tiled_mma.thr_id.shape)
                mma_tile_n = info.cta_tile_idx_n
                sfb_n = self._sfb_n_slice(mma_tile_n)
                tAgA_slice = tAgA[(None, mma_tile_m, None, 0)]
                tBgB_slice = tBgB[(None, mma_tile_n, None, 0)]
                tBgB2_slice = tBgB2[(None, mma_tile_n, None, 0)]
                tAgSFA_slice = tAgSFA[(None, mma_tile_m, None, 0)]
                tBgSFB_slice = tBgSFB[(None, sfb_n, None, 0)]
                tBgSFB2_slice = tBgSFB2[(None, sfb_n, None, 0)]

                ab_producer_state.reset_count()
                peek_ab_empty_status = cutlass.Boolean(1)
                if ab_producer_state.count < k_tile_cnt:
                    peek_ab_empty_status = ab_pipeline.producer_try_acquire(ab_producer_state)
                if is_group_changed:
                    for s in load_slots:
                        tensormap_manager.fence_tensormap_update(tmap_gmem[s])

                for _k_tile in cutlass.range(0, k_tile_cnt, 1, unroll=1):
                    ab_pipeline.producer_acquire(ab_producer_state, peek_ab_empty_status)
                    bar = ab_pipeline.producer_get_barrier(ab_producer_state)
                    kc = ab_producer_state.count
                    ks = ab_producer_state.index
                    cute.copy(tma_atom_a, tAgA_slice[(None, kc)], tAsA[(None, ks)], tma_bar_ptr=bar,
                              mcast_mask=a_mcast, tma_desc_ptr=tensormap_manager.get_tensormap_ptr(
                                  tmap_gmem[self.tm_a], cute.AddressSpace.generic))
                    cute.copy(tma_atom_b, tBgB_slice[(None, kc)], tBsB[(None, ks)], tma_bar_ptr=bar,
                              mcast_mask=b_mcast, tma_desc_ptr=tensormap_manager.get_tensormap_ptr(
                                  tmap_gmem[self.tm_b], cute.AddressSpace.generic))
                    cute.copy(tma_atom_sfa, tAgSFA_slice[(None, kc)], tAsSFA[(None, ks)], tma_bar_ptr=bar,
                              mcast_mask=sfa_mcast, tma_desc_ptr=tensormap_manager.get_tensormap_ptr(
                                  tmap_gmem[self.tm_sfa], cute.AddressSpace.generic))
                    cute.copy(tma_atom_sfb, tBgSFB_slice[(None, kc)], tBsSFB[(None, ks)], tma_bar_ptr=bar,
                              mcast_mask=sfb_mcast, tma_desc_ptr=tensormap_manager.get_tensormap_ptr(
                                  tmap_gmem[self.tm_sfb], cute.AddressSpace.generic))
                    if cutlass.const_expr(self.dual):
                        cute.copy(tma_atom_b2, tBgB2_slice[(None, kc)], tBsB2[(None, ks)], tma_bar_ptr=bar,
                                  mcast_mask=b_mcast, tma_desc_ptr=tensormap_manager.get_tensormap_ptr(
                                      tmap_gmem[self.tm_b2], cute.AddressSpace.generic))
                        cute.copy(tma_atom_sfb2, tBgSFB2_slice[(None, kc)], tBsSFB2[(None, ks)], tma_bar_ptr=bar,
                                  mcast_mask=sfb_mcast, tma_desc_ptr=tensormap_manager.get_tensormap_ptr(
                                      tmap_gmem[self.tm_sfb2], cute.AddressSpace.generic))
                    ab_producer_state.advance()
                    peek_ab_empty_status = cutlass.Boolean(1)
                    if ab_producer_state.count < k_tile_cnt:
                        peek_ab_empty_status = ab_pipeline.producer_try_acquire(ab_producer_state)

                tile_sched.advance_to_next_work()
                work_tile = tile_sched.get_current_work()
                last_group_idx = cur_group_idx
            ab_pipeline.producer_tail(ab_producer_state)

        #
        # MMA warp: scales to tensor memory, block-scaled MMAs into the accumulator stage.
        #
        if warp_idx == self.mma_warp_id:
            self._load_descriptors(tensormap_manager, load_atoms, [tmap_smem_ptrs[s] for s in load_slots],
                                   self.mma_warp_id)
            self.tensormap_init_barrier.arrive_and_wait()
            tmem.wait_for_alloc()
            acc_tmem_ptr = tmem.retrieve_ptr(self.acc_dtype)
            tCtAcc_base, tCtSFA, (tCtSFB, tCtSFB2), (sfb_col0, sfb2_col0), tCtSFB_layout = self._tmem_tensors(
                tiled_mma, acc_tmem_ptr, tCtAcc_fake, sfa_smem_layout_staged, sfb_smem_layout_staged)
            tiled_copy_s2t_sfa, tCsSFA_s2t, tCtSFA_s2t = self._s2t_copy_and_partition(sSFA, tCtSFA)
            tiled_copy_s2t_sfb, tCsSFB_s2t, tCtSFB_s2t = self._s2t_copy_and_partition(sSFB, tCtSFB)
            tiled_copy_s2t_sfb2, tCsSFB2_s2t, tCtSFB2_s2t = self._s2t_copy_and_partition(sSFB2, tCtSFB2)

            tile_sched = utils.StaticPersistentTileScheduler.create(tile_sched_params, cute.arch.block_idx(), grid_dim)
            group_helper = utils.GroupedGemmTileSchedulerHelper(
                group_count, tile_sched_params, self.cluster_tile_shape_mnk, utils.create_initial_search_state())
            work_tile = tile_sched.initial_work_tile_info()
            ab_consumer_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_ab_stage)
            acc_producer_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_acc_stage)
            while work_tile.is_valid_tile:
                info = group_helper.delinearize_z(work_tile.tile_idx, problem_sizes)
                k_tile_cnt = info.cta_tile_count_k
                mma_tile_n = info.cta_tile_idx_n
                acc_index = acc_producer_state.index * self.n_prod
                tCtAcc = tCtAcc_base[(None, None, None, acc_index)]
                tCtAcc2 = tCtAcc_base[(None, None, None, acc_index + self.n_prod - 1)]
                tCtSFB_mma = self._sfb_for_tile(acc_tmem_ptr, sfb_col0, tCtSFB, tCtSFB_layout, mma_tile_n)
                tCtSFB2_mma = self._sfb_for_tile(acc_tmem_ptr, sfb2_col0, tCtSFB2, tCtSFB_layout, mma_tile_n)

                ab_consumer_state.reset_count()
                peek_ab_full_status = cutlass.Boolean(1)
                if ab_consumer_state.count < k_tile_cnt and is_leader_cta:
                    peek_ab_full_status = ab_pipeline.consumer_try_wait(ab_consumer_state)
                if is_leader_cta:
                    acc_pipeline.producer_acquire(acc_producer_state)
                tiled_mma.set(tcgen05.Field.ACCUMULATE, False)

                for _k_tile in range(k_tile_cnt):
                    if is_leader_cta:
                        ab_pipeline.consumer_wait(ab_consumer_state, peek_ab_full_status)
                        cs = ab_consumer_state.index
                        cute.copy(tiled_copy_s2t_sfa, tCsSFA_s2t[(None, None, None, None, cs)], tCtSFA_s2t)
                        cute.copy(tiled_copy_s2t_sfb, tCsSFB_s2t[(None, None, None, None, cs)], tCtSFB_s2t)
                        if cutlass.const_expr(self.dual):
                            cute.copy(tiled_copy_s2t_sfb2, tCsSFB2_s2t[(None, None, None, None, cs)], tCtSFB2_s2t)
                        num_kblocks = cute.size(tCrA, mode=[2])
                        for kblock_idx in cutlass.range(num_kblocks, unroll_full=True):
                            kblock_coord = (None, None, kblock_idx, cs)
                            tiled_mma.set(tcgen05.Field.SFA, tCtSFA[(None, None, kblock_idx)].iterator)
                            tiled_mma.set(tcgen05.Field.SFB, tCtSFB_mma[(None, None, kblock_idx)].iterator)
                            cute.gemm(tiled_mma, tCtAcc, tCrA[kblock_coord], tCrB[kblock_coord], tCtAcc)
                            if cutlass.const_expr(self.dual):
                                tiled_mma.set(tcgen05.Field.SFB, tCtSFB2_mma[(None, None, kblock_idx)].iterator)
                                cute.gemm(tiled_mma, tCtAcc2, tCrA[kblock_coord], tCrB2[kblock_coord], tCtAcc2)
                            tiled_mma.set(tcgen05.Field.ACCUMULATE, True)
                        ab_pipeline.consumer_release(ab_consumer_state)
                    ab_consumer_state.advance()
                    peek_ab_full_status = cutlass.Boolean(1)
                    if ab_consumer_state.count < k_tile_cnt:
                        if is_leader_cta:
                            peek_ab_full_status = ab_pipeline.consumer_try_wait(ab_consumer_state)

                if is_leader_cta:
                    acc_pipeline.producer_commit(acc_producer_state)
                acc_producer_state.advance()
                tile_sched.advance_to_next_work()
                work_tile = tile_sched.get_current_work()
            acc_pipeline.producer_tail(acc_producer_state)

        #
        # Epilogue warps: tensor memory -> registers -> (alpha, SiLU·up) -> fp16 -> global memory.
        #
        if warp_idx < self.mma_warp_id:
            if cutlass.const_expr(self.tma_store):
                tensormap_manager.init_tensormap_from_atom(
                    tma_atom_c, tmap_smem_ptrs[self.tm_c], self.epilog_warp_id[0])
            tmem.allocate(self.num_tmem_alloc_cols)
            tmem.wait_for_alloc()
            acc_tmem_ptr = tmem.retrieve_ptr(self.acc_dtype)
            tCtAcc_base = cute.make_tensor(acc_tmem_ptr, tCtAcc_fake.layout)

            tile_sched = utils.StaticPersistentTileScheduler.create(tile_sched_params, cute.arch.block_idx(), grid_dim)
            group_helper = utils.GroupedGemmTileSchedulerHelper(
                group_count, tile_sched_params, self.cluster_tile_shape_mnk, utils.create_initial_search_state())
            work_tile = tile_sched.initial_work_tile_info()
            acc_consumer_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_acc_stage)
            if cutlass.const_expr(self.tma_store):
                self._tma_store_epilogue_loop(
                    tidx, warp_idx, tCtAcc_base, thr_mma, tma_atom_c, mC_mnl, c_smem_layout_staged, storage,
                    tensormap_manager, tmap_gmem[self.tm_c], tmap_smem_ptrs[self.tm_c], tile_sched, group_helper,
                    work_tile, acc_pipeline, acc_consumer_state, problem_sizes, addresses, alphas)
            else:
                tCcC = thr_mma.partition_C(cute.make_identity_tensor(cute.slice_(self.mma_tiler, (None, None, 0))))
                while work_tile.is_valid_tile:
                    info = group_helper.delinearize_z(work_tile.tile_idx, problem_sizes)
                    g = info.group_idx
                    m = info.problem_shape_m
                    n = info.problem_shape_n
                    mC = self._group_output(g, m, n, addresses)
                    gC_mnl = cute.local_tile(mC, cute.slice_(self.mma_tiler, (None, None, 0)), (None, None, None))
                    tCgC = thr_mma.partition_C(gC_mnl)
                    coord = (info.cta_tile_idx_m // cute.size(tiled_mma.thr_id.shape), info.cta_tile_idx_n, 0)
                    self._simt_epilogue(tidx, tCtAcc_base, tCgC, tCcC, acc_pipeline, acc_consumer_state, coord,
                                        m, n, alphas[(g, 0)], alphas[(g, 1)])
                    acc_consumer_state.advance()
                    tile_sched.advance_to_next_work()
                    work_tile = tile_sched.get_current_work()

            tmem.relinquish_alloc_permit()
            self.epilog_sync_barrier.arrive_and_wait()
            tmem.free(acc_tmem_ptr)

    @cute.jit
    def _tma_store_epilogue_loop(self, tidx: cutlass.Int32, warp_idx: cutlass.Int32, tCtAcc_base: cute.Tensor,
                                 thr_mma, tma_atom_c: cute.CopyAtom, mC_mnl: cute.Tensor, c_smem_layout_staged,
                                 storage, tensormap_manager, tmap_c_gmem, tmap_c_smem, tile_sched, group_helper,
                                 work_tile, acc_pipeline, acc_consumer_state, problem_sizes: cute.Tensor,
                                 addresses: cute.Tensor, alphas: cute.Tensor):
        """NVIDIA's epilogue: sub-tiles through shared memory, TMA-stored with this group's descriptor."""
        # The host's epilogue tile is an MLIR value of the host region; rebuild it on the device.
        epi_tile = sm100_utils.compute_epilogue_tile_shape(
            self.cta_tile_shape_mnk, self.use_2cta_instrs, self.c_layout, self.c_dtype)
        sC = storage.sC.get_tensor(c_smem_layout_staged.outer, swizzle=c_smem_layout_staged.inner)
        gC_mnl = cute.local_tile(mC_mnl, cute.slice_(self.mma_tiler, (None, None, 0)), (None, None, None))
        tCgC = thr_mma.partition_C(gC_mnl)
        tiled_copy_t2r, thr_copy_t2r, tTR_tAcc_base, tTR_rAcc = self._epilog_t2r(tidx, tCtAcc_base, tCgC, epi_tile)
        tTR_rAcc2 = cute.make_rmem_tensor(tTR_rAcc.shape, self.acc_dtype)
        tTR_rC = cute.make_rmem_tensor(tTR_rAcc.shape, self.c_dtype)
        copy_atom_r2s = sm100_utils.get_smem_store_op(self.c_layout, self.c_dtype, self.acc_dtype, tiled_copy_t2r)
        tiled_copy_r2s = cute.make_tiled_copy_D(copy_atom_r2s, tiled_copy_t2r)
        thr_copy_r2s = tiled_copy_r2s.get_slice(tidx)
        tRS_sC = thr_copy_r2s.partition_D(sC)
        tRS_rC = tiled_copy_r2s.retile(tTR_rC)
        gC_epi = cute.flat_divide(tCgC[((None, None), 0, 0, None, None, None)], epi_tile)
        bSG_sC, bSG_gC_partitioned = cpasync.tma_partition(
            tma_atom_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2), cute.group_modes(gC_epi, 0, 2))
        c_pipeline = pipeline.PipelineTmaStore.create(
            num_stages=self.num_c_stage,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 32 * len(self.epilog_warp_id)))
        last_group_idx = cutlass.Int32(-1)
        while work_tile.is_valid_tile:
            info = group_helper.delinearize_z(work_tile.tile_idx, problem_sizes)
            g = info.group_idx
            is_group_changed = g != last_group_idx
            if is_group_changed:
                real_c = self._group_output(g, info.problem_shape_m, info.problem_shape_n, addresses)
                tensormap_manager.update_tensormap(
                    (real_c,), (tma_atom_c,), (tmap_c_gmem,), self.epilog_warp_id[0], (tmap_c_smem,))
            alpha1 = alphas[(g, 0)]
            alpha2 = alphas[(g, 1)]
            mma_tile_coord_mnl = (info.cta_tile_idx_m // cute.size(thr_mma.thr_id.shape), info.cta_tile_idx_n, 0)
            bSG_gC = bSG_gC_partitioned[(None, None, None, *mma_tile_coord_mnl)]
            bSG_gC = cute.group_modes(bSG_gC, 1, cute.rank(bSG_gC))
            stage = acc_consumer_state.index
            tTR_tAcc = tTR_tAcc_base[(None, None, None, None, None, stage * self.n_prod)]
            tTR_tAcc = cute.group_modes(tTR_tAcc, 3, cute.rank(tTR_tAcc))
            tTR_tAcc2 = tTR_tAcc_base[(None, None, None, None, None, stage * self.n_prod + self.n_prod - 1)]
            tTR_tAcc2 = cute.group_modes(tTR_tAcc2, 3, cute.rank(tTR_tAcc2))

            acc_pipeline.consumer_wait(acc_consumer_state)
            if is_group_changed:
                if warp_idx == self.epilog_warp_id[0]:
                    tensormap_manager.fence_tensormap_update(tmap_c_gmem)

            subtile_cnt = cute.size(tTR_tAcc.shape, mode=[3])
            num_prev_subtiles = tile_sched.num_tiles_executed * subtile_cnt
            for subtile_idx in range(subtile_cnt):
                cute.copy(tiled_copy_t2r, tTR_tAcc[(None, None, None, subtile_idx)], tTR_rAcc)
                vals = [tiled_copy_r2s.retile(tTR_rAcc).load()]
                if cutlass.const_expr(self.dual):
                    cute.copy(tiled_copy_t2r, tTR_tAcc2[(None, None, None, subtile_idx)], tTR_rAcc2)
                    vals.append(tiled_copy_r2s.retile(tTR_rAcc2).load())
                tRS_rC.store(self._epilogue_values(vals, alpha1, alpha2).to(self.c_dtype))
                c_buffer = (num_prev_subtiles + subtile_idx) % self.num_c_stage
                cute.copy(tiled_copy_r2s, tRS_rC, tRS_sC[(None, None, None, c_buffer)])
                cute.arch.fence_proxy(cute.arch.ProxyKind.async_shared, space=cute.arch.SharedSpace.shared_cta)
                self.epilog_sync_barrier.arrive_and_wait()
                if warp_idx == self.epilog_warp_id[0]:
                    cute.copy(tma_atom_c, bSG_sC[(None, c_buffer)], bSG_gC[(None, subtile_idx)],
                              tma_desc_ptr=tensormap_manager.get_tensormap_ptr(tmap_c_gmem, cute.AddressSpace.generic))
                    c_pipeline.producer_commit()
                    c_pipeline.producer_acquire()
                self.epilog_sync_barrier.arrive_and_wait()
            cute.arch.fence_view_async_tmem_load()
            with cute.arch.elect_one():
                acc_pipeline.consumer_release(acc_consumer_state)
            acc_consumer_state.advance()
            tile_sched.advance_to_next_work()
            work_tile = tile_sched.get_current_work()
            last_group_idx = g
        c_pipeline.producer_tail()

# ---------------------------------------------------------------------------------------------
# Compiling without a GPU
# ---------------------------------------------------------------------------------------------
_FAKE_GROUPS = 8  # the study's largest group count (S1, S2)
_FAKE_ADDR = 1 << 20  # any 1 KB-aligned address: fake operands are never dereferenced


def fake_arguments(cfg: KernelConfig, group_count: int = _FAKE_GROUPS, max_active_clusters: int = B200_SMS):
    """Arguments of ``Sm100NvFp4GroupedGemm.__call__`` with fake addresses and sizes."""
    from cutlass.cute.runtime import make_fake_stream, make_ptr

    def ptr(dtype, i):
        return make_ptr(dtype, _FAKE_ADDR * (i + 1), cute.AddressSpace.gmem, assumed_align=16)

    return (ptr(cutlass.Float4E2M1FN, 0), ptr(cutlass.Float4E2M1FN, 1), ptr(cutlass.Float16, 2),
            ptr(cutlass.Float8E4M3FN, 3), ptr(cutlass.Float8E4M3FN, 4),
            cutlass.Int32(128), cutlass.Int32(4096), cutlass.Int32(7168),
            ptr(cutlass.Int32, 5), ptr(cutlass.Int64, 6), ptr(cutlass.Float32, 7), ptr(cutlass.Int64, 8),
            cutlass.Int32(B200_SMS), cutlass.Int32(64), group_count, max_active_clusters, make_fake_stream())


_COUNTED = ("tcgen05.mma", "tcgen05.ld", "tcgen05.cp", "cp.async.bulk.tensor", "mbarrier.try_wait")


class CompilerError(RuntimeError):
    """CuTe DSL refused to compile; the message is the compiler's own diagnostic."""


class _CapturedStderr:
    """Capture file descriptor 2 while compiling: MLIR prints its diagnostics there, and the
    Python exception only says 'Operation creation failed'."""

    def __enter__(self):
        import os
        import sys
        import tempfile

        sys.stderr.flush()
        self._file = tempfile.TemporaryFile(mode="w+b")
        self._saved = os.dup(2)
        os.dup2(self._file.fileno(), 2)
        return self

    def __exit__(self, *exc):
        import os
        import sys

        sys.stderr.flush()
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._file.seek(0)
        self.text = self._file.read().decode("utf-8", errors="replace")
        self._file.close()
        return False

    def diagnostics(self) -> str:
        lines = [ln for ln in getattr(self, "text", "").splitlines() if " error: " in ln or ln.startswith("error:")]
        return " | ".join(ln.split(" error: ", 1)[-1].strip() for ln in lines)


def _compile_fake(kernel: "Sm100NvFp4GroupedGemm", cfg: KernelConfig, arch: str):
    """``compiling.compile_offline`` with fake operands, tolerating one more no-driver symptom.

    The first compile in a process without a driver fails loading with CuTe DSL's DSLRuntimeError
    (which compile_offline tolerates); later ones fail earlier, in the host JIT engine's symbol
    lookup, with a plain ``RuntimeError("Unknown function ...")``. The PTX and cubin are written
    either way, so that case is read back here with compiling's own helpers.
    """
    import glob
    import os
    import tempfile

    from .compiling import CompileArtifacts, compile_offline, count_instructions, ptxas_resources

    dump = tempfile.mkdtemp(prefix=f"nvfp4lib-{arch}-{cfg.name}-")
    try:
        with _CapturedStderr() as err:
            return compile_offline(kernel, *fake_arguments(cfg), arch=arch, dump_dir=dump)
    except Exception as e:  # every failure is reported in the compiler's words
        ptx = sorted(glob.glob(os.path.join(dump, f"*.{arch}.ptx")))
        cubin = sorted(glob.glob(os.path.join(dump, f"*.{arch}.cubin")))
        if not (isinstance(e, RuntimeError) and "Unknown function" in str(e) and ptx and cubin):
            raise CompilerError(err.diagnostics() or _clean(e)) from e
        art = CompileArtifacts(arch, ptx[-1], cubin[-1], load_error=str(e)[:300])
        art.instructions = count_instructions(art.ptx)
        art.ptxas = ptxas_resources(art.ptx_path, arch)
        return art


def _ptx_forms(ptx: str) -> dict:
    """Which forms of the key instructions the PTX holds (e.g. the tcgen05.ld shape)."""
    out = {}
    for key, pat in (("tcgen05.mma forms", r"tcgen05\.mma\.[\w:.]+"), ("tcgen05.ld forms", r"tcgen05\.ld\.[\w:.]+"),
                     ("tcgen05.cp forms", r"tcgen05\.cp\.[\w:.]+"), ("st.global forms", r"st\.global\.[\w.]+")):
        out[key] = ",".join(sorted(set(re.findall(pat, ptx))))
    return out


def compile_report(config, arch: str = ARCH, *, keep_ptx: bool = False) -> dict:
    """Compile ``config`` for sm_100a with fake operands and report what the compiler made.

    Compiled for sm_100a, not run. Returns one row: registers, spills, static and dynamic shared
    memory (the kernel's own struct, checked against :func:`storage_plan` and the sm_100 limit),
    tensor-memory columns, threads, CTAs per SM permitted by each resource, and PTX instruction
    counts. A config that :func:`validate` or the compiler refuses returns ``{"error": message}``
    (plus ``rejected_by``) instead of raising.
    """
    cfg = _get_config(config)
    row = {"label": LABEL, "arch": arch, "threads": threads_per_cta(cfg),
           "structure": "study (warp 0 loads+MMA, 4-warp SIMT epilogue)" if cfg.warp_spec == "none"
           else "warp-specialized (TMA warp, MMA warp, 4 epilogue warps), persistent"}
    try:
        validate(cfg, arch)
    except ValueError as e:
        msg = str(e)
        by = "hardware MMA shape (CuTe DSL)" if "which the hardware does not have" in msg else (
            "CuTe DSL layout helpers" if "CuTe DSL 4.3.5 lays out" in msg else "kernel rule")
        return {**row, "error": msg, "rejected_by": by}
    kernel = Sm100NvFp4GroupedGemm(cfg)
    t0 = time.perf_counter()
    try:
        art = _compile_fake(kernel, cfg, arch)
    except CompilerError as e:  # the compiler's own refusal, in its words
        return {**row, "error": str(e)[-1500:], "rejected_by": "compiler"}
    plan = storage_plan(cfg)
    tm = tmem_columns(cfg)
    res = {k: v for k, v in art.ptxas.items() if k != "ptxas_log"}
    dyn = kernel.facts.get("smem_struct_bytes")
    smem_total = (dyn or 0) + (res.get("static_smem") or 0)
    occ = ctas_per_sm(smem_bytes=smem_total, registers=res.get("registers"), threads=threads_per_cta(cfg),
                      tmem_alloc=TMEM_ALLOC_COLUMNS)
    occ_min_tmem = ctas_per_sm(smem_bytes=smem_total, registers=res.get("registers"),
                               threads=threads_per_cta(cfg), tmem_alloc=tm["minimal_alloc"])
    row.update({
        "compile_s": round(time.perf_counter() - t0, 2),
        **res,
        "dynamic_smem": dyn, "dynamic_smem_plan": plan.total, "smem_plan_agrees": dyn == plan.total,
        "smem_per_stage": plan.per_stage, "smem_limit": SMEM_PER_BLOCK_MAX,
        "smem_fits": smem_total <= SMEM_PER_BLOCK_MAX,
        "tma_bytes_per_stage": kernel.facts.get("tma_bytes_per_stage"),
        "tmem_cols_acc": kernel.facts.get("tmem_acc_cols"), "tmem_cols_sf": kernel.facts.get("tmem_sf_cols"),
        "tmem_cols_used": (kernel.facts.get("tmem_acc_cols") or 0) + (kernel.facts.get("tmem_sf_cols") or 0),
        "tmem_plan_agrees": (kernel.facts.get("tmem_acc_cols"), kernel.facts.get("tmem_sf_cols"))
        == (tm["acc"], tm["sf"]),
        "tmem_cols_allocated": TMEM_ALLOC_COLUMNS,
        **{f"ctas_per_sm_{k.removeprefix('by_')}" if k != "ctas_per_sm" else k: v for k, v in occ.items()},
        "ctas_per_sm_if_minimal_tmem_alloc": occ_min_tmem["ctas_per_sm"],
        **{k: art.instructions.get(k, 0) for k in _COUNTED},
        "tcgen05.mma kind": art.instructions.get("tcgen05.mma kinds", ""),
        **_ptx_forms(art.ptx),
        "ptx_path": art.ptx_path,
    })
    if keep_ptx:
        row["ptx"] = art.ptx
    return row


class _StudyTile128x64(Sm100NvFp4GroupedGemm):
    pad_sfb_tile = False


def study_round2_tile128x64_error() -> str:
    """The compiler's message for the study's round-2 edit at tile (128, 64): ``mma_tiler`` changed
    and nothing else, so B's scale factors keep a 64-row tile that the 128-row scale atom does not
    fit. (This kernel pads that tile to 128 rows instead, as NVIDIA's dense example does, and
    compiles; see ``r2_tile128x64``.) Compiled for sm_100a, not run."""
    cfg = SWEEP_CONFIGS["r2_tile128x64"]
    try:
        _compile_fake(_StudyTile128x64(cfg), cfg, ARCH)
    except CompilerError as e:
        return str(e)
    return ""


# ---------------------------------------------------------------------------------------------
# The backend: refuses anything but an sm_100 GPU
# ---------------------------------------------------------------------------------------------
_compiled: dict = {}


def require_sm100(device=None) -> None:
    """Raise RuntimeError naming what was found unless ``device`` is an sm_100 (compute 10.0) GPU."""
    device = torch.device(device) if device is not None else None
    if not torch.cuda.is_available():
        raise RuntimeError("cute-blackwell needs sm_100 (B200/GB200), found no CUDA device. "
                           f"The kernel is {LABEL}; it does not fall back to another backend.")
    if device is None or device.type != "cuda":
        raise RuntimeError(f"cute-blackwell needs sm_100 (B200/GB200) operands, found operands on {device}; "
                           "move them to the sm_100 GPU.")
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) != (10, 0):
        raise RuntimeError(f"cute-blackwell needs sm_100, found sm_{major}{minor} "
                           f"({torch.cuda.get_device_name(device)}); the kernel is compiled for sm_100a "
                           "(tcgen05 FP4 MMA) and does not fall back to another backend.")


def prepare(a, b, b2, *, out_dtype=torch.float16, config="baseline", **options) -> Runner:
    """The backend factory (see :mod:`nvfp4lib.backends`). Compiled for sm_100a, not run.

    Refuses with RuntimeError on anything but an sm_100 GPU. One-time work: weight scales to the
    blocked layout, device tables, descriptor workspace, compile (cached per config and group
    count). Per call: activation scales to the blocked layout, alphas from the global scales, one
    launch. The launch path has never executed: a B200 owner's first run is its first test.
    """
    from ..formats import swizzle_scales

    device = a[0].data.device
    require_sm100(device)
    if options:
        raise TypeError(f"cute-blackwell: unknown options {sorted(options)}")
    if out_dtype != torch.float16:
        raise ValueError(f"cute-blackwell writes float16 only, got out_dtype={out_dtype}")
    cfg = validate(_get_config(config).with_(dual=b2 is not None))
    g_count = len(a)
    for g in range(g_count):
        k, n = a[g].K, b[g].shape[0]
        if k % 32:
            raise ValueError(f"group {g}: K={k}: TMA needs 16-byte rows of packed FP4, so K % 32 == 0")
        if n % 8 or (cfg.epilogue == "simt" and n % epilogue_columns(cfg)):
            raise ValueError(f"group {g}: N={n}: fp16 rows of C must be 16-byte aligned (N % 8 == 0), and the "
                             f"SIMT epilogue stores {epilogue_columns(cfg)}-column slices (N % "
                             f"{epilogue_columns(cfg)} == 0)")
    t0 = time.perf_counter()

    def prep(t):
        data = t.data.contiguous()
        if data.data_ptr() % 16:  # TMA needs 16-byte aligned global addresses
            data = data.clone()
        return {"data": data, "sf": swizzle_scales(t.scales).contiguous(), "global_scale": t.global_scale}

    wb = [prep(t) for t in b]
    wb2 = [prep(t) for t in b2] if b2 is not None else None
    act = [prep(t) for t in a]
    outputs = [torch.empty((t.shape[0], w.shape[0]), dtype=out_dtype, device=device) for t, w in zip(a, b)]
    tables = problem_tables(act, wb, outputs, wb2, device=device)
    sizes = [(t.shape[0], w.shape[0], t.K) for t, w in zip(a, b)]
    tc = tile_counts(sizes, cfg)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    slots = max(1, grid_ctas(cfg, tc["clusters"], sms))
    workspace = torch.empty((slots, num_tensormaps(cfg), BYTES_PER_TENSORMAP // 8), dtype=torch.int64, device=device)
    g0 = next((g for g in range(g_count) if sizes[g][0] > 0), 0)

    from cutlass.cute.runtime import make_ptr

    def p(dtype, t):
        return make_ptr(dtype, t.data_ptr(), cute.AddressSpace.gmem, assumed_align=16)

    def args():
        return (p(cutlass.Float4E2M1FN, act[g0]["data"]), p(cutlass.Float4E2M1FN, wb[g0]["data"]),
                p(cutlass.Float16, outputs[g0]), p(cutlass.Float8E4M3FN, act[g0]["sf"]),
                p(cutlass.Float8E4M3FN, wb[g0]["sf"]), cutlass.Int32(max(sizes[g0][0], 1)),
                cutlass.Int32(sizes[g0][1]), cutlass.Int32(sizes[g0][2]),
                p(cutlass.Int32, tables["sizes"]), p(cutlass.Int64, tables["addresses"]),
                p(cutlass.Float32, tables["alphas"]), p(cutlass.Int64, workspace), cutlass.Int32(slots),
                cutlass.Int32(tc["clusters"]))

    max_clusters = sms // (cfg.cluster_m * cfg.cluster_n)
    key = (cfg, g_count, max_clusters)
    stream = cuda.CUstream(torch.cuda.current_stream(device).cuda_stream)
    if key not in _compiled and tc["clusters"]:
        _compiled[key] = cute.compile(Sm100NvFp4GroupedGemm(cfg), *args(), g_count, max_clusters, stream)
    kernel = _compiled.get(key)

    def run():
        for g in range(g_count):  # activations change every call: their scales are re-blocked
            act[g]["sf"].copy_(swizzle_scales(a[g].scales))
            if act[g]["data"].data_ptr() != a[g].data.data_ptr():  # a copy made for alignment
                act[g]["data"].copy_(a[g].data)
        ga = torch.stack([t.global_scale for t in a])
        tables["alphas"][:, 0] = ga * torch.stack([t.global_scale for t in b])
        tables["alphas"][:, 1] = ga * torch.stack([t.global_scale for t in (b2 if b2 is not None else b)])
        if kernel is not None:
            s = cuda.CUstream(torch.cuda.current_stream(device).cuda_stream)
            kernel(*args(), s)

    return Runner(run, outputs, prepare_s=time.perf_counter() - t0,
                  held_bytes=sum(t.data.numel() + t.scales.numel() for t in b + (b2 or [])),
                  notes=f"cute-blackwell config {cfg.name} ({LABEL} until a recorded B200 run exists)",
                  info={"config": cfg.name, "tiles": tc["ctas"], "label": LABEL})
