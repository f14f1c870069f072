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

A caller that quantizes its own activations can skip the prologue that decodes them:
``w.call_operand(x16, offsets, global_scale)`` takes them already decoded to the GEMM's fp16 operand ``[T,
w.operand_k]`` (``nvfp4lib.nn.quant_triton.quantize_to_operand`` writes it while quantizing; the MoE layer does), one
launch fewer, the same result (eager or in a CUDA graph; torch.compile has no custom op of it to trace).

A single GEMM whose rows are the copies of T tokens (an MoE down projection) can also sum them back per token:
``w.combine(a, offsets, row, weights)`` is ``Σ_j weights[t, j] · C[row[t·k + j]]`` in fp32, the un-permute's numbers;
on cute-hopper one launch (each column block's last CTA sums), which measured slower at decode than the GEMM then a
separate un-permute launch (notebook 11's rounds): the MoE layer keeps two launches by default.

``prepare_weights(..., activations="bf16")`` (W4A16) takes bf16 activations instead: ``w([a_g bf16 [M_g, K] ...])``
or ``w(a [T, K] bf16, offsets)``, no global scale (C = A·(gs_B·dequantized B)ᵀ); on cute-hopper the rows go into the
GEMM as they are (no prologue), through the custom op ``nvfp4lib::grouped_mm_a16``.
"""
from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from .formats import NVFP4Tensor, dequantize
from .kernels.hopper_varlen.gather import F as _F  # (the one-shot call's table: no import per call, ~1 µs)
from .kernels.hopper_varlen.gather import group_table as _group_table
from .reference import exact_matmuls
from .tuning import GRID_CLASSES, decode_grid, heuristic, lookup, m_bucket, problem_key, shipped

__all__ = ["prepare_weights", "PreparedWeights", "check_offsets", "SERVING_BACKENDS", "ACTIVATIONS"]

SERVING_BACKENDS = ("cute-hopper", "reference")
ACTIVATIONS = ("nvfp4", "bf16")  # what a call's activations are: NVFP4Tensor (W4A4) or bf16 tensors (W4A16)
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
            raise ValueError(f"{what}[{i}] is on device {t.data.device} but {what}[0] is on device {x[0].data.device}")
        # (a device global scale is not read back: that would synchronise every one-shot call; NVFP4Tensor checked a
        # CPU one when it was built)
    return list(x)


def prepare_weights(b, b2=None, *, backend: str = "cute-hopper", out_dtype=torch.float16, config="auto",
                    tune: bool = False, check_scales: bool = True, activations: str = "nvfp4") -> "PreparedWeights":
    """Validate, pack and compile once for these weights; call the result with activations (see the module doc).

    ``config``: "auto" (a cached choice per rows-per-group bucket, else a shape heuristic; ``tune=True`` times the
    candidates on the first call of each bucket and caches the winner) or a config name of the backend.
    ``check_scales``: refuse NaN E4M3 block scales in the weights (one read-back to the host); the one-shot
    functions skip it (a NaN scale then gives NaN outputs, never a finite wrong number).
    ``activations``: "nvfp4" (calls take NVFP4Tensor) or "bf16" (calls take bf16 tensors; see the module doc)."""
    return PreparedWeights(b, b2, backend=backend, out_dtype=out_dtype, config=config, tune=tune,
                           check_scales=check_scales, activations=activations)


class PreparedWeights:
    def __init__(self, b, b2=None, *, backend="cute-hopper", out_dtype=torch.float16, config="auto", tune=False,
                 check_scales=True, activations="nvfp4"):
        if activations not in ACTIVATIONS:
            raise ValueError(f"activations must be one of {ACTIVATIONS}, got {activations!r}")
        self.activations = activations
        b = _weights(b, "b")
        b2 = None if b2 is None else _weights(b2, "b2")
        if b2 is not None:
            if len(b2) != len(b):
                raise ValueError(f"b2 has {len(b2)} groups but b has {len(b)}")
            if tuple(b2[0].shape) != tuple(b[0].shape):
                raise ValueError(f"b2 is {tuple(b2[0].shape)} per group but b is {tuple(b[0].shape)}")
            if b2[0].data.device != b[0].data.device:
                raise ValueError(f"b2 is on device {b2[0].data.device} but b is on device {b[0].data.device}")
        if backend not in SERVING_BACKENDS:
            raise ValueError(f"unknown serving backend {backend!r}; known: {', '.join(SERVING_BACKENDS)}")
        _check_out_dtype(out_dtype)
        self.groups, self.n, self.k = len(b), int(b[0].shape[0]), int(b[0].shape[1])
        self.dual, self.out_dtype, self.backend = b2 is not None, out_dtype, backend
        self.device = b[0].data.device
        self._index = b[0].data.get_device()  # (_elsewhere)
        self._checked = (None, None)  # the offsets and global_scale tensors last checked (w(a_packed, offsets))
        if backend == "reference":
            self.impl = _ReferenceImpl(b, b2, out_dtype)
        else:
            self.impl = _CuteHopperImpl(b, b2, out_dtype, config=config, tune=tune, check_scales=check_scales,
                                        activations=activations)
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

    def choice_source(self, rows: int) -> str:
        """Where :meth:`config_for` takes its config from: "named" (given to prepare_weights, or a backend with one),
        "tuned" (the tuning cache, filled by ``tune``) or "rule" (:func:`nvfp4lib.tuning.heuristic`)."""
        source = getattr(self.impl, "choice_source", None)
        return source(rows) if source is not None else "named"

    def __call__(self, a, offsets=None, *, global_scale=None, out=None):
        """``out``: (packed form, eager) a [T, N] tensor of ``out_dtype`` to write instead of a new one."""
        if self.activations == "bf16":
            return self._call_a16(a, offsets, global_scale, out)
        if offsets is None:
            if out is not None:
                raise TypeError("out= is for the packed form w(a_packed, offsets)")
            if global_scale is not None:
                raise TypeError("global_scale= is for the packed form w(a_packed, offsets); a list carries each "
                                "group's own global scale")
            return self._call_list(a)
        return self._call_packed(a, offsets, global_scale, out)

    @property
    def operand_k(self) -> int | None:
        """K of the fp16 operand :meth:`call_operand` takes (the weights' K padded to the packed layout's K tile), or
        None where these weights take no operand (bf16 activations)."""
        return None if self.activations == "bf16" else self.impl.operand_k

    def call_operand(self, x16: torch.Tensor, offsets: torch.Tensor, global_scale: torch.Tensor, *, out=None):
        """NVFP4 activations already decoded to the GEMM's operand: ``x16`` fp16 ``[T, operand_k]``, each element
        ``e2m1 · block scale · 2^-7`` (columns past K zeros), as :func:`nvfp4lib.nn.quant_triton.quantize_to_operand`
        writes it while quantizing; ``global_scale`` float32 [1] or [G]. The same result as ``w(a_packed, offsets,
        global_scale=...)`` on those codes and scales, without the activation prologue (one launch fewer)."""
        if self.activations == "bf16":
            raise TypeError("call_operand is for NVFP4 activations; these weights were prepared with "
                            "activations='bf16': call w(a, offsets)")
        if torch.compiler.is_compiling():
            raise TypeError("call_operand has no custom op for torch.compile to trace: call w(a_packed, offsets) in "
                            "compiled code")
        return self.impl.operand(x16, self._check_operand(x16, offsets, global_scale, out), offsets, out)

    def _check_operand(self, x16, offsets, global_scale, out):
        """:meth:`call_operand`'s checks of its arguments; the global scale as the kernel takes it."""
        k = self.operand_k
        if not isinstance(x16, torch.Tensor) or x16.dtype != torch.float16 or x16.dim() != 2 or x16.shape[1] != k:
            raise TypeError(f"call_operand: x16 must be an fp16 tensor [T, {k}], got "
                            f"{getattr(x16, 'dtype', type(x16).__name__)} {tuple(getattr(x16, 'shape', ()))}")
        if self._elsewhere(x16):
            raise ValueError(f"x16 is on device {x16.device} but the weights are on device {self.device}")
        if not x16.is_contiguous() or x16.data_ptr() % 16:
            raise ValueError("call_operand: the kernel loads x16 by TMA and needs a contiguous, 16-byte aligned tensor")
        if global_scale is None:
            raise TypeError("call_operand needs the activations' global_scale (float32 [1] or [G])")
        gs = self._check_buffers(None, offsets, global_scale, False)
        if out is not None and (not isinstance(out, torch.Tensor) or tuple(out.shape) != (x16.shape[0], self.n)
                                or out.dtype != self.out_dtype or not out.is_contiguous() or self._elsewhere(out)):
            raise ValueError(f"out must be a contiguous {self.out_dtype} tensor [T, N] = [{x16.shape[0]}, {self.n}] "
                             f"on {self.device}")
        return gs

    def combine(self, a, offsets, row, weights, *, global_scale=None, out_dtype=torch.bfloat16):
        """The packed call, then the weighted un-permute of its rows (the copies of T tokens) in one launch:
        ``out[t] = Σ_j weights[t, j] · C[row[t·k + j]]`` summed in fp32 in j's order (a negative row adds 0 ·
        weights[t, j]), ``[T, N]`` of ``out_dtype``, where C = ``w(a, offsets)`` (bf16 activations) or
        ``w.call_operand(a, offsets, global_scale)`` (NVFP4 weights: ``a`` is the fp16 operand). ``row`` int64
        [T·k], ``weights`` float [T, k] (fp32 read as it is; another dtype converted first), on the weights' device;
        every row of ``a`` belongs to a group (``offsets[G]`` = its rows, as the MoE routing gives). On cute-hopper
        with bf16 C (single GEMMs only) the GEMM's last CTA of each column block sums them (C is scratch, never
        returned); elsewhere the call, then the same sum in torch. Not traced by torch.compile."""
        if self.dual:
            raise TypeError("combine follows a single GEMM (its rows are the copies); these weights are dual")
        if torch.compiler.is_compiling():
            raise TypeError("combine has no custom op for torch.compile to trace: call w(...), then the un-permute")
        if not isinstance(row, torch.Tensor) or row.dtype != torch.int64 or row.dim() != 1 or row.device != self.device:
            raise TypeError(f"row must be an int64 tensor [T·k] on {self.device}, got "
                            f"{getattr(row, 'dtype', type(row).__name__)} {tuple(getattr(row, 'shape', ()))}")
        if (not isinstance(weights, torch.Tensor) or weights.dim() != 2 or not weights.is_floating_point()
                or weights.numel() != row.numel() or weights.device != self.device):
            raise ValueError(f"weights must be a float tensor [T, k] with T·k = {row.numel()} (row's length) on "
                             f"{self.device}, got {getattr(weights, 'dtype', type(weights).__name__)} "
                             f"{tuple(getattr(weights, 'shape', ()))}")
        _check_out_dtype(out_dtype)
        w32 = weights.to(torch.float32).contiguous()
        if self.backend != "cute-hopper" or self.out_dtype is not torch.bfloat16:
            c = self(a, offsets) if self.activations == "bf16" else self.call_operand(a, offsets, global_scale)
            return weighted_rows_torch(c, row, w32, out_dtype)
        if self.activations == "bf16":
            self._check_a16_packed(a, offsets, None)
            return self.impl.combine(a, None, offsets, row, w32, out_dtype)
        return self.impl.combine(a, self._check_operand(a, offsets, global_scale, None), offsets, row, w32, out_dtype)

    # -- the two call forms ---------------------------------------------------------------------------------------
    def _call_list(self, a):
        if isinstance(a, NVFP4Tensor):
            raise TypeError("w(a): a single NVFP4Tensor needs its group offsets, w(a_packed, offsets); or pass a list "
                            "of NVFP4Tensor, one per group")
        if not isinstance(a, (list, tuple)) or len(a) != self.groups:
            raise ValueError(f"w(a): a must be a list of {self.groups} NVFP4Tensor (one per group), got "
                             f"{len(a) if isinstance(a, (list, tuple)) else type(a).__name__}")
        compiling = torch.compiler.is_compiling()
        for g, t in enumerate(a):
            if not isinstance(t, NVFP4Tensor) or len(t.shape) != 2:
                raise TypeError(f"a[{g}] must be a 2-D NVFP4Tensor [M, K], got {type(t).__name__}")
            self._check_activation(t, f"a[{g}]", compiling)
        rows = [int(t.shape[0]) for t in a]
        offs = [0]
        for m in rows:
            offs.append(offs[-1] + m)
        codes = torch.cat([t.data for t in a])
        scales = torch.cat([t.scales for t in a])
        gs = torch.stack([t.global_scale.to(torch.float32) for t in a])
        offsets = torch.tensor(offs, dtype=torch.int32).to(self.device, non_blocking=True)
        out = self._run(codes, scales, gs, offsets, None, compiling)
        return [out[o: o + m] for o, m in zip(offs, rows)]

    def _call_packed(self, a, offsets, global_scale, out=None):
        # the host time of an eager call is mostly these checks and two launches: each check here is the cheapest
        # torch query that decides it (NVFP4Tensor.shape alone costs a launch's tenth)
        if not isinstance(a, NVFP4Tensor) or a.data.dim() != 2:
            raise TypeError(f"w(a_packed, offsets): a_packed must be one 2-D NVFP4Tensor [T, K], got "
                            f"{type(a).__name__}")
        compiling = torch.compiler.is_compiling()
        self._check_activation(a, "a_packed", compiling)
        if offsets is self._checked[0] and global_scale is self._checked[1] and global_scale is not None:
            gs = global_scale  # a serving loop passes the same buffers: checked on the first call
        else:
            gs = self._check_buffers(a, offsets, global_scale, compiling)
        return self._run(a.data, a.scales, gs, offsets, self._check_out(a, out), compiling)

    def _check_buffers(self, a, offsets, global_scale, compiling: bool):
        """Check the call's offsets and global scale; return the global scale as the kernel takes it ([1] or [G])."""
        if not isinstance(offsets, torch.Tensor):
            raise TypeError(f"offsets must be an int32 tensor [G+1] on {self.device}, got {type(offsets).__name__}")
        if offsets.dtype != torch.int32:
            raise TypeError(f"offsets must be int32, got {offsets.dtype}")
        if offsets.dim() != 1 or offsets.shape[0] != self.groups + 1:
            raise ValueError(f"offsets must have shape [G+1] = [{self.groups + 1}], got {tuple(offsets.shape)}")
        if self._elsewhere(offsets):
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
            if self._elsewhere(gs):
                raise ValueError(f"global_scale is on device {gs.device} but the weights are on device {self.device}")
            if not compiling:
                self._checked = (offsets, global_scale)
        return gs

    def _check_out(self, a, out):
        if out is not None and (not isinstance(out, torch.Tensor) or tuple(out.shape) != (a.data.shape[0], self.n)
                                or out.dtype != self.out_dtype or out.device != self.device
                                or not out.is_contiguous()):
            raise ValueError(f"out must be a contiguous {self.out_dtype} tensor [T, N] = [{a.data.shape[0]}, {self.n}] "
                             f"on {self.device}, got {getattr(out, 'dtype', type(out).__name__)} "
                             f"{tuple(getattr(out, 'shape', ()))}")
        return out

    def _run(self, codes, scales, gs, offsets, out, compiling: bool):
        # torch.compile traces the custom op (its fake gives shapes); eager calls skip the op's dispatch, whose
        # Python layers cost more host time than the two kernel launches
        if compiling:
            if out is not None:
                raise TypeError("out= is not supported under torch.compile (the op returns a new tensor)")
            return torch.ops.nvfp4lib.grouped_mm(codes, scales, gs, offsets, self.handle)
        return self.impl(codes, scales, gs, offsets, out)

    def _elsewhere(self, t: torch.Tensor) -> bool:
        """Whether ``t`` is not on the weights' device: an int compare (``tensor.device`` builds an object on each
        read); index -1 (CPU, meta) compares the devices."""
        return t.get_device() != self._index or (self._index < 0 and t.device != self.device)

    def _check_activation(self, t: NVFP4Tensor, what: str, compiling: bool) -> None:
        # every check costs host time on each call: only what the kernel needs and cannot see for itself
        # (``compiling``: torch.compiler.is_compiling(), asked once per call by the caller)
        codes, scales = t.data, t.scales
        if codes.shape[1] * 2 != self.k:
            raise ValueError(f"{what} has K={codes.shape[1] * 2} but the weights have K={self.k}")
        if self._elsewhere(codes):
            raise ValueError(f"{what} is on device {codes.device} but the weights are on device {self.device}")
        if not (codes.is_contiguous() and scales.is_contiguous()) and (
                codes.stride(-1) != 1 or codes.stride(0) % 8 or scales.stride(-1) != 1) or (
                not compiling and codes.data_ptr() % 8):
            raise ValueError(f"{what}: the kernel reads rows in place and needs row-major codes and scales with 8-byte "
                             f"aligned code rows (strides {tuple(codes.stride())}, {tuple(scales.stride())}); pass "
                             ".contiguous() tensors")


    # -- bf16 activations (activations="bf16") ------------------------------------------------------------------------
    def _call_a16(self, a, offsets, global_scale, out):
        if global_scale is not None:
            raise TypeError("global_scale= is for NVFP4 activations; bf16 activations have none (these weights were "
                            "prepared with activations='bf16')")
        if offsets is None:
            if out is not None:
                raise TypeError("out= is for the packed form w(a_packed, offsets)")
            if isinstance(a, torch.Tensor) or not isinstance(a, (list, tuple)) or len(a) != self.groups:
                raise ValueError(f"w(a): a must be a list of {self.groups} bf16 tensors [M_g, K] (one per group), got "
                                 f"{len(a) if isinstance(a, (list, tuple)) else type(a).__name__}; a single [T, K] "
                                 "tensor needs its group offsets, w(a, offsets)")
            for g, t in enumerate(a):
                self._check_a16(t, f"a[{g}]", packed=False)
            rows = [int(t.shape[0]) for t in a]
            offs = [0]
            for m in rows:
                offs.append(offs[-1] + m)
            x = torch.cat(list(a))
            offsets = torch.tensor(offs, dtype=torch.int32).to(self.device, non_blocking=True)
            c = self._run_a16(x, offsets)
            return [c[o: o + m] for o, m in zip(offs, rows)]
        self._check_a16_packed(a, offsets, out)
        return self._run_a16(a, offsets, out)

    def _check_a16_packed(self, a, offsets, out) -> None:
        """The packed bf16 call's checks of its arguments (``w(a, offsets, out=)``)."""
        self._check_a16(a, "a", packed=True)
        if not isinstance(offsets, torch.Tensor) or offsets.dtype != torch.int32:
            raise TypeError(f"offsets must be an int32 tensor [G+1] on {self.device}, got "
                            f"{getattr(offsets, 'dtype', type(offsets).__name__)}")
        if offsets.dim() != 1 or offsets.shape[0] != self.groups + 1:
            raise ValueError(f"offsets must have shape [G+1] = [{self.groups + 1}], got {tuple(offsets.shape)}")
        if offsets.device != self.device:
            raise ValueError(f"offsets are on {offsets.device} but the weights are on {self.device}: keep them on the "
                             "device (no host round trip per call)")
        if out is not None and (not isinstance(out, torch.Tensor) or tuple(out.shape) != (a.shape[0], self.n)
                                or out.dtype != self.out_dtype or out.device != self.device
                                or not out.is_contiguous()):
            raise ValueError(f"out must be a contiguous {self.out_dtype} tensor [T, N] = [{a.shape[0]}, {self.n}] "
                             f"on {self.device}, got {getattr(out, 'dtype', type(out).__name__)} "
                             f"{tuple(getattr(out, 'shape', ()))}")

    def _run_a16(self, x, offsets, out=None):
        if torch.compiler.is_compiling():
            if out is not None:
                raise TypeError("out= is not supported under torch.compile (the op returns a new tensor)")
            return torch.ops.nvfp4lib.grouped_mm_a16(x, offsets, self.handle)
        return self.impl.a16(x, offsets, out)

    def _check_a16(self, t, what: str, packed: bool) -> None:
        form = "w(a, offsets): a must be one bf16 tensor [T, K]" if packed else f"{what} must be a bf16 tensor [M, K]"
        if isinstance(t, NVFP4Tensor) or not isinstance(t, torch.Tensor):
            raise TypeError(f"{form}, got {type(t).__name__} (these weights were prepared with activations='bf16'; "
                            "NVFP4 activations need activations='nvfp4')")
        if t.dtype != torch.bfloat16:
            raise TypeError(f"{form}, got {t.dtype} (convert with .to(torch.bfloat16))")
        if t.dim() != 2:
            raise ValueError(f"{form}, got shape {tuple(t.shape)}")
        if t.shape[1] != self.k:
            raise ValueError(f"{what} has K={t.shape[1]} but the weights have K={self.k}")
        if t.device != self.device:
            raise ValueError(f"{what} is on device {t.device} but the weights are on device {self.device}")
        if packed and self.backend == "cute-hopper" and (not t.is_contiguous() or (
                not torch.compiler.is_compiling() and t.data_ptr() % 16)):
            raise ValueError(f"{what}: the kernel loads rows by TMA and needs a contiguous, 16-byte aligned [T, K] "
                             f"tensor (strides {tuple(t.stride())}); pass .contiguous()")


def _check_out_dtype(out_dtype) -> None:
    if out_dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"out_dtype must be torch.float16, torch.bfloat16 or torch.float32, got {out_dtype}")


def weighted_rows_torch(y: torch.Tensor, row: torch.Tensor, weights: torch.Tensor,
                        out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``out[t] = Σ_j weights[t, j] · y[row[t·k + j]]`` in fp32 in torch (:meth:`PreparedWeights.combine`'s form off
    its kernel, and :func:`nvfp4lib.nn.routing.weighted_rows`'): a negative row adds ``0 · weights[t, j]``."""
    t, k = weights.shape
    copies = y.index_select(0, row.clamp(min=0)).view(t, k, y.shape[-1]).to(torch.float32)
    copies = torch.where((row < 0).view(t, k, 1), torch.zeros((), device=y.device), copies)
    return (copies * weights.to(torch.float32).unsqueeze(-1)).sum(dim=1).to(out_dtype)


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
        one = torch.ones((), dtype=torch.float32, device=codes.device)
        a = dequantize(NVFP4Tensor(codes, scales.view(torch.float8_e4m3fn), one), torch.float32)
        return self._grouped(a, gs_a, offsets)

    operand_k = property(lambda self: self.b[0].shape[1])  # (no padding: the operand is [T, K])

    def operand(self, x16, gs_a, offsets, out=None):
        """The fp16 operand (e2m1 · block scale · 2^-7): its values times 2^7, exactly, are the dequantized codes."""
        y = self._grouped(x16[:, :self.operand_k].float() * 128.0, gs_a, offsets)
        return y if out is None else out.copy_(y)

    def a16(self, x, offsets, out=None):
        """bf16 activations ``x [T, K]``: the same products with x as it is (exact in fp32), no activation scale."""
        if out is not None:
            return out.copy_(self.a16(x, offsets))
        return self._grouped(x.to(torch.float32), torch.ones(1, dtype=torch.float32, device=x.device), offsets)

    def _grouped(self, a, gs_a, offsets):
        rows = a.shape[0]
        r = torch.arange(rows, dtype=torch.int32, device=a.device)
        lo = torch.minimum(torch.clamp(offsets.to(torch.int64), min=0), torch.tensor(rows, device=offsets.device))
        lo = torch.cummax(lo, 0).values
        group = torch.searchsorted(lo[1:].contiguous(), r.to(torch.int64), right=True)
        inside = (r >= lo[0]) & (group < len(self.b))
        scale = gs_a[torch.clamp(group, max=len(self.b) - 1)] if gs_a.shape[0] > 1 else gs_a.expand(rows)
        out = torch.zeros((rows, self.n), dtype=torch.float32, device=a.device)
        with exact_matmuls():
            for g, w in enumerate(self.b):
                y = (a @ w.T) * scale[:, None]
                if self.b2 is not None:
                    y = F.silu(y) * ((a @ self.b2[g].T) * scale[:, None])
                out = torch.where(((group == g) & inside)[:, None], y, out)
        return out.to(self.out_dtype)


def dual_layout(groups: int, n: int) -> int:
    """tile_m of the dual GEMM's packed weights: 64 rows (of gate and of up) per CTA when the problem has many weight
    blocks, 128 when few (the host-scheduled kernel's auto chose so on S1-S4)."""
    return 64 if groups * n >= 16384 else 128


def tuning_layout(tile_m: int, tile_k: int, activations: str = "nvfp4") -> str:
    """The layout field of a cute-hopper tuning key: the packed weights' tiling, and the activation type (bf16
    activations run other configs, whose times must not mix with NVFP4's)."""
    return f"m{tile_m}k{tile_k}" + ("_a16" if activations == "bf16" else "")


def auto_layout(dual: bool, groups: int, n: int, activations: str = "nvfp4"):
    """(layout, candidates) of ``config="auto"``: the packed weights' (dual, tile_m, tile_k) for the shape, and the
    configs of that layout for the activation type with the hinted stage wait or the once-wait, in :data:`CONFIGS`
    order.

    The spin-wait configs (``_w``) are A/B arms, named configs only, never tuning candidates: tuning times eager calls,
    which run the fused kernel, and the spin wait that was fine there (S1 128.4 us) ran S1's graph replays, the
    unfused kernel, 36% slower on two GPUs (tuning.py's note): a tuned choice would have carried it into graphs. Of the
    once-wait configs (``_o``) those a rule of tuning ships (``tuning.shipped``) are candidates (measured in graph
    replay and eager calls); the others are named A/B arms until a run has timed them."""
    from .kernels.hopper_varlen.config import CONFIGS
    from .kernels.hopper_varlen.runner import layout_of

    ships = shipped()
    layout = (dual, dual_layout(groups, n) if dual else 128, 128)
    return layout, [c for c, cfg in CONFIGS.items() if layout_of(cfg) == layout and cfg.act == activations
                    and (cfg.wait == "suspend" or (cfg.wait == "once" and c in ships))]


def _rule_pick(dual: bool, bucket: int, candidates: list[str], k: int, activations: str = "nvfp4",
               grid: str = "") -> str:
    """:func:`nvfp4lib.tuning.heuristic` over a layout's candidates (``grid``: the call's, as
    :func:`nvfp4lib.tuning.decode_grid` classes it); the bf16 configs (``vl_a16_`` names) mirror the NVFP4 ones and
    take their ranking, until they are timed apart."""
    if activations == "nvfp4":
        return heuristic(dual, bucket, candidates, k, grid)
    as_nvfp4 = [c.replace("vl_a16_", "vl_", 1) for c in candidates]
    return candidates[as_nvfp4.index(heuristic(dual, bucket, as_nvfp4, k, grid))]


def rule_choice(dual: bool, groups: int, n: int, k: int, rows: int, activations: str = "nvfp4",
                sms: int = 132) -> str:
    """The config ``config="auto"`` runs for a call of ``rows`` rows over ``groups`` groups where the tuning cache has
    no entry: the shape rule as set now, computed without a GPU."""
    _, candidates = auto_layout(dual, groups, n, activations)
    grid = decode_grid(dual, rows, groups, n, k, sms)
    return _rule_pick(dual, m_bucket(rows, groups), candidates, k, activations, grid)


class _CuteHopperImpl:
    """The device-scheduled swap-AB kernel (:mod:`nvfp4lib.kernels.hopper_varlen`): weights packed once for one
    layout; one compiled runner per config used, chosen per rows-per-group bucket (:mod:`nvfp4lib.tuning`)."""

    def __init__(self, b, b2, out_dtype, *, config, tune, check_scales=True, activations="nvfp4"):
        from .kernels.hopper_varlen.config import get_config
        from .kernels.hopper_varlen.runner import OUT_DTYPES, PackedWeights, layout_of, require_hopper

        if out_dtype not in OUT_DTYPES:
            raise ValueError(f"cute-hopper writes {', '.join(map(str, OUT_DTYPES))}, not {out_dtype}")
        require_hopper(b[0].data.device)
        n, k, groups, dual = int(b[0].shape[0]), int(b[0].shape[1]), len(b), b2 is not None
        if n % 8:
            raise ValueError(f"cute-hopper stores output rows in 16-byte chunks: N must be a multiple of 8, got {n}")
        if config == "auto":
            layout, self.candidates = auto_layout(dual, groups, n, activations)
            self.fixed = None
        else:
            cfg = get_config(config, dual, activations)
            layout, self.candidates, self.fixed = layout_of(cfg), [cfg.name], cfg.name
        self.weights = PackedWeights(b, b2, layout[1], layout[2], check_scales=check_scales, activations=activations)
        self.tune, self.out_dtype, self.n, self.k = tune, out_dtype, n, k
        self.gpu = torch.cuda.get_device_name(b[0].data.device)
        self.activations = activations
        tag = tuning_layout(layout[1], layout[2], activations)
        self._key = lambda bucket: problem_key(self.gpu, "cute-hopper", dual, out_dtype, groups, n, k, bucket, tag)
        self._runners: dict = {}
        self._choice: dict[tuple[int, str], str] = {}  # (bucket, tuning.decode_grid)
        self.sms = torch.cuda.get_device_properties(self.weights.device).multi_processor_count
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
        grid = decode_grid(self.weights.dual, rows, self.weights.groups, self.n, self.k, self.sms)
        if (bucket, grid) not in self._choice:
            self._choice[bucket, grid] = lookup(self._key(bucket)) or self._heuristic(bucket, grid)
        return self._choice[bucket, grid]

    def choice_source(self, rows: int) -> str:
        if self.fixed:
            return "named"
        return "tuned" if lookup(self._key(m_bucket(rows, self.weights.groups))) else "rule"

    def _heuristic(self, bucket: int, grid: str = "") -> str:
        return _rule_pick(self.weights.dual, bucket, self.candidates, self.k, self.activations, grid)

    def tune_bucket(self, codes, scales, gs_a, offsets) -> dict:
        """Time every candidate on these inputs; cache the fastest for their bucket. Returns {config: us}."""
        return self._tune(lambda c: self.runner(c)(codes, scales, gs_a, offsets), codes.shape[0])

    def _runner_for(self, rows: int, run):
        """The runner for ``rows`` rows (tuning its bucket first with ``run(config)`` where asked, given and not
        capturing); a serving loop repeats its row count, so it is resolved once per change of T."""
        if rows != self._last[0]:
            bucket = m_bucket(rows, self.weights.groups)
            if self.tune and run is not None and not self.fixed and all(b != bucket for b, _ in self._choice):
                if not torch.cuda.is_current_stream_capturing():
                    self._tune(run, rows)
            run = self.runner(self.config_for(rows))
            run.check_rows(rows)
            self._last = (rows, run)
        return self._last[1]

    def __call__(self, codes, scales, gs_a, offsets, out=None):
        rows, (last, run) = codes.shape[0], self._last
        if rows != last:  # (a serving loop repeats its row count: no closure, no lookup per call)
            run = self._runner_for(rows, lambda c: self.runner(c)(codes, scales, gs_a, offsets))
        return run(codes, scales, gs_a, offsets, out)

    @property
    def operand_k(self) -> int:
        return self.weights.k_pad

    def operand(self, x16, gs_a, offsets, out=None):
        """The fp16 operand ``x16 [T, K_pad]`` (checked by the caller): the runner of the rows' bucket, the GEMM alone
        (a tuned bucket is timed on codes; an operand call never tunes)."""
        return self._runner_for(x16.shape[0], None).call_operand(x16, gs_a, offsets, out)

    def combine(self, x, gs_a, offsets, row, weights, out_dtype):
        """:meth:`PreparedWeights.combine` (checked by the caller): the runner of the rows' bucket, as :meth:`a16` or
        :meth:`operand`, its GEMM then the weighted un-permute in one launch."""
        return self._runner_for(x.shape[0], None).call_combine(x, gs_a, offsets, row, weights, out_dtype)

    def a16(self, x, offsets, out=None):
        """bf16 activations ``x [T, K]`` (checked by the caller): the runner of the rows' bucket, as ``__call__``."""
        return self._runner_for(x.shape[0], lambda c: self.runner(c).call_a16(x, offsets)).call_a16(x, offsets, out)

    def _tune(self, run, rows: int) -> dict:
        from .tuning import store, tune

        best, times = tune(run, self.candidates)
        bucket = m_bucket(rows, self.weights.groups)
        store(self._key(bucket), best)
        for grid in GRID_CLASSES:  # (a tuned choice whatever the grid)
            self._choice[bucket, grid] = best
        self._last = (-1, None)
        return times


_GPU_NAMES: dict = {}
_ONESHOT_CHOICE: dict = {}


def _oneshot_config(device, dual: bool, out_dtype, groups: int, n: int, k: int, rows: int):
    """The config a one-shot call runs: the tuning cache's choice for the shape, else the heuristic (never timed);
    remembered per (shape, bucket) for the process."""
    from .kernels.hopper_varlen.config import CONFIGS

    bucket = m_bucket(rows, groups)
    key = (device, dual, out_dtype, groups, n, k, bucket)
    cfg = _ONESHOT_CHOICE.get(key)
    if cfg is None:
        gpu = _GPU_NAMES.get(device)
        if gpu is None:
            gpu = _GPU_NAMES[device] = torch.cuda.get_device_name(device)
        layout, cands = auto_layout(dual, groups, n)
        name = lookup(problem_key(gpu, "cute-hopper", dual, out_dtype, groups, n, k, bucket,
                                  tuning_layout(layout[1], layout[2]))) or _rule_pick(dual, bucket, cands, k)
        cfg = _ONESHOT_CHOICE[key] = CONFIGS[name]
    return cfg


def oneshot(a, b, b2=None, *, out_dtype=torch.float16, split: bool = False):
    """C ``[T, N]`` (the groups' rows in order; with ``split``, the list of per-group views of it) of a one-shot
    cute-hopper call with new weights, or None where the fast path does not apply: anything but lists of 2-D
    NVFP4Tensors on one CUDA device, sharing N and K, readable in place
    (:func:`.kernels.hopper_varlen.gather.group_table`, this call's only pass over the operands), with an output dtype
    and N the kernel takes. The caller then checks the operands (:func:`nvfp4lib.api.validate_operands`, which names
    what is wrong) and prepares the weights."""
    if a is None:
        return None
    table = _group_table(a, b, b2)
    if table is None:
        return None
    shape, index = b[0].addresses()[:2]
    if index < 0:
        return None
    sizes = table[2::_F]  # each group's rows (the table's a_rows column)
    c = oneshot_run(table, sum(sizes), len(b), shape[0], 2 * shape[1], b2 is not None, out_dtype, _cuda(index))
    if c is None or not split:
        return c
    return list(torch.split_with_sizes(c, sizes))


_ONESHOTS: dict = {}  # (device, dual, out dtype, G, N, K, T) -> OneShot: one lookup per call
_DEVICES: dict = {}  # CUDA device index -> torch.device (built once, not per call)


def _cuda(index: int) -> torch.device:
    d = _DEVICES.get(index)
    if d is None:
        d = _DEVICES[index] = torch.device("cuda", index)
    return d


def oneshot_run(table: list[int], rows: int, groups: int, n: int, k: int, dual: bool, out_dtype, device, *,
                swizzled: bool = False, out: torch.Tensor | None = None) -> torch.Tensor | None:
    """The one-shot call from an address table (the group rows of :func:`.kernels.hopper_varlen.gather.group_table`,
    or the study's harness with its scales in the blocked layout: ``swizzled``): one gather launch (weights and
    activation rows packed from the callers' tensors in place, offsets, global scales), the prologue and the GEMM,
    writing C ``[rows, N]`` into ``out`` where given (the caller checked it: contiguous, 16-byte aligned, of
    ``out_dtype`` on ``device``). None where the kernel cannot take it."""
    key = (device, dual, out_dtype, groups, n, k, rows)
    shot = _ONESHOTS.get(key)
    if shot is None:
        from .kernels.hopper_varlen.oneshot import OneShot
        from .kernels.hopper_varlen.runner import OUT_DTYPES

        if out_dtype not in OUT_DTYPES or n % 8:
            return None
        cfg = _oneshot_config(device, dual, out_dtype, groups, n, k, rows)
        if len(_ONESHOTS) > 4096:
            _ONESHOTS.clear()
        shot = _ONESHOTS[key] = OneShot.get(cfg, groups, n, k, out_dtype, device)
    return shot.run(table, rows, swz_a=swizzled, swz_b=swizzled, out=out)


@torch.library.custom_op("nvfp4lib::grouped_mm", mutates_args=())
def grouped_mm(codes: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor, offsets: torch.Tensor,
               handle: int) -> torch.Tensor:
    """C [T, N] of the prepared weights ``handle`` for packed activations (codes uint8 [T, K/2], E4M3 scales
    [T, K/16] as float8_e4m3fn or their bytes as uint8, A's global scale float32 [1] or [G]) and int32 group offsets
    [G+1]."""
    impl = _REGISTRY.get(handle)
    if impl is None:
        raise RuntimeError(f"nvfp4lib::grouped_mm: prepared weights {handle} no longer exist")
    return impl(codes, scales, global_scale, offsets)


@grouped_mm.register_fake
def _(codes, scales, global_scale, offsets, handle):
    impl = _REGISTRY[handle]
    return codes.new_empty((codes.shape[0], impl.n), dtype=impl.out_dtype)


__all__ += ["grouped_mm", "heuristic", "lookup", "m_bucket", "problem_key"]


@torch.library.custom_op("nvfp4lib::grouped_mm_a16", mutates_args=())
def grouped_mm_a16(x: torch.Tensor, offsets: torch.Tensor, handle: int) -> torch.Tensor:
    """C [T, N] of the prepared weights ``handle`` (prepared with activations="bf16") for bf16 activations
    ``x [T, K]`` and int32 group offsets [G+1]."""
    impl = _REGISTRY.get(handle)
    if impl is None:
        raise RuntimeError(f"nvfp4lib::grouped_mm_a16: prepared weights {handle} no longer exist")
    return impl.a16(x, offsets)


@grouped_mm_a16.register_fake
def _(x, offsets, handle):
    impl = _REGISTRY[handle]
    return x.new_empty((x.shape[0], impl.n), dtype=impl.out_dtype)


__all__ += ["grouped_mm_a16"]
