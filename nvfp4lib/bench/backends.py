"""The backends the study benchmarks, by name, and :func:`prepare`, which builds a timed call of one.

A backend is a *factory* ``prepare(a, b, b2, *, out_dtype, **options) -> Runner``.
``a``, ``b`` (and ``b2`` for the fused dual GEMM, else ``None``) are lists of
:class:`nvfp4lib.formats.NVFP4Tensor`, one per group, already validated by
:func:`nvfp4lib.api.validate_operands` (same device, matching K, K % 16 == 0, ...).

``prepare`` does the one-time work a real deployment does once per weight set
(dequantizing weights ahead of time, stacking/prepacking them, compiling) and
returns a :class:`Runner`.  Calling the runner does the per-call work (activations
change every call) and writes into ``runner.outputs``; the benchmark times only
the call, and reports ``prepare_s`` and ``held_bytes`` beside it.

Backends are registered by name in :data:`BACKENDS` as ``"module:function"``
strings so that importing nvfp4lib never imports CuTe DSL or Triton.

``cute-hopper`` is what users call: with no config (or ``config=auto`` or a ``vl_*`` config) the call of prepared
weights (:func:`nvfp4lib.prepare_weights`, the serving kernel) on the activations packed once into ``[T, K]`` with
device offsets. The study's earlier kernels are reachable only as named configs of it: the shared-memory decode
kernel's (``baseline``, ``tma_batched``, ...: :mod:`nvfp4lib.kernels.hopper_smem.config`), the host-scheduled
swap-AB kernel's ``rs_*`` configs, and ``study-auto`` (the host-scheduled kernel's configs timed on the operands at
prepare, the fastest kept: what the study's bench ran as ``auto``).
"""
from __future__ import annotations

import importlib
import time
from typing import Callable

import torch

from ..api import validate_operands
from ..runner import Runner
from .launch import STRATEGIES, graphed, per_group

__all__ = ["Runner", "BACKENDS", "get_backend", "available_backends", "prepare", "prepare_cute_hopper",
           "prepare_serving", "STUDY_AUTO", "AUTO_CANDIDATES", "fastest_runner"]


BACKENDS: dict[str, str] = {
    "reference": "nvfp4lib.reference:prepare",
    "cute-hopper": "nvfp4lib.bench.backends:prepare_cute_hopper",
    "cute-blackwell": "nvfp4lib.kernels.blackwell.runner:prepare",  # compiled for sm_100a, not run
    "torch-bf16": "nvfp4lib.bench.peers.torch_peers:prepare_bf16",
    "torch-grouped-mm": "nvfp4lib.bench.peers.torch_peers:prepare_grouped_mm",
    "torch-bf16-predequant": "nvfp4lib.bench.peers.torch_peers:prepare_bf16_predequant",
    "torch-grouped-mm-fused": "nvfp4lib.bench.peers.torch_peers:prepare_grouped_mm_fused",
    "torch-dequant": "nvfp4lib.bench.peers.torch_peers:prepare_dequant",
    "torch-compile": "nvfp4lib.bench.peers.torch_peers:prepare_compile",
    "triton": "nvfp4lib.bench.peers.triton_nvfp4:prepare",
}


def available_backends() -> list[str]:
    return sorted(BACKENDS)


def get_backend(name: str) -> Callable[..., Runner]:
    if not isinstance(name, str) or name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; known backends: {', '.join(available_backends())}")
    module, func = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), func)


def prepare(a, b, b2=None, *, backend: str = "reference", out_dtype=torch.float16, strategy: str = "grouped",
            graph: bool = False, **options) -> Runner:
    """Validate, then let ``backend`` do its one-time work; call the returned Runner to compute.

    ``strategy`` ("grouped", "loop", "streams") and ``graph`` choose how the work is launched (the study's round 5C,
    :mod:`.launch`); other options go to the backend (e.g. ``config=`` for cute-hopper)."""
    a, b, b2 = validate_operands(a, b, b2, out_dtype)
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; known: {', '.join(STRATEGIES)}")
    factory = get_backend(backend)
    if strategy == "grouped":
        runner = factory(a, b, b2, out_dtype=out_dtype, **options)
    else:
        runner = per_group(factory, a, b, b2, out_dtype=out_dtype, streams=strategy == "streams", **options)
    return graphed(runner) if graph else runner


# The host-scheduled kernel's ``auto`` (``config=study-auto``): :func:`fastest_runner` times these register-decode
# configs (nvfp4lib.kernels.hopper_rs.config) on the operands and keeps the fastest. No single tiling won every shape
# on the H100 (run of 2026-11-23): 96-token tiles (S2, S1-dual, S2-dual), 128 with 4 stages (S3, S4) or 5 (S1), the
# per-element dual epilogue (S3-dual, S4-dual), variable N up to 256 (large M). The decode-warpgroup (_dw) and
# inline-decode (_e_i) configs were candidates once and lost every shape.
STUDY_AUTO = "study-auto"
AUTO_CANDIDATES = {
    False: ("rs_m128_t96_k128_s3_e", "rs_m128_t128_k128_s3_e", "rs_m128_t128_k128_s4_e", "rs_m128_t128_k128_s5_e",
            "rs_m128_t64_k128_s4_e", "rs_m128_t256_k128_s3_v32_e"),
    True: ("rs_dual_m64_t96_k128_s3_e", "rs_dual_m128_t128_k128_s3", "rs_dual_m128_t128_k128_s4_e",
           "rs_dual_m128_t128_k128_s4", "rs_dual_m64_t256_k128_s3_v32_e"),
}


def prepare_cute_hopper(a, b, b2, *, out_dtype=torch.float16, config: str | None = None, **options) -> Runner:
    """``cute-hopper``: the serving kernel (no config, ``auto`` or a ``vl_*`` name), or one of the study's named
    kernel configs (see the module doc)."""
    if config in (None, "auto") or str(config).startswith("vl_"):
        return prepare_serving(a, b, b2, out_dtype=out_dtype, config=config or "auto", **options)
    from ..kernels.hopper_smem import kernel as hopper_smem

    if config == STUDY_AUTO:
        from ..kernels.common.sm90 import _require_hopper

        _require_hopper(a[0].data.device)
        return fastest_runner(lambda name: hopper_smem.prepare(a, b, b2, out_dtype=out_dtype, config=name, **options),
                              AUTO_CANDIDATES[b2 is not None], a[0].data.device)
    return hopper_smem.prepare(a, b, b2, out_dtype=out_dtype, config=config, **options)


def prepare_serving(a, b, b2, *, out_dtype=torch.float16, config: str = "auto", **build) -> Runner:
    """The call users make: weights prepared once (:func:`nvfp4lib.prepare_weights`), activations packed once into
    one ``NVFP4Tensor [T, K]`` with int32 group offsets on the device; each call is ``w(a_packed, offsets, out=...)``
    with the output and offsets kept between calls (as a serving loop keeps them). ``build``: kernel build knobs by
    recipe field (:func:`~nvfp4lib.kernels.hopper_varlen.runner.build_setting`, e.g. ``handoff=0``) for the kernels
    this runner compiles (an A/B arm); rows carry every build knob as ``info_<field>``."""
    from ..kernels.hopper_varlen.runner import build_knobs, build_setting

    with build_setting(**build):  # (every kernel the timed calls run is compiled by the first call below)
        return _prepare_serving(a, b, b2, out_dtype, config, build_knobs())


def _prepare_serving(a, b, b2, out_dtype, config: str, knobs: dict) -> Runner:
    from ..formats import NVFP4Tensor
    from ..serving import prepare_weights
    from ..tuning import rule_knobs

    t0 = time.perf_counter()
    shape = tuple(b[0].shape)
    if any(tuple(t.shape) != shape for t in b):
        raise ValueError("cute-hopper (prepared weights) needs one N and one K shared by all groups")
    w = prepare_weights(b, b2, out_dtype=out_dtype, config=config)
    device = a[0].data.device
    m = [int(t.shape[0]) for t in a]
    gs = torch.stack([t.global_scale.to(torch.float32).reshape(()) for t in a]).to(device)
    packed = NVFP4Tensor(torch.cat([t.data for t in a]), torch.cat([t.scales for t in a]),
                         torch.ones((), dtype=torch.float32, device=device))
    offsets = torch.tensor([0, *torch.tensor(m).cumsum(0).tolist()], dtype=torch.int32, device=device)
    c = torch.empty((sum(m), shape[0]), dtype=out_dtype, device=device)
    outputs = list(c.split(m))

    def run():
        w(packed, offsets, global_scale=gs, out=c)

    run()  # compiles the config the rows resolve to
    torch.cuda.synchronize(device)
    cfg = w.config_for(sum(m))
    return Runner(run, outputs, prepare_s=time.perf_counter() - t0, held_bytes=w.held_bytes,
                  notes=f"prepared weights (serving kernel), config {cfg}; w(a_packed, offsets) per call",
                  info={"config": cfg, "serving": True, "choice": w.choice_source(sum(m)), **rule_knobs(), **knobs},
                  keepalive=(w, packed, offsets, gs, c))


def fastest_runner(prepare_config, candidates, device, *, iters: int = 10, rounds: int = 2) -> Runner:
    """Prepare a Runner for every candidate config (``prepare_config(name)``), time each on its operands and return
    the fastest; the times are kept in ``runner.info["auto"]``. This is the host-scheduled kernel's ``study-auto``,
    which times inside ``prepare``: serving calls resolve from the tuning cache instead.

    A time is the median of ``iters`` CUDA-graph replays with the L2 flushed before each, the best of ``rounds``
    rounds over all candidates, after every candidate is compiled (compiling leaves the GPU idle long enough to drop
    its clock: timing each candidate right after its compile once chose the wrong one)."""
    from ..timing import L2Flusher, time_runner

    t0 = time.perf_counter()
    flush = L2Flusher(device)
    runners = {name: prepare_config(name) for name in candidates}
    graphs = {name: graphed(r) for name, r in runners.items()}
    times: dict[str, float] = {}
    for r in range(rounds):
        for name, g in graphs.items():
            t = sorted(time_runner(g, iters=iters, warmup=20 if r == 0 else 3, flush=flush))[iters // 2]
            times[name] = round(min(t, times.get(name, float("inf"))), 2)
    del flush, graphs
    name = min(times, key=times.get)
    runner = runners[name]
    runner.info.update(config=name, auto=times)
    runner.notes += f"; auto chose {name} of {times} (us, timed at prepare)"
    runner.prepare_s = time.perf_counter() - t0
    return runner
