"""The sm_100a kernel's plan, computed in Python (compiled for sm_100a, not run): hardware limits, the named configs,
shared-memory / tensor-memory / occupancy arithmetic, :func:`validate` (which asks the compiler about MMA shapes),
the tile and address tables the host builds, and the compiler-diagnostic capture they share with the reports."""
import math
import re
from dataclasses import asdict, dataclass, replace
from typing import ClassVar, Literal, Optional

import cutlass
import torch
from cutlass.cute.nvgpu import tcgen05

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
@dataclass(frozen=True)
class BlackwellConfig:
    """The sm_100a kernel's knobs (only this kernel's). ``tile_m`` rows of A (tokens) and ``tile_n`` rows of B
    (output columns) per CTA, ``tile_k`` K per stage (FP4 elements); ``ab_stages`` shared-memory stages of A/B and
    their scales, ``acc_stages`` accumulator buffers in tensor memory; ``epilogue`` SIMT stores or a TMA store;
    ``warp_spec``: the study's one-warp-loads-and-issues kernel ("none") or NVIDIA's warp-specialized persistent one
    ("producer_consumer"); ``use_2cta`` the CTA-pair MMA over a ``cluster_m`` x ``cluster_n`` cluster; ``dual`` the
    fused silu(A·B1ᵀ)·(A·B2ᵀ) (set from the operands)."""

    family: ClassVar[str] = "blackwell"
    name: str
    tile_m: int = 128
    tile_n: int = 128
    tile_k: int = 256
    ab_stages: int = 1
    acc_stages: int = 1
    epilogue: Literal["simt", "tma"] = "simt"
    warp_spec: Literal["none", "producer_consumer"] = "none"
    dual: bool = False
    use_2cta: bool = False
    cluster_m: int = 1
    cluster_n: int = 1

    def with_(self, **changes) -> "BlackwellConfig":
        return replace(self, **changes)

    def as_dict(self) -> dict:
        return {"family": self.family, **asdict(self)}


_BASE = BlackwellConfig("baseline")
# What the study should have ended with: warp specialization, a multi-stage pipeline, a TMA
# store epilogue. Three stages so that the dual variant (54 KB/stage: A, B1, B2 and their scales)
# fits in shared memory; one accumulator stage so that the dual variant's two 128-column
# accumulators plus scales fit in the 512 tensor-memory columns.
_WS = _BASE.with_(name="ws_pipelined", ab_stages=3, epilogue="tma", warp_spec="producer_consumer")

CONFIGS: dict[str, BlackwellConfig] = {c.name: c for c in (_BASE, _WS)}

SWEEP_CONFIGS: dict[str, BlackwellConfig] = {c.name: c for c in (
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


def _get_config(config) -> BlackwellConfig:
    if isinstance(config, BlackwellConfig):
        return config
    table = {**CONFIGS, **SWEEP_CONFIGS}
    if config not in table:
        raise ValueError(f"unknown cute-blackwell config {config!r}; known: {', '.join(table)}")
    return table[config]


# ---------------------------------------------------------------------------------------------
# Plans computed in Python (checked against the kernel's own numbers at trace time)
# ---------------------------------------------------------------------------------------------
def num_products(cfg: BlackwellConfig) -> int:
    return 2 if cfg.dual else 1


def threads_per_cta(cfg: BlackwellConfig) -> int:
    """128 for the study's structure; 4 epilogue + 1 MMA + 1 TMA warps when warp-specialized."""
    return 128 if cfg.warp_spec == "none" else 192


def num_tensormaps(cfg: BlackwellConfig) -> int:
    """TMA descriptors each CTA rewrites per group: A, B, SFA, SFB (+ B2, SFB2) (+ C for TMA stores)."""
    return 4 + 2 * cfg.dual + (cfg.epilogue == "tma")


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def mma_shape(cfg: BlackwellConfig) -> tuple[int, int, int]:
    """(M, N, K) of one tcgen05.mma: the 2-CTA MMA spans the rows of both CTAs of a pair."""
    return (cfg.tile_m * (2 if cfg.use_2cta else 1), cfg.tile_n, MMA_K)


def epilogue_columns(cfg: BlackwellConfig) -> int:
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


def storage_plan(cfg: BlackwellConfig) -> StoragePlan:
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


def tmem_columns(cfg: BlackwellConfig) -> dict:
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


def _mma_compiler_error(cfg: BlackwellConfig) -> Optional[tuple[str, str]]:
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


def validate(cfg: BlackwellConfig, arch: str = ARCH) -> BlackwellConfig:
    """Return ``cfg`` if this kernel can be compiled for it; else raise ValueError naming the rule."""
    name = cfg.name
    if arch != ARCH:
        raise ValueError(f"{name}: the Blackwell kernel targets {ARCH} (tcgen05 FP4 MMA); got arch={arch!r}")
    if cfg.tile_k != MMA_K * MMA_K_BLOCKS:
        raise ValueError(f"{name}: tile_k={cfg.tile_k}: CUTLASS's scale-factor layouts fix a k-tile at "
                         f"{MMA_K_BLOCKS} MMAs of K={MMA_K}, so tile_k must be {MMA_K * MMA_K_BLOCKS}")
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
def tile_counts(problem_sizes, cfg: BlackwellConfig) -> dict:
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


def grid_ctas(cfg: BlackwellConfig, total_clusters: int, sm_count: int = B200_SMS) -> int:
    """CTAs launched: one per tile for the study's structure, at most one per SM when persistent."""
    per_cluster = cfg.cluster_m * cfg.cluster_n
    if cfg.warp_spec == "none":
        return total_clusters * per_cluster
    return min(total_clusters, sm_count // per_cluster) * per_cluster


def tensormap_workspace_bytes(cfg: BlackwellConfig, total_clusters: int, sm_count: int = B200_SMS) -> int:
    """Global workspace for the per-CTA TMA descriptors (128 B each) the kernel rewrites per group."""
    return grid_ctas(cfg, total_clusters, sm_count) * num_tensormaps(cfg) * BYTES_PER_TENSORMAP


def shape_tile_table(cfg: BlackwellConfig, names=("S1", "S2", "S3", "S4"), sm_count: int = B200_SMS) -> list[dict]:
    """For each benchmark shape: CTAs, waves, k-tiles per tile, wasted MMA rows, workspace."""
    from ...problems import get_problem

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
