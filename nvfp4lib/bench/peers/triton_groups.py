"""What the Triton peers share: the exact E2M1 × E4M3 → fp16 decode as a Triton function, and the per-group table
through which one launch reads every group's activations where they already are (no per-call packing).

**Decode** (``decode_bytes`` in :mod:`.triton_kernels`): for a byte holding codes
e_2i (low nibble) and e_2i+1 (high nibble), the code's sign goes to fp16 bit 15 and its magnitude bits e1 e0 m to
bits 11..9: that fp16 is the E2M1 value × 2^-14 (code 1 is the fp16 subnormal 2^-15, which fp16 arithmetic keeps).
One fp16 multiply by (E4M3 scale × 2^7) — the E4M3 → fp16 conversion and the × 2^7 are exact, ≤ 448·128 < 65504 —
gives value × scale × 2^-7, exactly: every such product has at most 6 significant bits and lies in
[2^-17, 21], where fp16 (subnormals included, spacing 2^-24) holds it. :func:`check_decode_exhaustively` checks all
16 codes × 254 finite scales. On the GPU the bit placement is inline PTX (:data:`DECODE_PTX`, 11 instructions per
8 codes); the multiply is an fp16x2 one: no fp32 round trip.
The GEMM multiplies its fp32 accumulator by gs_A · gs_B · 2^14 to undo the two 2^-7.

**Group table** (:func:`group_table`): int64 ``[G, GROUP_COLUMNS]`` on the device, built once at prepare: each
activation's code, scale and global-scale addresses, its row strides, M, K, N and the first row of its output.
A kernel casts the addresses back to pointers; a CUDA graph replays raw addresses too, so the contract is the same:
the runner reads the tensors it was prepared with (:func:`same_addresses` lets an eager call notice a rebinding).
"""
from __future__ import annotations

import torch

__all__ = ["GROUP_COLUMNS", "OPERAND_EXPONENT", "DECODE_PTX", "emulate_ptx", "group_table", "addresses",
           "same_addresses", "decode_reference",
           "check_decode_exhaustively", "require_triton_cuda"]

GROUP_COLUMNS = ("codes", "scales", "global_scale", "codes_stride", "scales_stride", "m", "k", "n", "out_row0",
                 "pad")
OPERAND_EXPONENT = -7  # each decoded operand is value × scale × 2^-7


def require_triton_cuda(what: str, device) -> None:
    """Refuse clearly where the Triton peers cannot run (the interpreter, TRITON_INTERPRET=1, runs on the CPU)."""
    import os

    interp = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if torch.device(device).type != "cuda" and not interp:
        raise RuntimeError(f"{what} needs a CUDA GPU; the operands are on {device} (set TRITON_INTERPRET=1 to run "
                           "the Triton interpreter on the CPU)")
    try:
        import triton  # noqa: F401
    except ImportError as e:
        raise RuntimeError(f"{what} needs the triton package, which is not installed") from e


def addresses(a) -> tuple[int, ...]:
    return tuple(p for t in a for p in (t.data.data_ptr(), t.scales.data_ptr(), t.global_scale.data_ptr()))


def same_addresses(a, seen: tuple[int, ...]) -> bool:
    return addresses(a) == seen


def group_table(a, n, out_rows, device) -> torch.Tensor:
    """int64 ``[G, len(GROUP_COLUMNS)]``: one row per activation (see the module docstring)."""
    rows = []
    for t, ng, r0 in zip(a, n, out_rows):
        if t.data.stride(-1) != 1 or t.scales.stride(-1) != 1:
            raise ValueError("the Triton peers read activations in place: their codes and scales must have unit "
                             f"stride along K, got strides {t.data.stride()} and {t.scales.stride()}")
        rows.append((t.data.data_ptr(), t.scales.data_ptr(), t.global_scale.data_ptr(), t.data.stride(0),
                     t.scales.stride(0), int(t.shape[0]), int(t.shape[1]), int(ng), int(r0), 0))
    return torch.tensor(rows, dtype=torch.int64).to(device)


# Eight codes (one 32-bit word w of four bytes) -> four fp16x2 words: ($0, $1) the low-nibble elements of bytes
# (0, 1) and (2, 3), ($2, $3) the high-nibble ones. lc = (w << 4 & SIGN) | (w << 1 & MAG): per byte, the low code as
# an fp16 high byte (sign at bit 7, e1 e0 m at bits 3..1); hc the same for the high code from w and w >> 3; prmt
# moves byte j into an fp16's high byte and zeroes the low one. 11 instructions for 8 elements; :func:`emulate_ptx`
# replays them on the CPU (tests compare it with the portable form, :func:`decode_reference`).
DECODE_PTX = """{
.reg .b32 a, b, lc, hc, z;
mov.b32 z, 0;
shl.b32 a, $4, 4;
shl.b32 b, $4, 1;
and.b32 b, b, 0x0E0E0E0E;
lop3.b32 lc, a, 0x80808080, b, 0xEA;
shr.u32 b, $4, 3;
and.b32 b, b, 0x0E0E0E0E;
lop3.b32 hc, $4, 0x80808080, b, 0xEA;
prmt.b32 $0, lc, z, 0x1404;
prmt.b32 $1, lc, z, 0x3424;
prmt.b32 $2, hc, z, 0x1404;
prmt.b32 $3, hc, z, 0x3424;
}"""


def _prmt(a: int, b: int, sel: int) -> int:
    by = [(a >> 8 * i) & 0xFF for i in range(4)] + [(b >> 8 * i) & 0xFF for i in range(4)]
    return sum(by[(sel >> 4 * j) & 7] << 8 * j for j in range(4))


def emulate_ptx(w: int) -> tuple[int, int, int, int]:
    """:data:`DECODE_PTX` on one 32-bit word, instruction by instruction (lop3 0xEA is (a & b) | c)."""
    m32 = 0xFFFFFFFF
    lc = ((w << 4) & m32 & 0x80808080) | ((w << 1) & m32 & 0x0E0E0E0E)
    hc = (w & 0x80808080) | ((w >> 3) & 0x0E0E0E0E)
    return _prmt(lc, 0, 0x1404), _prmt(lc, 0, 0x3424), _prmt(hc, 0, 0x1404), _prmt(hc, 0, 0x3424)


def decode_reference(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The decode's arithmetic in torch fp16 (CPU or GPU): [..., K] interleaved, value × scale × 2^-7."""
    c = codes.to(torch.int32)
    lo = (((c & 0x08) << 12) | ((c & 0x07) << 9)).to(torch.int16).view(torch.float16)
    hi = (((c & 0x80) << 8) | ((c & 0x70) << 5)).to(torch.int16).view(torch.float16)
    s = (scales.view(torch.float8_e4m3fn).to(torch.float16) * 128.0).repeat_interleave(8, dim=-1)
    return torch.stack([lo * s, hi * s], dim=-1).flatten(-2)


def check_decode_exhaustively() -> int:
    """Every code byte (two codes) × every finite E4M3 scale byte: the fp16 decode equals value × scale × 2^-7
    exactly. Returns the number of (code, scale) pairs checked; raises AssertionError on the first mismatch."""
    from ...formats import E2M1_VALUES

    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    sbytes = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    got = decode_reference(codes[None, :].expand(len(sbytes), 256).reshape(-1, 8),
                           sbytes.repeat_interleave(32)[:, None]).double()
    e2m1 = torch.tensor(E2M1_VALUES, dtype=torch.float64)
    want = torch.stack([e2m1[codes.long() & 15], e2m1[codes.long() >> 4]], -1).flatten()  # [512]
    want = want[None, :] * sbytes.view(torch.float8_e4m3fn).double()[:, None] * 2.0 ** OPERAND_EXPONENT
    bad = (got.reshape(len(sbytes), 512) != want) & ~(got.reshape(len(sbytes), 512).isnan() & want.isnan())
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise AssertionError(f"fp16 decode is not exact for scale byte {int(sbytes[i]):#04x}")
    return 16 * len(sbytes)

