"""Expert parallelism for loaded checkpoints (issue 42): what ``from_pretrained(..., ep_group=)``, :func:`.generate`
and the ``generate --ep W`` command need of the process group, and the design they share.

- **What a rank holds.** Rank r of the W ranks of ``ep_group`` holds experts ``[r·E/W, (r+1)·E/W)`` of every MoE
  layer (:func:`~nvfp4lib.nn.ep.expert_range`), as an :class:`~nvfp4lib.nn.EPMoE`; everything else (embeddings,
  attention, norms, routers, shared experts, dense layers, ``lm_head``) is replicated: every rank reads and holds it.
  The other ranks' experts are never read from disk (only their names in the index are looked at, so a checkpoint
  missing an expert fails the same way on every rank) and never reach this rank's device.
- **Data-parallel attention.** Each rank runs its own batch of sequences through the whole model; only the MoE layers
  exchange tokens (the EPMoE transport: ``"all-gather"`` or ``"symm-mem"``). Every rank must therefore call the
  model's forward in the same step, as many times as the others (lockstep): a rank whose sequences are finished still
  steps. :func:`.generate` decodes ``max_new_tokens`` for every sequence (no early stop) and checks up front that every
  rank runs the same shapes (:meth:`ExpertParallel.require_same`), so the ranks' steps match one for one.
- **Capacity.** ``ep_capacity`` is the number of tokens a rank sends per MoE step (its batch times the step's
  positions), fixed at load: the transports' buffers are sized by it, which is what makes a step graph-capturable. A
  forward over more tokens raises ValueError on that rank before it communicates; if another rank's step fits, that
  rank waits in its collective until the peer is gone or the group's timeout (``init_process_group(timeout=)``)
  passes. So callers check shapes before stepping: :func:`.generate` agrees on every rank's shapes first, refuses a
  batch larger than the capacity on every rank alike, and prefills in chunks of at most ``capacity`` tokens.
- **W4A4 activation scales** are static, from the checkpoint: an expert layer's is the maximum over all E experts' (as
  the single-process load takes it). Each rank reads its own experts' scales and the group takes the maximum (one
  all-gather of four numbers per layer input, :meth:`ExpertParallel.gathered`): the same number, without reading
  another rank's tensors. With the scales static, a token's MoE output does not depend on the other tokens of the
  step, so an EP model on a rank's batch computes what the single-process model computes on that batch. (A checkpoint
  without activation scales gets EPMoE's per-step scale of the whole EP batch instead: what one process computes on
  all ranks' sequences together.)
"""
from __future__ import annotations

import torch

__all__ = ["ExpertParallel"]


class ExpertParallel:
    """The expert-parallel settings of a loaded model (``model.nvfp4_ep``): the process ``group`` (its ``rank`` and
    ``world``), ``capacity`` (tokens a rank sends per MoE step) and the ``transport`` name (see the module doc)."""

    def __init__(self, group, capacity, transport: str, device: torch.device):
        import torch.distributed as dist

        from ..nn.ep import TRANSPORTS

        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("ep_group needs torch.distributed initialised (dist.init_process_group) first")
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"ep_capacity must be an int >= 1 (tokens a rank sends per MoE step: its batch times the "
                             f"positions of a step), got {capacity!r}")
        if transport not in TRANSPORTS:
            raise ValueError(f"ep_transport must be one of {TRANSPORTS}, got {transport!r}")
        self.group, self.capacity, self.transport = group, capacity, transport
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        nccl = dist.get_backend(group) == "nccl"
        if nccl and device.type != "cuda":
            raise ValueError(f"ep_group is an NCCL group, but the model is to be loaded on {device}: load it on this "
                             "rank's CUDA device, or use a gloo group on the CPU")
        self.device = device if nccl else torch.device("cpu")  # where the host-side collectives' tensors live

    def experts(self, n: int) -> range:
        """The experts of this rank among a layer's ``n``."""
        from ..nn.ep import expert_range

        return expert_range(n, self.world, self.rank)

    def gathered(self, values: list[float]) -> torch.Tensor:
        """Every rank's ``values`` (the same count on each), as a float64 ``[world, len(values)]`` CPU tensor: one
        all-gather, which every rank calls at the same point."""
        import torch.distributed as dist

        mine = torch.tensor(values, dtype=torch.float64, device=self.device)
        out = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(out, mine, group=self.group)
        return torch.stack(out).cpu()

    def require_same(self, **values: int) -> None:
        """Raise ValueError on every rank (alike) unless every rank passed the same ``values``."""
        got = self.gathered([float(v) for v in values.values()])
        differ = [f"{name} ({', '.join(str(int(v)) for v in got[:, i])} on ranks 0..{self.world - 1})"
                  for i, name in enumerate(values) if bool((got[:, i] != got[0, i]).any())]
        if differ:
            raise ValueError("expert-parallel ranks step in lockstep and must run the same shapes, but "
                             + "; ".join(differ) + " differ")

    def report(self) -> dict:
        return {"world": self.world, "rank": self.rank, "capacity": self.capacity, "transport": self.transport}

    def __repr__(self) -> str:
        return (f"ExpertParallel(rank={self.rank}/{self.world}, capacity={self.capacity}, "
                f"transport={self.transport!r})")
