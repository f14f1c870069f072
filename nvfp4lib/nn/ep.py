"""Expert parallelism (issue 42): :class:`EPMoE`, an MoE layer whose E experts are split over the W ranks of a process
group, and the :class:`Transport` that moves token rows to the experts' owners and the results back.

Rank r holds experts ``[r·E/W, (r+1)·E/W)`` as an :class:`~.moe.NVFP4MoE` over them (its prepared weights, quantizer
and static scales are used; its own forward is not). A step on every rank:

1. W4A4: x quantized with the global scale of the whole EP batch (the max of the ranks' ``amax(|x|)``, one
   :meth:`Transport.all_max`; or the static one), then codes and block scales sent as one byte row per token;
   W4A16: x in bf16, as bytes. W4A4 with a dynamic scale at decode sizes on the all-gather transport
   (:data:`GATHER_QUANTIZE_MAX_TOKENS`): x sent as it is (its own dtype), and each rank quantizes the rows it
   receives with the global scale of every gathered token (the same scale, without the all-reduce);
2. :meth:`Transport.dispatch`: each token copy reaches its expert's owner, which gets its rows grouped by local
   expert with device-side offsets (within an expert: source rank, then token order);
3. the expert GEMMs of the serving path on those rows (W4A4: the intermediate's global scale is again the group's
   max, over the valid rows only: rows past the offsets are left unspecified by the kernel);
4. :meth:`Transport.combine`: the results back to the tokens' ranks, weighted by their top-k weights, in x's dtype.

Exactness: the result equals the single-process :class:`~.moe.NVFP4MoE` on the same weights run on the
concatenation of all ranks' tokens (rank order), taking that batch's rows for this rank — the global scales of W4A4
are that batch's, which is what one GPU serving it computes. The GEMM rows are the same rows (one row's output does not
depend on the other rows: the reference backend checks this on the CPU); what differs is the combine's fp32 summation
order over the k experts of a token: ``"all-gather"`` sums each rank's experts, then the ranks (bit-identical for
top-2, where a sum of two terms and zeros has one order; up to summation order beyond), ``"symm-mem"`` returns every
copy's row to its token's rank and runs the single-process un-permute itself (bit-identical for any k).

Capacity, graph-safely: a rank sends at most ``capacity`` tokens per step (a shape, checked on the host: ValueError),
and a rank's experts take at most ``recv_capacity`` token copies per step (default ``W·capacity·top_k``: never
exceeded). A smaller ``recv_capacity`` saves memory and GEMM rows, but then the routing decides, on the device,
whether a step fits. Copies that do not fit are dropped loudly, never silently: their tokens' outputs become NaN, and
the device counter :attr:`EPMoE.overflow` counts them (summed over the group: every rank sees the same count).
:meth:`EPMoE.check` reads it (one synchronisation) and raises RuntimeError, resetting it. An eager forward (not being
captured or compiled) calls ``check()`` itself when ``eager_check=True`` (the default; one read-back per step); a
captured step cannot, so whoever replays a graph calls ``check()`` when it can afford the synchronisation.

Transports (both graph-capturable, counts on the device, buffers allocated at construction, before any capture):

- :class:`AllGatherTransport` (``"all-gather"``, the baseline, no custom kernels): one all-gather of every rank's
  token rows with their routing (padded to ``capacity``), each rank computing its experts' copies of all tokens, then
  one reduce-scatter (fp32) of the per-token partial sums. On NCCL the tensor collectives; on gloo (the CPU tests) the
  list all-gather and an all-reduce then this rank's slice, the same sums. At shutdown, free the CUDA graphs that
  captured its collectives (``graph.reset()``) before ``destroy_process_group``: in the 2-GPU tests a live one left
  both ranks waiting there after every check had passed.
- :class:`~.ep_symm.SymmMemTransport` (``"symm-mem"``, GPU only): an all-to-all over torch symmetric memory.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .ep_transport import Dispatched, EPShape, Transport, _group_of
from .moe import INTERMEDIATE_DTYPE, NVFP4MoE, _packed
from .routing import _triton_form, gather_rows, route_local, weighted_rows

__all__ = ["EPMoE", "EPShape", "Transport", "Dispatched", "AllGatherTransport", "TRANSPORTS", "make_transport",
           "expert_range"]

TRANSPORTS = ("all-gather", "symm-mem")

# W4A4 with a dynamic activation scale on the all-gather transport, at most this many tokens per step over the group
# (world · capacity): each rank sends its tokens in bf16 and quantizes the rows it receives with the global scale of
# all gathered tokens (every rank holds them all: no all-reduce of the amax, ~15-20 us of NCCL at decode), at the
# price of 3.6x the gathered bytes for bf16 x (2H instead of H/2 + H/16 per token; x is sent in its own dtype, so
# the scale and codes are exactly those of quantizing x), which decode sizes hardly notice. Larger
# steps send NVFP4 rows after an all-reduce of the amax. Prediction (before any GPU run): all-gather W4A4 dispatch
# at T = 1 per rank ~43 -> ~25 us (2x H100), about W4A16's. Measured (2x H100, the run at 956f53a against 7c4a089,
# notebook 13; the routing's sort form landed in the same commit): T = 1 dispatch 44.0 -> 29.4 us (DeepSeek-like)
# and 43.2 -> 27.4 us (Qwen3-like), 4-5 us above W4A16's; dispatch + combine 41.7 and 39.0 us; exact.
GATHER_QUANTIZE_MAX_TOKENS = 256
# There, from this many tokens over the group (world · capacity) each gathered token is quantized once and its owned
# copies' codes and scales gathered after (two row gathers), instead of quantizing every owned copy's row (top_k
# times the tokens' elements for a rank holding all of a token's experts). Prediction (before any GPU run; 2x H100,
# the all-gather W4A4 dispatch at 956f53a against W4A16's gather): T = 64 per rank DeepSeek-like 61.5 -> ~46 us,
# Qwen3-like 39.4 -> ~34 us; T = 1 (2 tokens: under a threshold of 32) unchanged, where one more launch would cost
# more than the few rows it saves. Measured (2x H200, one run per setting at 5e6c186, moe-bench --ep 2 --transport
# all-gather --tokens 64 --quantize-once-min 32 against the form off; notebook 13): T = 64 dispatch DeepSeek-like
# 60.8 -> 46.7 us, Qwen3-like 38.8 -> 36.5 us; the layer step unchanged within 0.2% (the experts phase dominates it);
# exact as before. On from 32 tokens since that run.
GATHER_QUANTIZE_ONCE_MIN_TOKENS = 32


def expert_range(experts: int, world: int, rank: int) -> range:
    """The experts rank ``rank`` of ``world`` holds: ``[rank·E/W, (rank+1)·E/W)`` (E a multiple of W)."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in a group of {world}")
    if experts % world:
        raise ValueError(f"experts = {experts} must be a multiple of the EP world size {world}")
    n = experts // world
    return range(rank * n, (rank + 1) * n)


class AllGatherTransport(Transport):
    """The baseline: all-gather tokens + routing, reduce-scatter the per-token partial sums (see the module doc)."""

    name = "all-gather"
    gathers_all = True

    def __init__(self, group=None):
        self.group = _group_of(group)
        self.rank, self.world = dist.get_rank(self.group), dist.get_world_size(self.group)
        self.gloo = dist.get_backend(self.group) == "gloo"

    def setup(self, shape: EPShape) -> None:
        self.shape = s = shape
        self.ranks = torch.arange(s.world, device=s.device, dtype=torch.int32)
        self.no_drop = torch.zeros(1, dtype=torch.int32, device=s.device)

    def all_max(self, x, use):
        return self.all_max_(x.to(torch.float32).reshape(1).clone(), use)

    def all_max_(self, x, use):
        dist.all_reduce(x, op=dist.ReduceOp.MAX, group=self.group)
        return x

    def _all_gather(self, send: torch.Tensor) -> torch.Tensor:
        s = self.shape
        out = torch.empty((s.world * s.capacity, send.shape[1]), dtype=send.dtype, device=send.device)
        if self.gloo:  # the list form (older gloo lacks the tensor form): the same bytes
            dist.all_gather(list(out.chunk(s.world)), send, group=self.group)
        else:
            dist.all_gather_into_tensor(out, send, group=self.group)
        return out

    def _sum_scatter(self, partial: torch.Tensor) -> torch.Tensor:
        s = self.shape
        if self.gloo:  # all-reduce, then this rank's slice: the same sums (W = 2: a + b either way)
            dist.all_reduce(partial, group=self.group)
            return partial[s.rank * s.capacity:(s.rank + 1) * s.capacity]
        out = torch.empty((s.capacity, partial.shape[1]), dtype=partial.dtype, device=partial.device)
        dist.reduce_scatter_tensor(out, partial, group=self.group)
        return out

    def _pack(self, payload, topk_ids, topk_weights) -> torch.Tensor:
        """The send rows ``[capacity, payload + 8·top_k bytes]``: payload, int32 expert ids, fp32 weights, then
        padding rows (one Triton launch on a GPU where the payload's rows are whole 32-bit words:
        routing_triton.pack_rows_triton)."""
        s, t = self.shape, payload[0].shape[0]
        if _triton_form(payload[0]):
            from .routing_triton import pack_rows_triton

            send = pack_rows_triton(payload, topk_ids, topk_weights, s.capacity)
            if send is not None:
                return send
        send = torch.cat([*payload, topk_ids.to(torch.int32).contiguous().view(torch.uint8),
                          topk_weights.to(torch.float32).contiguous().view(torch.uint8)], dim=1)
        if t == s.capacity:
            return send
        # padding rows: expert ids -1 (owned by no rank, bytes 0xFF); zero payload (a valid NVFP4 row: the reference
        # backend refuses NaN scales even in rows it does not compute) and weights
        pad = send.new_zeros((s.capacity - t, send.shape[1]))
        rb = send.shape[1] - 8 * s.top_k
        pad[:, rb:rb + 4 * s.top_k] = 255
        return torch.cat([send, pad])

    def dispatch(self, payload, topk_ids, topk_weights, quantize=None):
        s, k, n_local = self.shape, self.shape.top_k, self.shape.local_experts
        payload = payload if isinstance(payload, tuple) else (payload,)
        t = payload[0].shape[0]
        rb = sum(p.shape[1] for p in payload)  # (s.row_bytes, or x's own rows where quantize is given)
        got = self._all_gather(self._pack(payload, topk_ids, topk_weights))
        ids = got[:, rb:rb + 4 * k].view(torch.int32)  # in place: a row stride, no copy
        weights = got[:, rb + 4 * k:].view(torch.float32)
        # this rank's experts' copies first, grouped by local expert; every other copy (another rank's, padding)
        # after them with row and token -1, its payload never gathered
        r = route_local(ids, n_local, s.rank * n_local)
        token, g = r.token[:s.recv_capacity], None
        if quantize is not None:  # x's rows, every token's: the global scale is the whole batch's
            if s.world * s.capacity >= GATHER_QUANTIZE_ONCE_MIN_TOKENS:  # each token once, then its copies' codes
                codes, scales, g = quantize(got[:, :rb], None)
                rows = (gather_rows(codes, token), gather_rows(scales.view(torch.uint8), token))
            else:  # each owned copy's row quantized where it is read (the gather fused into the quantizer)
                codes, scales, g = quantize(got[:, :rb], token)
                rows = (codes, scales.view(torch.uint8))
        else:
            start, rows = 0, []
            for width in s.parts or (s.row_bytes,):  # each part gathered on its own: the GEMM reads it as it lands
                rows.append(gather_rows(got[:, start:start + width], token))
                start += width
            rows = tuple(rows) if len(rows) > 1 else rows[0]
        if s.recv_capacity >= s.world * s.capacity * k:  # every copy fits: nothing to count or clamp
            return Dispatched(rows, r.offsets, self.no_drop, (r.row, weights, t), g)
        offsets = torch.clamp(r.offsets, max=s.recv_capacity)
        owner = torch.div(ids, n_local, rounding_mode="floor")  # -1 for padding
        per_rank = (owner.reshape(-1, 1) == self.ranks).sum(0)
        dropped = torch.clamp(per_rank - s.recv_capacity, min=0).sum().to(torch.int32).reshape(1)
        # a copy past the receive capacity: weight NaN (its token's output NaN, counted in dropped), row unread
        lost = r.row >= s.recv_capacity
        w = torch.where(lost.view(weights.shape), torch.full((), float("nan"), device=got.device), weights)
        return Dispatched(rows, offsets, dropped, (torch.where(lost, -1, r.row), w, t), g)

    def combine(self, y, d, out_dtype):
        row, weights, t = d.state
        # each token's own copies weighted and summed in one pass (routing.weighted_rows; on a GPU one launch): the
        # other ranks' copies and padding (row -1) add zero whatever their weights, a lost copy NaN
        partial = weighted_rows(y, row, weights, torch.float32)
        return self._sum_scatter(partial)[:t].to(out_dtype)


def make_transport(name: str, group=None) -> Transport:
    """A transport by name (:data:`TRANSPORTS`) on ``group`` (default: the world)."""
    if name == "all-gather":
        return AllGatherTransport(group)
    if name == "symm-mem":
        from .ep_symm import SymmMemTransport

        return SymmMemTransport(group)
    raise ValueError(f"transport must be one of {TRANSPORTS} or a Transport, got {name!r}")


class EPMoE(torch.nn.Module):
    """The experts of this rank (``w_gate``, ``w_up``, ``w_down``: lists of E/W NVFP4Tensor, the experts of
    :func:`expert_range`) in an MoE layer of ``experts`` experts spread over ``group`` (see the module doc).

    ``top_k``: copies per token (fixed: buffers are sized by it); ``capacity``: tokens this rank sends per step, at
    most (every rank passes the same); ``recv_capacity``: token copies a rank's experts take per step (default
    ``W·capacity·top_k``, never exceeded); ``transport``: a name of :data:`TRANSPORTS` or a :class:`Transport`;
    ``eager_check``: an eager step raises on overflow (one read-back); other keywords go to
    :class:`~.moe.NVFP4MoE` (activations, backend, quantizer, input_scales, keep_weights). ``local_layer``: what builds
    this rank's experts from its weight lists and those keywords (default :class:`~.moe.NVFP4MoE`); it must offer what
    the step uses of NVFP4MoE: ``experts``, ``hidden``, ``activations``, ``device``, ``input_scales``, ``_check``,
    ``gate_up(rows, offsets)`` and ``down(rows, offsets)`` (with ``global_scale=`` and ``_quantize(x, g,
    amax_reduce=)`` in W4A4) — e.g. the benchmark's bf16 peer (:mod:`nvfp4lib.bench.ep_bench`).

    ``forward(x [T, H], topk_ids [T, top_k] (global expert ids), topk_weights)`` with ``T <= capacity``; every rank of
    the group calls it in the same step (T may differ between ranks)."""

    def __init__(self, w_gate, w_up, w_down, *, experts: int, top_k: int, capacity: int, group=None,
                 transport="all-gather", recv_capacity: int | None = None, eager_check: bool = True,
                 local_layer=None, **layer_kwargs):
        super().__init__()
        if isinstance(transport, str):
            transport = make_transport(transport, group)
        if not isinstance(transport, Transport):
            raise TypeError(f"transport must be one of {TRANSPORTS} or a Transport, got {type(transport).__name__}")
        self.local = (local_layer or NVFP4MoE)(w_gate, w_up, w_down, **layer_kwargs)
        rank, world = transport.rank, transport.world
        mine = expert_range(experts, world, rank)
        if self.local.experts != len(mine):
            raise ValueError(f"rank {rank} of {world} holds {len(mine)} of the {experts} experts ({mine.start} .. "
                             f"{mine.stop - 1}), but was given {self.local.experts}")
        if not 1 <= top_k <= experts:
            raise ValueError(f"top_k = {top_k} must lie in [1, experts = {experts}]")
        if capacity < 1:
            raise ValueError(f"capacity = {capacity} must be >= 1 (tokens a rank sends per step)")
        recv_capacity = world * capacity * top_k if recv_capacity is None else recv_capacity
        if recv_capacity < 1:
            raise ValueError(f"recv_capacity = {recv_capacity} must be >= 1 (token copies a rank takes per step)")
        self.experts, self.top_k, self.capacity, self.recv_capacity = experts, top_k, capacity, recv_capacity
        self.rank, self.world, self.expert_range = rank, world, mine
        self.hidden, self.activations, self.device = self.local.hidden, self.local.activations, self.local.device
        self.eager_check = eager_check
        h = self.hidden
        static = self.local.input_scales or (None, None)
        # W4A4 with a dynamic scale on a transport that gathers every token, at decode sizes: send bf16 rows and
        # quantize them after the gather (the batch's scale without a collective; see GATHER_QUANTIZE_MAX_TOKENS)
        self.quantize_gathered = (self.activations == "nvfp4" and static[0] is None and transport.gathers_all
                                  and world * capacity <= GATHER_QUANTIZE_MAX_TOKENS)
        nvfp4_rows = self.activations == "nvfp4" and not self.quantize_gathered
        row_bytes = h // 2 + h // 16 if nvfp4_rows else 2 * h
        self.transport = transport
        parts = (h // 2, h // 16) if nvfp4_rows else ()
        transport.setup(EPShape(world, rank, experts, top_k, capacity, recv_capacity, row_bytes, h, self.device,
                                parts))
        self.overflow = torch.zeros(1, dtype=torch.int32, device=self.device)

    @classmethod
    def shard(cls, w_gate, w_up, w_down, *, transport="all-gather", group=None, **kwargs) -> "EPMoE":
        """The layer of this rank from all E experts' weight lists (keeps only its own slice)."""
        if isinstance(transport, str):
            transport = make_transport(transport, group)
        mine = expert_range(len(w_gate), transport.world, transport.rank)
        return cls(*(list(w[mine.start:mine.stop]) for w in (w_gate, w_up, w_down)), experts=len(w_gate),
                   transport=transport, group=group, **kwargs)

    def extra_repr(self) -> str:
        return (f"rank={self.rank}/{self.world}, experts={self.expert_range.start}..{self.expert_range.stop - 1} of "
                f"{self.experts}, top_k={self.top_k}, capacity={self.capacity}, recv_capacity={self.recv_capacity}, "
                f"transport={self.transport.name!r}")

    def check(self) -> None:
        """Raise RuntimeError if a step since the last check dropped token copies (one synchronisation); resets."""
        n = int(self.overflow.item())
        if n:
            self.overflow.zero_()
            raise RuntimeError(f"EP overflow: {n} token copies exceeded recv_capacity = {self.recv_capacity} copies "
                               f"per rank per step (their tokens' outputs are NaN); build the layer with a larger "
                               f"recv_capacity (at most world·capacity·top_k = "
                               f"{self.world * self.capacity * self.top_k} never overflows)")

    def forward(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        self._check(x, topk_ids, topk_weights)
        d, g = self.dispatch(x, topk_ids, topk_weights)
        out = self.combine(self.run_experts(d, g), d, x.dtype)
        if self.eager_check and not _capturing():
            self.check()
        return out

    # The step's three phases, in the forward's order (a benchmark times them apart: nvfp4lib.bench.ep_bench)

    def dispatch(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor):
        """Steps 1-2 of the module doc: ``(Dispatched, g)``, ``g`` the activations' global scale (W4A4) or None."""
        local, tr = self.local, self.transport
        g, quantize = None, None
        if self.quantize_gathered:  # x's rows out (any float dtype: exact); quantized where they arrive
            payload = x.contiguous().view(torch.uint8)

            def quantize(rows, index):
                return local._quantize(rows.view(x.dtype), None, index)
        elif self.activations == "nvfp4":
            static = local.input_scales or (None, None)
            if static[0] is not None:
                codes, scales, g = local._quantize(x, static[0])
            else:  # the group's amax, taken between the quantizer's amax and its rows (no separate amax pass)
                codes, scales, g = local._quantize(x, amax_reduce=lambda amax: tr.all_max_(amax, 0))
            payload = (codes.reshape(x.shape[0], -1), scales.view(torch.uint8).reshape(x.shape[0], -1))
        else:
            payload = x.to(torch.bfloat16).contiguous().view(torch.uint8)
        d = tr.dispatch(payload, topk_ids, topk_weights, quantize=quantize)
        self.overflow.add_(d.dropped)
        return d, (d.global_scale if quantize is not None else g)

    def run_experts(self, d: Dispatched, g) -> torch.Tensor:
        """Step 3: this rank's experts on the received rows, ``[recv_capacity, H]`` (rows past the offsets
        unspecified)."""
        local, tr, h = self.local, self.transport, self.hidden
        if self.activations == "nvfp4":
            static = local.input_scales or (None, None)
            codes, scales = d.rows if isinstance(d.rows, tuple) else (d.rows[:, :h // 2].contiguous(),
                                                                      d.rows[:, h // 2:].contiguous())
            inter = local.gate_up(_packed(codes, scales, g), d.offsets, global_scale=g)
            # the intermediate's rows past the offsets are unspecified: only the first offsets[-1] count (and are
            # quantized); its global scale is the group's max over them, or the static one
            reduce = None if static[1] is not None else (lambda amax: tr.all_max_(amax, 1))
            codes, scales, g2 = local._quantize(inter, static[1], amax_reduce=reduce, valid=d.offsets[-1:])
            return local.down(_packed(codes, scales.view(torch.uint8), g2), d.offsets, global_scale=g2)
        rows = d.rows.view(torch.bfloat16)
        return local.down(local.gate_up(rows, d.offsets), d.offsets)

    def combine(self, y: torch.Tensor, d: Dispatched, out_dtype: torch.dtype) -> torch.Tensor:
        """Step 4: the experts' rows back to their tokens' ranks, weighted, ``[T, H]`` of ``out_dtype``."""
        return self.transport.combine(y.to(INTERMEDIATE_DTYPE), d, out_dtype)

    def _check(self, x, topk_ids, topk_weights) -> None:
        self.local._check(x, topk_ids, topk_weights)  # shapes, dtypes, devices: the local layer's own rules
        if x.shape[0] > self.capacity:
            raise ValueError(f"T = {x.shape[0]} tokens exceed this layer's capacity = {self.capacity} tokens per "
                             f"rank per step (fixed when the buffers were allocated): split the step or rebuild")
        if topk_ids.shape[1] != self.top_k:
            raise ValueError(f"topk_ids must be an integer [T={x.shape[0]}, top_k={self.top_k}] tensor, got "
                             f"{topk_ids.dtype} {tuple(topk_ids.shape)}")


def _capturing() -> bool:
    return torch.compiler.is_compiling() or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
