"""What every Hopper (sm_90a) family shares outside its kernel: the shared-memory limit, the decode's post-scale,
the device check a runner makes before a launch, and the torch → CuTe tensor view its launches take."""
from __future__ import annotations

import torch

from .decode_ptx import OPERAND_EXPONENT

SMEM_LIMIT = 232448  # bytes of shared memory one CTA may use on sm_90 (227 KB)
POST_SCALE = 2.0 ** (-2 * OPERAND_EXPONENT)  # the decode's operands are value × 2^-7 each; the product carries 2^-14


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
