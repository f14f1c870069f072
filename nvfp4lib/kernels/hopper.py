"""``backend="cute-hopper"``: the CuTe DSL NVFP4 grouped GEMM on Hopper, its named configs, compile reports.

The kernel itself is :mod:`nvfp4lib.kernels.sm90`; the layout it reads is :mod:`.packing`.
Configs are named: ``baseline`` is the study's kernel mirrored on Hopper (128×128×256, one
stage, 128 threads, SIMT epilogue, no warp specialization). Only configs listed in ``CONFIGS``
are shipped (compiled in CI, checked on the GPU); ``SWEEP_CONFIGS`` adds the study's other
candidates, including ones the hardware or this kernel refuses, for the compile report.
"""
from __future__ import annotations

import time

import torch

from ..backends import Runner
from .config import KernelConfig
from .packing import ActivationPacker, pack_weights, tile_table

_B = KernelConfig("baseline")
CONFIGS: dict[str, KernelConfig] = {c.name: c for c in (
    _B,
    _B.with_(name="baseline_dual", tile_n=64, dual=True),
    _B.with_(name="stages2", ab_stages=2),
    _B.with_(name="tile64x128", tile_m=64),
    _B.with_(name="tile128x64", tile_n=64),
    _B.with_(name="tile64x64", tile_m=64, tile_n=64),
    _B.with_(name="vec4", decode="vec4"),
    _B.with_(name="vec4_dual", tile_n=64, dual=True, decode="vec4"),
    _B.with_(name="vec4_wg2", decode="vec4", warpgroups=2),
    _B.with_(name="vec4_wg2_dual", tile_n=64, dual=True, decode="vec4", warpgroups=2),
    _B.with_(name="vec4_wg2_dec2", decode="vec4", warpgroups=2, decode_warpgroups=2),
    _B.with_(name="vec4_wg2_dec2_dual", tile_n=64, dual=True, decode="vec4", warpgroups=2, decode_warpgroups=2),
)}
SWEEP_CONFIGS: dict[str, KernelConfig] = {c.name: c for c in (
    _B.with_(name="stages3", ab_stages=3),
    _B.with_(name="stages4", ab_stages=4),
    _B.with_(name="tile128x256", tile_n=256),
    _B.with_(name="tile128x128x512", tile_k=512),
    _B.with_(name="tile128x128x128", tile_k=128),
    _B.with_(name="tma_epilogue", epilogue="tma"),
    _B.with_(name="producer_consumer", warp_spec="producer_consumer"),
    _B.with_(name="pingpong", warp_spec="pingpong"),
)}
# Diagnostics (wrong results by design; timed, never checked, never shipped).
ABLATIONS: dict[str, KernelConfig] = {c.name: c for c in (
    _B.with_(name="baseline_no_dequant", ablate="no_dequant"),
    _B.with_(name="baseline_no_mma", ablate="no_mma"),
)}
DEFAULT_SINGLE = "vec4_wg2_dec2"  # the fastest exact config measured so far; "baseline" stays selectable
DEFAULT_DUAL = "vec4_wg2_dec2_dual"

_compiled: dict = {}


def get_config(config, dual: bool) -> KernelConfig:
    from .sm90 import validate

    if isinstance(config, KernelConfig):
        cfg = config
    else:
        name = config or (DEFAULT_DUAL if dual else DEFAULT_SINGLE)
        table = {**CONFIGS, **SWEEP_CONFIGS, **ABLATIONS}
        if name not in table:
            raise ValueError(f"unknown cute-hopper config {name!r}; known: {', '.join(table)}")
        cfg = table[name]
    return validate(cfg.with_(dual=dual))


def _require_hopper(device: torch.device) -> None:
    if device.type != "cuda" or not torch.cuda.is_available():
        raise RuntimeError("cute-hopper needs a CUDA GPU with sm_90 (Hopper); the operands are on "
                           f"{device} and CUDA available={torch.cuda.is_available()}")
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) != (9, 0):
        raise RuntimeError(f"cute-hopper needs sm_90 (Hopper); found sm_{major}{minor} "
                           f"({torch.cuda.get_device_name(device)})")


def _cute(t: torch.Tensor, align: int = 16):
    from cutlass.cute.runtime import from_dlpack

    return from_dlpack(t, assumed_align=align).mark_layout_dynamic(leading_dim=t.dim() - 1)


def _compile(cfg: KernelConfig, args):
    """Compile once per (config, output dtype); tensors are passed with dynamic shapes."""
    import cutlass.cute as cute

    from .sm90 import GroupedNvfp4GemmSm90

    key = (cfg, args[6].element_type)
    if key not in _compiled:
        _compiled[key] = cute.compile(GroupedNvfp4GemmSm90(cfg), *args)
    return _compiled[key]


def prepare(a, b, b2, *, out_dtype=torch.float16, config=None) -> Runner:
    """Prepack the weights, build the tile table, compile (cached); the runner packs A and launches once."""
    import cuda.bindings.driver as cuda

    t0 = time.perf_counter()
    device = a[0].data.device
    _require_hopper(device)
    cfg = get_config(config, dual=b2 is not None)
    packed = pack_weights([b] if b2 is None else [b, b2], cfg.tile_n, cfg.tile_k)
    m = tuple(t.shape[0] for t in a)
    packer = ActivationPacker(m, packed.k_pad, cfg.tile_m, device)
    tiles = tile_table(m, packed.n, packed.k, packer.row_offsets, packed.n_pad, cfg.tile_m, cfg.tile_n,
                       cfg.tile_k, device)
    c_all = torch.empty((packer.rows, max(packed.n)), dtype=out_dtype, device=device)
    outputs = [c_all[o: o + mg, :ng] for o, mg, ng in zip(packer.row_offsets, m, packed.n)]
    alpha = torch.zeros((len(a), 2), dtype=torch.float32, device=device)
    w2 = 1 if b2 is not None else 0
    args = (_cute(packer.codes), _cute(packer.scales), _cute(packed.codes[0]), _cute(packed.scales[0]),
            _cute(packed.codes[w2]), _cute(packed.scales[w2]), _cute(c_all), _cute(tiles),
            _cute(alpha, 8))
    stream = cuda.CUstream(torch.cuda.current_stream(device).cuda_stream)
    kernel = _compile(cfg, (*args, stream)) if len(tiles) else None
    gs_b = packed.global_scales

    def run():
        act = packer(a)
        alpha[:, 0] = act.global_scales * gs_b[0]
        alpha[:, 1] = act.global_scales * gs_b[-1]
        if kernel is not None:
            kernel(*args, cuda.CUstream(torch.cuda.current_stream(device).cuda_stream))

    torch.cuda.synchronize(device)
    return Runner(run, outputs, prepare_s=time.perf_counter() - t0, held_bytes=packed.nbytes,
                  notes=f"weights prepacked once as NVFP4 ({packed.nbytes / 1e6:.1f} MB); config {cfg.name}",
                  info={"config": cfg.name, "tiles": len(tiles), **({"ablation": cfg.ablate} if cfg.ablate else {})})


# ---------------------------------------------------------------------------------------------
# Compile reports (no GPU needed)
# ---------------------------------------------------------------------------------------------
def fake_arguments(cfg: KernelConfig):
    """Fake tensors with symbolic sizes, as the kernel receives them at run time."""
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor

    def fake(dtype, shape, align=16):
        return make_fake_compact_tensor(dtype, shape, stride_order=(1, 0), assumed_align=align)

    s = cute.sym_int
    rows_a, rows_b = s(), s()
    kb, ks = s(divisibility=cfg.tile_k // 2), s(divisibility=cfg.tile_k // 16)
    u8 = cutlass.Uint8
    b, sfb = fake(u8, (rows_b, kb)), fake(u8, (rows_b, ks))
    return (fake(u8, (rows_a, kb)), fake(u8, (rows_a, ks)), b, sfb, b, sfb,
            fake(cutlass.Float16, (s(), s())), fake(cutlass.Int32, (s(), 8)),
            fake(cutlass.Float32, (s(), 2), 8), cuda.CUstream(0))


def compile_report(cfg: KernelConfig, arch: str = "sm_90a") -> dict:
    """Compile ``cfg`` for sm_90a with fake tensors; PTX instruction counts, ptxas resources, smem plan."""
    from .compiling import compile_offline
    from .sm90 import GroupedNvfp4GemmSm90, acc_registers, smem_plan, validate

    if arch != "sm_90a":
        raise ValueError(f"the Hopper kernel compiles for sm_90a, not {arch}")
    validate(cfg)
    t0 = time.perf_counter()
    art = compile_offline(GroupedNvfp4GemmSm90(cfg), *fake_arguments(cfg), arch=arch)
    plan = smem_plan(cfg)
    res = {k: v for k, v in art.ptxas.items() if k != "ptxas_log"}
    return {
        "compile_s": round(time.perf_counter() - t0, 2), "threads": 128 * (cfg.warpgroups + cfg.decode_warpgroups),
        "smem_bytes": plan["total"], "smem_per_stage": plan["packed_a"] // cfg.ab_stages
        + plan["packed_b"] // cfg.ab_stages + plan["scales"] // cfg.ab_stages,
        "acc_registers": acc_registers(cfg), "ctas_per_sm_by_smem": 233472 // (plan["total"] + 1024),
        **res, **art.instructions, "ptx_path": art.ptx_path,
    }
