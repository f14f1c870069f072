"""The symm-mem transport's Triton form (nn/ep_symm_triton.py, nn.ep_symm.PLAN_TRITON) against the single-process
layer, as tests/test_ep.py runs the torch form: 2 ranks as threads of this process on plain tensors, Triton's
interpreter on the CPU (skipped where Triton is missing), one kernel interpreted at a time. Bit-identical for any k,
steps one after another on the same buffers; the overflow case loses the same copies as the torch form."""
import os
import threading

import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
    pytest.skip("Triton on the CPU needs TRITON_INTERPRET=1", allow_module_level=True)

from nvfp4lib.nn import ep_symm, ep_symm_triton, routing_triton  # noqa: E402
from nvfp4lib.nn.ep_symm import SymmMemTransport  # noqa: E402
from tests.test_ep import symm_overflow_on_two_threads, symm_steps_on_two_threads  # noqa: E402


@pytest.fixture
def triton_form(monkeypatch):
    """The transport takes its Triton form on the CPU, and its launches run one at a time (the interpreter is not
    made for threads); counts how many steps took it."""
    lock, taken = threading.Lock(), []

    def locked(launch):
        def run(*a, **kw):
            with lock:
                return launch(*a, **kw)
        return run

    monkeypatch.setattr(ep_symm, "_triton_form", lambda t: True)
    monkeypatch.setattr(ep_symm, "PLAN_TRITON", True)
    for mod in (ep_symm_triton, routing_triton):
        monkeypatch.setattr(mod, "launch", locked(mod.launch))
    fused = SymmMemTransport._dispatch_fused

    def counted(self, *a):
        taken.append(self.rank)
        return fused(self, *a)

    monkeypatch.setattr(SymmMemTransport, "_dispatch_fused", counted)
    return taken


@pytest.mark.parametrize("activations", ["bf16", "nvfp4"])
def test_triton_form_matches_the_single_layer(triton_form, activations):
    symm_steps_on_two_threads(activations)
    assert len(triton_form) == 2 * 2 * 5  # every step of both ranks (k = 2 and 3, five cases) took the Triton form


def test_triton_form_overflow(triton_form):
    symm_overflow_on_two_threads()  # the same copies lost as the torch form's
    assert len(triton_form) == 2


def test_plan_against_the_torch_arithmetic():
    """plan() on random counts (W = 4, empty experts, a capacity that drops copies) against the torch form's sums."""
    g = torch.Generator().manual_seed(5)
    world, n_local, cap = 4, 6, 40
    counts = torch.randint(0, 5, (world, world * n_local), generator=g, dtype=torch.int32)
    counts[:, 3] = 0
    for me in range(world):
        p = ep_symm_triton.plan(counts, me, cap)
        c = counts.to(torch.int64)
        by_dest = c.view(world, world, n_local)
        total = by_dest.sum(0)
        first = (total.cumsum(1) - total + by_dest[:me].sum(0)).reshape(-1)
        mine = total[me]
        offsets = torch.clamp(torch.cat([mine.new_zeros(1), mine.cumsum(0)]), max=cap)
        dropped = torch.clamp(total.sum(1) - cap, min=0).sum()
        assert torch.equal(p.snap, counts)
        assert p.first.tolist() == first.tolist() and p.offsets.tolist() == offsets.tolist()
        assert int(p.dropped) == int(dropped)
        seg = c[:, me * n_local:(me + 1) * n_local]  # [source, local expert]
        start = (mine.cumsum(0) - mine)[None, :] + seg.cumsum(0) - seg
        row = (c.cumsum(1) - c)[:, me * n_local:(me + 1) * n_local]
        assert p.seg_start.tolist() == start.reshape(-1).tolist()
        assert p.seg_len.tolist() == seg.reshape(-1).tolist()
        assert p.seg_row.tolist() == row.reshape(-1).tolist()
