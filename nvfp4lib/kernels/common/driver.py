"""Four CUDA driver calls for the one-shot hot path, each at about a microsecond of host time (ctypes on libcuda).

A one-shot call (new weights every call) spends its host time in a handful of steps before its first kernel runs, and
for the large shapes the GPU waits for them. On the lent H100's host (2026-11-26, development script, median of 300
synchronised calls, outputs byte-identical) the gather's launch took 9.7-10.1 µs through its compiled Triton launcher
and 6.3-6.6 µs as a prepared ``cuLaunchKernel`` (:class:`KernelLaunch`); the table's host-to-device copy took 4.8-6.3
µs through ``Tensor.copy_`` and 3.3-3.6 µs as ``cuMemcpyHtoDAsync`` (:func:`copy_to_device`). Events are recorded and
waited on here too (:class:`Events`: ``torch.cuda.Event`` costs 2-3 µs per record).

Every function returns the driver's ``CUresult`` (0: success). :data:`INVALID_CONTEXT` means the calling thread has
no current CUDA context (a thread whose first CUDA work this is): :func:`ensure_context` makes the context of an
earlier call current, as Triton's launcher does before each launch. Where libcuda cannot be loaded (no NVIDIA driver,
so no GPU path at all), :func:`available` is False: Triton launches stay on Triton's launcher
(:func:`.triton_launch.bound` gives None) and one-shot calls refuse with a message. Importing this module loads
nothing.
"""
from __future__ import annotations

import ctypes

__all__ = ["INVALID_CONTEXT", "Events", "KernelLaunch", "available", "copy_to_device", "current_context",
           "ensure_context"]

INVALID_CONTEXT = 201  # CUDA_ERROR_INVALID_CONTEXT
_LIB: list = []  # [libcuda or None], loaded on first use


def _cuda():
    if not _LIB:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            vp, u32, sz = ctypes.c_void_p, ctypes.c_uint, ctypes.c_size_t
            sigs = {"cuLaunchKernel": [vp] + [u32] * 7 + [vp, vp, vp],
                    "cuMemcpyHtoDAsync_v2": [ctypes.c_uint64, vp, sz, vp],
                    "cuEventCreate": [ctypes.POINTER(vp), u32], "cuEventRecord": [vp, vp],
                    "cuEventSynchronize": [vp], "cuEventDestroy_v2": [vp],
                    "cuCtxGetCurrent": [ctypes.POINTER(vp)], "cuCtxSetCurrent": [vp]}
            for name, args in sigs.items():
                fn = getattr(lib, name)
                fn.argtypes, fn.restype = args, ctypes.c_int
        except (OSError, AttributeError):
            lib = None
        _LIB.append(lib)
    return _LIB[0]


def available() -> bool:
    """Whether libcuda could be loaded (a machine with the NVIDIA driver)."""
    return _cuda() is not None


def current_context() -> int:
    """The calling thread's current CUDA context (0: none)."""
    ctx = ctypes.c_void_p()
    _cuda().cuCtxGetCurrent(ctypes.byref(ctx))
    return ctx.value or 0


def ensure_context(ctx: int) -> None:
    """Make ``ctx`` (from :func:`current_context` on a thread that had one) current on the calling thread."""
    if ctx:
        _cuda().cuCtxSetCurrent(ctx)


def copy_to_device(dst: int, src: int, nbytes: int, stream: int) -> int:
    """``cuMemcpyHtoDAsync``: ``nbytes`` from host address ``src`` (pinned) to device address ``dst`` on ``stream``."""
    return _LIB[0].cuMemcpyHtoDAsync_v2(dst, src, nbytes, stream)


class KernelLaunch:
    """``cuLaunchKernel`` of one loaded kernel (a ``CUfunction`` handle) with a fixed 1-D grid, block and dynamic
    shared memory, and 8-byte parameters (pointers, 64-bit integers) kept in one array: :meth:`set` changes one,
    a call launches on ``stream`` and returns the ``CUresult``."""

    def __init__(self, function: int, grid: int, threads: int, shared: int, params: list[int]):
        _cuda()
        self._values = (ctypes.c_uint64 * len(params))(*params)
        base = ctypes.addressof(self._values)
        self._pointers = (ctypes.c_void_p * len(params))(*[base + 8 * i for i in range(len(params))])
        self._head = (function, grid, 1, 1, threads, 1, 1, shared)

    def set(self, i: int, value: int) -> None:
        self._values[i] = value

    def __call__(self, stream: int) -> int:
        return _LIB[0].cuLaunchKernel(*self._head, stream, self._pointers, None)


class Events:
    """``n`` driver events without timing (``CU_EVENT_DISABLE_TIMING``), destroyed with this object: ``record(i,
    stream)``, ``wait(i)`` (host waits until event i's work has run; at once for an event never recorded)."""

    def __init__(self, n: int):
        lib = _cuda()
        self._handles = []
        for _ in range(n):
            ev = ctypes.c_void_p()
            r = lib.cuEventCreate(ctypes.byref(ev), 2)
            if r:
                raise RuntimeError(f"cuEventCreate failed: CUresult {r}")
            self._handles.append(ev.value)

    def record(self, i: int, stream: int) -> int:
        return _LIB[0].cuEventRecord(self._handles[i], stream)

    def wait(self, i: int) -> int:
        return _LIB[0].cuEventSynchronize(self._handles[i])

    def __del__(self):
        lib = _LIB[0] if _LIB else None
        if lib is not None:
            for h in getattr(self, "_handles", ()):
                lib.cuEventDestroy_v2(h)
