"""Triton launches at a few microseconds of host time.

Every ``kernel[grid](...)`` call goes through Triton's per-call argument binding. A host profile on the lent H100
put that at ~50 µs per launch; an A/B on one card (2026-11-26, development runs, not recorded) measured 20-30 µs
more per launch than the direct path, i.e. 101-167 µs per W4A4 MoE call at T = 1 (six launches).

:func:`launch` sends the first launch of a kernel for a given specialisation through Triton (which compiles it) and
keeps the compiled kernel; later launches with the same specialisation call its compiled launcher directly, on
torch's current stream.

The specialisation key is at least as fine as Triton's: per tensor argument its dtype and whether its address is
16-byte aligned, per integer whether it is 1, whether it is a multiple of 16 and whether it fits 32 bits, per other
argument its type; plus the constexpr values, the warp count and the device. Where a launch hook is set (a
profiler), the device is not CUDA (Triton's interpreter) or ``NVFP4LIB_TRITON_FAST_LAUNCH=0`` is set (an escape
hatch should a Triton release change its launcher's arguments; :data:`FAST` at run time), every launch goes through
Triton. Importing this module does not import Triton.
"""
from __future__ import annotations

import os

import torch

__all__ = ["launch", "bound", "plain", "hooked", "FAST"]

FAST = os.environ.get("NVFP4LIB_TRITON_FAST_LAUNCH", "1") != "0"
DIRECT = True  # call the compiled launcher's C function directly where its shape is known (:func:`_direct`)

_COMPILED: dict = {}


def hooked(hook) -> bool:
    """Whether Triton has a launch hook set (then launches go through Triton, which calls it): None or an empty
    ``HookChain`` (Triton 3.6 keeps one where no hook is set) means none."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _spec(a):
    if isinstance(a, torch.Tensor):
        return a.dtype, not a.data_ptr() & 15
    if isinstance(a, bool):
        return bool, a
    if isinstance(a, int):
        return int, a == 1, not a % 16, -(1 << 31) <= a < (1 << 31)
    return (type(a),)


_KNOBS = []  # triton.knobs, imported on the first launch


def launch(kernel, grid: tuple, args: tuple, consts: dict, num_warps: int = 4, stream: int | None = None) -> None:
    """``kernel[grid](*args, **consts, num_warps=num_warps)``: ``args`` the kernel's runtime arguments in signature
    order (the first a tensor on the launch's device), ``consts`` its constexpr arguments, which must all come after
    them in the signature. ``stream``: a CUDA stream handle (default: torch's current stream on that device)."""
    if not _KNOBS:
        from triton import knobs

        _KNOBS.append(knobs.runtime)
    rt = _KNOBS[0]
    dev = args[0].device
    key = _key(kernel, dev, args, consts, num_warps)
    entry = _COMPILED.get(key)
    if entry is None or not FAST or dev.type != "cuda" or hooked(rt.launch_enter_hook) or hooked(rt.launch_exit_hook):
        names = tuple(getattr(kernel, "arg_names", ()))
        if names and names[len(args):] != tuple(consts):
            raise TypeError(f"launch: {getattr(kernel, '__name__', kernel)} takes {names}; pass its runtime "
                            "arguments, then every constexpr in signature order")
        # a kernel given GDC=True (:mod:`.pdl`) is compiled to launch with programmatic dependent launch
        pdl = {"launch_pdl": True} if consts.get("GDC") else {}
        ck = kernel[grid](*args, **consts, num_warps=num_warps, **pdl)
        if dev.type == "cuda" and ck is not None and hasattr(ck, "run"):
            _COMPILED[key] = (ck, _direct(ck))
        return
    grid = tuple(grid) + (1,) * (3 - len(grid))
    if stream is None:
        stream = torch._C._cuda_getCurrentRawStream(dev.index)
    ck, direct = entry
    if direct is not None and DIRECT:
        fn, function, cooperative, pdl = direct
        fn(*grid, stream, function, cooperative, pdl, None, None, ck.packed_metadata, None, None, None, *args,
           *consts.values())
    else:
        ck.run(*grid, stream, ck.function, ck.packed_metadata, None, None, None, *args, *consts.values())


def _key(kernel, dev, args, consts, num_warps):
    # (id: a JITFunction hashes its source on every call; the kernels launched here live as long as the process)
    return id(kernel), dev, tuple(consts.items()), num_warps, tuple([_spec(a) for a in args])


def plain() -> bool:
    """Whether launches may bypass Triton now: fast launches on and no launch hook set (a profiler's)."""
    rt = _KNOBS[0] if _KNOBS else None
    return FAST and rt is not None and not hooked(rt.launch_enter_hook) and not hooked(rt.launch_exit_hook)


def bound(kernel, grid: tuple, args: tuple, consts: dict, num_warps: int = 4):
    """A prepared driver launch (:class:`.driver.KernelLaunch`) of ``kernel`` as compiled for these arguments'
    specialisation and ``consts`` by an earlier :func:`launch`: its parameters are ``args`` (tensors by address),
    then Triton's two scratch pointers (null), for a caller that launches one kernel many times with mostly the same
    arguments (it changes the others with ``set`` and checks :func:`plain` before each launch). None where that
    kernel was not compiled yet, its launcher is not Triton 3.6's ``CudaLauncher`` without scratch, the launch is not
    a plain 1-D one (cooperative, PDL, clusters) or libcuda cannot be loaded."""
    from . import driver

    if not all(isinstance(a, torch.Tensor) or (type(a) is int and a != 1) for a in args):
        return None  # (Triton passes other types its own way, and an integer equal to 1 as a constant)
    entry = _COMPILED.get(_key(kernel, args[0].device, args, consts, num_warps))
    if entry is None or entry[1] is None or len(grid) != 1 or not driver.available():
        return None
    ck, (_, function, cooperative, pdl) = entry
    meta = ck.metadata
    if cooperative or pdl or getattr(meta, "num_ctas", 1) != 1:
        return None
    params = [a.data_ptr() if isinstance(a, torch.Tensor) else int(a) for a in args] + [0, 0]
    return driver.KernelLaunch(function, grid[0], 32 * meta.num_warps, meta.shared, params)


def _direct(ck):
    """(C launch function, kernel function, cooperative, PDL) of a compiled kernel whose launcher is Triton 3.6's
    ``CudaLauncher`` and needs no scratch buffers: its ``__call__`` then only passes these on (with no scratch), so
    calling the C function directly skips a Python frame and two scratch checks. Predicted: ~1.5 µs per launch (of
    the ~9 µs ``ck.run`` took on the lent H100's host). A/B in one process (2026-11-26, 5 alternating rounds of 300
    synchronised calls, outputs identical): the one-shot S4 call 63.8 against 63.2 µs of host time, the Qwen3-like
    W4A4 layer at T = 1 (six Triton launches) 266 against 282 µs, with overlapping rounds: within the host's noise.
    None for any other launcher (then ``ck.run`` is called)."""
    run = getattr(ck, "run", None)
    fn = getattr(run, "launch", None)
    if fn is None or type(run).__name__ != "CudaLauncher" or getattr(run, "global_scratch_size", 1) \
            or getattr(run, "profile_scratch_size", 1) or not hasattr(run, "launch_pdl") \
            or not hasattr(run, "launch_cooperative_grid"):
        return None
    return fn, ck.function, run.launch_cooperative_grid, run.launch_pdl
