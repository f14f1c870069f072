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
