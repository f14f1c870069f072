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

Two kernel structures, selected by ``BlackwellConfig.warp_spec``:

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

The module is split by concern: :mod:`.plan` (limits, configs, arithmetic, validation, host tables),
:mod:`.kernel` (the kernel class, study form), :mod:`.warp_specialized` (its warp-specialized form); this one
compiles without a GPU, reports, and is the backend.
"""
import re
import time

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch

from ...runner import Runner

__all__ = [
    "LABEL", "ARCH", "BlackwellConfig", "CONFIGS", "SWEEP_CONFIGS", "validate", "prepare", "require_sm100",
    "compile_report", "CompilerError", "study_round2_tile128x64_error", "StoragePlan", "storage_plan",
    "tmem_columns", "threads_per_cta", "num_tensormaps", "mma_shape", "epilogue_columns", "problem_tables",
    "tile_counts", "grid_ctas", "shape_tile_table", "tensormap_workspace_bytes", "cutlass_scale_offsets",
    "ctas_per_sm", "fake_arguments", "Sm100NvFp4GroupedGemm",
]

from .kernel import Sm100NvFp4GroupedGemm, cutlass_scale_offsets  # noqa: E402, F401
from .plan import (  # noqa: E402, F401  (bw.X: the names the reports and tests use)
    ADDR_A,
    ADDR_C,
    ADDR_SFB2,
    ARCH,
    B200_SMS,
    BYTES_PER_TENSORMAP,
    CONFIGS,
    LABEL,
    NUM_ADDR,
    SMEM_PER_BLOCK_MAX,
    SWEEP_CONFIGS,
    TMEM_ALLOC_COLUMNS,
    TMEM_COLUMNS,
    BlackwellConfig,
    CompilerError,
    StoragePlan,
    _CapturedStderr,
    _clean,
    _get_config,
    ctas_per_sm,
    epilogue_columns,
    grid_ctas,
    mma_shape,
    num_tensormaps,
    problem_tables,
    shape_tile_table,
    storage_plan,
    tensormap_workspace_bytes,
    threads_per_cta,
    tile_counts,
    tmem_columns,
    validate,
)

# ---------------------------------------------------------------------------------------------
# Compiling without a GPU
# ---------------------------------------------------------------------------------------------
_FAKE_GROUPS = 8  # the study's largest group count (S1, S2)
_FAKE_ADDR = 1 << 20  # any 1 KB-aligned address: fake operands are never dereferenced


def fake_arguments(cfg: BlackwellConfig, group_count: int = _FAKE_GROUPS, max_active_clusters: int = B200_SMS):
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


def _compile_fake(kernel: "Sm100NvFp4GroupedGemm", cfg: BlackwellConfig, arch: str):
    """``compiling.compile_offline`` with fake operands, tolerating one more no-driver symptom.

    The first compile in a process without a driver fails loading with CuTe DSL's DSLRuntimeError
    (which compile_offline tolerates); later ones fail earlier, in the host JIT engine's symbol
    lookup, with a plain ``RuntimeError("Unknown function ...")``. The PTX and cubin are written
    either way, so that case is read back here with compiling's own helpers.
    """
    import glob
    import os
    import tempfile

    from ..common.compiling import CompileArtifacts, compile_offline, count_instructions, ptxas_resources

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
    """The backend factory (see :mod:`nvfp4lib.bench.backends`). Compiled for sm_100a, not run.

    Refuses with RuntimeError on anything but an sm_100 GPU. One-time work: weight scales to the
    blocked layout, device tables, descriptor workspace, compile (cached per config and group
    count). Per call: activation scales to the blocked layout, alphas from the global scales, one
    launch. The launch path has never executed: a B200 owner's first run is its first test.
    """
    from ...formats import swizzle_scales

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
