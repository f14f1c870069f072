"""The study's harness as given: GPU MODE's ``nvfp4_group_gemm`` and ``nvfp4_dual_gemm`` input tuples.

The study was run in GPU MODE's harness (repository gpu-mode/reference-kernels, ``problems/nvidia/``). This module
takes that harness's tuples exactly as its ``generate_input`` builds them and computes them with the serving path.

``custom_kernel(data)`` -- task ``nvfp4_group_gemm``; ``data = (abc, sf, sf_reordered, problem_sizes)``, one entry
per group in each list:

- ``abc[g] = (a, b, c)``: codes ``a [M, K/2, L]`` and ``b [N, K/2, L]`` (``float4_e2m1fn_x2``), output
  ``c [M, N, L]`` float16, all on the GPU;
- ``sf[g] = (sfa [M, K/16, L], sfb [N, K/16, L])``: the plain E4M3 scales, **on the CPU** (the task's reference
  reads them); never read here;
- ``sf_reordered[g] = (sfa, sfb)``: the same scales on the GPU in the 128x4 "blocked" layout, seen as the 6-d
  ``(32, 4, ceil(rows/128), 4, ceil(K/64), L)`` tensor of :func:`nvfp4lib.formats.scales_cute_view` (its padding
  holds arbitrary values);
- ``problem_sizes[g] = (M, N, K, L)``.

It writes every ``c`` and returns the list of them. ``custom_kernel_dual(data)`` -- task ``nvfp4_dual_gemm``, one
``C = silu(A·B1ᵀ) * (A·B2ᵀ)``; ``data = (a, b1, b2, sfa, sfb1, sfb2, sfa_reordered, sfb1_reordered,
sfb2_reordered, c)`` with the shapes above (its plain scales are on the GPU too, but the reordered ones are what is
read, as for the group task); it writes ``c`` and returns it.

Only what is on the GPU is read: the codes and the reordered scales. Where every tensor lies as the task lays it
out (:func:`_task_row`), both entry points are one one-shot call (:func:`nvfp4lib.serving.oneshot_run`: one gather
reads them in place, then the prologue and the GEMM; no weights prepared); otherwise the reordered scales are turned
back into row-major scales by a few torch ops on the device (no host round trip, no synchronisation) and the weights
are prepared for the call. The tasks have no global scales (1 here) and always L = 1; anything else is refused with
a TypeError/ValueError naming the problem. :func:`study_tuple` builds the tuples from
:class:`nvfp4lib.problems.GroupedInputs`.
"""
from __future__ import annotations

import functools
import math
import operator

import torch

from .formats import BLOCK_SIZE, NVFP4Tensor, scales_cute_view, swizzle_scales, unswizzle_scales

__all__ = ["custom_kernel", "custom_kernel_dual", "group_operands", "dual_operands", "study_tuple"]

_FP4 = getattr(torch, "float4_e2m1fn_x2", None)
_CODE_DTYPES = tuple(d for d in (_FP4, torch.uint8) if d is not None)
_BACKENDS = ("cute-hopper", "reference")


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _check_backend(backend) -> None:
    if backend not in _BACKENDS:
        raise ValueError(f"backend {backend!r} is not supported here; known: {', '.join(_BACKENDS)}")


def _check_device(device: torch.device, backend: str) -> None:
    if backend == "cute-hopper" and device.type != "cuda":
        raise ValueError(f"the harness's codes are on {device}; backend 'cute-hopper' needs them on a CUDA GPU")


def _tensor(t, what: str, dtypes: tuple, device: torch.device | None, shape: tuple) -> torch.Tensor:
    """``t`` checked against the task's dtype, L = 1, ``shape`` and ``device``; returns its L = 0 slice."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{what} must be {' or '.join(map(str, dtypes))}, got {t.dtype}")
    if t.dim() != len(shape):
        raise ValueError(f"{what} must have {len(shape)} dims {shape}, got shape {tuple(t.shape)}")
    if t.shape[-1] != 1:
        raise ValueError(f"{what} has L = {t.shape[-1]}: only L = 1 is supported (the tasks always use it)")
    if tuple(t.shape) != shape:
        raise ValueError(f"{what} has shape {tuple(t.shape)}, expected {shape} from the problem size")
    if device is not None and t.device != device:
        raise ValueError(f"{what} is on {t.device} but the codes are on {device}: the harness's GPU tensors must "
                         "share one device")
    return t[..., 0]


def _codes(t, rows: int, k: int, what: str, device) -> torch.Tensor:
    return _tensor(t, what, _CODE_DTYPES, device, (rows, k // 2, 1)).view(torch.uint8).contiguous()


def _output(t, m: int, n: int, what: str, device) -> torch.Tensor:
    return _tensor(t, what, (torch.float16,), device, (m, n, 1))


def _scales(t, rows: int, k: int, what: str, device) -> torch.Tensor:
    """Row-major E4M3 scales ``[rows, K/16]`` from the task's reordered 6-d tensor, on its device."""
    cols = k // BLOCK_SIZE
    shape = (32, 4, _ceil_div(rows, 128), 4, _ceil_div(cols, 4), 1)
    five = _tensor(t, what, (torch.float8_e4m3fn,), device, shape)
    # back to the blocked order (rest_m, rest_k, 32, 4, 4): a view when the tensor has the task's strides
    flat = five.permute(2, 4, 0, 1, 3).reshape(-1)
    return unswizzle_scales(flat, rows, cols).contiguous()


def _size(size, g: int) -> tuple[int, int, int]:
    try:
        if len(size) != 4:
            raise TypeError
        m, n, k, l_ = (operator.index(v) for v in size)
    except TypeError:
        raise TypeError(f"problem_sizes[{g}] must be 4 integers (M, N, K, L), got {size!r}") from None
    if l_ != 1:
        raise ValueError(f"problem_sizes[{g}] has L = {l_}: only L = 1 is supported (the tasks always use it)")
    if m < 0 or n <= 0 or k <= 0 or k % BLOCK_SIZE:
        raise ValueError(f"problem_sizes[{g}] = {tuple(size)}: need M >= 0, N > 0 and K a positive multiple of "
                         f"{BLOCK_SIZE}")
    return m, n, k


def _pair(x, what: str, g: int) -> tuple:
    if not isinstance(x, (tuple, list)) or len(x) != (3 if what == "abc_tensors" else 2):
        want = "(a, b, c)" if what == "abc_tensors" else "a pair"
        raise TypeError(f"{what}[{g}] must be {want}, got {type(x).__name__}"
                        f"{f' of {len(x)}' if isinstance(x, (tuple, list)) else ''}")
    return tuple(x)


def group_operands(data, backend: str = "reference"):
    """``(a, b, c)`` from an ``nvfp4_group_gemm`` tuple: lists of NVFP4Tensor and the ``[M, N]`` views of the
    harness's outputs. Raises TypeError/ValueError naming what does not match the task's format."""
    if not isinstance(data, (tuple, list)) or len(data) != 4:
        raise TypeError("data must be the nvfp4_group_gemm tuple (abc_tensors, sfasfb_tensors, "
                        "sfasfb_reordered_tensors, problem_sizes), got "
                        f"{type(data).__name__}{f' of {len(data)}' if isinstance(data, (tuple, list)) else ''}")
    abc, plain, reordered, sizes = data
    for what, x in (("abc_tensors", abc), ("sfasfb_tensors", plain), ("sfasfb_reordered_tensors", reordered),
                    ("problem_sizes", sizes)):
        if not isinstance(x, (tuple, list)):
            raise TypeError(f"{what} must be a list (one entry per group), got {type(x).__name__}")
    if not abc:
        raise ValueError("abc_tensors is empty: a grouped GEMM needs at least one group")
    if not (len(abc) == len(plain) == len(reordered) == len(sizes)):
        raise ValueError(f"group counts differ: {len(abc)} abc_tensors, {len(plain)} sfasfb_tensors, "
                         f"{len(reordered)} sfasfb_reordered_tensors, {len(sizes)} problem_sizes")
    first = _pair(abc[0], "abc_tensors", 0)[0]
    if not isinstance(first, torch.Tensor):
        raise TypeError(f"a[0] must be a torch.Tensor, got {type(first).__name__}")
    device = first.device
    _check_device(device, backend)
    one = torch.ones((), dtype=torch.float32, device=device)
    a, b, c = [], [], []
    for g in range(len(abc)):
        m, n, k = _size(sizes[g], g)
        ta, tb, tc = _pair(abc[g], "abc_tensors", g)
        sa, sb = _pair(reordered[g], "sfasfb_reordered_tensors", g)
        a.append(NVFP4Tensor(_codes(ta, m, k, f"a[{g}]", device), _scales(sa, m, k, f"sfa_reordered[{g}]", device),
                             one))
        b.append(NVFP4Tensor(_codes(tb, n, k, f"b[{g}]", device), _scales(sb, n, k, f"sfb_reordered[{g}]", device),
                             one))
        c.append(_output(tc, m, n, f"c[{g}]", device))
    return a, b, c


def dual_operands(data, backend: str = "reference"):
    """``(a, b1, b2, c)`` from an ``nvfp4_dual_gemm`` tuple: three NVFP4Tensor and the ``[M, N]`` view of ``c``."""
    if not isinstance(data, (tuple, list)) or len(data) != 10:
        raise TypeError("data must be the nvfp4_dual_gemm tuple (a, b1, b2, sfa, sfb1, sfb2, sfa_reordered, "
                        "sfb1_reordered, sfb2_reordered, c), got "
                        f"{type(data).__name__}{f' of {len(data)}' if isinstance(data, (tuple, list)) else ''}")
    ta, tb1, tb2, _, _, _, sa, sb1, sb2, tc = data
    for what, t in (("a", ta), ("c", tc)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"{what} must be 3-d [rows, cols, L], got shape {tuple(t.shape)}")
    m, n, k = int(tc.shape[0]), int(tc.shape[1]), 2 * int(ta.shape[1])
    if k == 0 or k % BLOCK_SIZE:
        raise ValueError(f"a has K = {k} (2 x {ta.shape[1]} bytes): K must be a positive multiple of {BLOCK_SIZE}")
    device = ta.device
    _check_device(device, backend)
    one = torch.ones((), dtype=torch.float32, device=device)
    a = NVFP4Tensor(_codes(ta, m, k, "a", device), _scales(sa, m, k, "sfa_reordered", device), one)
    b1 = NVFP4Tensor(_codes(tb1, n, k, "b1", device), _scales(sb1, n, k, "sfb1_reordered", device), one)
    b2 = NVFP4Tensor(_codes(tb2, n, k, "b2", device), _scales(sb2, n, k, "sfb2_reordered", device), one)
    return a, b1, b2, _output(tc, m, n, "c", device)


def custom_kernel(data, *, backend: str = "cute-hopper", config: str = "auto") -> list[torch.Tensor]:
    """The ``nvfp4_group_gemm`` entry point: write each group's ``c`` and return the list of them.

    Where the task's tensors can be read in place (:func:`_fast_group`), one one-shot call. Otherwise groups sharing N
    and K run as prepared weights (:func:`nvfp4lib.serving.prepare_weights`, ``config`` resolved
    from the tuning cache or the shape heuristic, never timed here); others through
    :func:`nvfp4lib.api.grouped_gemm` (one prepared-weights call per distinct (N, K): the same kernel)."""
    from .api import grouped_gemm
    from .serving import prepare_weights

    _check_backend(backend)
    if backend == "cute-hopper" and config == "auto":
        fast = _fast_group(data)
        if fast is not None and fast[-1].type == "cuda":
            # the task's own tensors read in place: one gather launch, the prologue, the GEMM
            from .serving import oneshot_run

            table, ms, n, k, cs, device = fast
            out = oneshot_run(table, sum(ms), len(ms), n, k, False, torch.float16, device, swizzled=True)
            if out is not None:
                torch._foreach_copy_(cs, list(out.view(-1, n, 1).split(ms)))  # into each group's c [M, N, 1]
                return [abc[2] for abc in data[0]]
    a, b, c = group_operands(data, backend)
    if len({tuple(t.shape) for t in b}) == 1:
        results = prepare_weights(b, backend=backend, config=config, check_scales=False)(a)
    else:
        results = grouped_gemm(a, b, backend=backend, config=config)
    for out, r in zip(c, results):
        out.copy_(r)
    return [abc[2] for abc in data[0]]


_ONES: dict = {}
_HALF = (torch.float16,)


def _one(device) -> int:
    """The address of a float32 1 on ``device``, kept: the tasks' global scales (they carry none)."""
    one = _ONES.get(device)
    if one is None:
        one = _ONES[device] = torch.ones((), dtype=torch.float32, device=device)
    return one.data_ptr()


def _blocked(t, rows: int, cols: int, index: int) -> bool:
    """Whether the task's reordered scales ``t`` are the canonical 6-d view of a flat blocked buffer (strides
    ``(16, 4, 512·rk, 1, 512, ·)`` from its first element): then its address is the blocked layout's."""
    rk = -(-cols // 4)
    return (isinstance(t, torch.Tensor) and t.dtype == torch.float8_e4m3fn and t.get_device() == index
            and t.shape == (32, 4, -(-rows // 128), 4, rk, 1) and t.stride()[:5] == (16, 4, 512 * rk, 1, 512))


@functools.cache
def _gather():
    """:mod:`.kernels.hopper_varlen.gather`, imported once (kernels are imported lazily; an import statement per
    group would cost ~1 µs of a call's host time)."""
    from .kernels.hopper_varlen import gather

    return gather


def _task_row(index: int, gs: int, m: int, n: int, k: int, ta, sa, tb, sb, tc, tb2=None, sb2=None):
    """The one-shot gather's table row (:data:`.kernels.hopper_varlen.gather.FIELDS`, ``F`` ints) of one task GEMM
    ``c = A·Bᵀ`` (with ``tb2, sb2``: the dual's ``silu(A·Bᵀ) * (A·B2ᵀ)``), or None unless the gather can read every
    tensor in place: the codes ``[rows, K/2, 1]`` and ``c [M, N, 1]`` (float16) with row-major rows, the reordered
    scales blocked (:func:`_blocked`), all on device ``index``; N a multiple of 8 (the kernel stores output rows in
    16-byte chunks), K of 16, M >= 0; the weights' codes 8-byte aligned (:func:`.gather.codes_readable`). ``gs``: the
    address of the global scale (:func:`_one`). Raises what a non-tensor's attribute read raises (callers catch it)."""
    if m < 0 or k <= 0 or k % BLOCK_SIZE or n <= 0 or n % 8:
        return None
    kh, cols = k // 2, k // BLOCK_SIZE
    for t, dtypes, rows, width in ((ta, _CODE_DTYPES, m, kh), (tb, _CODE_DTYPES, n, kh), (tc, _HALF, m, n),
                                   (tb2, _CODE_DTYPES, n, kh))[: 3 if tb2 is None else 4]:
        if (t.dtype not in dtypes or t.get_device() != index or t.shape != (rows, width, 1)
                or t.stride()[:2] != (width, 1)):
            return None
    if not (_blocked(sa, m, cols, index) and _blocked(sb, n, cols, index)
            and (tb2 is None or _blocked(sb2, n, cols, index))):
        return None
    bc, bs = tb.data_ptr(), sb.data_ptr()
    uc, us = (bc, bs) if tb2 is None else (tb2.data_ptr(), sb2.data_ptr())
    gather = _gather()
    if not gather.codes_readable(bc, uc):
        return None
    return [ta.data_ptr(), sa.data_ptr(), m, bc, bs, uc, us, gs, gs, gs] + [0] * (gather.F - 10)


_NOT_IN_PLACE = (TypeError, ValueError, IndexError, AttributeError)  # a malformed tuple: the checked path names it


def _fast_group(data):
    """(address table, rows per group, N, K, the groups' c, device) for an ``nvfp4_group_gemm`` tuple that the
    one-shot gather can read in place — every group's tensors as :func:`_task_row` needs them, the groups sharing N
    and K — else None (then :func:`group_operands` checks everything and names what is wrong). On any device: the
    caller runs it on CUDA only."""
    try:
        abc, _, reordered, sizes = data
        if not (len(abc) == len(reordered) == len(sizes)):
            return None
        first = abc[0][0]
        device, index = first.device, first.get_device()
        gs = _one(device)
        table, ms, cs, nk = [], [], [], None
        for g in range(len(abc)):  # (this loop runs per call, over every group: one helper call per group)
            m, n, k, l_ = sizes[g]
            if l_ != 1 or (n, k) != (nk or (n, k)):
                return None
            nk = (n, k)
            ta, tb, tc = abc[g]
            sa, sb = reordered[g]
            row = _task_row(index, gs, m, n, k, ta, sa, tb, sb, tc)
            if row is None:
                return None
            table += row
            ms.append(m)
            cs.append(tc)
    except _NOT_IN_PLACE:
        return None
    return table, ms, nk[0], nk[1], cs, device


def _fast_dual(data):
    """(address table, M, N, K, the ``[M, N]`` view of ``c``, device) for an ``nvfp4_dual_gemm`` tuple that the
    one-shot gather can read in place (its tensors as :func:`_task_row` needs them; ``c`` 16-byte aligned besides:
    the GEMM writes it directly), else None (then :func:`dual_operands` checks everything). On any device: the caller
    runs it on CUDA only. Every shape the task allows takes it (M and N multiples of 128, K of 256); so do other M
    and K; N not a multiple of 8 falls back, and the checked path then refuses it for cute-hopper too."""
    try:
        ta, tb1, tb2, _, _, _, sa, sb1, sb2, tc = data
        m, n, _ = tc.shape
        k = 2 * ta.shape[1]
        row = _task_row(ta.get_device(), _one(ta.device), m, n, k, ta, sa, tb1, sb1, tc, tb2, sb2)
        if row is None or tc.data_ptr() & 15:
            return None
        return row, m, n, k, tc.view(m, n), ta.device
    except _NOT_IN_PLACE:
        return None


def custom_kernel_dual(data, *, backend: str = "cute-hopper", config: str = "auto") -> torch.Tensor:
    """The ``nvfp4_dual_gemm`` entry point: ``c = silu(A·B1ᵀ) * (A·B2ᵀ)`` written into the harness's ``c``, returned.

    Where the task's tensors can be read in place (:func:`_fast_dual`), one one-shot call (the gather, the prologue
    and the dual GEMM writing ``c``; no weights prepared); otherwise, or with a named ``config``, the weights are
    prepared for the call (:func:`nvfp4lib.serving.prepare_weights`)."""
    from .serving import prepare_weights

    _check_backend(backend)
    if backend == "cute-hopper" and config == "auto":
        fast = _fast_dual(data)
        if fast is not None and fast[-1].type == "cuda":
            from .serving import oneshot_run

            table, m, n, k, c, device = fast
            if oneshot_run(table, m, 1, n, k, True, torch.float16, device, swizzled=True, out=c) is not None:
                return data[9]
    a, b1, b2, c = dual_operands(data, backend)
    c.copy_(prepare_weights([b1], [b2], backend=backend, config=config, check_scales=False)([a])[0])
    return data[9]


# --------------------------------------------------------------------------- building the tuples


def _folded_scales(t: NVFP4Tensor, what: str) -> torch.Tensor:
    """``t``'s block scales with its global scale folded in, since the tuples carry none: the scales themselves for 1;
    for a power of two whose product with every block scale is an E4M3 value, those products (the same dequantized
    values, exactly: the dual problems' uniform weights, 2^-8 × {1, 2}); anything else is refused. (A builder, not a
    call: reading the possibly device scalar once is fine here.)"""
    g = float(t.global_scale)
    if g == 1.0:
        return t.scales
    wide = t.scales.float() * g
    folded = wide.to(torch.float8_e4m3fn)
    if math.frexp(g)[0] != 0.5 or not torch.equal(folded.float(), wide):
        raise ValueError(f"{what} has global scale {g}: the harness's tuples carry none, and it folds into the block "
                         "scales exactly only as a power of two whose products with them are E4M3 values")
    return folded


def _task_codes(t: NVFP4Tensor) -> torch.Tensor:
    codes = t.data.unsqueeze(0).permute(1, 2, 0)  # [rows, K/2, 1] over (L, rows, K/2) storage, as the task lays it
    return codes.view(_FP4) if _FP4 is not None else codes


def _task_scales(t: NVFP4Tensor, device, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(plain ``[rows, K/16, 1]`` on the CPU, reordered 6-d on ``device``) scales of ``t``, its global scale folded."""
    scales = _folded_scales(t, what)
    rows, cols = scales.shape
    return scales.unsqueeze(-1).cpu(), scales_cute_view(swizzle_scales(scales), rows, cols).to(device)


def _task_output(m: int, n: int, device) -> torch.Tensor:
    return torch.full((1, m, n), float("nan"), dtype=torch.float16, device=device).permute(1, 2, 0)


def study_tuple(inputs):
    """The harness's tuple for :class:`nvfp4lib.problems.GroupedInputs`, on their device. The tuples carry no global
    scales: each must be 1 or fold into the block scales exactly (:func:`_folded_scales`), else ValueError.

    Single GEMMs give the ``nvfp4_group_gemm`` tuple (plain scales on the CPU, as the task has them); a dual problem
    of one group gives the ``nvfp4_dual_gemm`` tuple (plain scales on the device). Outputs are NaN-filled."""
    a, b, b2 = inputs.a, inputs.b, inputs.b2
    device = a[0].device
    if b2 is not None:
        if len(a) != 1:
            raise ValueError(f"the nvfp4_dual_gemm task is one GEMM; this problem has {len(a)} groups")
        (x,), (w1,), (w2,) = a, b, b2
        plain, perm = zip(*(_task_scales(t, device, what) for t, what in ((x, "a[0]"), (w1, "b[0]"), (w2, "b2[0]"))))
        return (_task_codes(x), _task_codes(w1), _task_codes(w2), *(p.to(device) for p in plain), *perm,
                _task_output(x.shape[0], w1.shape[0], device))
    abc, plain, perm, sizes = [], [], [], []
    for g, (x, w) in enumerate(zip(a, b)):
        (pa, ra), (pb, rb) = _task_scales(x, device, f"a[{g}]"), _task_scales(w, device, f"b[{g}]")
        abc.append((_task_codes(x), _task_codes(w), _task_output(x.shape[0], w.shape[0], device)))
        plain.append((pa, pb))
        perm.append((ra, rb))
        sizes.append((int(x.shape[0]), int(w.shape[0]), int(x.shape[1]), 1))
    return abc, plain, perm, sizes
