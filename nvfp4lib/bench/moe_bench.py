"""The MoE layer benchmark of issue 21: :class:`~nvfp4lib.nn.NVFP4MoE` against the same layer in bf16.

Per layer (:data:`LAYERS`: DeepSeek-V3-, Qwen3-MoE- and Mixtral-like shapes), token count T and routing
(:func:`make_routing`: uniform, or a seeded Zipf-like expert popularity), ``bench_moe`` times

- the NVFP4 layer in each asked mode (``"nvfp4"``: W4A4, ``"bf16"``: W4A16), backend ``nvfp4-moe``;
- its bf16 peer (:class:`~nvfp4lib.peers.bf16_moe.BF16GroupedMoE`: weights dequantized once, ``torch._grouped_mm``),
  backend ``bf16-grouped-mm``;

each captured in one CUDA graph, checked against :func:`~nvfp4lib.nn.reference_moe` (output poisoned with NaN, one
replay) before it is timed, then replayed ``iters`` times with the L2 flushed before each (CUDA events around the
replay); then called eagerly, checked once and timed per call and back to back (``eager_*`` fields: the time a
model without CUDA graphs pays). Every row carries its floor (:func:`moe_floor_us`): ``max(FLOPs / bf16 MMA rate,
touched weight bytes / copy bandwidth)``, the ceilings measured in the same run; touched = the experts that received
at least one token,
at NVFP4 bytes for the NVFP4 layer and bf16 bytes for the peer (both floors are on every row). Weights are built
on the GPU, one layer at a time, and freed before the next. Rows are returned, never stored here
(``python -m nvfp4lib moe-bench --record`` appends them to ``data/moe.jsonl``).
"""
from __future__ import annotations

import contextlib
import gc
import importlib
import itertools
import math
import statistics
from dataclasses import asdict, dataclass
from dataclasses import field as dataclass_field
from typing import Callable

import torch

from .. import tuning
from .calls import host_probe
from .roofline import measure_ceilings
from .store import new_run_id, provenance

__all__ = ["MoELayer", "LAYERS", "TOKENS", "ROUTINGS", "MODES", "LABELS", "ZIPF_S", "get_layer", "make_routing",
           "moe_floor_us", "make_weights", "bench_moe", "add_command"]


@dataclass(frozen=True)
class MoELayer:
    """An MoE expert layer's shape: ``experts`` (E) experts, ``top_k`` (k) per token, gate and up ``[I, H]`` and down
    ``[H, I]`` per expert, with ``hidden`` H and ``intermediate`` I."""

    name: str
    experts: int
    top_k: int
    hidden: int
    intermediate: int
    like: str = ""

    def flops(self, tokens: int) -> int:
        """Multiply-adds x 2 of the T·k token copies through gate, up and down."""
        return 2 * tokens * self.top_k * 3 * self.hidden * self.intermediate

    def expert_bytes(self, fmt: str = "nvfp4") -> int:
        """One expert's three weight matrices: NVFP4 (codes 0.5 B per element, one E4M3 scale per 16, one fp32
        global scale per matrix) or bf16 (2 B per element)."""
        n = 3 * self.hidden * self.intermediate
        if fmt == "nvfp4":
            return n // 2 + n // 16 + 3 * 4
        if fmt == "bf16":
            return 2 * n
        raise ValueError(f"fmt must be 'nvfp4' or 'bf16', got {fmt!r}")

    def weight_bytes(self, fmt: str = "nvfp4") -> int:
        return self.experts * self.expert_bytes(fmt)


LAYERS = (
    MoELayer("deepseek-v3", 256, 8, 7168, 2048, like="DeepSeek-V3-like"),
    MoELayer("qwen3-moe", 128, 8, 2048, 768, like="Qwen3-MoE-like"),
    MoELayer("mixtral", 8, 2, 4096, 14336, like="Mixtral-like"),
)
TOKENS = (1, 8, 64, 512, 4096)
ROUTINGS = ("uniform", "zipf")
MODES = ("nvfp4", "bf16")  # the layer's activations: W4A4, W4A16
LABELS = {"nvfp4": "NVFP4 W4A4", "bf16": "NVFP4 W4A16", "peer": "bf16 peer"}
ZIPF_S = 1.2
NVFP4_BACKEND, PEER_BACKEND = "nvfp4-moe", "bf16-grouped-mm"
# Normwise relative error allowed against reference_moe (which is fp32 on the same dequantized weights):
# - the NVFP4 layer (W4A4, on the activations it quantized itself): its bf16 output is one rounding (<= 2^-9 relative
#   per element, ~1e-3 normwise); the intermediate the dual GEMM writes in bf16 can differ from the reference's by one
#   ulp where the fp32 sums round differently, and re-quantizing it then moves a few E2M1 codes by one step. Measured
#   well under 1e-2 (tests/gpu/test_moe_gpu.py checks the layer at 1e-2 too); a wrong expert, row or scale is O(1).
# - the bf16 peer: five bf16 roundings in a row (the dequantized weights, the gate/up product's output, silu(gate),
#   its product with up, the down product's output), each ~1.7e-3 normwise on normal data; 4-7e-3 in all on the CPU
#   test shapes (tests/test_moe_bench.py). 2e-2 leaves a 3x margin and still fails a wrong expert or row by far.
TOL = {"nvfp4": 1e-2, "bf16": 1e-2, "peer": 2e-2}
CALIBRATION_T = 64  # tokens of the batch that calibrates static activation scales (bench_moe's static_scales)
# the expert-parallel bench's defaults (nvfp4lib.bench.ep_bench, `moe-bench --ep W`): issue 42's layers and T per rank
EP_LAYERS = ("deepseek-v3", "qwen3-moe")
EP_TOKENS = (1, 8, 64, 4096)
EP_ITERS = 50
EP_TRANSPORTS = ("all-gather", "symm-mem")  # nvfp4lib.nn.ep.TRANSPORTS (not imported here: the parser stays light)


def get_layer(name: str) -> MoELayer:
    """A layer of :data:`LAYERS` by name (or its ``like``), or a shape ``"E,k,H,I"`` (a layer named after it)."""
    for layer in LAYERS:
        if name in (layer.name, layer.like):
            return layer
    parts = name.split(",")
    if len(parts) == 4 and all(p.strip().isdigit() for p in parts):
        e, k, h, i = (int(p) for p in parts)
        if not (1 <= k <= e and h > 0 and i > 0):
            raise ValueError(f"layer shape {name!r}: need 1 <= top-k <= experts and positive sizes (E,k,H,I)")
        return MoELayer(f"E{e}-k{k}-H{h}-I{i}", e, k, h, i, like="custom shape")
    raise ValueError(f"unknown MoE layer {name!r}; known: {', '.join(x.name for x in LAYERS)}, or a shape E,k,H,I")


def routing_seed(seed: int, tokens: int, routing: str) -> int:
    """The seed of one (T, routing) draw: every layer sees the same draw of its E for the same T and routing."""
    return seed * 1_000_003 + 10 * tokens + ROUTINGS.index(routing)


def make_routing(tokens: int, experts: int, top_k: int, routing: str = "uniform", *, seed: int = 0,
                 s: float = ZIPF_S, device="cpu"):
    """``(topk_ids int64 [T, k], topk_weights float32 [T, k])``: k distinct experts per token, drawn on the CPU from a
    generator seeded with ``seed`` (so the same on every machine), then moved to ``device``.

    ``"uniform"``: every expert equally likely. ``"zipf"``: a seeded permutation ranks the experts, expert of rank r
    (1-based) drawn with probability proportional to ``1 / r^s``; k distinct per token (drawn without replacement,
    so a popular expert gets at most one copy of a token). Weights: a softmax of seeded normal logits per token."""
    if routing not in ROUTINGS:
        raise ValueError(f"routing must be one of {ROUTINGS}, got {routing!r}")
    if not 1 <= top_k <= experts:
        raise ValueError(f"top_k = {top_k} must lie in [1, experts = {experts}]")
    if tokens < 1:
        raise ValueError(f"tokens = {tokens} must be >= 1")
    g = torch.Generator().manual_seed(seed)
    if routing == "uniform":
        p = torch.ones(experts, dtype=torch.float64)
    else:
        rank = torch.empty(experts, dtype=torch.float64)
        rank[torch.randperm(experts, generator=g)] = torch.arange(1, experts + 1, dtype=torch.float64)
        p = rank.pow(-s)
    ids = torch.multinomial(p.expand(tokens, experts), top_k, replacement=False, generator=g)
    weights = torch.softmax(torch.randn(tokens, top_k, generator=g, dtype=torch.float32), dim=-1)
    return ids.to(device), weights.to(device)


def touched_experts(topk_ids: torch.Tensor) -> int:
    """How many distinct experts received at least one token copy."""
    return int(torch.unique(topk_ids).numel())


def moe_floor_us(layer: MoELayer, tokens: int, touched: int, ceilings: dict, fmt: str = "nvfp4") -> float:
    """``max(FLOPs / bf16 MMA rate, touched x expert bytes / copy bandwidth)`` in us, ``ceilings`` as
    :func:`nvfp4lib.bench.roofline.measure_ceilings` gives them (or the H100 datasheet's). Only weight bytes count: the
    activations of a decode step are a rounding error beside them, and a prefill step is bound by its FLOPs."""
    t_mma = layer.flops(tokens) / (ceilings["bf16_tflops"] * 1e12)
    t_mem = touched * layer.expert_bytes(fmt) / (ceilings["copy_gbps"] * 1e9)
    return max(t_mma, t_mem) * 1e6


def floor_bound(layer: MoELayer, tokens: int, touched: int, ceilings: dict, fmt: str = "nvfp4") -> str:
    t_mma = layer.flops(tokens) / (ceilings["bf16_tflops"] * 1e12)
    t_mem = touched * layer.expert_bytes(fmt) / (ceilings["copy_gbps"] * 1e9)
    return "compute" if t_mma >= t_mem else "memory"


def make_weights(layer: MoELayer, *, seed: int = 0, device="cuda"):
    """E experts' (gate, up, down) as lists of NVFP4Tensor, generated and quantized expert by expert on ``device``
    (never the whole layer in float at once): normal entries scaled by 1/sqrt(fan-in), so every product is O(1)."""
    from ..formats import quantize

    g = torch.Generator(device=device).manual_seed(seed)
    h, i = layer.hidden, layer.intermediate

    def one(n, k):
        w = torch.randn(n, k, generator=g, device=device, dtype=torch.float32).mul_(1 / math.sqrt(k))
        return quantize(w.to(torch.bfloat16))

    gate, up, down = [], [], []
    for _ in range(layer.experts):
        gate.append(one(i, h))
        up.append(one(i, h))
        down.append(one(h, i))
    return gate, up, down


def _nvfp4_bytes(*lists) -> int:
    return sum(t.data.numel() * t.data.element_size() + t.scales.numel() * t.scales.element_size()
               + t.global_scale.numel() * t.global_scale.element_size() for ws in lists for t in ws)


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    if not bool(torch.isfinite(out).all()):
        return float("inf")
    den = float(ref.norm())
    num = float((out - ref).norm())
    return (0.0 if num == 0 else float("inf")) if den == 0 else num / den


def _graph_of(fn, x, ids, w):
    """``fn(x, ids, w)`` run once (compiles, warms the allocator), then captured; returns (graph, its output)."""
    fn(x, ids, w)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(x, ids, w)
    return graph, out


def time_stats(ts: list[float]) -> dict:
    """Median, minimum and the 10th and 90th percentile (nearest lower rank) of microsecond samples, as the MoE rows
    carry them."""
    s = sorted(ts)
    n = len(s)
    return {"median_us": statistics.median(s), "min_us": s[0], "p10_us": s[int(0.1 * (n - 1))],
            "p90_us": s[int(0.9 * (n - 1))]}


def _time_graph(graph, iters: int, flush) -> dict:
    from .harness import time_runner

    return {"iters": iters, **time_stats(time_runner(graph.replay, iters=iters, warmup=3, flush=flush))}


def _measure(fn, x, ids, w, ref, tol: float, iters: int, flush, profile: bool = False, timeline=None) -> dict:
    """Capture, poison, replay once and check, time, check again; with ``profile``, the replay's kernels
    (:func:`~nvfp4lib.bench.kernel_profile.profile_runner`, L2 flushed before each) as ``profile``; with a
    ``timeline`` (:class:`~nvfp4lib.bench.timeline.Timeline` the layer was built with), one more replay's per-CTA
    stamps (L2 flushed before it) as ``timeline``."""
    graph, out = _graph_of(fn, x, ids, w)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    err = _rel_err(out, ref)
    if not err <= tol:
        return {"status": f"wrong: rel_err {err:.3g} > {tol}", "rel_err": err, "tol": tol}
    timing = _time_graph(graph, iters, flush)
    err2 = _rel_err(out, ref)
    if not err2 <= tol:
        return {"status": f"wrong after timing: rel_err {err2:.3g}", "rel_err": err2, "tol": tol}
    if profile:
        from .kernel_profile import profile_runner

        timing["profile"] = profile_runner(graph.replay, iters=iters, flush=flush)
    if timeline is not None:
        timeline.clear()
        flush()
        graph.replay()
        torch.cuda.synchronize()
        timing["timeline"] = timeline.summary()
    del graph
    return {**timing, **_measure_eager(fn, x, ids, w, ref, tol, iters, flush), "rel_err": err, "tol": tol,
            "status": "ok"}


def _measure_eager(fn, x, ids, w, ref, tol: float, iters: int, flush) -> dict:
    """The same forward called eagerly (no graph), as a model without CUDA graphs calls it: checked once, then timed
    each call on its own and back to back (:func:`nvfp4lib.bench.calls.time_both`), as ``eager_*`` fields."""
    from .calls import time_both

    err = _rel_err(fn(x, ids, w), ref)
    if not err <= tol:
        return {"eager_status": f"wrong: rel_err {err:.3g} > {tol}", "eager_rel_err": err}
    timing = time_both(lambda i: fn(x, ids, w), iters, flush)
    return {"eager_status": "ok", "eager_rel_err": err, **{f"eager_{k}": v for k, v in timing.items()}}


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@contextlib.contextmanager
def knob_setting(module: str, name: str, value):
    """The knob ``name`` of ``module`` (a dotted module path, imported only to set it) equal to ``value`` inside the
    block, as it was after it (also after an error); None: as it is. How a bench sets a kernel knob for one run."""
    if value is None:
        yield
        return
    mod = importlib.import_module(module)
    old = getattr(mod, name)
    setattr(mod, name, value)
    try:
        yield
    finally:
        setattr(mod, name, old)


def knob_value(knob: tuple[str, str]):
    """The knob ``(module, name)`` (as :func:`knob_setting` takes it) as it is now; the module imported to read it."""
    return getattr(importlib.import_module(knob[0]), knob[1])


QUANT_KNOB = ("nvfp4lib.nn.quant_triton", "ONE_PROGRAM")  # moe-bench --quant-one-program
ROUTE_KNOB = ("nvfp4lib.nn.routing_triton", "ROUTE_MAX_COPIES")  # moe-bench --route-max-copies
FUSE_KNOB = ("nvfp4lib.kernels.hopper_varlen.kernel", "FUSE_MAX_ROWS")  # moe-bench --fuse-max-rows
CHAIN_KNOB = ("nvfp4lib.kernels.common.pdl", "CHAIN")  # moe-bench --chain-pdl (on, gemm)
CHAIN_GEMM_KNOB = ("nvfp4lib.kernels.common.pdl", "CHAIN_GEMM")  # moe-bench --chain-pdl gemm
OPERAND_KNOB = ("nvfp4lib.nn.moe", "QUANT_TO_OPERAND")  # moe-bench --quant-operand
ONCE_WAIT_KNOB = ("nvfp4lib.tuning", "ONCE_WAIT")  # moe-bench --once-wait
SHORT_K_KNOB = ("nvfp4lib.tuning", "SHORT_K")  # moe-bench --short-k
DUAL_96_KNOB = ("nvfp4lib.tuning", "DUAL_96")  # moe-bench --dual-96
DECODE_S5_KNOB = ("nvfp4lib.tuning", "DECODE_S5")  # moe-bench --decode-s5
DECODE_T32_KNOB = ("nvfp4lib.tuning", "DECODE_T32_S4")  # moe-bench --decode-t32-s4
DECODE_PAIR_KNOB = ("nvfp4lib.tuning", "DECODE_PAIR")  # moe-bench --decode-pair
NARROW_PAIR_KNOB = ("nvfp4lib.tuning", "NARROW_PAIR")  # moe-bench --narrow-pair
DUAL_96_K_KNOB = ("nvfp4lib.tuning", "DUAL_96_K")  # moe-bench --dual-96-k
SMALL_TILES_KNOB = ("nvfp4lib.nn.quant_triton", "SMALL_TILES")  # moe-bench --quant-small-tiles
ROUTE_GATHER_KNOB = ("nvfp4lib.nn.routing", "ROUTE_GATHER")  # moe-bench --route-gather
AMAX_ROUTE_KNOB = ("nvfp4lib.nn.routing", "AMAX_IN_ROUTE")  # moe-bench --amax-in-route
PAIR_KNOB = ("nvfp4lib.kernels.hopper_varlen.config", "PAIR_MIN_K_TILES")  # moe-bench --pair-min-k-tiles
COMBINE_KNOB = ("nvfp4lib.nn.moe", "COMBINE_IN_GEMM")  # moe-bench --combine-in-gemm

@dataclass(frozen=True)
class ABOption:
    """One knob's A/B option of moe-bench (``--flag v1 v2 ...``): its help, an example of values, the rows' field that
    records it, ``setting(value)`` (a context manager that sets the knob for one arm; None: the value is passed to
    :func:`bench_moe` instead) and argparse's keywords."""
    flag: str
    help: str
    example: str
    field: str
    setting: Callable | None
    kw: dict = dataclass_field(default_factory=dict)

    @property
    def dest(self) -> str:
        return self.flag[2:].replace("-", "_")


def _knob(knob: tuple[str, str], convert=lambda v: v):
    """The setting of a module knob (:func:`knob_setting`) to ``convert(value)``."""
    return lambda value: knob_setting(*knob, convert(value))


def _build(recipe_field: str, convert=bool):
    """The setting of one of the serving kernel's build knobs by its recipe field
    (``kernels.hopper_varlen.runner.build_setting``), the on/off ones as the bools the modules hold (the recipes of
    kernels built ahead of time hold bools). The layers are built inside the arm, so W4A16's weights are packed in its
    word layout."""
    def setting(value):
        from ..kernels.hopper_varlen.runner import build_setting

        return build_setting(**{recipe_field: convert(value)})

    return setting


@contextlib.contextmanager
def _chain_setting(value: str):
    """--chain-pdl: off, on (the layer's launches chained), gemm (the GEMMs also let the next kernel launch)."""
    with knob_setting(*CHAIN_KNOB, value != "off"), knob_setting(*CHAIN_GEMM_KNOB, value == "gemm"):
        yield


# The knobs' A/B options: several values run the whole set once per value in this process, in the order given
AB_OPTIONS = (
    ABOption("--split-k", "the serving kernel's split-K at decode (SPLIT_K; default: as shipped, on with the pair "
             "rule); idle, balance, pair: on with that rule (SPLIT_RULE)", "e.g. off on balance",
             "split_k and split_rule",
             None, dict(choices=["on", "off", "idle", "balance", "pair"])),
    ABOption("--quant-one-program", "W4A4's activation quantizer on small inputs in one program "
             "(nn.quant_triton.ONE_PROGRAM; default: as shipped)", "off on", "quant_one_program",
             _knob(QUANT_KNOB, lambda v: v == "on"), dict(choices=["on", "off"])),
    ABOption("--route-max-copies", "the most token copies (T·k) the one-launch Triton routing takes, torch's form "
             "above (nn.routing_triton.ROUTE_MAX_COPIES; default: as shipped)", "e.g. 128 1024", "route_max_copies",
             _knob(ROUTE_KNOB), dict(type=int, metavar="N")),
    ABOption("--fuse-max-rows", "captured NVFP4 calls of at most N rows run the serving kernel's fused kernel "
             "(prologue inside the GEMM: one launch; hopper_varlen.kernel.FUSE_MAX_ROWS; default: as shipped)",
             "e.g. 0 64", "fuse_max_rows",
             _knob(FUSE_KNOB), dict(type=int, metavar="N")),
    ABOption("--chain-pdl", "the layer's kernels launched chained by programmatic dependent launch "
             "(kernels.common.pdl.CHAIN; gemm: the GEMMs also let the next kernel launch, CHAIN_GEMM; default: as "
             "shipped)", "e.g. off on gemm", "chain_pdl and chain_gemm",
             _chain_setting, dict(choices=["off", "on", "gemm"])),
    ABOption("--quant-operand", "W4A4 quantizing straight into the GEMMs' fp16 operands, the GEMMs without their "
             "prologues (nn.moe.QUANT_TO_OPERAND; default: as shipped)", "off on", "quant_operand (W4A4 rows)",
             _knob(OPERAND_KNOB, lambda v: v == "on"), dict(choices=["off", "on"])),
    ABOption("--prewait-stages", "the stages whose weights a W4A16 decode GEMM CTA asks for before its wait for "
             "the kernel before (hopper_varlen.kernel.PREWAIT_STAGES; 0: all its first stages; default: as shipped)",
             "e.g. 0 2", "prewait_stages",
             _build("prewait", int), dict(type=int, metavar="S")),
    ABOption("--once-wait", "the single GEMM's study tiers (over 16 rows per expert) run their once-wait configs, "
             "*_o (tuning.ONCE_WAIT; default: as shipped)", "off on", "once_wait",
             _knob(ONCE_WAIT_KNOB, lambda v: v == "on"), dict(choices=["off", "on"])),
    ABOption("--short-k", "at 65-128 rows per expert, GEMMs of K up to this run the tiles of "
             "tuning.SHORT_K_TIER (tuning.SHORT_K; 0: off; default: as shipped)", "0 4096", "short_k",
             _knob(SHORT_K_KNOB), dict(type=int, metavar="K")),
    ABOption("--dual-96", "dual GEMMs of up to this many rows per expert (the bucket) take the 96-token tiles in "
             "32-token steps (tuning.DUAL_96; 0: none; default: as shipped)", "0 64", "dual_96",
             _knob(DUAL_96_KNOB), dict(type=int, metavar="ROWS")),
    ABOption("--dual-96-k", "dual GEMMs of K up to this take those tiles at 65-128 rows per expert too "
             "(tuning.DUAL_96_K; 0: off; default: as shipped)", "0 2048", "dual_96_k",
             _knob(DUAL_96_K_KNOB), dict(type=int, metavar="K")),
    ABOption("--decode-s5", "up to 4 rows per expert, the 16-token tiles with 5 stages, three CTAs per SM "
             "(tuning.DECODE_S5, where the grid has at least tuning.DECODE_S5_MIN_CTAS per SM; default: as "
             "shipped)", "off on", "decode_s5",
             _knob(DECODE_S5_KNOB, lambda v: v == "on"), dict(choices=["off", "on"])),
    ABOption("--decode-t32-s4", "from 5 to 16 rows per expert, the 32-token tiles with 4 stages, three CTAs per SM, "
             "where the grid has at least tuning.DECODE_S5_MIN_CTAS per SM (tuning.DECODE_T32_S4; default: as "
             "shipped)", "off on", "decode_t32_s4",
             _knob(DECODE_T32_KNOB, lambda v: v == "on"), dict(choices=["off", "on"])),
    ABOption("--decode-pair", "wide decode calls take the two-block tiles (each warpgroup two 64-row blocks, two "
             "CTAs per SM) instead of the three-CTA tiers (tuning.DECODE_PAIR; default: as shipped)", "off on",
             "decode_pair", _knob(DECODE_PAIR_KNOB, lambda v: v == "on"), dict(choices=["off", "on"])),
    ABOption("--narrow-pair", "narrow decode calls (up to 4 rows per expert, at least one CTA per SM) take the "
             "16-token two-block tiles in split-K form (tuning.NARROW_PAIR; default: as shipped)", "off on",
             "narrow_pair", _knob(NARROW_PAIR_KNOB, lambda v: v == "on"), dict(choices=["off", "on"])),
    ABOption("--tile-handoff", "the serving GEMM's warp 0 alone finds the CTA's tile and hands it to the other warps "
             "(hopper_varlen.kernel.TILE_HANDOFF; 0: every warp finds it; default: as shipped)", "0 1",
             "tile_handoff",
             _build("handoff"), dict(type=int, choices=[0, 1])),
    ABOption("--handoff-wait", "with the tile handoff, warp 0 waits at its barrier with the other warps instead of "
             "arriving without waiting (hopper_varlen.kernel.HANDOFF_WAIT; default: as shipped)", "0 1", "handoff_wait",
             _build("handoff_wait"), dict(type=int, choices=[0, 1])),
    ABOption("--a16-int-scale", "W4A16's weight decode converts the block scales in integer arithmetic "
             "(hopper_rs.ops.A16_INT_SCALE; 0: through f32; default: as shipped)", "0 1", "a16_int_scale (W4A16 rows)",
             _build("a16_int_scale"), dict(type=int, choices=[0, 1])),
    ABOption("--a16-own-words", "W4A16's weights packed in their own word layout, the decode of a k16 word 4 SASS "
             "instructions shorter (hopper_rs.ops.A16_OWN_WORDS; 0: the fp16 path's bytes; default: as shipped)", "0 1",
             "a16_own_words (W4A16 rows)",
             _build("a16_own_words"), dict(type=int, choices=[0, 1])),
    ABOption("--quant-small-tiles", "W4A4's quantizer launches small inputs in smaller tiles, at least "
             "nn.quant_triton.SMALL_PROGRAMS programs (nn.quant_triton.SMALL_TILES; 0: the default tiles; default: as "
             "shipped)", "0 1", "quant_small_tiles (W4A4 rows)",
             _knob(SMALL_TILES_KNOB, bool), dict(type=int, choices=[0, 1])),
    ABOption("--input-scales", "W4A4's activation global scales: computed per call (dynamic, the default) or "
             "static, as checkpoints give them (calibrated once per layer on a seeded batch)", "dynamic static",
             "input_scales (W4A4 rows)",
             None, dict(choices=["dynamic", "static"])),
    ABOption("--route-gather", "W4A16 routing and gathering x's rows in one launch (nn.routing.ROUTE_GATHER; "
             "0: the routing launch then the gather's; default: as shipped)", "0 1", "route_gather (W4A16 rows)",
             _knob(ROUTE_GATHER_KNOB, bool), dict(type=int, choices=[0, 1])),
    ABOption("--amax-in-route", "W4A4 (scales per call) finding x's amax in the routing launch, no amax launch "
             "before the first quantization (nn.routing.AMAX_IN_ROUTE; default: as shipped)", "0 1",
             "amax_in_route (W4A4 rows)",
             _knob(AMAX_ROUTE_KNOB, bool), dict(type=int, choices=[0, 1])),
    ABOption("--chain-gemm-a16", "W4A16 GEMMs letting the next kernel launch at their mainloop's end "
             "(kernels.common.pdl.CHAIN_GEMM_A16; 0: at their end; default: as shipped)", "0 1",
             "chain_gemm_a16 (W4A16 rows)",
             _build("chain_gemm_a16"), dict(type=int, choices=[0, 1])),
    ABOption("--early-descriptors", "the serving GEMM's warp 0 asks for its TMA descriptors before the tile search "
             "(hopper_varlen.kernel.EARLY_DESCRIPTORS; 0: after it; default: as shipped)", "0 1", "early_descriptors",
             _build("early_descriptors"), dict(type=int, choices=[0, 1])),
    ABOption("--raw-scale", "W4A4's weight decode without the block scale's x 2^7, the epilogue's factor carrying it "
             "(hopper_varlen.kernel.RAW_SCALE; 0: with it; default: as shipped)", "0 1", "raw_scale (W4A4 rows)",
             _build("raw_scale"), dict(type=int, choices=[0, 1])),
    ABOption("--combine-in-gemm", "steps of at most nn.moe.COMBINE_MAX_COPIES copies run the down GEMM and the "
             "weighted un-permute as one launch (nn.moe.COMBINE_IN_GEMM; 0: two launches; default: as shipped)", "0 1",
             "combine_in_gemm",
             _knob(COMBINE_KNOB, bool), dict(type=int, choices=[0, 1])),
    ABOption("--pair-min-k-tiles", "split-K's pair rule: two CTAs per SM where every slice keeps at least this many "
             "K tiles (hopper_varlen.config.PAIR_MIN_K_TILES; default: as shipped)", "e.g. 16 8", "pair_min_k_tiles",
             _knob(PAIR_KNOB), dict(type=int, metavar="N")),
)


def bench_moe(layers=LAYERS, tokens=TOKENS, routings=ROUTINGS, *, modes=("nvfp4",), iters: int = 30,
              seed: int = 2121, backend: str = "cute-hopper", peer: bool = True, ceilings: dict | None = None,
              quantizer: str = "auto", profile: bool = False, gemv_max_tokens: int | None = None,
              split_k: bool | str | None = None, timeline: bool = False, static_scales: bool = False,
              progress=print) -> list[dict]:
    """Rows (one per layer, T, routing and mode, plus the peer's) with provenance; nothing is stored here.

    ``layers``: :class:`MoELayer` or their names; ``modes``: the layer's activations, ``"nvfp4"`` (W4A4) and/or
    ``"bf16"`` (W4A16); ``backend``: the layer's serving backend; ``quantizer``: how W4A4 quantizes on the fly
    (:data:`nvfp4lib.nn.moe.QUANTIZERS`, recorded in each row); ``profile``: each graph replay's kernels, their
    durations and starts, as the row's ``profile`` (:func:`~nvfp4lib.bench.kernel_profile.profile_runner`). A mode
    the backend cannot build is recorded as a row with that status and no time. ``gemv_max_tokens``: the NVFP4
    layers' decode-path limit (:attr:`~nvfp4lib.nn.NVFP4MoE.gemv_max_tokens`; None: the default), recorded in each
    NVFP4 row with whether the step took that path (``gemv``). ``split_k``: the serving kernel's
    :data:`~nvfp4lib.kernels.hopper_varlen.config.SPLIT_K` knob for the run (None: as it is; True: on with the
    shipped rule; a rule of :data:`~nvfp4lib.kernels.hopper_varlen.config.SPLIT_RULES`: on with it), recorded in every
    NVFP4 row with ``split_rule``. ``timeline``: the NVFP4 layers built with the GEMMs' per-CTA stamps
    (:mod:`.timeline`; a development probe: a few stores per CTA), each NVFP4 row's ``timeline`` read from one more
    replay. ``static_scales``: the W4A4 layers built with static activation scales, as checkpoints give them
    (:func:`~nvfp4lib.nn.reference.calibrate_input_scales` on a seeded calibration batch of :data:`CALIBRATION_T`
    tokens, uniform routing), checked against the reference with those scales; W4A4 rows carry ``input_scales``
    ("static" or "dynamic")."""
    if not torch.cuda.is_available():
        raise RuntimeError("bench_moe needs a CUDA GPU (none here): it times graph-captured MoE layers on the device. "
                           "Run `python -m nvfp4lib moe-bench --record` on the H100; recorded rows are in "
                           "data/moe.jsonl")
    from ..nn import NVFP4MoE, calibrate_input_scales, reference_moe
    from .harness import L2Flusher
    from .peers.bf16_moe import BF16GroupedMoE

    for m in modes:
        if m not in MODES:
            raise ValueError(f"mode {m!r} is not one of {MODES}")
    layers = [get_layer(x) if isinstance(x, str) else x for x in layers]
    for r in routings:
        if r not in ROUTINGS:
            raise ValueError(f"routing {r!r} is not one of {ROUTINGS}")
    from ..nn.moe import resolve_quantizer

    quantizer = resolve_quantizer(quantizer, "cuda")  # rows record the quantizer that ran
    from ..kernels.common import pdl
    from ..kernels.hopper_varlen import config as vl_config

    stamps = None
    if timeline:
        from .timeline import Timeline

        stamps = Timeline("cuda")
    # (the knobs as they were after the run; with a timeline, every GEMM compiled in the run stamps into it: a layer's
    # runners compile on their first call)
    with vl_config.split_setting(split_k), stamps.building() if stamps is not None else contextlib.nullcontext():
        # the W4A4 quantizer's one-program knob, as set for the run (the Triton quantizer's only)
        one_program = knob_value(QUANT_KNOB) if quantizer == "triton" else None
        small_tiles = int(knob_value(SMALL_TILES_KNOB)) if quantizer == "triton" else None  # (smaller tiles)
        route_max = knob_value(ROUTE_KNOB)  # the one-launch routing's limit
        route_gather, amax_route = int(knob_value(ROUTE_GATHER_KNOB)), int(knob_value(AMAX_ROUTE_KNOB))
        fuse_max = knob_value(FUSE_KNOB)  # captured small calls fused
        chain, chain_gemm = bool(pdl.CHAIN), pdl.gemm_chained()  # chained launches, the GEMMs' trigger
        to_operand = bool(knob_value(OPERAND_KNOB))
        from ..kernels.hopper_varlen.runner import build_knobs

        build = build_knobs()  # the serving kernel's build knobs as set for the run (by their recipe fields)
        # (the GEMMs' weights asked for before their wait, warp 0 finding the tile, W4A16's scale route)
        prewait, handoff, a16_int = build["prewait"], int(build["handoff"]), int(build["a16_int_scale"])
        a16_own = int(build["a16_own_words"])
        chain_a16 = bool(build["chain_gemm_a16"])
        early_desc = int(build["early_descriptors"])
        raw_scale = int(build["raw_scale"])
        handoff_wait = int(build["handoff_wait"])  # (warp 0 waiting at the handoff's barrier)
        combine = int(knob_value(COMBINE_KNOB))  # the down GEMM and the un-permute in one launch
        rule = tuning.rule_knobs()  # the shape rule's knobs as set now (once_wait, short_k, dual_96)
        short_k_tier = ",".join(tuning.SHORT_K_TIER[1])  # (the tiles the rule by K takes)
        run_id, ceil, flush = new_run_id(), ceilings or measure_ceilings(), L2Flusher()
        rows = []
        for li, layer in enumerate(layers):
            w_seed = seed + li
            gate, up, down = make_weights(layer, seed=w_seed, device="cuda")
            scales = None
            if static_scales:  # (a calibration batch of its own, as a checkpoint's scales come from one)
                ids_cal, _ = make_routing(CALIBRATION_T, layer.experts, layer.top_k, "uniform", seed=w_seed)
                x_cal = torch.randn(CALIBRATION_T, layer.hidden, generator=torch.Generator().manual_seed(w_seed)).to(
                    device="cuda", dtype=torch.bfloat16)
                scales = calibrate_input_scales(x_cal, ids_cal.cuda(), gate, up)
            built: dict = {}
            for kind in [*modes, *(["peer"] if peer else [])]:
                _free()
                before = torch.cuda.memory_allocated()
                try:
                    if kind == "peer":
                        built[kind] = BF16GroupedMoE(gate, up, down)
                    else:
                        built[kind] = NVFP4MoE(gate, up, down, activations=kind, backend=backend, quantizer=quantizer,
                                               input_scales=scales if kind == "nvfp4" else None)
                        if gemv_max_tokens is not None:
                            built[kind].gemv_max_tokens = gemv_max_tokens
                    torch.cuda.synchronize()
                    # what building allocated, plus, for the NVFP4 layer, the weight lists it was given and keeps
                    built[kind + ":held"] = torch.cuda.memory_allocated() - before + (
                        0 if kind == "peer" else _nvfp4_bytes(gate, up, down))
                except (RuntimeError, ValueError, NotImplementedError, TypeError) as e:
                    built[kind] = f"error: {type(e).__name__}: {str(e)[:400]}"
            for t in tokens:
                for routing in routings:
                    r_seed = routing_seed(seed, t, routing)
                    ids_cpu, w_cpu = make_routing(t, layer.experts, layer.top_k, routing, seed=r_seed)
                    touched = touched_experts(ids_cpu)
                    ids, w = ids_cpu.cuda(), w_cpu.cuda()
                    x = torch.randn(t, layer.hidden, generator=torch.Generator().manual_seed(r_seed + 1)).to(
                        device="cuda", dtype=torch.bfloat16)
                    base = {"run_id": run_id, **{f"ceil_{k}": v for k, v in ceil.items()}, **asdict(layer),
                            "layer": layer.name, "tokens": t, "routing": routing, "zipf_s": ZIPF_S if routing == "zipf"
                            else None, "seed": seed, "weight_seed": w_seed, "routing_seed": r_seed,
                            "touched_experts": touched, "flops": layer.flops(t),
                            "floor_nvfp4_us": moe_floor_us(layer, t, touched, ceil, "nvfp4"),
                            "floor_bf16_us": moe_floor_us(layer, t, touched, ceil, "bf16"), "graph": True,
                            "quantizer": quantizer}
                    del base["name"]
                    refs: dict = {}
                    for kind in [*modes, *(["peer"] if peer else [])]:
                        fmt = "bf16" if kind == "peer" else "nvfp4"
                        row = {**base, "mode": "bf16-weights" if kind == "peer" else kind, "label": LABELS[kind],
                               "backend": PEER_BACKEND if kind == "peer" else NVFP4_BACKEND,
                               "layer_backend": "torch._grouped_mm" if kind == "peer" else backend,
                               "weight_bytes": layer.weight_bytes(fmt), "touched_weight_bytes":
                                   touched * layer.expert_bytes(fmt),
                               "floor_us": base[f"floor_{fmt}_us"],
                               "floor_bound": floor_bound(layer, t, touched, ceil, fmt)}
                        mod = built[kind]
                        if isinstance(mod, str):
                            row["status"] = mod
                        else:
                            row["held_bytes"] = built[kind + ":held"]
                            if kind != "peer":
                                row["gemv_max_tokens"] = mod.gemv_max_tokens
                                row["split_k"] = vl_config.SPLIT_K
                                row["split_rule"] = vl_config.SPLIT_RULE
                                row["fuse_max_rows"] = fuse_max
                                row["quant_one_program"] = one_program if kind == "nvfp4" else None
                                row["quant_small_tiles"] = small_tiles if kind == "nvfp4" else None
                                row["input_scales"] = ("static" if scales is not None else "dynamic") \
                                    if kind == "nvfp4" else None
                                # W4A4 quantizing straight into the GEMMs' operands (no prologues; Triton only)
                                row["quant_operand"] = to_operand if kind == "nvfp4" and quantizer == "triton" \
                                    else None
                                row["gemv"] = bool(mod._gemv_step(x))
                                row["prewait_stages"] = prewait
                                row["tile_handoff"] = handoff
                                row["handoff_wait"] = handoff_wait
                                row["early_descriptors"] = early_desc
                                row["combine_in_gemm"] = combine
                                row["a16_int_scale"] = a16_int if kind == "bf16" else None
                                row["a16_own_words"] = a16_own if kind == "bf16" else None
                                row["raw_scale"] = raw_scale if kind == "nvfp4" else None
                                row["route_gather"] = route_gather if kind == "bf16" else None
                                row["amax_in_route"] = amax_route if kind == "nvfp4" else None
                                row["pair_min_k_tiles"] = vl_config.PAIR_MIN_K_TILES
                            row["route_max_copies"] = route_max
                            row.update(rule, short_k_tier=short_k_tier)
                            row["chain_pdl"] = chain
                            # (the W4A16 GEMMs trigger early only with pdl.CHAIN_GEMM_A16: pdl.CHAIN_GEMM's note)
                            row["chain_gemm_a16"] = int(chain_a16) if kind == "bf16" else None
                            row["chain_gemm"] = chain_gemm and (kind == "nvfp4" or (kind == "bf16" and chain_a16))
                            # the peer has W4A16 semantics; W4A4 is checked on the activations the layer quantized
                            act = "bf16" if kind in ("peer", "bf16") else "nvfp4"
                            try:
                                if act not in refs:
                                    refs[act] = reference_moe(x, ids, w, gate, up, down, activations=act,
                                                              input_scales=scales if act == "nvfp4" else None)
                                row.update(_measure(mod, x, ids, w, refs[act], TOL[kind], iters, flush, profile,
                                                    stamps if kind != "peer" else None))
                                # the host's speed just after: eager calls are host-bound at decode, and the host's
                                # speed moved 2x between runs (calls.host_probe's note)
                                row.update(host_probe())
                            except (RuntimeError, ValueError, NotImplementedError, TypeError) as e:
                                row["status"] = f"error: {type(e).__name__}: {str(e)[:400]}"
                            _free()
                        if "median_us" in row:
                            row["ratio"] = row["median_us"] / row["floor_us"]
                            row["ratio_nvfp4_floor"] = row["median_us"] / row["floor_nvfp4_us"]
                        rows.append(row)
                        if progress:
                            progress(row)
                    del refs
            del gate, up, down, built
            _free()
        prov = provenance()
        return [{**prov, **r} for r in rows]


def _print_row(r: dict) -> None:
    t = f"{r['median_us']:10.1f}" if "median_us" in r else f"{'-':>10}"
    ratio = f"{r['ratio']:7.2f}" if "ratio" in r else f"{'-':>7}"
    eager = (f"eager {r['eager_per_call_us']:9.1f} us (b2b {r['eager_b2b_us']:8.1f})" if "eager_per_call_us" in r
             else f"eager {r.get('eager_status', '-')[:30]}")
    split = {True: f" split-K {r.get('split_rule', '')}".rstrip(), False: " no split"}.get(r.get("split_k"), "")
    print(f"  {r['layer']:<12} T={r['tokens']:<5} {r['routing']:<8} {r['label'] + split:<20} {t} us  floor "
          f"{r['floor_us']:9.1f} us  x{ratio}  {eager}  {r['status'][:60]}", flush=True)
    if r.get("profile"):
        from .kernel_profile import format_profile

        print(format_profile("    graph replay", r["profile"]), flush=True)
    for gemm, g in (r.get("timeline") or {}).items():
        phases = ", ".join(f"{p} {v[0]:.2f}" for p, v in g.get("phases", {}).items())
        print(f"    timeline {gemm}: {g['tiles']} of {g['ctas']} CTAs with a tile, starts over "
              f"{g['start_spread_us']:.2f} us, span {g.get('span_us', float('nan')):.2f} us; median us: {phases}",
              flush=True)


def _layer_arg(text: str) -> str:
    get_layer(text)  # a known name, or "E,k,H,I"
    return text



def _ab_arg(p, flag: str, what: str, example: str, field: str, **kw) -> None:
    """A knob's option of ``moe-bench``: one value or several, each running the whole set once (an A/B)."""
    p.add_argument(flag, nargs="+", help=f"{what}; several values run the whole set once per value in this process, in "
                                         f"the order given (an A/B, {example}); rows carry {field}", **kw)

def add_command(sub, add_record_args, write, ep_run=None) -> None:
    """``python -m nvfp4lib moe-bench``: the parser and the command, registered on ``sub`` (argparse subparsers).
    With ``--ep W`` (under torchrun) ``ep_run(args, write)`` runs instead: the expert-parallel bench,
    :func:`.ep_bench.run_command` (passed in by the command line: ep_bench builds on this module)."""
    from .store import MOE

    p = sub.add_parser("moe-bench", help="time NVFP4MoE and its bf16 peer per layer, T and routing (GPU); rows to "
                                         "build/ (data/ with --record); --ep W: the expert-parallel layer on W GPUs")
    p.add_argument("--layer", nargs="+", type=_layer_arg, metavar="LAYER",
                   help=f"{', '.join(x.name for x in LAYERS)}, or a shape E,k,H,I (experts, top-k, hidden, "
                        f"intermediate); default: all three (--ep: {' '.join(EP_LAYERS)})")
    p.add_argument("--tokens", nargs="+", type=int,
                   help=f"tokens per call (--ep: per rank); default {' '.join(map(str, TOKENS))} (--ep: "
                        f"{' '.join(map(str, EP_TOKENS))})")
    p.add_argument("--routing", nargs="+", choices=list(ROUTINGS), help="default: both (--ep: uniform)")
    p.add_argument("--mode", nargs="+", choices=list(MODES), default=list(MODES),
                   help="the layer's activations: nvfp4 (W4A4), bf16 (W4A16); a mode the backend lacks is recorded "
                        "as such")
    p.add_argument("--backend", default="cute-hopper")
    p.add_argument("--quantizer", default="auto", choices=["auto", "torch", "triton"],
                   help="how W4A4 quantizes on the fly (the same bits; triton: two launches instead of ~45 kernels)")
    p.add_argument("--no-peer", action="store_true", help="skip the bf16 peer")
    p.add_argument("--seed", type=int, default=2121)
    p.add_argument("--iters", type=int, help=f"replays per timing; default 30 (--ep: {EP_ITERS} per graph)")
    p.add_argument("--gemv-max-tokens", type=int, metavar="N",
                   help="the NVFP4 layers' decode path for steps of at most N tokens (0: never; default: the layer's)")
    p.add_argument("--profile", action="store_true",
                   help="also profile each graph replay kernel by kernel (CUPTI): the row's profile field")
    p.add_argument("--timeline", action="store_true",
                   help="build the NVFP4 layers' GEMMs with per-CTA stamps (hopper_varlen.kernel.TIMELINE; a "
                        "development probe) and read them from one more replay: the row's timeline field (phases "
                        "per CTA: schedule, wait, first stage, mainloop, epilogue)")
    for o in AB_OPTIONS:
        _ab_arg(p, o.flag, o.help, o.example, o.field, **o.kw)
    g = p.add_argument_group("expert parallelism (issue 42)")
    g.add_argument("--ep", type=int, metavar="W",
                   help="EPMoE over W ranks, one process each: `torchrun --nproc_per_node W -m nvfp4lib moe-bench --ep "
                        "W`; per layer, T per rank, transport and form: the step split into dispatch, experts and "
                        "combine, checked against the single-GPU layer, beside the bf16 EP peer and one GPU on all "
                        "W·T tokens; rows to build/ep.jsonl (--record: data/ep.jsonl)")
    g.add_argument("--transport", nargs="+", choices=list(EP_TRANSPORTS), help="--ep: default both")
    g.add_argument("--quantize-once-min", type=int, metavar="N",
                   help="--ep: the all-gather W4A4 decode quantizes each gathered token once (then gathers its copies' "
                        "codes) from N tokens over the group (nn.ep.GATHER_QUANTIZE_ONCE_MIN_TOKENS; default: as "
                        "shipped, 32; above nn.ep.GATHER_QUANTIZE_MAX_TOKENS: off); an A/B: two runs, the default "
                        "and off; rows carry it")
    g.add_argument("--put-rows", choices=["torch", "triton"],
                   help="--ep: how the symm-mem transport writes rows into its peers (nn.ep_symm.PUT_ROWS_TRITON; "
                        "default: as shipped); symm-mem rows carry it. An A/B: two runs in one GPU session")
    g.add_argument("--symm-plan", choices=["torch", "triton"],
                   help="--ep: the symm-mem transport's index arithmetic and row writes in four Triton launches a step "
                        "or the torch form (nn.ep_symm.PLAN_TRITON; default: as shipped); symm-mem rows carry it. An "
                        "A/B: two runs in one GPU session")
    g.add_argument("--graphs", choices=["auto", "on", "off"], default="auto",
                   help="--ep: time CUDA-graph replays (auto: on a GPU; the CPU runs eagerly)")
    g.add_argument("--step-timeout", type=float, default=300.0, metavar="S",
                   help="--ep: seconds one stage of one config may take, and every host wait and collective, before "
                        "the process ends (exit 124) instead of hanging")
    add_record_args(p, MOE, "moe")

    def run(args) -> int:
        if args.ep is not None:
            if ep_run is None:
                raise SystemExit("moe-bench --ep: no expert-parallel runner was registered with this parser")
            return ep_run(args, write)
        if not torch.cuda.is_available():
            print("moe-bench needs a CUDA GPU (none here); recorded rows are in data/moe.jsonl")
            return 2
        rows = []
        knobs = [o for o in AB_OPTIONS if o.setting is not None]
        for split, static, *values in itertools.product(args.split_k or [None], args.input_scales or ["dynamic"],
                                                       *(getattr(args, o.dest) or [None] for o in knobs)):
            with contextlib.ExitStack() as arm:
                for o, value in zip(knobs, values):
                    if value is not None:
                        arm.enter_context(o.setting(value))
                rows += bench_moe(args.layer or LAYERS, args.tokens or TOKENS, args.routing or ROUTINGS,
                                  modes=tuple(args.mode), iters=args.iters or 30, seed=args.seed, backend=args.backend,
                                  peer=not args.no_peer, quantizer=args.quantizer, profile=args.profile,
                                  gemv_max_tokens=args.gemv_max_tokens,
                                  split_k={None: None, "on": True, "off": False}.get(split, split),
                                  timeline=args.timeline, static_scales=static == "static",
                                  progress=_print_row)
        write(args, rows, MOE.name)
        return 0 if all(r["status"] == "ok" or "NotImplementedError" in r["status"] for r in rows) else 1

    p.set_defaults(fn=run)
