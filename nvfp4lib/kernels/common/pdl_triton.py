"""The Triton side of :mod:`.pdl`: what a chained kernel runs first."""
from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["chain"]


@triton.jit
def chain(GDC: tl.constexpr):
    """With ``GDC`` (a kernel launched chained, :func:`.pdl.flag`): wait until the kernel before has finished and its
    writes are visible, then let the next kernel launch. Call it before the kernel's first memory access."""
    if GDC:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
