"""The torch-facing side of the device-scheduled kernel: prepack the weights once, compile once per weight shape
(through CuTe DSL's TVM-FFI entry: torch tensors passed directly, torch's current stream), launch per call.

A call takes the packed activations (codes ``[T, K/2]`` uint8, E4M3 scales ``[T, K/16]``), A's global scale (one,
or one per group, float32 on the device) and the group offsets (int32 ``[G+1]`` on the device); it allocates its
output and scratch from torch's caching allocator and never synchronises, so it can be captured in a CUDA graph and
replayed for another split of the rows.
"""
from __future__ import annotations

import contextlib

import torch

from ...formats import NVFP4Tensor
from ..common import aot, pdl
from ..common.packing import check_scales_finite
from ..common.sm90 import POST_SCALE
from ..common.sm90 import _require_hopper as require_hopper
from ..hopper_rs import ops as rs_ops
from ..hopper_rs.layout import a16_units, prepack_weights
from . import kernel
from .config import (
    CONFIGS,
    NWG,
    ROW_BYTES,
    SPLIT_TILES,
    VarlenConfig,
    check_grid,
    choose_splits,
    partials_width,
    validate,
)
from .gather import group_table, launch
from .kernel import kernel_classes
from .report import TVM_FFI, call_arguments, combine_arguments, gemm_arguments

OUT_DTYPES = {torch.float16: "Float16", torch.bfloat16: "BFloat16"}
# what the GEMM-then-combine call (:meth:`VarlenRunner.call_combine`) writes: the token rows, in the caller's dtype
COMBINE_DTYPES = {**OUT_DTYPES, torch.float32: "Float32"}
E4M3 = torch.float8_e4m3fn
# A call's output is allocated as ``torch.empty(rows, n, ...)``, not ``torch.empty((rows, n), ...)``: the tuple form
# took 2.9 us against 1.9 us on this repository's development CPU (timeit, torch 2.13, 2026-11-27), about a launch's
# fifth on the H100's host
_compiled: dict = {}


def _compile(key, make, args, recipe: dict | None = None):
    """Compile once per key; ``make`` and ``args`` are callables (building fake tensors costs host time that a
    one-shot call would pay every time). ``recipe`` (:mod:`..common.aot`): where a library built ahead of time for it
    is found, it is loaded instead of compiling; a recording process notes it."""
    fn = _compiled.get(key)
    if fn is None:
        fn = aot.load(recipe)
        if fn is None:
            import cutlass.cute as cute

            fn = cute.compile(make(), *args(), options=TVM_FFI)
        _compiled[key] = fn
        aot.note(recipe)
    return fn


# The module knobs a kernel's build reads besides its config and shape: (recipe field, module, attribute). They are
# part of its compile key and its AOT recipe, and set from a recipe to build it elsewhere (aot_compile).
BUILD_KNOBS = (("chain", pdl, "CHAIN"), ("chain_gemm", pdl, "CHAIN_GEMM"), ("prewait", kernel, "PREWAIT_STAGES"),
               ("handoff", kernel, "TILE_HANDOFF"), ("a16_int_scale", rs_ops, "A16_INT_SCALE"),
               ("a16_own_words", rs_ops, "A16_OWN_WORDS"), ("chain_gemm_a16", pdl, "CHAIN_GEMM_A16"),
               ("early_descriptors", kernel, "EARLY_DESCRIPTORS"), ("raw_scale", kernel, "RAW_SCALE"),
               ("handoff_wait", kernel, "HANDOFF_WAIT"), ("slice_barrier_all", kernel, "SLICE_BARRIER_ALL"),
               ("ablation", kernel, "ABLATION"))


def build_knobs() -> dict:
    """:data:`BUILD_KNOBS` as they are now, by recipe field."""
    return {field: getattr(mod, name) for field, mod, name in BUILD_KNOBS}


@contextlib.contextmanager
def build_setting(**fields):
    """The build knobs named by their recipe fields (:data:`BUILD_KNOBS`) set to these values inside the block, as
    they were after it (also after an error): the kernels compiled inside keep them (a runner's compile key holds
    them). An A/B arm of a kernel's build in one process (``bench --backend cute-hopper:handoff=0``)."""
    known = {field: (mod, name) for field, mod, name in BUILD_KNOBS}
    unknown = sorted(set(fields) - set(known))
    if unknown:
        raise ValueError(f"unknown build knob(s) {', '.join(unknown)}; known: {', '.join(known)}")
    old = build_knobs()
    try:
        for field, value in fields.items():
            setattr(*known[field], value)
        yield
    finally:
        for field, (mod, name) in known.items():
            setattr(mod, name, old[field])


def _recipe(kind: str, cfg: VarlenConfig, groups: int, n: int, k_pad: int, out_name: str, **more) -> dict | None:
    """What :func:`aot_compile` needs to build this kernel again on another machine, with the knobs its build reads
    as they are now; None where it cannot be rebuilt from a recipe (a config not in CONFIGS, a timeline address)."""
    if CONFIGS.get(cfg.name) != cfg or kernel.TIMELINE:
        return None
    return {"kind": kind, "config": cfg.name, "groups": groups, "n": n, "k_pad": k_pad, "out": out_name,
            **build_knobs(), **more}


def _parts(kind: str, cfg: VarlenConfig, groups: int, n: int, k_pad: int, out_name: str, k: int | None = None,
           fused: bool = False, combine_out: str | None = None, top_k: int | None = None):
    """(make, args) of a kernel of ``kind`` ("varlen-gemm": the GEMM alone; "varlen-call": prologue and GEMM;
    "varlen-combine": the GEMM then the weighted un-permute of ``top_k`` copies per token, writing ``combine_out``):
    the callables that build its object and its fake arguments, with the knobs as they are when called."""
    _, gemm_cls, call_cls = kernel_classes()
    if kind == "varlen-gemm":
        return (lambda: gemm_cls(cfg, groups, n, k_pad)), (lambda: gemm_arguments(cfg, groups, n, k_pad, out_name, k=k))
    if kind == "varlen-combine":
        return ((lambda: gemm_cls(cfg, groups, n, k_pad, combine=top_k).call_combine),
                (lambda: combine_arguments(cfg, groups, n, k_pad, out_name, k=k, combine_dtype=combine_out,
                                           top_k=top_k)))
    if kind == "varlen-call":
        return ((lambda: call_cls(gemm_cls(cfg, groups, n, k_pad), fused)),
                (lambda: call_arguments(cfg, groups, n, k_pad, out_name)))
    raise ValueError(f"unknown kernel kind {kind!r}: varlen-gemm, varlen-call or varlen-combine")


def aot_compile(recipe: dict, options: str):
    """Compile ``recipe`` (:func:`_recipe`'s) with ``options`` (CuTe DSL's; TVM-FFI added), the knobs its build reads
    set to the recipe's for the compile and restored after: :func:`nvfp4lib.kernels.common.aot.build`'s step."""
    import cutlass.cute as cute

    make, args = _parts(recipe["kind"], CONFIGS[recipe["config"]], recipe["groups"], recipe["n"], recipe["k_pad"],
                        recipe["out"], k=recipe.get("k"), fused=recipe.get("fused", False),
                        combine_out=recipe.get("combine_out"), top_k=recipe.get("top_k"))
    old = build_knobs()
    for field, mod, name in BUILD_KNOBS:
        setattr(mod, name, recipe[field])
    try:
        return cute.compile(make(), *args(), options=f"{options} {TVM_FFI}")
    finally:
        for field, mod, name in BUILD_KNOBS:
            setattr(mod, name, old[field])


def compile_gemm(cfg: VarlenConfig, groups: int, n: int, k_pad: int, out_name: str, k: int | None = None):
    """The GEMM alone (``act="bf16"``: B is the caller's rows, K = ``k``), compiled once per shape."""
    return _compile(("gemm", cfg, groups, n, k_pad, out_name, k or k_pad, kernel.TIMELINE, *build_knobs().values()),
                    *_parts("varlen-gemm", cfg, groups, n, k_pad, out_name, k=k),
                    _recipe("varlen-gemm", cfg, groups, n, k_pad, out_name, k=k or k_pad))


def compile_combine(cfg: VarlenConfig, groups: int, n: int, k_pad: int, out_name: str, combine_out: str, top_k: int,
                    k: int | None = None):
    """The GEMM (its C: the copies' rows, ``out_name``) then the weighted un-permute of ``top_k`` copies per token to
    token rows of ``combine_out`` (:meth:`.kernel.GroupedVarlenGemmSm90.call_combine`), compiled once per shape."""
    return _compile(("combine", cfg, groups, n, k_pad, out_name, combine_out, top_k, k or k_pad, kernel.TIMELINE,
                     *build_knobs().values()),
                    *_parts("varlen-combine", cfg, groups, n, k_pad, out_name, k=k, combine_out=combine_out,
                            top_k=top_k),
                    _recipe("varlen-combine", cfg, groups, n, k_pad, out_name, k=k or k_pad, combine_out=combine_out,
                            top_k=top_k))


def compile_call(cfg: VarlenConfig, groups: int, n: int, k_pad: int, out_name: str, fused: bool | None = None):
    """The prologue and the GEMM of an NVFP4-activation call as one host function
    (``fn(codes, scales, x16, weights, C, offsets, gs_a, gs_b, counters, partials, tile_counts)``; one kernel with
    ``fused``, else two;
    None: :data:`.kernel.FUSED_PROLOGUE`), compiled once per shape."""
    fused = kernel.FUSED_PROLOGUE if fused is None else fused
    return _compile(("call", cfg, groups, n, k_pad, out_name, fused, kernel.TIMELINE, *build_knobs().values()),
                    *_parts("varlen-call", cfg, groups, n, k_pad, out_name, fused=fused),
                    _recipe("varlen-call", cfg, groups, n, k_pad, out_name, fused=bool(fused)))


class PackedWeights:
    """The weights in the kernel's layout for one (dual, tile_m, tile_k), every group's matrices packed once in one
    Triton pass read in place from the groups' own tensors (:mod:`.gather`; the torch form where Triton is missing).
    Every config with that layout (:func:`layout_of`) runs on the same packed tensor. For ``activations="bf16"`` the
    units are made ready for the bf16 decode (:func:`~..hopper_rs.layout.a16_units`): canonical (its integer scale
    route needs it; the values are the same) and, with ``hopper_rs.ops.A16_OWN_WORDS`` as it is when packed, each
    code word in W4A16's own layout; ``own_words`` records which (None for NVFP4 activations), and the runners on
    these weights build their decode for it."""

    def __init__(self, b: list[NVFP4Tensor], b2: list[NVFP4Tensor] | None, tile_m: int, tile_k: int,
                 check_scales: bool = True, activations: str = "nvfp4"):
        device = b[0].data.device
        require_hopper(device)
        self.device, self.groups, self.dual, self.tile_m, self.tile_k = device, len(b), b2 is not None, tile_m, tile_k
        self.n, self.k = int(b[0].shape[0]), int(b[0].shape[1])
        self.k_pad = -(-self.k // tile_k) * tile_k
        n_pad = -(-self.n // tile_m) * tile_m
        blocks = tile_m * (2 if self.dual else 1) // (64 * NWG)
        table = group_table(None, b, b2)
        if table is None:  # parts not readable in place: the torch form, ~20 passes
            packed, self.gs_b = pack_torch(b, b2, n_pad, self.k_pad, blocks)
        else:
            packed, _, _, _, _, self.gs_b = launch(torch.tensor(table, dtype=torch.int64).to(device), self.groups,
                                                   self.n, self.k, n_pad, self.k_pad, NWG, blocks, self.dual, 0,
                                                   post=POST_SCALE, weights_only=True)
        if check_scales and bool(((packed[..., 2048:] & 0x7F) == 0x7F).any()):  # one read-back (NaN: S.1111.111)
            check_scales_finite(b, "b")  # names the group
            check_scales_finite(b2 or [], "b2")
        self.own_words = bool(rs_ops.A16_OWN_WORDS) if activations == "bf16" else None
        if activations == "bf16":
            a16_units(packed, self.own_words)
        self.packed = packed.view(-1, ROW_BYTES)
        self.x16 = Scratch(self.k_pad, device)

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + self.gs_b.numel() * 4


def device_index(device) -> int:
    """The CUDA device index of ``device`` (a bare "cuda": the current device), for raw stream-handle lookups."""
    dev = torch.device(device)
    return dev.index if dev.index is not None else torch.cuda.current_device()


COUNTER_SETS = 4  # streams whose fused-call counters are made zeroed with the weights (Scratch)


class _PerStream:
    """A buffer and a set of int32 counters per CUDA stream, shared by every call on that stream (calls on one stream
    are ordered, so reuse is safe; two streams at once each get their own). The buffer's first dimension grows to at
    least a call's ``need`` (doubling; outgrown buffers are kept for the owner's lifetime: a CUDA graph may have
    captured one). The counters of the first :data:`COUNTER_SETS` streams are slices of one zeroed tensor made with
    the owner, so a stream first seen during a capture captures no fill kernel; past them, counters are zeroed on
    allocation."""

    def __init__(self, device, words: int, first: int, make):
        self.device, self._index = device, device_index(device)
        self._words, self._first, self._make = words, first, make  # counters' length, first size, make(size)
        self._by_stream: dict = {}  # CUDA stream handle -> (buffer, counters)
        self._old: list[torch.Tensor] = []
        self._sets = list(torch.zeros(COUNTER_SETS, words, dtype=torch.int32, device=device).unbind(0))

    def _get(self, need: int) -> tuple[torch.Tensor, torch.Tensor]:
        stream = torch._C._cuda_getCurrentRawStream(self._index)
        pair = self._by_stream.get(stream)
        if pair is None or pair[0].shape[0] < need:
            if pair is None:
                count = self._sets.pop(0) if self._sets else torch.zeros(self._words, dtype=torch.int32,
                                                                          device=self.device)
                size = self._first
            else:
                self._old.append(pair[0])
                size, count = 2 * pair[0].shape[0], pair[1]
            pair = self._by_stream[stream] = (self._make(max(need, size)), count)
        return pair


class Scratch(_PerStream):
    """What a call's kernels share on the current CUDA stream (:class:`_PerStream`): the fp16 activation buffer
    ``[R >= rows, K_pad]`` (first 128 rows) and the fused call's counters (int32 [4]: its epoch and tickets, two done
    words; zeros at first, then carried from call to call, :meth:`.kernel.GroupedVarlenGemmSm90.kernel_fused`). One
    pair per stream: an allocation costs as much host time as a launch. The pre-zeroed counters are made here, with
    the weights: before them, every replay of a graph whose stream was first seen during its capture ran a fill
    kernel before the prologue (~0.7 us plus a launch gap, H100 kernel profile of 2026-11-27)."""

    def __init__(self, k_pad: int, device):
        self.k_pad = k_pad
        super().__init__(device, 4, 128, lambda rows: torch.empty((rows, k_pad), dtype=torch.float16, device=device))

    def __call__(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(x16, counters) for a call of ``rows`` rows on the current stream."""
        return self._get(rows)


def no_splits(cfg: VarlenConfig, n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The split arguments of a call that does not split (:func:`.report.split_arguments`; not read)."""
    return (torch.empty((1, 1, partials_width(cfg, n)), dtype=torch.float32, device=device),
            torch.zeros(1, dtype=torch.int32, device=device))


class SplitScratch(_PerStream):
    """What a ``split_k`` runner's split calls share on the current CUDA stream (:class:`_PerStream`): the tiles'
    counters (int32 [:data:`~.config.SPLIT_TILES`], zeros; each tile's last CTA puts its count back to zero) and the
    fp32 partial sums ``[S, R, W]`` (no initial values: every slice writes its own)."""

    def __init__(self, width: int, device):
        self.width = width
        super().__init__(device, SPLIT_TILES, 0, lambda n: torch.empty(n, dtype=torch.float32, device=device))

    def __call__(self, slices: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        need = slices * rows * self.width
        flat, count = self._get(need)
        return flat[:need].view(slices, rows, self.width), count


def pack_torch(b: list[NVFP4Tensor], b2: list[NVFP4Tensor] | None, n_pad: int, k_pad: int, blocks: int):
    """(the packed weights ``[ctas, K_pad/64, NWG·blocks, 2304]``, ``gs_b`` fp32 ``[G, 2]``: each matrix's global
    scale × 2^14, gate then up) of :class:`PackedWeights`, in torch on any device: the form used where the Triton
    pass cannot read the parts in place."""
    mats = [stack_uniform(w, n_pad, k_pad) for w in ([b] if b2 is None else [b, b2])]
    packed = prepack_weights([m[:2] for m in mats], NWG, blocks)
    return packed, torch.stack([mats[0][2], mats[-1][2]], dim=1).mul_(POST_SCALE).contiguous()


def stack_uniform(w: list[NVFP4Tensor], n_pad: int, k_pad: int):
    """Codes [G·n_pad, k_pad/2], scale bytes [G·n_pad, k_pad/16] and global scales [G] of same-shape matrices, in a
    few whole-tensor ops (not a copy per group): the zero padding decodes to zeros."""
    g, (n, k) = len(w), tuple(w[0].shape)
    codes = torch.stack([t.data for t in w])
    scales = torch.stack([t.scales.view(torch.uint8) for t in w])
    if (n, k) != (n_pad, k_pad):
        codes = torch.nn.functional.pad(codes, (0, (k_pad - k) // 2, 0, n_pad - n))
        scales = torch.nn.functional.pad(scales, (0, (k_pad - k) // 16, 0, n_pad - n))
    gs = torch.stack([t.global_scale.to(torch.float32) for t in w])
    return codes.view(g * n_pad, k_pad // 2), scales.view(g * n_pad, k_pad // 16), gs


def layout_of(cfg: VarlenConfig) -> tuple[bool, int, int]:
    """The packed weights' (dual, tile_m, tile_k) a config reads (a two-box config reads half its tile_m's)."""
    return cfg.dual, cfg.packed_m, cfg.tile_k


class VarlenRunner:
    """One config compiled for packed weights: ``runner(codes, scales, gs_a, offsets) -> C [T, N]``, or
    ``runner.call_operand(x16, gs_a, offsets)`` on activations already decoded to the GEMM's fp16 operand (the GEMM
    alone, compiled on first use); a config with ``act="bf16"``: ``runner.call_a16(x, offsets) -> C [T, N]`` (no
    prologue: the bf16 rows are the GEMM's operand)."""

    def __init__(self, w: PackedWeights, cfg: VarlenConfig, out_dtype=torch.float16):
        self.cfg = validate(cfg)
        if layout_of(cfg) != (w.dual, w.tile_m, w.tile_k):
            raise ValueError(f"config {cfg.name} needs the layout {layout_of(cfg)} (dual, tile_m, tile_k); the weights "
                             f"were packed for {(w.dual, w.tile_m, w.tile_k)}")
        if out_dtype not in OUT_DTYPES:
            raise ValueError(f"cute-hopper writes {', '.join(map(str, OUT_DTYPES))}, not {out_dtype}")
        self.w, self.out_dtype = w, out_dtype
        out_name = OUT_DTYPES[out_dtype]
        g, n, kp = w.groups, w.n, w.k_pad
        if cfg.act == "bf16":  # the GEMM alone, on the caller's bf16 rows [T, K], its decode for the weights' words
            if w.own_words is None:
                raise ValueError(f"config {cfg.name} takes bf16 activations; these weights were packed for NVFP4 "
                                 "activations (PackedWeights(..., activations='bf16'))")
            with build_setting(a16_own_words=w.own_words):
                self._gemm = compile_gemm(cfg, g, n, kp, out_name, k=w.k)
            self._call = None
            self._gs_unread = w.gs_b.view(-1)  # the kernel's gs_a argument, not read for bf16 activations
        elif w.own_words is not None:
            raise ValueError(f"config {cfg.name} takes NVFP4 activations; these weights were packed for bf16 "
                             "activations (PackedWeights(..., activations='nvfp4'))")
        else:  # the prologue and the GEMM, from one host function
            self._gemm, self._call = None, compile_call(cfg, g, n, kp, out_name)
        # (.kernel.EAGER_FUSED: calls not being captured run the fused kernel, compiled on the first such call;
        # .kernel.FUSE_MAX_ROWS: captured calls of at most that many rows run it too, compiled here, not in a capture)
        self._fusable = self._call is not None and not kernel.FUSED_PROLOGUE
        self._eager_fused = self._fusable and kernel.EAGER_FUSED
        self._eager = None
        if self._fusable and kernel.FUSE_MAX_ROWS > 0:
            self._compile_eager()
        self._no_split = no_splits(cfg, n, w.device)
        self._combined, self._done = {}, None  # (call_combine: compiled per output dtype and k; the counters)
        self._splits = SplitScratch(partials_width(cfg, n), w.device) if cfg.split_k else None
        self.sms = torch.cuda.get_device_properties(w.device).multi_processor_count

    def slices(self, rows: int) -> int:
        """K slices per tile of a call of ``rows`` rows (:func:`~.config.choose_splits`; 1 without ``split_k``)."""
        w = self.w
        return choose_splits(self.cfg, rows, w.groups, w.n, w.k_pad, self.sms)

    def _split_args(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._splits is None:
            return self._no_split
        slices = self.slices(rows)
        return self._splits(slices, rows) if slices > 1 else self._no_split

    def check_rows(self, rows: int) -> None:
        """Raise ValueError where ``rows`` rows need more CTAs than one call launches (:func:`.config.check_grid`)."""
        check_grid(self.cfg, rows, self.w.groups, self.w.n)

    def call_a16(self, x: torch.Tensor, offsets: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` bf16 [T, K] (contiguous, 16-byte aligned), ``offsets`` int32 [G+1], ``out`` [T, N] or None; all on
        the weights' device, already checked by the caller."""
        if self._call is not None:
            raise TypeError(f"config {self.cfg.name} takes NVFP4 activations: runner(codes, scales, gs_a, offsets)")
        return self._gemm_alone(x, self._gs_unread, offsets, out)

    def call_operand(self, x16: torch.Tensor, gs_a: torch.Tensor, offsets: torch.Tensor,
                     out: torch.Tensor | None = None) -> torch.Tensor:
        """``x16`` fp16 [T, K_pad] (contiguous; each element e2m1 · block scale · 2^-7, what the prologue writes),
        ``gs_a`` float32 [1] or [G], ``offsets`` int32 [G+1], ``out`` [T, N] or None; all on the weights' device,
        already checked by the caller. The NVFP4 GEMM alone: it waits for the kernel before it (the operand's
        writer) as it waits for the prologue."""
        if self._call is None:
            raise TypeError(f"config {self.cfg.name} takes bf16 activations: runner.call_a16(x, offsets)")
        return self._gemm_alone(x16, gs_a, offsets, out)

    def call_combine(self, x: torch.Tensor, gs_a: torch.Tensor | None, offsets: torch.Tensor, row: torch.Tensor,
                     weights: torch.Tensor, out_dtype) -> torch.Tensor:
        """The GEMM on its operand ``x`` (as :meth:`call_a16`, or :meth:`call_operand` with ``gs_a``), then the
        weighted un-permute of its rows in the same launch (:meth:`.kernel.GroupedVarlenGemmSm90.call_combine`):
        ``[T, N]`` of ``out_dtype`` (:data:`COMBINE_DTYPES`) from ``row`` int64 [T·k] and ``weights`` fp32 [T, k]
        (contiguous); all checked by the caller. The GEMM's own rows (bf16) are scratch."""
        w, cfg = self.w, self.cfg
        if cfg.dual or self.out_dtype is not torch.bfloat16:
            raise TypeError(f"config {cfg.name}: the combine follows a single GEMM that writes bf16 rows")
        tokens = weights.shape[0]
        out = torch.empty(tokens, w.n, dtype=out_dtype, device=w.device)
        rows = x.shape[0]
        if rows == 0 or tokens == 0:  # (no copies: every sum is empty)
            return out.zero_()
        name, top_k = COMBINE_DTYPES[out_dtype], weights.shape[1]
        fn = self._combined.get((name, top_k))
        if fn is None:
            k = w.k if cfg.act == "bf16" else None
            fn = self._combined[name, top_k] = compile_combine(cfg, w.groups, w.n, w.k_pad, "BFloat16", name, top_k,
                                                               k=k)
        if self._done is None:  # (one set per stream for every output dtype: a CUDA graph may hold its address)
            self._done = _PerStream(w.device, -(-w.n // cfg.tile_m), 0,
                                    lambda n: torch.empty(n, dtype=torch.uint8, device=w.device))
        y = torch.empty(rows, w.n, dtype=torch.bfloat16, device=w.device)
        fn(w.packed, x, y, offsets, self._gs_unread if gs_a is None else gs_a, w.gs_b, *self._split_args(rows), row,
           weights, out, self._done._get(0)[1])
        return out

    def _gemm_alone(self, x, gs_a, offsets, out):
        """The GEMM on its operand ``x`` (bf16 rows, or the NVFP4 call's fp16 operand), no prologue."""
        w = self.w
        rows = x.shape[0]
        if out is None:
            out = torch.empty(rows, w.n, dtype=self.out_dtype, device=w.device)
        if rows == 0:
            return out
        if self._gemm is None:  # (an NVFP4 runner's, on its first operand call: one serving codes never needs it)
            self._gemm = compile_gemm(self.cfg, w.groups, w.n, w.k_pad, OUT_DTYPES[self.out_dtype])
        self._gemm(w.packed, x, out, offsets, gs_a, w.gs_b, *self._split_args(rows))
        return out

    def __call__(self, codes: torch.Tensor, scales: torch.Tensor, gs_a: torch.Tensor, offsets: torch.Tensor,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        """``codes`` uint8 [T, K/2], ``scales`` E4M3 [T, K/16] (row-major; float8_e4m3fn as NVFP4Tensor holds them,
        or their bytes as uint8), ``gs_a`` float32 [1] or [G], ``offsets`` int32 [G+1], ``out`` [T, N] or None; all
        on the weights' device, already checked by the caller."""
        if self._call is None:
            raise TypeError(f"config {self.cfg.name} takes bf16 activations: runner.call_a16(x, offsets)")
        w = self.w
        rows = codes.shape[0]
        if out is None:  # (an allocation costs about as much host time as a launch: callers may pass their own;
            # sizes as arguments, the note at OUT_DTYPES)
            out = torch.empty(rows, w.n, dtype=self.out_dtype, device=w.device)
        if rows == 0:
            return out
        if scales.dtype is not E4M3:  # (the compiled call takes E4M3: the NVFP4Tensor's scales need no view)
            scales = scales.view(E4M3)
        x16, count = w.x16(rows)
        call = self._call
        if self.fused(rows, torch._C._cuda_isCurrentStreamCapturing()):
            call = self._eager or self._compile_eager()
        call(codes, scales, x16, w.packed, out, offsets, gs_a, w.gs_b, count, *self._split_args(rows))
        return out

    def fused(self, rows: int, capturing: bool) -> bool:
        """Whether an NVFP4 call of ``rows`` rows runs the fused kernel (one launch) instead of the prologue and the
        GEMM: not captured with :data:`.kernel.EAGER_FUSED`, or at most :data:`.kernel.FUSE_MAX_ROWS` rows (captured
        or not); with :data:`.kernel.FUSED_PROLOGUE` the call is that kernel already."""
        return self._fusable and ((self._eager_fused and not capturing) or rows <= kernel.FUSE_MAX_ROWS)

    def _compile_eager(self):
        w = self.w
        self._eager = compile_call(self.cfg, w.groups, w.n, w.k_pad, OUT_DTYPES[self.out_dtype], fused=True)
        return self._eager
