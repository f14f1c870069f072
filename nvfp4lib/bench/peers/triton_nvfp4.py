"""``backend="triton"``: a Triton grouped NVFP4 GEMM that reads the packed codes and E4M3 scales directly.

Triton has no FP4 MMA on Hopper (``tl.dot_scaled`` with e2m1 needs Blackwell; NVFP4's E4M3 scales per 16 are not its
input format anyway), so each program decodes its activation and weight tiles in registers and runs ``tl.dot`` with
fp32 accumulation. Kept as lean as a plain in-kernel-decode kernel:

- **Decode**: each code's bits placed in an fp16 (value × 2^-14) by 11 PTX instructions per 8 codes, then one
  fp16x2 multiply by E4M3 scale × 2^7 per pair (:mod:`.triton_groups`; exact, checked exhaustively; a portable
  Triton form of the same bits runs in the interpreter). No fp32 round trip, no bf16 subnormal fix-up. The fp32
  accumulator is multiplied by gs_A · gs_B · 2^14 in the epilogue (the global scales stay fp32, as the reference
  has them).
- **One launch per call, nothing else**: the activations are read where they are, through a per-group address
  table built at prepare (:func:`.triton_groups.group_table`); rows past a group's M are clamped loads, never
  stored, so there is no padding, no packing copy and no global-scale product on the host side of the call.
- **Weights** stacked once at prepare (:func:`nvfp4lib.kernels.common.packing.stack_weights`: N and K zero-padded to the
  tile), so weight loads need no masks; activation loads are masked along K only where some K is not a multiple
  of ``BLOCK_K``.
- **Tile order**: within a group, the M tiles of one N tile are adjacent, so CTAs that read the same weight tile
  (the bytes that dominate) run together and share it through L2.
- **Autotuned at prepare** over block sizes, warps, stages and ``swap`` (weights on the MMA's M side, tokens on
  its N side: less padding for small groups): every candidate is timed on the problem at hand and the fastest
  is kept, cached per problem key for the process. A steady-state call never times anything.
"""
from __future__ import annotations

import time
from typing import NamedTuple

import torch

from ...kernels.common.packing import stack_weights
from ...runner import Runner
from .triton_groups import OPERAND_EXPONENT, addresses, group_table, require_triton_cuda

__all__ = ["Candidate", "CANDIDATES", "prepare", "tile_list", "probe_dot_scaled"]


class Candidate(NamedTuple):
    block_m: int  # tokens per tile
    block_n: int  # weight rows per tile
    block_k: int
    warps: int
    stages: int
    swap: bool = False  # acc[BLOCK_N, BLOCK_M] = W · Aᵀ: weights on the MMA's M side

    @property
    def name(self) -> str:
        return (f"{'s' if self.swap else ''}m{self.block_m}n{self.block_n}k{self.block_k}"
                f"w{self.warps}s{self.stages}")


# Timed at prepare (the first one alone with autotune=False). Chosen from a wider sweep on the H100 (2026-11-25):
# m64n128 won S1/S2, swapped m128n128 S3/S4, m64n64 the dual forms; the others are each within a few percent of
# the best on some benchmark shape. Block K 256 and 128x256 tiles were never close (register-bound).
CANDIDATES = {
    False: (Candidate(64, 128, 128, 4, 3), Candidate(128, 128, 128, 8, 3), Candidate(64, 64, 128, 4, 3),
            Candidate(128, 64, 128, 4, 3), Candidate(128, 128, 128, 8, 3, True), Candidate(64, 128, 128, 4, 4, True)),
    True: (Candidate(64, 64, 128, 4, 3), Candidate(128, 128, 128, 8, 3), Candidate(64, 128, 128, 4, 3),
           Candidate(128, 64, 128, 4, 3), Candidate(128, 128, 128, 8, 3, True), Candidate(128, 128, 64, 8, 3)),
}

_kernel = None
DECODE_ASM = True  # the bit placement as inline PTX on the GPU (False: the portable Triton form there too)
_chosen: dict = {}  # problem key -> Candidate (the process's autotune cache)


def tile_list(m, n, block_m: int, block_n: int, device) -> torch.Tensor:
    """int32 [tiles, 4] = (group, m0, n0, 0): every output tile of every non-empty group; within a group the M
    tiles of one N tile are adjacent (they share the weight tile through L2)."""
    rows = [(g, m0, n0, 0) for g, (mg, ng) in enumerate(zip(m, n)) if mg
            for n0 in range(0, ng, block_n) for m0 in range(0, mg, block_m)]
    return torch.tensor(rows or [(0, 0, 0, 0)], dtype=torch.int32, device=device)[: len(rows)]


def _alignment(values) -> int:
    """The largest power of two up to 16 that divides every value (byte addresses and strides)."""
    al = 16
    while al > 1 and any(v % al for v in values):
        al //= 2
    return al


def _alignments(a) -> tuple[int, int]:
    """(codes, scales) alignment of the activations' addresses and row strides: the kernel's loads are as wide as
    these allow (a 16-byte load where rows of codes are 16-byte aligned)."""
    live = [t for t in a if t.shape[0]]
    return (_alignment([v for t in live for v in (t.data.data_ptr(), t.data.stride(0))]),
            _alignment([v for t in live for v in (t.scales.data_ptr(), t.scales.stride(0))]))


def _setup(a, b, b2, out_dtype, cand: Candidate):
    device = a[0].data.device
    packed = stack_weights([b] if b2 is None else [b, b2], cand.block_n, cand.block_k)
    m = tuple(int(t.shape[0]) for t in a)
    offs = [0, *torch.tensor(m).cumsum(0).tolist()]
    groups = group_table(a, packed.n, offs[:-1], device)
    tiles = tile_list(m, packed.n, cand.block_m, cand.block_n, device)
    c_all = torch.empty((max(offs[-1], 1), max(packed.n)), dtype=out_dtype, device=device)
    outputs = [c_all[o: o + mg, :ng] for o, mg, ng in zip(offs, m, packed.n)]
    gs = packed.global_scales
    gsb = torch.stack([gs[0], gs[-1]], dim=1).contiguous()
    w2 = 1 if b2 is not None else 0
    even_k = all(kg % cand.block_k == 0 for kg in packed.k)
    grid = (len(tiles),)
    asm = device.type == "cuda" and DECODE_ASM  # the interpreter (CPU) runs the portable form of the decode
    state = {"seen": addresses(a), "groups": groups, "align": _alignments(a)}

    def run():
        if addresses(a) != state["seen"]:  # the caller rebound a group's tensors: read the new ones (eager only)
            state.update(seen=addresses(a), groups=group_table(a, packed.n, offs[:-1], device), align=_alignments(a))
        if grid[0]:
            _kernel[grid](state["groups"], tiles, packed.codes[0], packed.scales[0], packed.codes[w2],
                          packed.scales[w2], gsb, c_all, packed.codes[0].stride(0), packed.scales[0].stride(0),
                          c_all.stride(0), packed.n_pad, 2.0 ** (-2 * OPERAND_EXPONENT), DUAL=b2 is not None,
                          SWAP=cand.swap, EVEN_K=even_k, ALIGN_A=state["align"][0], ALIGN_SFA=state["align"][1],
                          BLOCK_M=cand.block_m, BLOCK_N=cand.block_n, BLOCK_K=cand.block_k, ASM=asm,
                          num_warps=cand.warps, num_stages=cand.stages)

    return run, outputs, packed.nbytes, (groups, tiles, packed, gsb, c_all)


def _problem_key(a, b, b2, out_dtype):
    dev = a[0].data.device
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else str(dev)
    return (name, b2 is not None, str(out_dtype), tuple(int(t.shape[0]) for t in a),
            tuple(tuple(t.shape) for t in b))


def _time_ms(run, device, iters: int = 5) -> float:
    run()  # compile, warm
    torch.cuda.synchronize(device)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters):
        run()
    e.record()
    torch.cuda.synchronize(device)
    return s.elapsed_time(e) / iters


def prepare(a, b, b2, *, out_dtype=torch.float16, candidates=None, autotune: bool = True) -> Runner:
    global _kernel
    device = a[0].data.device
    require_triton_cuda("the triton backend", device)
    if _kernel is None:
        from .triton_kernels import grouped_nvfp4

        _kernel = grouped_nvfp4
    t0 = time.perf_counter()
    cands = list(candidates or CANDIDATES[b2 is not None])
    key = _problem_key(a, b, b2, out_dtype)
    how = "untuned"
    if not autotune or device.type != "cuda":
        cands = cands[:1]
    elif candidates is None and key in _chosen:
        cands, how = [_chosen[key]], "chosen earlier for this problem"
    elif len(cands) > 1:
        how = f"fastest of {len(cands)} timed at prepare"
    timed = {}
    best = None
    for cand in cands:
        run, outputs, held, keep = _setup(a, b, b2, out_dtype, cand)
        if len(cands) == 1:
            best = (0.0, cand, run, outputs, held, keep)
            break
        try:
            ms = _time_ms(run, device)
        except Exception as e:  # a candidate this GPU cannot run (e.g. out of shared memory) is skipped
            timed[cand.name] = f"{type(e).__name__}"
            continue
        timed[cand.name] = round(ms * 1e3, 1)
        if best is None or ms < best[0]:
            best = (ms, cand, run, outputs, held, keep)
    if best is None:
        raise RuntimeError(f"no Triton candidate ran here: {timed}")
    _, cand, run, outputs, held, keep = best
    asm = device.type == "cuda" and DECODE_ASM
    if len(cands) > 1:
        _chosen[key] = cand
    return Runner(run, outputs, prepare_s=time.perf_counter() - t0, held_bytes=held, keepalive=keep,
                  notes=f"Triton, exact fp16 in-register decode ({'PTX' if asm else 'portable'} bit placement + "
                        "fp16x2 scale multiply) + tl.dot, one launch, activations read in place; "
                        f"{cand.name} ({how})",
                  info={"block_m": cand.block_m, "block_n": cand.block_n, "block_k": cand.block_k,
                        "warps": cand.warps, "stages": cand.stages, "swap": cand.swap, "config": cand.name,
                        "timed_us": timed})


def probe_dot_scaled(device="cuda") -> dict:
    """Does this Triton's ``tl.dot_scaled`` take e2m1 operands here, and with which scale format?

    NVFP4 needs E4M3 scales per 16 elements; ``tl.dot_scaled`` is specified for MX formats (E8M0 scales per 32).
    We try e2m1 × e2m1 with E8M0 scales on a 128×128×128 problem and report what happens."""
    info = {"probe": "triton tl.dot_scaled e2m1", "supported": False, "error": ""}
    try:
        import triton
        import triton.language as tl

        info["triton"] = triton.__version__

        @triton.jit
        def k(a_ptr, as_ptr, b_ptr, bs_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
            rm = tl.arange(0, M)
            rn = tl.arange(0, N)
            rk = tl.arange(0, K // 2)
            rs = tl.arange(0, K // 32)
            a = tl.load(a_ptr + rm[:, None] * (K // 2) + rk[None, :])
            b = tl.load(b_ptr + rk[:, None] * N + rn[None, :])
            sa = tl.load(as_ptr + rm[:, None] * (K // 32) + rs[None, :])
            sb = tl.load(bs_ptr + rn[:, None] * (K // 32) + rs[None, :])
            c = tl.dot_scaled(a, sa, "e2m1", b, sb, "e2m1")
            tl.store(c_ptr + rm[:, None] * N + rn[None, :], c)

        m = n = kk = 128
        a = torch.randint(0, 256, (m, kk // 2), dtype=torch.uint8, device=device)
        b = torch.randint(0, 256, (kk // 2, n), dtype=torch.uint8, device=device)
        sa = torch.full((m, kk // 32), 127, dtype=torch.uint8, device=device)
        sb = torch.full((n, kk // 32), 127, dtype=torch.uint8, device=device)
        c = torch.empty((m, n), dtype=torch.float32, device=device)
        k[(1,)](a, sa, b, sb, c, M=m, N=n, K=kk)
        torch.cuda.synchronize()
        info["supported"] = True
        info["note"] = "ran with E8M0 scales per 32 (MXFP4); NVFP4's E4M3 scales per 16 are not its input format"
    except Exception as e:  # the refusal is the finding
        info["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    return info
