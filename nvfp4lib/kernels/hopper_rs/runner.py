"""The host side of the register-decode kernel (:mod:`.kernel`): token tiles planned per group, the tile table
and the activation row table, ``prepare`` (prepack once, compile cached, two launches per call: the activation
prologue and the GEMM), and the compile reports. The kernel classes are built on first use."""
from __future__ import annotations

import time

import torch

from ...runner import Runner
from ..common.packing import WIDE_TILE_COLUMNS, check_scales_finite, padded_row_offsets, round_up, stack_weights
from ..common.sm90 import POST_SCALE, _cute, _require_hopper
from .config import (
    NWG,
    ROW_BYTES,
    THREADS,
    RSConfig,
    acc_registers,
    blocks_per_warpgroup,
    smem_plan,
    token_step,
    validate,
)
from .layout import prepack_weights
from .ops import ACT_SMEM, GROUP_PARAMS, PARAM_GROUPS

_compiled: dict = {}


def _kernel_classes():
    from .kernel import _kernel_classes

    return _kernel_classes()


def _compile_cached(key, make, args):
    import cutlass.cute as cute

    if key not in _compiled:
        _compiled[key] = cute.compile(make(), *args)
    return _compiled[key]


def split_tokens(mg: int, parts: int, step: int) -> list[tuple[int, int]]:
    """(first token, tokens) of ``parts`` near-equal tiles of a group of ``mg`` tokens, each but the last a
    multiple of ``step`` wide (fewer tiles if the rounding leaves some empty)."""
    size = round_up(-(-mg // parts), step)
    return [(m0, min(size, mg - m0)) for m0 in range(0, mg, size)]


def makespan(costs: list[float], machines: int) -> float:
    """Longest-processing-time-first schedule of ``costs`` on ``machines``: the finish time of the last."""
    import heapq

    load = [0.0] * min(machines, max(1, len(costs)))
    for c in sorted(costs, reverse=True):
        heapq.heapreplace(load, load[0] + c)
    return max(load)


def plan_token_tiles(m, k_tiles, n_blocks, tile_n: int, step: int, sms: int,
                     overhead: int = RSConfig.cta_overhead_tokens) -> list[list[tuple[int, int]]]:
    """Token tiles per group: start from the fewest tiles of at most ``tile_n`` tokens, then keep splitting the
    group with the widest tiles while the estimated makespan (LPT over ``sms`` SMs, one CTA each, a CTA's cost
    ``k_tiles × (tokens rounded to step + overhead)``, ``overhead`` being the config's ``cta_overhead_tokens``)
    improves: small problems get more, narrower CTAs to fill the GPU; large ones keep wide tiles (each weight decoded
    once per tile)."""
    parts = [-(-mg // tile_n) if mg else 0 for mg in m]

    def tiles(p):
        return [split_tokens(mg, pg, step) if pg else [] for mg, pg in zip(m, p)]

    def cost(t):
        return makespan([kt * (round_up(w, step) + overhead)
                         for tg, kt, nb in zip(t, k_tiles, n_blocks) for _, w in tg for _ in range(nb)], sms)

    cur = tiles(parts)
    best, best_cost = cur, cost(cur)
    for _ in range(4 * len(m) + 8):
        widths = [max((w for _, w in tg), default=0) for tg in cur]
        g = max(range(len(m)), key=lambda i: widths[i])
        if widths[g] <= step:
            break
        parts[g] += 1
        cur = tiles(parts)
        c = cost(cur)
        if c < best_cost:
            best, best_cost = cur, c
    return best


def swap_tile_table(m, n, k, row_offsets, n_pad: int, cfg: RSConfig, sms: int, device) -> torch.Tensor:
    """int32 [tiles, 10] (:data:`WIDE_TILE_COLUMNS`; column ``pad`` holds the wgmma N variant) for the swap-AB kernel,
    widest tiles first so the hardware's in-order CTA dispatch approximates a longest-first schedule."""
    step = token_step(cfg)
    k_tiles = [-(-kg // cfg.tile_k) for kg in k]
    n_blocks = [-(-ng // cfg.tile_m) for ng in n]
    plan = plan_token_tiles(m, k_tiles, n_blocks, cfg.tile_n, step, sms, cfg.cta_overhead_tokens)
    rows = []
    for g, tg in enumerate(plan):
        for n0 in range(0, n[g], cfg.tile_m):
            for m0, w in tg:
                r0 = row_offsets[g] + m0
                rows.append((g, r0, w, n0, min(cfg.tile_m, n[g] - n0), g * n_pad + n0, k_tiles[g],
                             round_up(w, step) // step - 1, 0, r0))
    rows.sort(key=lambda r: (-r[7] * r[6], r[0], r[3], r[1]))
    if not rows:
        return torch.zeros((0, len(WIDE_TILE_COLUMNS)), dtype=torch.int32, device=device)
    return torch.tensor(rows, dtype=torch.int32, device=device)


def activation_rows(a, row_offsets, rows: int, device) -> torch.Tensor:
    """int64 [rows, 3] (:data:`ROW_COLUMNS`): where each row of the padded activation buffer comes from.

    The prologue reads the caller's tensors in place (a runner captures ``a``; a CUDA graph replays the
    addresses), so each group's codes and scales must be row-major with 8-byte aligned code rows."""
    table = torch.zeros((rows, 3), dtype=torch.int64)
    for g, (t, o) in enumerate(zip(a, row_offsets)):
        mg = int(t.shape[0])
        if mg == 0:
            continue
        codes, scales = t.data, t.scales
        if codes.stride(-1) != 1 or scales.stride(-1) != 1 or codes.data_ptr() % 8 or codes.stride(0) % 8:
            raise ValueError(f"a[{g}]: cute-hopper swap_ab reads activations in place and needs row-major codes and "
                             f"scales with 8-byte aligned code rows (strides {tuple(codes.stride())}, "
                             f"{tuple(scales.stride())}); pass .contiguous() tensors")
        r = torch.arange(mg, dtype=torch.int64)
        table[o: o + mg, 0] = codes.data_ptr() + r * codes.stride(0)
        table[o: o + mg, 1] = scales.data_ptr() + r * scales.stride(0)
        table[o: o + mg, 2] = int(t.shape[1]) // 16
    return table.to(device)


def group_parameters(a, row_offsets, param_groups: int = PARAM_GROUPS) -> tuple:
    """The prologue's kernel parameters (:data:`GROUP_PARAMS` per group, as cutlass.Int64), or () past
    ``param_groups`` groups (a config's ``param_groups``; the prologue then reads the row table)."""
    import cutlass

    if len(a) > param_groups:
        return ()
    vals = []
    for t, o in zip(a, row_offsets):
        vals += [t.data.data_ptr(), t.scales.data_ptr(), t.data.stride(0) * t.data.element_size(),
                 t.scales.stride(0) * t.scales.element_size(), o, int(t.shape[0]), int(t.shape[1]) // 16]
    return tuple(cutlass.Int64(v) for v in vals)


def prepare(a, b, b2, cfg: RSConfig, *, out_dtype=torch.float16) -> Runner:
    """Prepack the weights (once), compile (cached); each call is two launches, the activation prologue (decode +
    global scales) and the GEMM."""
    t0 = time.perf_counter()
    validate(cfg)
    device = a[0].data.device
    _require_hopper(device)
    import cuda.bindings.driver as cuda

    pro_cls, gemm_cls = _kernel_classes()
    check_scales_finite(a, "a")
    blocks = blocks_per_warpgroup(cfg)
    weights = stack_weights([b] if b2 is None else [b, b2], cfg.tile_m, cfg.tile_k)
    packed = prepack_weights(list(zip(weights.codes, weights.scales)), NWG, blocks)
    m = tuple(int(t.shape[0]) for t in a)
    offs, rows = padded_row_offsets(m, token_step(cfg))  # each group starts at a TMA box (token_step rows)
    row_table = activation_rows(a, offs, rows, device)
    x16 = torch.zeros((rows, weights.k_pad), dtype=torch.float16, device=device)
    tiles = swap_tile_table(m, weights.n, weights.k, offs, weights.n_pad, cfg,
                            torch.cuda.get_device_properties(device).multi_processor_count, device)
    c_all = torch.empty((rows, weights.n_pad), dtype=out_dtype, device=device)
    outputs = [c_all[o: o + mg, :ng] for o, mg, ng in zip(offs, m, weights.n)]
    gs_a = torch.tensor([t.global_scale.data_ptr() for t in a], dtype=torch.int64).to(device)
    gs_b = torch.stack([weights.global_scales[0], weights.global_scales[-1]], dim=1) * POST_SCALE
    alpha = torch.zeros((len(a), 2), dtype=torch.float32, device=device)

    def stream():
        return cuda.CUstream(torch.cuda.current_stream(device).cuda_stream)

    groups = group_parameters(a, offs, cfg.param_groups)
    pro_args = (_cute(row_table, 8), _cute(x16), _cute(gs_a, 8), _cute(gs_b, 8), _cute(alpha, 8), groups)
    prologue = _compile_cached(("prologue", cfg.prologue_smem, len(groups)), lambda: pro_cls(cfg.prologue_smem),
                               (*pro_args, stream()))
    gemm_args = (_cute(packed.view(-1, ROW_BYTES)), _cute(x16), _cute(c_all), _cute(tiles), _cute(alpha, 8),
                 _cute(gs_a, 8))
    gemm = (_compile_cached((cfg, str(out_dtype)), lambda: gemm_cls(cfg), (*gemm_args, stream()))
            if len(tiles) else None)

    def run():
        prologue(*pro_args, stream())
        if gemm is not None:
            gemm(*gemm_args, stream())

    torch.cuda.synchronize(device)
    return Runner(run, outputs, prepare_s=time.perf_counter() - t0, held_bytes=packed.numel(),
                  notes=f"weights prepacked once for the register decode ({packed.numel() / 1e6:.1f} MB); "
                        f"config {cfg.name}",
                  info={"config": cfg.name, "tiles": len(tiles), "split_k": 1},
                  keepalive=(a, packed, row_table, x16, tiles, c_all, gs_a, gs_b, alpha))


# ---------------------------------------------------------------------------------------------
# Compile reports (no GPU needed)
# ---------------------------------------------------------------------------------------------
def fake_arguments(cfg: RSConfig):
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor

    def fake(dtype, shape, align=16):
        return make_fake_compact_tensor(dtype, shape, stride_order=(1, 0), assumed_align=align)

    s = cute.sym_int
    groups = s()
    x = fake(cutlass.Float16, (s(), s(divisibility=cfg.tile_k)))
    return (fake(cutlass.Uint8, (s(), ROW_BYTES)), x, fake(cutlass.Float16, (s(), s(divisibility=8))),
            fake(cutlass.Int32, (s(), len(WIDE_TILE_COLUMNS))), fake(cutlass.Float32, (groups, 2), 8),
            make_fake_compact_tensor(cutlass.Int64, (groups,), assumed_align=8), cuda.CUstream(0))


def fake_prologue_arguments(param_groups: int = 0):
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor

    s = cute.sym_int
    groups = s()
    return (make_fake_compact_tensor(cutlass.Int64, (s(), 3), stride_order=(1, 0), assumed_align=8),
            make_fake_compact_tensor(cutlass.Float16, (s(), s(divisibility=64)), stride_order=(1, 0),
                                     assumed_align=16),
            make_fake_compact_tensor(cutlass.Int64, (groups,), assumed_align=8),
            make_fake_compact_tensor(cutlass.Float32, (groups, 2), stride_order=(1, 0), assumed_align=8),
            make_fake_compact_tensor(cutlass.Float32, (groups, 2), stride_order=(1, 0), assumed_align=8),
            tuple(cutlass.Int64(0) for _ in range(len(GROUP_PARAMS) * param_groups)), cuda.CUstream(0))


def compile_report(cfg: RSConfig, dump_dir: str | None = None) -> dict:
    """Compile ``cfg`` (and the activation prologue) for sm_90a with fake tensors: PTX instruction counts, ptxas
    resources, the smem plan. No GPU needed."""
    from ..common.compiling import compile_offline, count_instructions

    validate(cfg)
    t0 = time.perf_counter()
    art = compile_offline(kernel_for(cfg), *fake_arguments(cfg), arch="sm_90a", dump_dir=dump_dir)
    plan = smem_plan(cfg)
    log = art.ptxas.get("ptxas_log", "")
    return {
        **cfg.as_dict(), "compile_s": round(time.perf_counter() - t0, 2), "threads": THREADS,
        "math_warpgroups": NWG, "acc_registers": acc_registers(cfg), "smem_bytes": plan["total"],
        "smem_per_stage": plan["per_stage"], "ctas_per_sm_by_smem": 233472 // (plan["total"] + 1024),
        "wgmma_n_variants": cfg.tile_n // token_step(cfg),
        **{k: v for k, v in art.ptxas.items() if k != "ptxas_log"}, **art.instructions,
        **count_instructions(art.ptx, ("lop3.b32", "mul.rn.f16x2", "cvt.rn.f16x2.e4m3x2", "ld.shared.v4.b32",
                                       "ld.shared.v2.b32", "griddepcontrol.wait", "st.shared", "st.shared.b16",
                                       "st.shared.v4.b32", "fence.proxy.async", "ld.global.nc.v2.b32",
                                       "st.global.v4.b32", "st.global.b16", "bar.sync", "bar.arrive")),
        # ptxas serialises every wgmma when it cannot prove the register operand safe (C7513): a silent slowdown
        "wgmma_serialized": "C7513" in log, "ptx_path": art.ptx_path,
    }


def prologue_report(param_groups: int = 0, dump_dir: str | None = None, smem: int = ACT_SMEM) -> dict:
    """Compile the activation prologue for sm_90a with fake tensors (reading the row table, or with the parameters of
    ``param_groups`` groups; asking for ``smem`` bytes of shared memory): its PTX instruction counts and ptxas
    resources."""
    from ..common.compiling import compile_offline, count_instructions

    art = compile_offline(prologue_kernel(smem), *fake_prologue_arguments(param_groups), arch="sm_90a",
                          dump_dir=dump_dir)
    return {**{k: v for k, v in art.ptxas.items() if k != "ptxas_log"}, **art.instructions,
            "params": art.ptx.count(".param .u64"),
            **count_instructions(art.ptx, ("griddepcontrol.launch_dependents", "ld.global.nc.u64",
                                           "cvt.rn.f16x2.e4m3x2", "ld.global.nc.v2.b32", "st.global.v4.b32"))}


def kernel_for(cfg: RSConfig):
    return _kernel_classes()[1](cfg)


def prologue_kernel(smem: int = ACT_SMEM):
    return _kernel_classes()[0](smem)
