"""Serving: weights prepared once, activations and routing per call.

``w = prepare_weights(b, b2=None, backend="cute-hopper")`` validates, packs and compiles once for the weights
(``b``: one NVFP4 ``[N, K]`` matrix per group or expert; ``b2`` the up projection of the fused
``silu(A·B1ᵀ)·(A·B2ᵀ)``). Then each call is either

- ``w(a)`` with ``a`` a list of G ``NVFP4Tensor`` (any rows per group, 0 included): returns G outputs; or
- ``w(a_packed, offsets)`` with ``a_packed`` one ``NVFP4Tensor [T, K]`` whose rows are grouped by expert and
  ``offsets`` an int32 device tensor ``[G+1]`` (group g owns rows ``offsets[g] .. offsets[g+1]``): returns
  ``C [T, N]``. Nothing is read back to the host, so the call can be captured in a CUDA graph and replayed after
  the offsets change (any split of the T rows). A's global scale is ``a_packed.global_scale`` or
  ``global_scale=`` (float32, ``[1]`` or ``[G]``, on the device).

Both call the torch custom op ``nvfp4lib::grouped_mm`` (fake implementation for ``torch.compile``). Rows of C
outside ``offsets[0] .. offsets[G]`` are left unspecified by the kernel (zeros in the reference). Offsets are
clamped to ``[0, T]`` and made monotone on the device (the kernel never reads or writes out of bounds); whether
they are right is the caller's business: ``check_offsets`` tests them at the cost of one synchronisation.
"""
from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from .formats import NVFP4Tensor, dequantize
from .tuning import heuristic, lookup, m_bucket, problem_key

__all__ = ["prepare_weights", "PreparedWeights", "check_offsets", "SERVING_BACKENDS"]

SERVING_BACKENDS = ("cute-hopper", "reference")
_REGISTRY: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()
_next_handle = [0]


def _weights(x, what: str) -> list[NVFP4Tensor]:
    if isinstance(x, NVFP4Tensor) or not isinstance(x, (list, tuple)) or not x:
        raise TypeError(f"{what} must be a non-empty list of NVFP4Tensor [N, K] (one per group), got "
                        f"{type(x).__name__}")
    for i, t in enumerate(x):
        if not isinstance(t, NVFP4Tensor) or len(t.shape) != 2:
            raise TypeError(f"{what}[{i}] must be a 2-D NVFP4Tensor [N, K], got "
                            f"{type(t).__name__}{'' if not isinstance(t, NVFP4Tensor) else tuple(t.shape)}")
    n, k = tuple(x[0].shape)
    for i, t in enumerate(x):
        if tuple(t.shape) != (n, k):
            raise ValueError(f"{what}[{i}] is {tuple(t.shape)} but {what}[0] is {(n, k)}: prepared weights share N "
                             "and K across groups (use nvfp4lib.grouped_gemm for ragged N or K)")
        if t.data.device != x[0].data.device:
            raise ValueError(f"{what}[{i}] is on {t.data.device} but {what}[0] is on {x[0].data.device}")
        # (a device global scale is not read back: that would synchronise every one-shot call; NVFP4Tensor checked a
        # CPU one when it was built)
    return list(x)


def prepare_weights(b, b2=None, *, backend: str = "cute-hopper", out_dtype=torch.float16, config="auto",
                    tune: bool = False, check_scales: bool = True) -> "PreparedWeights":
    """Validate, pack and compile once for these weights; call the result with activations (see the module doc).

    ``config``: "auto" (a cached choice per rows-per-group bucket, else a shape heuristic; ``tune=True`` times the
    candidates on the first call of each bucket and caches the winner) or a config name of the backend.
    ``check_scales``: refuse NaN E4M3 block scales in the weights (one read-back to the host); the one-shot
    functions skip it (a NaN scale then gives NaN outputs, never a finite wrong number)."""
    return PreparedWeights(b, b2, backend=backend, out_dtype=out_dtype, config=config, tune=tune,
                           check_scales=check_scales)


class PreparedWeights:
    def __init__(self, b, b2=None, *, backend="cute-hopper", out_dtype=torch.float16, config="auto", tune=False,
                 check_scales=True):
        b = _weights(b, "b")
        b2 = None if b2 is None else _weights(b2, "b2")
        if b2 is not None:
            if len(b2) != len(b):
                raise ValueError(f"b2 has {len(b2)} groups but b has {len(b)}")
            if tuple(b2[0].shape) != tuple(b[0].shape):
                raise ValueError(f"b2 is {tuple(b2[0].shape)} per group but b is {tuple(b[0].shape)}")
            if b2[0].data.device != b[0].data.device:
                raise ValueError(f"b2 is on {b2[0].data.device} but b is on {b[0].data.device}")
        if backend not in SERVING_BACKENDS:
            raise ValueError(f"unknown serving backend {backend!r}; known: {', '.join(SERVING_BACKENDS)}")
        if out_dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise TypeError(f"out_dtype must be torch.float16, torch.bfloat16 or torch.float32, got {out_dtype}")
        self.groups, self.n, self.k = len(b), int(b[0].shape[0]), int(b[0].shape[1])
        self.dual, self.out_dtype, self.backend = b2 is not None, out_dtype, backend
        self.device = b[0].data.device
        if backend == "reference":
            self.impl = _ReferenceImpl(b, b2, out_dtype)
        else:
            self.impl = _CuteHopperImpl(b, b2, out_dtype, config=config, tune=tune, check_scales=check_scales)
        self.impl.n, self.impl.out_dtype = self.n, out_dtype
        self.handle = _next_handle[0]
        _next_handle[0] += 1
        _REGISTRY[self.handle] = self.impl

    @property
    def held_bytes(self) -> int:
        return self.impl.held_bytes

    def config_for(self, rows: int) -> str:
        """The config a call with ``rows`` rows runs (resolved without timing)."""
        return self.impl.config_for(rows)

    def __call__(self, a, offsets=None, *, global_scale=None, out=None):
        """``out``: (packed form, eager) a [T, N] tensor of ``out_dtype`` to write instead of a new one."""
        if offsets is None:
            if out is not None:
                raise TypeError("out= is for the packed form w(a_packed, offsets)")
            if global_scale is not None:
                raise TypeError("global_scale= is for the packed form w(a_packed, offsets); a list carries each "
                                "group's own global scale")
            return self._call_list(a)
        return self._call_packed(a, offsets, global_scale, out)

    # -- the two call forms ---------------------------------------------------------------------------------------
    def _call_list(self, a):
        if isinstance(a, NVFP4Tensor):
            raise TypeError("w(a): a single NVFP4Tensor needs its group offsets, w(a_packed, offsets); or pass a list "
                            "of NVFP4Tensor, one per group")
        if not isinstance(a, (list, tuple)) or len(a) != self.groups:
            raise ValueError(f"w(a): a must be a list of {self.groups} NVFP4Tensor (one per group), got "
                             f"{len(a) if isinstance(a, (list, tuple)) else type(a).__name__}")
        for g, t in enumerate(a):
            if not isinstance(t, NVFP4Tensor) or len(t.shape) != 2:
                raise TypeError(f"a[{g}] must be a 2-D NVFP4Tensor [M, K], got {type(t).__name__}")
            self._check_activation(t, f"a[{g}]")
        rows = [int(t.shape[0]) for t in a]
        offs = [0]
        for m in rows:
            offs.append(offs[-1] + m)
        codes = torch.cat([t.data for t in a])
        scales = torch.cat([t.scales for t in a]).view(torch.uint8)
        gs = torch.stack([t.global_scale.to(torch.float32) for t in a])
        offsets = torch.tensor(offs, dtype=torch.int32).to(self.device, non_blocking=True)
        out = self._run(codes, scales, gs, offsets)
        return [out[o: o + m] for o, m in zip(offs, rows)]

    def _call_packed(self, a, offsets, global_scale, out=None):
        if not isinstance(a, NVFP4Tensor) or len(a.shape) != 2:
            raise TypeError(f"w(a_packed, offsets): a_packed must be one 2-D NVFP4Tensor [T, K], got "
                            f"{type(a).__name__}")
        self._check_activation(a, "a_packed")
        if not isinstance(offsets, torch.Tensor):
            raise TypeError(f"offsets must be an int32 tensor [G+1] on {self.device}, got {type(offsets).__name__}")
        if offsets.dtype != torch.int32:
            raise TypeError(f"offsets must be int32, got {offsets.dtype}")
        if tuple(offsets.shape) != (self.groups + 1,):
            raise ValueError(f"offsets must have shape [G+1] = [{self.groups + 1}], got {tuple(offsets.shape)}")
        if offsets.device != self.device:
            raise ValueError(f"offsets are on {offsets.device} but the weights are on {self.device}: keep them on the "
                             "device (no host round trip per call)")
        if global_scale is None:
            gs = a.global_scale.reshape(1)
        else:
            gs = global_scale
            if not isinstance(gs, torch.Tensor) or gs.dtype != torch.float32 or gs.dim() != 1 or gs.shape[0] not in (
                    1, self.groups):
                raise TypeError(f"global_scale must be a float32 tensor of shape [1] or [G] = [{self.groups}], got "
                                f"{getattr(gs, 'dtype', type(gs).__name__)} {tuple(getattr(gs, 'shape', ()))}")
            if gs.device != self.device:
                raise ValueError(f"global_scale is on {gs.device} but the weights are on {self.device}")
        if out is not None and (not isinstance(out, torch.Tensor) or tuple(out.shape) != (a.data.shape[0], self.n)
                                or out.dtype != self.out_dtype or out.device != self.device
                                or not out.is_contiguous()):
            raise ValueError(f"out must be a contiguous {self.out_dtype} tensor [T, N] = [{a.data.shape[0]}, {self.n}] "
                             f"on {self.device}, got {getattr(out, 'dtype', type(out).__name__)} "
                             f"{tuple(getattr(out, 'shape', ()))}")
        return self._run(a.data, a.scales.view(torch.uint8), gs, offsets, out)

    def _run(self, codes, scales, gs, offsets, out=None):
        # torch.compile traces the custom op (its fake gives shapes); eager calls skip the op's dispatch, whose
        # Python layers cost more host time than the two kernel launches
        if torch.compiler.is_compiling():
            if out is not None:
                raise TypeError("out= is not supported under torch.compile (the op returns a new tensor)")
            return torch.ops.nvfp4lib.grouped_mm(codes, scales, gs, offsets, self.handle)
        return self.impl(codes, scales, gs, offsets, out)

    def _check_activation(self, t: NVFP4Tensor, what: str) -> None:
        # every check costs host time on each call: only what the kernel needs and cannot see for itself
        codes, scales = t.data, t.scales
        if codes.shape[1] * 2 != self.k:
            raise ValueError(f"{what} has K={codes.shape[1] * 2} but the weights have K={self.k}")
        if codes.device != self.device:
            raise ValueError(f"{what} is on {codes.device} but the weights are on {self.device}")
        if not codes.is_contiguous() and (codes.stride(-1) != 1 or codes.stride(0) % 8) or not (
                scales.stride(-1) == 1) or (not torch.compiler.is_compiling() and codes.data_ptr() % 8):
            raise ValueError(f"{what}: the kernel reads rows in place and needs row-major codes and scales with 8-byte "
                             f"aligned code rows (strides {tuple(codes.stride())}, {tuple(scales.stride())}); pass "
                             ".contiguous() tensors")


def check_offsets(offsets: torch.Tensor, rows: int) -> None:
    """Raise ValueError unless ``offsets`` start at 0, never decrease and end at most at ``rows`` (one sync)."""
    o = offsets.detach().to("cpu", torch.int64)
    if int(o[0]) != 0:
        raise ValueError(f"offsets[0] = {int(o[0])}: the first group starts at row 0")
    d = o[1:] - o[:-1]
    if bool((d < 0).any()):
        g = int(torch.nonzero(d < 0)[0])
        raise ValueError(f"offsets decrease at group {g}: offsets[{g}] = {int(o[g])} > offsets[{g + 1}] = "
                         f"{int(o[g + 1])}")
    if int(o[-1]) > rows:
        raise ValueError(f"offsets[G] = {int(o[-1])} is past the {rows} rows of a_packed")


class _ReferenceImpl:
    """The exact semantics on any device: dequantize, fp32 products, one rounding; no synchronisation either
    (each group's rows are selected with a mask computed from the offsets on the device)."""

    def __init__(self, b, b2, out_dtype):
        self.b = [dequantize(t, torch.float32) for t in b]
        self.b2 = None if b2 is None else [dequantize(t, torch.float32) for t in b2]
        self.held_bytes = sum(t.numel() * 4 for t in self.b + (self.b2 or []))

    def config_for(self, rows: int) -> str:
        return "reference"

    def __call__(self, codes, scales, gs_a, offsets, out=None):
        if out is not None:
            return out.copy_(self(codes, scales, gs_a, offsets))
        rows = codes.shape[0]
        one = torch.ones((), dtype=torch.float32, device=codes.device)
        a = dequantize(NVFP4Tensor(codes, scales.view(torch.float8_e4m3fn), one), torch.float32)
        r = torch.arange(rows, dtype=torch.int32, device=codes.device)
        lo = torch.minimum(torch.clamp(offsets.to(torch.int64), min=0), torch.tensor(rows, device=offsets.device))
        lo = torch.cummax(lo, 0).values
        group = torch.searchsorted(lo[1:].contiguous(), r.to(torch.int64), right=True)
        inside = (r >= lo[0]) & (group < len(self.b))
        scale = gs_a[torch.clamp(group, max=len(self.b) - 1)] if gs_a.shape[0] > 1 else gs_a.expand(rows)
        out = torch.zeros((rows, self.n), dtype=torch.float32, device=codes.device)
        tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            for g, w in enumerate(self.b):
                y = (a @ w.T) * scale[:, None]
                if self.b2 is not None:
                    y = F.silu(y) * ((a @ self.b2[g].T) * scale[:, None])
                out = torch.where(((group == g) & inside)[:, None], y, out)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = tf32
        return out.to(self.out_dtype)


def dual_layout(groups: int, n: int) -> int:
    """tile_m of the dual GEMM's packed weights: 64 rows (of gate and of up) per CTA when the problem has many weight
    blocks, 128 when few (the host-scheduled kernel's auto chose so on S1-S4)."""
    return 64 if groups * n >= 16384 else 128


class _CuteHopperImpl:
    """The device-scheduled swap-AB kernel (:mod:`nvfp4lib.kernels.hopper_varlen`): weights packed once for one
    layout; one compiled runner per config used, chosen per rows-per-group bucket (:mod:`nvfp4lib.tuning`)."""

    def __init__(self, b, b2, out_dtype, *, config, tune, check_scales=True):
        from .kernels.hopper_varlen.config import CONFIGS, get_config
        from .kernels.hopper_varlen.runner import OUT_DTYPES, PackedWeights, layout_of, require_hopper

        if out_dtype not in OUT_DTYPES:
            raise ValueError(f"cute-hopper writes {', '.join(map(str, OUT_DTYPES))}, not {out_dtype}")
        require_hopper(b[0].data.device)
        n, k, groups, dual = int(b[0].shape[0]), int(b[0].shape[1]), len(b), b2 is not None
        if n % 8:
            raise ValueError(f"cute-hopper stores output rows in 16-byte chunks: N must be a multiple of 8, got {n}")
        if config == "auto":
            layout = (dual, dual_layout(groups, n) if dual else 128, 128)
            self.candidates = [c for c, cfg in CONFIGS.items() if layout_of(cfg) == layout]
            self.fixed = None
        else:
            cfg = get_config(config, dual)
            layout, self.candidates, self.fixed = layout_of(cfg), [cfg.name], cfg.name
        self.weights = PackedWeights(b, b2, layout[1], layout[2], check_scales=check_scales)
        self.tune, self.out_dtype, self.n = tune, out_dtype, n
        self.gpu = torch.cuda.get_device_name(b[0].data.device)
        self._key = lambda bucket: problem_key(self.gpu, "cute-hopper", dual, out_dtype, groups, n, k, bucket,
                                               f"m{layout[1]}k{layout[2]}")
        self._runners: dict = {}
        self._choice: dict[int, str] = {}
        self._last = (-1, None)

    @property
    def held_bytes(self) -> int:
        return self.weights.nbytes

    def runner(self, name: str):
        from .kernels.hopper_varlen.config import CONFIGS
        from .kernels.hopper_varlen.runner import VarlenRunner

        if name not in self._runners:
            self._runners[name] = VarlenRunner(self.weights, CONFIGS[name], self.out_dtype)
        return self._runners[name]

    def config_for(self, rows: int) -> str:
        if self.fixed:
            return self.fixed
        bucket = m_bucket(rows, self.weights.groups)
        if bucket not in self._choice:
            self._choice[bucket] = lookup(self._key(bucket)) or heuristic(self.weights.dual, bucket, self.candidates)
        return self._choice[bucket]

    def tune_bucket(self, codes, scales, gs_a, offsets) -> dict:
        """Time every candidate on these inputs; cache the fastest for their bucket. Returns {config: us}."""
        from .tuning import store, tune

        best, times = tune(lambda c: self.runner(c)(codes, scales, gs_a, offsets), self.candidates)
        bucket = m_bucket(codes.shape[0], self.weights.groups)
        store(self._key(bucket), best)
        self._choice[bucket] = best
        self._last = (-1, None)
        return times

    def __call__(self, codes, scales, gs_a, offsets, out=None):
        rows = codes.shape[0]
        if rows != self._last[0]:  # a serving loop repeats its row count: resolve the runner once per change
            if self.tune and not self.fixed and m_bucket(rows, self.weights.groups) not in self._choice:
                if not torch.cuda.is_current_stream_capturing():
                    self.tune_bucket(codes, scales, gs_a, offsets)
            self._last = (rows, self.runner(self.config_for(rows)))
        return self._last[1](codes, scales, gs_a, offsets, out)


@torch.library.custom_op("nvfp4lib::grouped_mm", mutates_args=())
def grouped_mm(codes: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor, offsets: torch.Tensor,
               handle: int) -> torch.Tensor:
    """C [T, N] of the prepared weights ``handle`` for packed activations (codes uint8 [T, K/2], E4M3 scale bytes as
    uint8 [T, K/16], A's global scale float32 [1] or [G]) and int32 group offsets [G+1]."""
    impl = _REGISTRY.get(handle)
    if impl is None:
        raise RuntimeError(f"nvfp4lib::grouped_mm: prepared weights {handle} no longer exist")
    return impl(codes, scales, global_scale, offsets)


@grouped_mm.register_fake
def _(codes, scales, global_scale, offsets, handle):
    impl = _REGISTRY[handle]
    return codes.new_empty((codes.shape[0], impl.n), dtype=impl.out_dtype)


__all__ += ["grouped_mm", "heuristic", "lookup", "m_bucket", "problem_key"]
