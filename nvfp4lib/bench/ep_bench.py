"""The expert-parallel MoE benchmark of issue 42: :class:`~nvfp4lib.nn.EPMoE` on W ranks, per phase, against one GPU.

Launched as one process per rank (``torchrun --nproc_per_node W -m nvfp4lib moe-bench --ep W``; on the CPU, gloo and
the reference backend, as the tests run it). Per layer (default :data:`EP_LAYERS`), tokens per rank T (default
:data:`EP_TOKENS`), transport (:data:`~nvfp4lib.nn.ep.TRANSPORTS`) and form, every rank builds the whole layer's
weights from one seed (checked equal on every rank), draws the whole batch of W·T tokens and its routing from one seed
(:func:`.moe_bench.make_routing`, uniform by default) and takes its own T rows. The forms:

- ``nvfp4`` (W4A4) and ``bf16`` (W4A16): ``EPMoE`` holding this rank's experts as an ``NVFP4MoE``;
- ``peer``: the bf16 EP peer, the same ``EPMoE`` and transport with this rank's experts as
  :class:`~.peers.bf16_moe.BF16GroupedMoE` (weights dequantized once, ``torch._grouped_mm``; ``local_layer=``);
- ``single`` rows (one per NVFP4 mode and T): one GPU (rank 0; the others wait at a barrier) running the
  single-GPU ``NVFP4MoE`` with all experts on the same W·T tokens, for the throughput ratio.

Each EP row is checked before it is timed: its step's output (a graph replay, the output poisoned with NaN first)
against the single-GPU ``NVFP4MoE`` of its mode on the concatenation of all ranks' tokens, this rank's rows of it
(``tests/gpu/test_ep_gpu.py``'s check and tolerances, :data:`TOL`; the peer against the W4A16 layer, at the bf16
peer's tolerance of ``moe-bench``). ``rel_err`` is normwise over all ranks' rows; ``bit_identical`` says whether every
rank's rows came out equal. A row that fails its check is recorded, not timed.

The time of a step is split by timing separate graphs of the layer's own phases (``EPMoE.dispatch``,
``EPMoE.run_experts``, ``EPMoE.combine``; see :data:`PHASES`, stored in every row): the whole step, the dispatch
alone, the transport alone (dispatch then combine of a fixed expert output: the experts skipped) and the experts
alone (on the rows one dispatch delivered). Combine is the transport's time less the dispatch's; ``overlap_us`` is
what the separate graphs do not add up to. Every graph is replayed ``iters`` times with the L2 flushed before each
(CUDA events around each replay, every rank timing its own replays); a phase's time is the median over replays of its
slowest rank (a step waits for it), each rank's median kept in ``*_ranks``. Without graphs (``graphs=False``: the CPU,
or ``--graphs off``) the same phases are eager calls (CUDA events on a GPU, wall clock on the CPU).

A hung collective must not hold the machine: every host-side wait (the gloo group's barriers and gathers, NCCL's
collectives) has the step timeout, and a watchdog thread ends the process (exit 124) when one stage of one config
runs past it (a device-side wait, such as a symmetric-memory barrier whose peer died, cannot be timed out otherwise).
Stages agree across ranks before going on: an error on one rank ends that config on every rank, as a row with that
status. Rows are returned on rank 0 (``[]`` elsewhere) with rank 0's provenance; nothing is stored here
(``moe-bench --ep W --record`` appends them to ``data/ep.jsonl``; a run that hung leaves the rows it had beside
``--out`` as ``*.partial.jsonl``, never in ``data/``).

First run (2 H200s, 20 replays per graph, the default grid of 64 rows: 2.6 min): every row exact, both transports
mixed in one process without a hang (each config ends with the device drained and the ranks agreeing).
"""
from __future__ import annotations

import gc
import math
import os
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from functools import partial

import torch

from ..nn import ep as ep_layer
from ..nn import ep_symm
from . import moe_bench as mb
from .store import new_run_id, provenance

__all__ = ["EP_LAYERS", "EP_TOKENS", "EP_ITERS", "TOL", "PHASES", "KINDS", "RankGroup", "Watchdog", "bench_ep",
           "estimate_s", "run_command", "print_table"]

# the defaults (defined beside moe-bench's parser): issue 42's layers (256 and 128 experts), tokens per rank (decode
# sizes and a prefill chunk), replays per graph (4 graphs per row; the grid's time is mostly building and capturing)
EP_LAYERS, EP_TOKENS, EP_ITERS = mb.EP_LAYERS, mb.EP_TOKENS, mb.EP_ITERS
KINDS = ("nvfp4", "bf16", "peer")
# rel_err allowed against the single-GPU layer (tests/gpu/test_ep_gpu.py's bounds: the expert GEMMs may pick another
# tuned config for the EP row count, one bf16 ulp here and there, which in W4A4 can move a code of the intermediate);
# the bf16 peer against the single-GPU W4A16 layer: the peer's own bound in moe-bench (five bf16 roundings)
TOL = {"nvfp4": 1e-2, "bf16": 2e-3, "peer": mb.TOL["peer"]}
PHASES = {
    "timing": "each phase its own CUDA graph (an eager call where graph is false), replayed iters times with the L2 "
              "flushed before each; a phase's time is the median of its slowest rank",
    "step_us": "the whole EP step (EPMoE.forward)",
    "dispatch_us": "EPMoE.dispatch alone: W4A4's group max and quantization of x, then the transport's dispatch "
                   "(routing, the exchange, the received rows grouped by local expert with their offsets)",
    "transport_us": "EPMoE.dispatch then EPMoE.combine of a fixed expert output: the step with the experts skipped "
                    "(dispatch + combine)",
    "combine_us": "transport_us - dispatch_us (derived, not timed alone: combine needs a dispatch's state)",
    "experts_us": "EPMoE.run_experts alone on the rows one dispatch delivered: this rank's expert GEMMs (W4A4: with "
                  "the intermediate's group max and quantization)",
    "overlap_us": "step_us - (transport_us + experts_us): what the separately timed phases do not add up to",
    "single_us": "single rows: the one-GPU NVFP4MoE with all experts on all W·T tokens",
}
_TIMED = ("step", "dispatch", "transport", "experts")
_ERRORS = (RuntimeError, ValueError, TypeError, NotImplementedError, AssertionError)


# --- ranks ----------------------------------------------------------------------------------------------------------

class StageFailed(Exception):
    """A stage of a config failed on some rank (every rank raises it, with the same message)."""


@dataclass
class RankGroup:
    """This process's place in the EP group: ``group`` (the layer's; NCCL on GPUs, gloo on the CPU), ``host`` (a gloo
    group for the bench's own barriers and gathers, with ``timeout_s``), the device, and whether to use CUDA graphs."""

    rank: int
    world: int
    device: torch.device
    group: object
    host: object
    timeout_s: float
    graphs: bool

    @classmethod
    def current(cls, *, timeout_s: float = 300.0, graphs: bool | None = None) -> "RankGroup":
        """From the initialised default process group (NCCL: this process's current CUDA device; gloo: the CPU)."""
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError("bench_ep needs torch.distributed initialised (torchrun, or dist.init_process_group)")
        backend = dist.get_backend()
        cuda = backend == "nccl"
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        host = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s)) if cuda else dist.group.WORLD
        return cls(dist.get_rank(), dist.get_world_size(), device, dist.group.WORLD, host, timeout_s,
                   cuda if graphs is None else graphs and cuda)

    def gather(self, obj) -> list:
        """Every rank's ``obj`` (picklable), in rank order, on every rank (host side, within ``timeout_s``)."""
        import torch.distributed as dist

        out = [None] * self.world
        dist.all_gather_object(out, obj, group=self.host)
        return out

    def sync(self) -> None:
        """The device's queue drained, then every rank here."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.gather(None)


class Watchdog:
    """Ends the process (exit 124) when no :meth:`kick` came for ``timeout_s``: a stage stuck in a device-side wait.
    ``on_fire(what)`` runs first (rank 0 writes the rows it has)."""

    def __init__(self, timeout_s: float, on_fire=None, rank: int = 0):
        self.timeout_s, self.on_fire, self.rank = timeout_s, on_fire, rank
        self.what, self.last = "start", time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="ep-bench-watchdog")
        self._thread.start()

    def kick(self, what: str) -> None:
        self.what, self.last = what, time.monotonic()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(min(5.0, self.timeout_s / 4)):
            if time.monotonic() - self.last > self.timeout_s:
                print(f"\nep-bench rank {self.rank}: no progress for {self.timeout_s:.0f} s in {self.what}; ending "
                      "the process (a collective or a device-side wait hung)", file=sys.stderr, flush=True)
                try:
                    if self.on_fire is not None:
                        self.on_fire(self.what)
                finally:
                    os._exit(124)


# --- measuring ------------------------------------------------------------------------------------------------------

def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class _Step:
    """A callable as the bench runs it: captured once in a CUDA graph (warmed on a side stream first: compiles, first
    collectives) and replayed, or called eagerly. ``out``: the latest output."""

    def __init__(self, fn, rg: RankGroup):
        self.fn, self.graph = fn, None
        if rg.graphs:
            side = torch.cuda.Stream(rg.device)
            side.wait_stream(torch.cuda.current_stream(rg.device))
            with torch.cuda.stream(side):
                fn()
            torch.cuda.current_stream(rg.device).wait_stream(side)
            torch.cuda.synchronize(rg.device)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.out = fn()
        else:
            self.out = fn()

    def __call__(self):
        if self.graph is not None:
            self.graph.replay()
        else:
            self.out = self.fn()
        return self.out


def _times(step, iters: int, rg: RankGroup, flush) -> list[float]:
    """Microseconds per call: CUDA events around each (the L2 flushed before each) on a GPU, the wall clock on the
    CPU; the ranks start together."""
    rg.sync()
    if rg.device.type == "cuda":
        from ..timing import time_runner

        return time_runner(step, iters=iters, warmup=3, flush=flush)
    step()
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def _err_parts(out: torch.Tensor, ref: torch.Tensor) -> dict:
    o, r = out.double(), ref.double()
    finite = bool(torch.isfinite(o).all())
    return {"num2": float((o - r).pow(2).sum()) if finite else float("inf"), "den2": float(r.pow(2).sum()),
            "finite": finite, "equal": bool(torch.equal(out, ref))}


def _rel(parts: list[dict]) -> tuple[float, list[float], bool]:
    """(normwise rel err over all ranks' rows, each rank's, all bit-identical)."""
    def rel(num2, den2):
        if math.isinf(num2):
            return float("inf")
        return math.sqrt(num2 / den2) if den2 > 0 else (0.0 if num2 == 0 else float("inf"))

    total = rel(sum(p["num2"] for p in parts), sum(p["den2"] for p in parts))
    return total, [rel(p["num2"], p["den2"]) for p in parts], all(p["equal"] for p in parts)


class _Config:
    """One EP row's stages, run on every rank in the same order; each ends with the ranks agreeing (:meth:`stage`)."""

    def __init__(self, rg: RankGroup, dog: Watchdog | None, label: str):
        self.rg, self.dog, self.label = rg, dog, label

    def stage(self, name: str, fn=None, *, share: bool = False, only_rank: int | None = None):
        """``fn()`` on this rank (or on ``only_rank`` alone, the others waiting), then the ranks agree: every rank
        raises :class:`StageFailed` if any rank's ``fn`` raised. Returns this rank's result, or with ``share`` every
        rank's (small, picklable: they travel through the host group)."""
        if self.dog is not None:
            self.dog.kick(f"{self.label}: {name}")
        res, err = None, None
        if fn is not None and (only_rank is None or only_rank == self.rg.rank):
            try:
                res = fn()
            except _ERRORS as e:
                err = f"{type(e).__name__}: {str(e)[:300]}"
        if self.rg.device.type == "cuda" and err is None:
            try:
                torch.cuda.synchronize(self.rg.device)
            except _ERRORS as e:
                err = f"{type(e).__name__}: {str(e)[:300]}"
        got = self.rg.gather((res if share else None, err))
        bad = [f"rank {r}: {e}" for r, (_, e) in enumerate(got) if e]
        if bad:
            raise StageFailed(f"error in {name}: " + "; ".join(bad))
        return [g[0] for g in got] if share else res


# --- the bench -------------------------------------------------------------------------------------------------------

def _weights_digest(ws) -> int:
    """A checksum of a few experts' bytes (equal weights on every rank is what the exactness check assumes)."""
    picks = [ws[0][0], ws[1][len(ws[1]) // 2], ws[2][-1]]
    return sum(int(t.data.view(torch.uint8).sum(dtype=torch.int64)) + int(t.scales.view(torch.uint8).sum(
        dtype=torch.int64)) for t in picks)


def _inputs(layer: mb.MoELayer, t: int, routing: str, seed: int, world: int, device):
    """The whole batch of ``world·t`` tokens (x bf16, ids, weights) on ``device``, as moe-bench draws one."""
    total = world * t
    r_seed = mb.routing_seed(seed, total, routing)
    ids, w = mb.make_routing(total, layer.experts, layer.top_k, routing, seed=r_seed)
    x = torch.randn(total, layer.hidden, generator=torch.Generator().manual_seed(r_seed + 1)).to(torch.bfloat16)
    return r_seed, mb.touched_experts(ids), x.to(device), ids.to(device), w.to(device)


def _local_layer(kind: str, mine, backend: str, quantizer: str):
    if kind == "peer":
        from .peers.bf16_moe import BF16GroupedMoE

        return BF16GroupedMoE(*mine)
    from ..nn import NVFP4MoE

    return NVFP4MoE(*mine, activations=kind, backend=backend, quantizer=quantizer)


def bench_ep(layers=EP_LAYERS, tokens=EP_TOKENS, transports=("all-gather", "symm-mem"), *, modes=("nvfp4", "bf16"),
             peer: bool = True, single: bool = True, routing: str = "uniform", iters: int = EP_ITERS,
             seed: int = 2121, backend: str = "cute-hopper", quantizer: str = "auto", rg: RankGroup | None = None,
             watchdog: Watchdog | None = None, progress=None, rows_out: list | None = None) -> list[dict]:
    """Rows (on rank 0; ``[]`` on the other ranks) per layer, T, transport and form (see the module doc); every rank
    of ``rg`` (default :meth:`RankGroup.current`) calls it with the same arguments. ``rows_out``: a list rank 0 fills
    as rows come (what a watchdog can still write if a later config hangs)."""
    from ..nn import NVFP4MoE
    from ..nn.ep import TRANSPORTS, EPMoE, expert_range
    from ..nn.moe import resolve_quantizer

    rg = rg or RankGroup.current()
    layers = [mb.get_layer(x) if isinstance(x, str) else x for x in layers]
    for m in modes:
        if m not in mb.MODES:
            raise ValueError(f"mode {m!r} is not one of {mb.MODES}")
    for tr in transports:
        if tr not in TRANSPORTS:
            raise ValueError(f"transport {tr!r} is not one of {TRANSPORTS}")
    if routing not in mb.ROUTINGS:
        raise ValueError(f"routing {routing!r} is not one of {mb.ROUTINGS}")
    if rg.device.type != "cuda" and backend != "reference":
        raise ValueError(f"backend {backend!r} needs a CUDA GPU; on the CPU the EP bench runs backend='reference'")
    for layer in layers:
        if layer.experts % rg.world:
            raise ValueError(f"{layer.name}: {layer.experts} experts do not split over {rg.world} ranks")
    quantizer = resolve_quantizer(quantizer, rg.device)
    kinds = [*modes, *(["peer"] if peer else [])]
    run_id = rg.gather(new_run_id())[0]
    flush = None
    if rg.device.type == "cuda":
        from ..timing import L2Flusher

        flush = L2Flusher(rg.device)
    gpus = rg.gather(torch.cuda.get_device_name(rg.device) if rg.device.type == "cuda" else "none (CPU)")
    rows = rows_out if rows_out is not None else []
    me = rg.rank

    def emit(row):
        if me == 0:
            rows.append(row)
            if progress:
                progress(row)

    for li, layer in enumerate(layers):
        w_seed = seed + li
        cfg = _Config(rg, watchdog, f"{layer.name}: weights")
        try:
            ws = cfg.stage("weights", partial(mb.make_weights, layer, seed=w_seed, device=rg.device))
            digests = cfg.stage("weights digest", partial(_weights_digest, ws), share=True)
            if len(set(digests)) != 1:
                raise StageFailed(f"the ranks built different weights from seed {w_seed}: digests {digests}")
        except StageFailed as e:
            for kind in kinds:
                emit(_base(run_id, rg, layer, None, kind, 0, routing, seed, w_seed, None, None, backend, quantizer,
                           iters, gpus) | {"status": f"error: {e}"})
            continue
        mine_range = expert_range(layer.experts, rg.world, me)
        mine = [list(w[mine_range.start:mine_range.stop]) for w in ws]
        batches = {t: _inputs(layer, t, routing, seed, rg.world, rg.device) for t in tokens}
        singles: dict = {}
        for kind in kinds:
            ref_mode = "bf16" if kind == "peer" else kind
            label = f"{layer.name} {mb.LABELS[kind]}"
            cfg = _Config(rg, watchdog, label)
            try:
                if ref_mode not in singles:
                    for k in [k for k in singles if k != "bf16"]:  # keep W4A16's: the peer's reference
                        del singles[k]
                    _free()
                    singles[ref_mode] = cfg.stage("single-GPU layer", partial(
                        NVFP4MoE, *ws, activations=ref_mode, backend=backend, quantizer=quantizer))
                one = singles[ref_mode]
                # the single-GPU layer's output on all W·T tokens: this rank's rows are its reference
                refs = {t: cfg.stage(f"reference T={t}", partial(_rows_of, one, b[2:], me, t)) for t, b in
                        batches.items()}
                local = cfg.stage("local experts", partial(_local_layer, kind, mine, backend, quantizer))
            except StageFailed as e:
                for t in tokens:
                    emit(_base(run_id, rg, layer, None, kind, t, routing, seed, w_seed, batches[t][0],
                               batches[t][1], backend, quantizer, iters, gpus) | {"status": f"error: {e}"})
                continue
            if single and kind != "peer":
                for t in tokens:
                    t0 = time.monotonic()
                    row = _single_row(cfg, one, batches[t], layer, kind, t, routing, seed, w_seed, run_id, rg,
                                      backend, quantizer, iters, gpus, flush)
                    emit(row | {"wall_s": time.monotonic() - t0})
            for transport in transports:
                for t in tokens:
                    r_seed, touched, x, ids, w = batches[t]
                    row = _base(run_id, rg, layer, transport, kind, t, routing, seed, w_seed, r_seed, touched,
                                backend, quantizer, iters, gpus)
                    cfg = _Config(rg, watchdog, f"{label} {transport} T={t}")
                    t0 = time.monotonic()
                    try:
                        row.update(_measure_ep(cfg, EPMoE, layer, kind, transport, t, local, mine,
                                               x[me * t:(me + 1) * t], ids[me * t:(me + 1) * t],
                                               w[me * t:(me + 1) * t], refs[t], iters, flush))
                    except StageFailed as e:
                        row["status"] = f"error: {e}"
                    _free()
                    # wall_s: its EPMoE built, its graphs captured, checked and timed
                    emit(row | {"wall_s": time.monotonic() - t0})
            del local, refs
            _free()
        del ws, mine, singles, batches
        _free()
    if me != 0:
        return []
    prov = provenance(rg.device if rg.device.type == "cuda" else None)  # last: the clocks of a GPU under load
    return [{**prov, **r} for r in rows]


def _base(run_id, rg, layer, transport, kind, t, routing, seed, w_seed, r_seed, touched, backend, quantizer, iters,
          gpus) -> dict:
    row = {"run_id": run_id, "form": "ep", "world": rg.world, "gpus_used": rg.world, "transport": transport,
           **asdict(layer), "layer": layer.name, "tokens": t, "total_tokens": rg.world * t, "routing": routing,
           "seed": seed, "weight_seed": w_seed, "routing_seed": r_seed, "touched_experts": touched,
           "mode": "bf16-weights" if kind == "peer" else kind, "kind": kind, "label": mb.LABELS[kind],
           "backend": mb.PEER_BACKEND if kind == "peer" else mb.NVFP4_BACKEND,
           "layer_backend": "torch._grouped_mm" if kind == "peer" else backend, "quantizer": quantizer,
           "graph": rg.graphs, "iters": iters, "gpus_ranks": gpus, "phases": PHASES,
           "put_rows": ep_symm.PUT_ROWS[ep_symm.PUT_ROWS_TRITON] if transport == "symm-mem" else None,
           "symm_plan": ep_symm.PLANS[ep_symm.PLAN_TRITON] if transport == "symm-mem" else None,
           # the all-gather W4A4 decode forms' knobs as set for the run (nn.ep: x's rows quantized after the gather
           # up to the first, each token once from the second)
           "gather_quantize_max_tokens": ep_layer.GATHER_QUANTIZE_MAX_TOKENS if transport == "all-gather" else None,
           "gather_quantize_once_min_tokens": ep_layer.GATHER_QUANTIZE_ONCE_MIN_TOKENS if transport == "all-gather"
           else None}
    del row["name"]
    return row


def _measure_ep(cfg: _Config, EPMoE, layer, kind, transport, t, local, mine, x, ids, w, ref, iters, flush) -> dict:
    """The stages of one EP row (see the module doc); raises StageFailed."""
    rg = cfg.rg
    tol = TOL[kind]
    ep = cfg.stage("build", partial(EPMoE, *mine, experts=layer.experts, top_k=layer.top_k, capacity=t,
                                    transport=transport, eager_check=False, local_layer=partial(_given, local)))
    out = {"capacity": ep.capacity, "recv_capacity": ep.recv_capacity, "tol": tol,
           "reference": ("the single-GPU NVFP4MoE (W4A16) on all W·T tokens, the peer's bf16 roundings allowed"
                         if kind == "peer" else f"the single-GPU NVFP4MoE ({kind}) on all W·T tokens")}
    # one eager step: compiles, first collectives; what the experts-only and transport-only graphs replay on
    d, g, y = cfg.stage("eager step", partial(_eager_parts, ep, x, ids, w))
    out["recv_rows_ranks"] = cfg.stage("received rows", partial(_last_offset, d), share=True)
    out["eager_rel_err"] = _rel(cfg.stage("eager check", partial(_combined_err, ep, y, d, x.dtype, ref),
                                          share=True))[0]
    timed = {}
    phases = {"step": partial(ep, x, ids, w),
              "dispatch": partial(_dispatch_rows, ep, x, ids, w),
              "transport": partial(_transport_only, ep, x, ids, w, y),
              "experts": partial(ep.run_experts, d, g)}
    for name, fn in phases.items():
        step = cfg.stage(f"capture {name}", partial(_Step, fn, rg))
        if name == "step":  # the step is checked (output poisoned first) before and after it is timed
            err, per_rank, bit = _rel(cfg.stage("check", partial(_check_step, step, ref), share=True))
            out.update({"rel_err": err, "rel_err_ranks": per_rank, "bit_identical": bit})
            if not err <= tol:
                cfg.stage("overflow", ep.check)
                return {**out, "status": f"wrong: rel_err {err:.3g} > {tol}"}
        timed[name] = cfg.stage(f"time {name}", partial(_times, step, iters, rg, flush), share=True)
        if name == "step":
            after = _rel(cfg.stage("check after timing", partial(_err_parts, step.out, ref), share=True))[0]
            if not after <= tol:
                return {**out, "status": f"wrong after timing: rel_err {after:.3g}"}
        step = None
        _free()
    cfg.stage("overflow", ep.check)  # recv_capacity never overflows at its default; a drop would be an error
    for name, per in timed.items():
        meds = [statistics.median(ts) for ts in per]
        out[f"{name}_us"] = max(meds)
        out[f"{name}_us_ranks"] = meds
    slowest = max(range(rg.world), key=lambda r: statistics.median(timed["step"][r]))
    out.update(mb.time_stats(timed["step"][slowest]))  # median_us == step_us: the slowest rank's replays
    out["combine_us"] = out["transport_us"] - out["dispatch_us"]
    out["overlap_us"] = out["step_us"] - (out["transport_us"] + out["experts_us"])
    out["status"] = "ok"
    return out


def _given(layer, *_args, **_kwargs):
    """EPMoE's ``local_layer`` for a layer built already (one per rank, kind and layer: shared by its rows)."""
    return layer


def _rows_of(layer, batch, rank: int, t: int) -> torch.Tensor:
    return layer(*batch)[rank * t:(rank + 1) * t].clone()


def _last_offset(d) -> int:
    return int(d.offsets[-1])


def _combined_err(ep, y, d, dtype, ref) -> dict:
    return _err_parts(ep.combine(y, d, dtype), ref)


def _check_step(step: "_Step", ref) -> dict:
    if step.graph is not None:
        step.out.fill_(float("nan"))
    step()
    return _err_parts(step.out, ref)


def _dispatch_rows(ep, x, ids, w):
    return ep.dispatch(x, ids, w)[0].rows


def _transport_only(ep, x, ids, w, y):
    return ep.combine(y, ep.dispatch(x, ids, w)[0], x.dtype)


def _eager_parts(ep, x, ids, w):
    d, g = ep.dispatch(x, ids, w)
    y = ep.run_experts(d, g).clone()
    return d, g, y


def _single_row(cfg: _Config, one, batch, layer, kind, t, routing, seed, w_seed, run_id, rg, backend, quantizer,
                iters, gpus, flush) -> dict:
    """One GPU (rank 0) with all experts on all W·T tokens; the other ranks wait."""
    r_seed, touched, x, ids, w = batch
    row = _base(run_id, rg, layer, None, kind, t, routing, seed, w_seed, r_seed, touched, backend, quantizer, iters,
                gpus)
    row.update({"form": "single", "gpus_used": 1, "tol": TOL[kind],
                "reference": "its own eager call (the EP rows' reference)"})
    solo = RankGroup(0, 1, rg.device, None, None, rg.timeout_s, rg.graphs)

    def measure():
        want = one(x, ids, w)
        step = _Step(lambda: one(x, ids, w), solo)
        if step.graph is not None:
            step.out.fill_(float("nan"))
        step()
        parts = _err_parts(step.out, want)
        err, _, bit = _rel([parts])
        res = {"rel_err": err, "bit_identical": bit}
        if not err <= TOL[kind]:
            return {**res, "status": f"wrong: rel_err {err:.3g} > {TOL[kind]}"}
        if solo.device.type == "cuda":
            from ..timing import time_runner

            ts = time_runner(step, iters=iters, warmup=3, flush=flush)
        else:
            ts = []
            for _ in range(iters):
                t0 = time.perf_counter()
                step()
                ts.append((time.perf_counter() - t0) * 1e6)
        return {**res, **mb.time_stats(ts), "single_us": statistics.median(ts), "status": "ok"}

    try:
        row.update(cfg.stage(f"one GPU T={t}", measure, share=True, only_rank=0)[0])
    except StageFailed as e:
        row["status"] = f"error: {e}"
    _free()
    return row


# --- runtime, table, command ----------------------------------------------------------------------------------------

# The estimate's constants (seconds): what one layer's weights cost to build per NVFP4 GB (make_weights, the
# single-GPU layers, the local layers), what one EP row costs besides its replays (building the layer and transport,
# four captures with their warm steps, the checks, the ranks agreeing), and one single-GPU row's.
# Fitted to the first run of the default grid (2 H200s, 20 replays per graph: 2.6 min for its 64 rows); H100s
# are expected within the same few minutes. Each row records its own ``wall_s`` to refit them.
EST_BUILD_S_PER_GB, EST_ROW_S, EST_SINGLE_S = 2.0, 2.0, 1.0
_EST_TFLOPS, _EST_GBPS, _EST_FIXED_US, _EST_FLUSH_US = 500.0, 2500.0, 60.0, 40.0


def _est_step_us(layer: mb.MoELayer, tokens: int, gpus: int) -> float:
    """A rough step time on ``gpus`` H100s: max(FLOPs, touched NVFP4 bytes) over the rates, plus fixed costs."""
    touched = layer.experts * (1 - (1 - layer.top_k / layer.experts) ** tokens)
    t = max(layer.flops(tokens) / (gpus * _EST_TFLOPS * 1e12),
            touched * layer.expert_bytes("nvfp4") / (gpus * _EST_GBPS * 1e9))
    return t * 1e6 + _EST_FIXED_US


def estimate_s(layers, tokens, transports, *, modes=("nvfp4", "bf16"), peer: bool = True, single: bool = True,
               iters: int = EP_ITERS, world: int = 2) -> float:
    """Seconds the run should take on ``world`` H100s (constants above; measured runs print their real time)."""
    layers = [mb.get_layer(x) if isinstance(x, str) else x for x in layers]
    kinds = len(modes) + bool(peer)
    total = 0.0
    for layer in layers:
        total += EST_BUILD_S_PER_GB * layer.weight_bytes("nvfp4") / 1e9 * (1 + len(modes))
        for t in tokens:
            step = _est_step_us(layer, world * t, world)
            # four graphs per row, each warmed, checked and replayed iters + 3 times
            total += kinds * len(transports) * (EST_ROW_S + 4 * (iters + 5) * (step + _EST_FLUSH_US) * 1e-6)
            if single:
                total += len(modes) * (EST_SINGLE_S + (iters + 5) * (_est_step_us(layer, world * t, 1)
                                                                     + _EST_FLUSH_US) * 1e-6)
    return total


def _fmt(v, spec=".1f", width=8) -> str:
    return format(v, spec).rjust(width) if isinstance(v, (int, float)) and not isinstance(v, bool) else \
        str("-" if v is None else v).rjust(width)


def print_row(r: dict) -> None:
    what = "one GPU" if r["form"] == "single" else r["transport"]
    if r["form"] == "single":
        times = f"single {_fmt(r.get('single_us'))} us"
    else:
        times = (f"step {_fmt(r.get('step_us'))}  dispatch {_fmt(r.get('dispatch_us'))}  experts "
                 f"{_fmt(r.get('experts_us'))}  combine {_fmt(r.get('combine_us'))} us")
    err = f"{r['rel_err']:.2e}" if isinstance(r.get("rel_err"), float) else "-"
    print(f"  {r['layer']:<12} T={r['tokens']:<5} {what:<10} {r['label']:<12} {times}  rel_err {err}  "
          f"{r['status'][:70]}", flush=True)


def print_table(rows: list[dict]) -> None:
    """Per layer and T per rank: each form's step and phases (us), and the one GPU's time on all W·T tokens over the
    EP step (the throughput ratio)."""
    single = {(r["layer"], r["tokens"], r["kind"]): r.get("single_us") for r in rows if r["form"] == "single"}
    print(f"\n{'layer':<12} {'T/rank':>6} {'transport':<10} {'form':<12} {'step us':>9} {'dispatch':>9} "
          f"{'experts':>9} {'combine':>9} {'1 GPU us':>9} {'1GPU/EP':>8} {'rel err':>9}  status")
    for r in rows:
        if r["form"] == "single":
            continue
        one = single.get((r["layer"], r["tokens"], r["kind"]))
        ratio = one / r["step_us"] if one and r.get("step_us") else None
        err = f"{r['rel_err']:.2e}" if isinstance(r.get("rel_err"), float) else "-"
        print(f"{r['layer']:<12} {r['tokens']:>6} {r['transport']:<10} {r['label']:<12} "
              f"{_fmt(r.get('step_us'), '.1f', 9)} {_fmt(r.get('dispatch_us'), '.1f', 9)} "
              f"{_fmt(r.get('experts_us'), '.1f', 9)} {_fmt(r.get('combine_us'), '.1f', 9)} "
              f"{_fmt(one, '.1f', 9)} {_fmt(ratio, '.2f', 8)} {err:>9}  {r['status'][:60]}")


def run_command(args, write) -> int:
    """``moe-bench --ep W`` (every rank runs it; rank 0 prints and writes the rows)."""
    import torch.distributed as dist

    from ..nn.ep import TRANSPORTS
    from .store import EP, MOE, SCRATCH_DIR, append_rows

    world = args.ep
    owns = False
    if not dist.is_initialized():
        if int(os.environ.get("WORLD_SIZE", "0")) != world or "RANK" not in os.environ:
            print(f"moe-bench --ep {world} runs one process per rank; launch it as `torchrun --nproc_per_node {world} "
                  f"-m nvfp4lib moe-bench --ep {world} ...` (WORLD_SIZE here: {os.environ.get('WORLD_SIZE', 'unset')})",
                  file=sys.stderr)
            return 2
        timeout = timedelta(seconds=args.step_timeout)
        if torch.cuda.is_available():
            local = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local)
            dist.init_process_group("nccl", timeout=timeout, device_id=torch.device("cuda", local))
        else:
            dist.init_process_group("gloo", timeout=timeout)
        owns = True
    try:
        graphs = {"auto": None, "on": True, "off": False}[args.graphs]
        rg = RankGroup.current(timeout_s=args.step_timeout, graphs=graphs)
        if rg.world != world:
            raise SystemExit(f"--ep {world} but the process group has {rg.world} ranks")
        if args.graphs == "on" and not rg.graphs:
            print("--graphs on: no CUDA here, the phases run eagerly", file=sys.stderr)
        layers = args.layer or list(EP_LAYERS)
        tokens = args.tokens or list(EP_TOKENS)
        transports = args.transport or list(TRANSPORTS)
        routing = (args.routing or ["uniform"])
        iters = args.iters or EP_ITERS
        if len(routing) != 1:
            raise SystemExit("--ep measures one routing per run (default: uniform)")
        if args.record == MOE:  # --record without FILE: the EP table
            args.record = EP
        rows: list = []
        # beside --out (it comes back with it), never into it nor data/: a run that hangs records nothing
        partial = args.out.with_name(args.out.stem + ".partial.jsonl") if args.out else \
            SCRATCH_DIR / "ep.partial.jsonl"

        def on_fire(what):
            if rg.rank == 0 and rows:
                prov = provenance(rg.device if rg.device.type == "cuda" else None)
                append_rows(partial, [{**prov, **r, "partial": f"the run hung in {what}"} for r in rows])
                print(f"ep-bench: wrote the {len(rows)} rows measured before the hang to {partial} (a partial run: "
                      "not for data/)", file=sys.stderr, flush=True)

        dog = Watchdog(args.step_timeout, on_fire, rg.rank)
        if rg.rank == 0:
            est = estimate_s(layers, tokens, transports, modes=tuple(args.mode), peer=not args.no_peer,
                             iters=iters, world=world)
            n_rows = len(layers) * len(tokens) * (len(transports) * (len(args.mode) + (not args.no_peer))
                                                  + len(args.mode))
            print(f"moe-bench --ep {world}: {n_rows} rows ({', '.join(map(str, layers))}; T per rank "
                  f"{', '.join(map(str, tokens))}; {', '.join(transports)}; {', '.join(args.mode)}"
                  f"{'' if args.no_peer else ' + bf16 peer'}; one GPU), {iters} replays per graph, "
                  f"{'CUDA graphs' if rg.graphs else 'eager'} on {rg.device.type}; estimated "
                  f"{est / 60:.1f} min; every stage times out after {args.step_timeout:.0f} s", flush=True)
        t0 = time.monotonic()
        put_rows = None if args.put_rows is None else args.put_rows == "triton"
        symm_plan = None if args.symm_plan is None else args.symm_plan == "triton"
        try:
            with mb.knob_setting("nvfp4lib.nn.ep_symm", "PUT_ROWS_TRITON", put_rows), \
                    mb.knob_setting("nvfp4lib.nn.ep_symm", "PLAN_TRITON", symm_plan), \
                    mb.knob_setting("nvfp4lib.nn.ep", "GATHER_QUANTIZE_ONCE_MIN_TOKENS", args.quantize_once_min):
                out = bench_ep(layers, tokens, transports, modes=tuple(args.mode), peer=not args.no_peer,
                               routing=routing[0], iters=iters, seed=args.seed, backend=args.backend,
                               quantizer=args.quantizer, rg=rg, watchdog=dog,
                               progress=print_row if rg.rank == 0 else None, rows_out=rows)
        finally:
            dog.stop()
        ok = all(r["status"] == "ok" for r in out)
        ok = all(rg.gather(ok if rg.rank == 0 else True))
        if rg.rank == 0:
            print_table(out)
            print(f"\nran {(time.monotonic() - t0) / 60:.1f} min on {world} ranks", flush=True)
            write(args, out, "ep.jsonl")
        return 0 if ok else 1
    finally:
        if owns:
            dist.destroy_process_group()
