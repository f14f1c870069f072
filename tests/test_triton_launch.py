"""The fast Triton launch's specialisation key (no Triton needed): at least as fine as Triton's own."""
import torch

from nvfp4lib.kernels.common.triton_launch import _spec, hooked


def test_key_separates_what_triton_specialises_on():
    buf = torch.empty(64, dtype=torch.uint8)
    assert _spec(buf) == (torch.uint8, buf.data_ptr() % 16 == 0)
    assert _spec(buf[1:]) != _spec(buf[16:]) or buf.data_ptr() % 16  # a misaligned view is another kernel
    assert _spec(buf.view(torch.int32)) != _spec(buf)  # dtype
    assert len({_spec(1), _spec(2), _spec(16), _spec(1 << 40)}) == 4  # 1, any, multiple of 16, past 32 bits
    assert _spec(True) != _spec(1) and _spec(1.0) != _spec(1)


def test_launches_go_through_triton_while_a_hook_is_set():
    """Triton 3.6 keeps an empty hook chain where no hook is set: that is no hook (every one-shot call had gone
    through Triton's argument binding while it counted as one)."""
    from types import SimpleNamespace

    assert not hooked(None) and not hooked(SimpleNamespace(calls=[]))
    assert hooked(SimpleNamespace(calls=[print])) and hooked(print)


class _FakeCompiled:
    """What Triton's launch returns: a compiled kernel whose ``run`` is the compiled launcher."""

    function, packed_metadata = "fn", "meta"

    def __init__(self, calls):
        self.calls = calls

    def run(self, *a):
        self.calls.append(("direct", a))


class _FakeKernel:
    """A JITFunction stand-in: ``kernel[grid](*args, **consts, num_warps=)`` launches through 'Triton'."""

    arg_names = ["x", "n", "R", "CB"]
    __name__ = "fake"

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        def go(*args, num_warps, **consts):
            self.calls.append(("triton", grid, args, consts, num_warps))
            return _FakeCompiled(self.calls)
        return go


def _cuda_arg():
    from collections import namedtuple
    from types import SimpleNamespace

    device = namedtuple("Device", "type index")("cuda", 0)  # hashable, as torch.device is
    return SimpleNamespace(device=device)  # keyed by its type, like a float


def test_first_launch_compiles_then_the_launcher_is_called_in_signature_order(monkeypatch):
    from types import SimpleNamespace

    from nvfp4lib.kernels.common import triton_launch as tl

    monkeypatch.setattr(tl, "_KNOBS", [SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None)])
    monkeypatch.setattr(tl, "_COMPILED", {})
    k, x = _FakeKernel(), _cuda_arg()
    tl.launch(k, (3,), (x, 64), {"R": 4, "CB": 32}, num_warps=8, stream=7)
    tl.launch(k, (3,), (x, 64), {"R": 4, "CB": 32}, num_warps=8, stream=7)
    assert [c[0] for c in k.calls] == ["triton", "direct"]
    assert k.calls[1][1] == (3, 1, 1, 7, "fn", "meta", None, None, None, x, 64, 4, 32)
    tl.launch(k, (3,), (x, 1), {"R": 4, "CB": 32}, num_warps=8, stream=7)  # n = 1: another specialisation
    tl.launch(k, (3,), (x, 64), {"R": 4, "CB": 16}, num_warps=8, stream=7)  # another constexpr
    assert [c[0] for c in k.calls[2:]] == ["triton", "triton"]
    monkeypatch.setattr(tl, "FAST", False)  # NVFP4LIB_TRITON_FAST_LAUNCH=0
    tl.launch(k, (3,), (x, 64), {"R": 4, "CB": 32}, num_warps=8, stream=7)
    monkeypatch.setattr(tl, "FAST", True)
    monkeypatch.setattr(tl, "_KNOBS", [SimpleNamespace(launch_enter_hook=print, launch_exit_hook=None)])
    tl.launch(k, (3,), (x, 64), {"R": 4, "CB": 32}, num_warps=8, stream=7)  # a profiler's hook: through Triton
    assert [c[0] for c in k.calls[4:]] == ["triton", "triton"]


def test_constexprs_out_of_signature_order_are_refused(monkeypatch):
    from types import SimpleNamespace

    import pytest

    from nvfp4lib.kernels.common import triton_launch as tl

    monkeypatch.setattr(tl, "_KNOBS", [SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None)])
    monkeypatch.setattr(tl, "_COMPILED", {})
    with pytest.raises(TypeError, match="signature order"):
        tl.launch(_FakeKernel(), (1,), (_cuda_arg(), 64), {"CB": 32, "R": 4}, stream=0)


class CudaLauncher:
    """Named as Triton 3.6's launcher: its ``__call__`` allocates scratch where the kernel needs it, then calls the C
    ``launch`` with (grid, stream, function, cooperative, pdl, global scratch, profile scratch, metadata..., args)."""

    launch_cooperative_grid, launch_pdl, profile_scratch_size = False, True, 0

    def __init__(self, calls, scratch=0):
        self.calls, self.global_scratch_size = calls, scratch

    def launch(self, *a):
        self.calls.append(("c", a))

    def __call__(self, gx, gy, gz, stream, function, *args):
        self.calls.append(("py", (gx, gy, gz, stream, function, *args)))


class _FakeCompiledCuda:
    function, packed_metadata = "fn", "meta"

    def __init__(self, calls, scratch):
        self.run = CudaLauncher(calls, scratch)


class _FakeCudaKernel(_FakeKernel):
    def __init__(self, scratch=0):
        super().__init__()
        self.scratch = scratch

    def __getitem__(self, grid):
        def go(*args, num_warps, **consts):
            self.calls.append(("triton", grid, args, consts, num_warps))
            return _FakeCompiledCuda(self.calls, self.scratch)
        return go


def test_a_cuda_launcher_without_scratch_is_called_at_its_c_function(monkeypatch):
    """The direct call passes what ``CudaLauncher.__call__`` would (no scratch buffers); a launcher that needs
    scratch, or ``DIRECT`` off, goes through ``__call__``."""
    from types import SimpleNamespace

    from nvfp4lib.kernels.common import triton_launch as tl

    monkeypatch.setattr(tl, "_KNOBS", [SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None)])
    monkeypatch.setattr(tl, "_COMPILED", {})
    k, x = _FakeCudaKernel(), _cuda_arg()
    for _ in range(2):
        tl.launch(k, (3,), (x, 64), {"R": 4, "CB": 32}, num_warps=8, stream=7)
    assert [c[0] for c in k.calls] == ["triton", "c"]
    assert k.calls[1][1] == (3, 1, 1, 7, "fn", False, True, None, None, "meta", None, None, None, x, 64, 4, 32)
    monkeypatch.setattr(tl, "DIRECT", False)
    tl.launch(k, (3,), (x, 64), {"R": 4, "CB": 32}, num_warps=8, stream=7)
    assert k.calls[2] == ("py", (3, 1, 1, 7, "fn", "meta", None, None, None, x, 64, 4, 32))
    monkeypatch.setattr(tl, "DIRECT", True)
    s = _FakeCudaKernel(scratch=128)
    for _ in range(2):
        tl.launch(s, (3,), (x, 64), {"R": 4, "CB": 32}, num_warps=8, stream=7)
    assert [c[0] for c in s.calls] == ["triton", "py"]


def test_a_bound_launch_holds_the_arguments_in_signature_order(monkeypatch):
    """``bound`` prepares a driver launch of a kernel compiled earlier: its parameters are the runtime arguments
    (tensors by address) then Triton's two scratch pointers; it refuses what Triton passes otherwise (an integer 1, a
    PDL or cooperative launch), a kernel never compiled, and a machine without libcuda."""
    import ctypes
    from types import SimpleNamespace

    from nvfp4lib.kernels.common import driver
    from nvfp4lib.kernels.common import triton_launch as tl

    monkeypatch.setattr(tl, "_COMPILED", {})
    monkeypatch.setattr(driver, "available", lambda: True)
    k, x = _FakeKernel(), torch.empty(64, dtype=torch.uint8)
    consts = {"R": 4, "CB": 32}
    assert tl.bound(k, (3,), (x, 1 << 40), consts, 8) is None  # not compiled yet
    ck = SimpleNamespace(metadata=SimpleNamespace(num_warps=8, shared=1024, num_ctas=1))
    tl._COMPILED[tl._key(k, x.device, (x, 1 << 40), consts, 8)] = (ck, (None, 77, False, False))
    launch = tl.bound(k, (3,), (x, 1 << 40), consts, 8)
    assert launch._head == (77, 3, 1, 1, 256, 1, 1, 1024)
    assert [ctypes.c_uint64.from_address(p).value for p in launch._pointers] == [x.data_ptr(), 1 << 40, 0, 0]
    launch.set(1, 1 << 41)
    assert ctypes.c_uint64.from_address(launch._pointers[1]).value == 1 << 41
    assert tl.bound(k, (3,), (x, 1), consts, 8) is None  # Triton passes an integer 1 as a constant
    assert tl.bound(k, (3, 2), (x, 1 << 40), consts, 8) is None  # 1-D grids only
    tl._COMPILED[tl._key(k, x.device, (x, 1 << 40), consts, 8)] = (ck, (None, 77, False, True))
    assert tl.bound(k, (3,), (x, 1 << 40), consts, 8) is None  # PDL
    tl._COMPILED[tl._key(k, x.device, (x, 1 << 40), consts, 8)] = (ck, None)
    assert tl.bound(k, (3,), (x, 1 << 40), consts, 8) is None  # not a CudaLauncher
    monkeypatch.setattr(driver, "available", lambda: False)
    tl._COMPILED[tl._key(k, x.device, (x, 1 << 40), consts, 8)] = (ck, (None, 77, False, False))
    assert tl.bound(k, (3,), (x, 1 << 40), consts, 8) is None
