"""The public grouped GEMM functions: validate at the boundary, then hand to a backend."""
from __future__ import annotations

import torch

from .backends import Runner, get_backend
from .formats import NVFP4Tensor
from .serving import oneshot as _serving_oneshot  # (here, not per call: ~1 µs)

__all__ = ["grouped_gemm", "grouped_dual_gemm_silu", "prepare", "validate_operands"]

OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _as_list(x, what: str) -> list:
    if isinstance(x, NVFP4Tensor):
        raise TypeError(f"{what} must be a list of NVFP4Tensor (one per group), got a single NVFP4Tensor")
    if not isinstance(x, (list, tuple)):
        raise TypeError(f"{what} must be a list of NVFP4Tensor (one per group), got {type(x).__name__}")
    for i, t in enumerate(x):
        if not isinstance(t, NVFP4Tensor):
            raise TypeError(f"{what}[{i}] must be an NVFP4Tensor, got {type(t).__name__}")
        if t.data.dim() != 2:
            raise ValueError(f"{what}[{i}] must be 2-D [rows, K], got shape {tuple(t.shape)}")
    return list(x)


def validate_operands(a, b, b2=None, out_dtype=torch.float16):
    """Check the grouped operands; return them as lists. Raises TypeError/ValueError naming the problem.

    (One pass per group over shapes and devices: one-shot calls pay this every call. An NVFP4Tensor's parts share one
    device, checked when it is built, so its codes' device stands for it.)"""
    a = _as_list(a, "a")
    b = _as_list(b, "b")
    b2 = None if b2 is None else _as_list(b2, "b2")
    if len(a) == 0:
        raise ValueError("a grouped GEMM needs at least one group (a is empty)")
    for name, w in (("b", b), ("b2", b2)):
        if w is not None and len(w) != len(a):
            raise ValueError(f"{name} has {len(w)} groups but a has {len(a)}")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be one of {OUT_DTYPES}, got {out_dtype}")
    device = a[0].data.device
    for g, x in enumerate(a):
        xd, wd = x.data, b[g].data
        ka = xd.shape[1]
        wn, wk = wd.shape
        if wk != ka or wn == 0:
            _shape_error(g, "b", ka, wn, wk)
        if xd.device != device or wd.device != device:
            _device_error(g, device, (("a", xd), ("b", wd)))
        if b2 is not None:
            ud = b2[g].data
            un, uk = ud.shape
            if uk != ka or un == 0:
                _shape_error(g, "b2", ka, un, uk)
            if un != wn:
                raise ValueError(f"group {g}: b[{g}] has N={wn} but b2[{g}] has N={un}")
            if ud.device != device:
                _device_error(g, device, (("b2", ud),))
    return a, b, b2


def _shape_error(g: int, name: str, ka: int, wn: int, wk: int):
    if wk != ka:
        raise ValueError(f"group {g}: K mismatch, a[{g}] has K={2 * ka} but {name}[{g}] has K={2 * wk}")
    raise ValueError(f"group {g}: {name}[{g}] has N=0; N must be positive")


def _device_error(g: int, device, parts):
    for name, t in parts:
        if t.device != device:
            raise ValueError(f"{name}[{g}] is on device {t.device} but a[0] is on device {device}: "
                             "all operands must be on one device")


def prepare(a, b, b2=None, *, backend: str = "reference", out_dtype=torch.float16, strategy: str = "grouped",
            graph: bool = False, **options) -> Runner:
    """Validate, then let ``backend`` do its one-time work; call the returned Runner to compute.

    ``strategy`` ("grouped", "loop", "streams") and ``graph`` choose how the work is launched
    (see :mod:`nvfp4lib.launch`); other options go to the backend (e.g. ``config=`` for CuTe kernels)."""
    from .launch import STRATEGIES, graphed, per_group

    a, b, b2 = validate_operands(a, b, b2, out_dtype)
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; known: {', '.join(STRATEGIES)}")
    factory = get_backend(backend)
    if backend == "cute-hopper" and options.get("config", "auto") in ("auto", None):
        if strategy == "grouped":  # the study's `auto`: time the candidates on these operands (tuning.py)
            from .kernels.common.sm90 import _require_hopper
            from .tuning import AUTO_CANDIDATES, fastest_runner

            _require_hopper(a[0].data.device)
            rest = {k: v for k, v in options.items() if k != "config"}
            runner = fastest_runner(lambda name: factory(a, b, b2, out_dtype=out_dtype, config=name, **rest),
                                    AUTO_CANDIDATES[b2 is not None], a[0].data.device)
            return graphed(runner) if graph else runner
        options = {**options, "config": "rs_dual_m128_t128_k128_s3" if b2 is not None else "rs_m128_t128_k128_s3_e"}
    if strategy == "grouped":
        runner = factory(a, b, b2, out_dtype=out_dtype, **options)
    else:
        runner = per_group(factory, a, b, b2, out_dtype=out_dtype, streams=strategy == "streams", **options)
    return graphed(runner) if graph else runner


def _oneshot(a, b, b2, backend, out_dtype, options):
    """A one-call product: with cute-hopper and groups sharing N and K, the serving path (weights packed in a few
    GPU ops, a cached config: nothing timed inside the call); otherwise the backend's own prepare. A runner whose
    config is "auto" would time its candidates inside this call: one-shot calls take the shape heuristic instead."""
    if backend == "cute-hopper":
        if not options or (len(options) == 1 and options.get("config") == "auto"):
            c = _serving_oneshot(a, b, b2, out_dtype=out_dtype, split=True)  # one pass over the operands
            if c is not None:
                return c
        a, b, b2 = validate_operands(a, b, b2, out_dtype)  # (names what kept the operands off the one-shot path)
        shape = b[0].data.shape
        if all(t.data.shape == shape for t in b) and (b2 is None or all(t.data.shape == shape for t in b2)) \
                and set(options) <= {"config"}:
            from .serving import prepare_weights

            return prepare_weights(b, b2, backend=backend, out_dtype=out_dtype, config=options.get("config", "auto"),
                                   check_scales=False)(a)
        if options.get("config", "auto") == "auto":
            options = {**options, "config": "rs_dual_m128_t128_k128_s3" if b2 is not None else "rs_m128_t128_k128_s3_e"}
    return prepare(a, b, b2, backend=backend, out_dtype=out_dtype, **options)()


def grouped_gemm(a, b, *, backend: str = "reference", out_dtype=torch.float16, **options) -> list[torch.Tensor]:
    """C_g = A_g · B_gᵀ for every group; ``a[g]`` is [M_g, K], ``b[g]`` is [N_g, K]; returns [M_g, N_g] tensors.
    For repeated calls with the same weights, prepare them once: :func:`nvfp4lib.prepare_weights`."""
    return _oneshot(a, b, None, backend, out_dtype, options)


def grouped_dual_gemm_silu(a, b1, b2, *, backend: str = "reference", out_dtype=torch.float16,
                           **options) -> list[torch.Tensor]:
    """C_g = silu(A_g·B1_gᵀ) * (A_g·B2_gᵀ), both products in fp32, one rounding to ``out_dtype``."""
    if b2 is None:
        raise TypeError("grouped_dual_gemm_silu needs b2 (the up projection); use grouped_gemm for one product")
    return _oneshot(a, b1, b2, backend, out_dtype, options)
