"""What every expert-parallel transport of :mod:`.ep` shares: the step's fixed sizes (:class:`EPShape`), what a
dispatch hands the experts (:class:`Dispatched`), and the :class:`Transport` interface itself."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

__all__ = ["EPShape", "Dispatched", "Transport", "joined"]


@dataclass(frozen=True)
class EPShape:
    """What a transport sizes its buffers by (all fixed before capture)."""

    world: int
    rank: int
    experts: int  # E, over the group
    top_k: int
    capacity: int  # tokens a rank sends per step, at most
    recv_capacity: int  # token copies a rank's experts take per step, at most
    row_bytes: int  # one token's payload (W4A4: codes + block scales; W4A16: bf16)
    hidden: int
    device: torch.device
    parts: tuple[int, ...] = ()  # the payload's parts, bytes each (W4A4: codes H/2, block scales H/16); () one part

    @property
    def local_experts(self) -> int:
        return self.experts // self.world


class Dispatched(NamedTuple):
    rows: Any  # uint8 [recv_capacity, row_bytes]: the received copies grouped by local expert (or its parts: a tuple)
    offsets: torch.Tensor  # int32 [E/W + 1]: local expert e owns rows offsets[e] .. offsets[e+1]
    dropped: torch.Tensor  # int32 [1]: copies of the group's step that did not fit a rank's recv_capacity
    state: Any  # the transport's own, for combine
    global_scale: Any = None  # W4A4 rows the transport quantized itself (dispatch's ``quantize``): their global scale


class Transport:
    """Moves a step's token rows to their experts' owners and the results back; see the module doc. Subclasses set
    ``name``, ``rank``, ``world``."""

    name = "?"
    rank = 0
    world = 1

    def setup(self, shape: EPShape) -> None:
        """Allocate the step's buffers (collective on some transports: every rank calls it, in the same order)."""
        raise NotImplementedError

    def all_max(self, x: torch.Tensor, use: int) -> torch.Tensor:
        """The max over the group of a float32 ``[1]`` (``use``: 0 or 1, the step's two calls, each its own buffer)."""
        raise NotImplementedError

    def all_max_(self, x: torch.Tensor, use: int) -> torch.Tensor:
        """:meth:`all_max` in place (``x`` float32 ``[1]``): what the quantizer's ``amax_reduce`` calls."""
        return x.copy_(self.all_max(x, use))

    # whether dispatch takes ``quantize``: every rank receives every token (the all-gather), so the W4A4 global scale
    # of the whole batch can be taken from the received bf16 rows without a collective
    gathers_all = False

    def dispatch(self, payload, topk_ids: torch.Tensor, topk_weights: torch.Tensor, quantize=None) -> Dispatched:
        """This rank's ``T`` tokens (``payload``: uint8 ``[T, row_bytes]``, or a tuple of uint8 ``[T, ·]`` parts that
        lie side by side in a row, e.g. W4A4's codes and block scales) to the owners of their experts. ``quantize``
        (where :attr:`gathers_all`; ``payload`` then bf16 rows): ``quantize(x, index) -> (codes, scales, g)``, the
        rows ``x[index]`` quantized with the global scale of all of ``x`` (every rank's tokens, bf16 ``[W·capacity,
        H]``, padding rows zero), applied to the received rows: ``rows`` are then (codes, scale bytes) and
        ``global_scale`` is g."""
        raise NotImplementedError

    def combine(self, y: torch.Tensor, d: Dispatched, out_dtype: torch.dtype) -> torch.Tensor:
        """``y [recv_capacity, H]`` (the experts' rows, in ``d.rows``' order) -> ``[T, H]`` of ``out_dtype`` for this
        rank's T tokens: ``Σ_j topk_weights[t, j] · y[copy (t, j)]`` in fp32."""
        raise NotImplementedError


def _group_of(group):
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("EP needs torch.distributed initialised (dist.init_process_group) before the layer is built")
    return group if group is not None else dist.group.WORLD


def joined(payload) -> torch.Tensor:
    """A dispatch's payload as one uint8 ``[T, row_bytes]`` tensor (its parts side by side)."""
    return torch.cat(payload, dim=1) if isinstance(payload, tuple) else payload
