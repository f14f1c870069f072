"""nvfp4lib.nn.compiled: under torch.compile the NVFP4 modules are one opaque custom op each (no graph break, one
graph over several layers, the eager bits); traced instead (OPAQUE off) they give the same bits; opcheck; a collected
module is named, not a crash."""
import gc

import pytest
import torch

from nvfp4lib.formats import quantize
from nvfp4lib.nn import NVFP4Linear, NVFP4MoE, compiled

H, INTER, E = 64, 32, 8


def _moe(activations, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = [(torch.randn(E, *s, generator=g) / 8).to(torch.bfloat16) for s in ((INTER, H), (INTER, H), (H, INTER))]
    return NVFP4MoE.from_float(*w, activations=activations, backend="reference")


def _linear(activations, seed=0):
    w = (torch.randn(96, H, generator=torch.Generator().manual_seed(seed)) / 8).to(torch.bfloat16)
    return NVFP4Linear(quantize(w), activations=activations, backend="reference")


class _Block(torch.nn.Module):
    """Two layers of (norm, Linear, MoE) in a loop: the shape of a decoder stack (the routing given, so that a
    rounding does not flip an expert choice)."""

    def __init__(self, activations):
        super().__init__()
        self.lin = torch.nn.ModuleList([_linear(activations, s) for s in range(2)])
        self.moe = torch.nn.ModuleList([_moe(activations, s) for s in range(2)])

    def forward(self, x, ids, w):
        for lin, moe in zip(self.lin, self.moe):
            x = x + lin(torch.nn.functional.rms_norm(x, (H,)))[:, :H]
            x = x + moe(torch.nn.functional.rms_norm(x, (H,)), ids, w)
        return x


def _inputs(t=5):
    g = torch.Generator().manual_seed(3)
    w = torch.rand(t, 2, generator=g)
    return torch.randn(t, H, generator=g).to(torch.bfloat16), torch.randint(0, E, (t, 2), generator=g), w / w.sum(-1,
                                                                                                         keepdim=True)


def _graphs(model, x, grad: bool = False):
    """The FX graphs dynamo hands the backend for ``model(*x)`` (fullgraph; autograd recording with ``grad``), and
    the compiled output."""
    seen = []

    def backend(gm, inputs):
        seen.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with torch.set_grad_enabled(grad):
        out = torch.compile(model, backend=backend, fullgraph=True)(*x)
    return seen, out


def _targets(gm):
    return {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}


@pytest.mark.parametrize("activations", ["nvfp4", "bf16"])
def test_one_graph_with_the_opaque_ops_and_the_eager_bits(activations):
    model = _Block(activations)
    x = _inputs()
    graphs, out = _graphs(model, x)
    assert len(graphs) == 1
    calls = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert calls.count("nvfp4lib.moe.default") == 2 and calls.count("nvfp4lib.linear.default") == 2
    assert not any("grouped_mm" in c for c in calls)  # the GEMMs are inside the opaque ops
    with torch.no_grad():  # (inference modules: the ops have no backward)
        assert torch.equal(out, model(*x))
        # and Inductor compiles around them: the norms and residual adds fused in fp32 round otherwise in bf16, and
        # W4A4 turns a one-ulp change of its input into E2M1 code flips (~5% here; a missing or wrong op is O(1))
        torch._dynamo.reset()
        got, want = torch.compile(model, fullgraph=True)(*x).float(), model(*x).float()
        assert ((got - want).norm() / want.norm()).item() < (0.1 if activations == "nvfp4" else 2e-2)


@pytest.mark.parametrize("activations", ["nvfp4", "bf16"])
def test_exact_casts_give_the_eager_bits(activations):
    """With Inductor's emulate_precision_casts (generate(exact_casts=True)), the fused norms and adds round where the
    eager code does: the compiled block gives the eager bits, W4A4 included (without it they differ; the test above)."""
    model = _Block(activations)
    x = _inputs()
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(model, fullgraph=True, options={"emulate_precision_casts": True})(*x)
        assert torch.equal(got, model(*x))


def test_traced_form_when_the_knob_is_off(monkeypatch):
    monkeypatch.setattr(compiled, "OPAQUE", False)
    model = _Block("nvfp4")
    x = _inputs()
    graphs, out = _graphs(model, x)
    targets = set().union(*(_targets(g) for g in graphs))
    assert "nvfp4lib.moe.default" not in targets and "nvfp4lib.linear.default" not in targets
    assert any("grouped_mm" in t for t in targets)
    with torch.no_grad():
        assert torch.equal(out, model(*x))  # the traced torch forms: the eager bits


def test_traced_where_autograd_records():
    """A router's weights requiring grad outside no_grad: the forward is traced (the ops have no backward)."""
    model = _Block("bf16")
    x, ids, w = _inputs()
    w.requires_grad_(True)
    seen, out = _graphs(model, (x, ids, w), grad=True)
    targets = set().union(*(_targets(g) for g in seen))
    assert "nvfp4lib.moe.default" not in targets and "nvfp4lib.linear.default" in targets  # (x needs no grad)
    assert out.requires_grad and torch.equal(out.detach(), model(x, ids, w.detach()))


def test_opcheck():
    moe, lin = _moe("nvfp4"), _linear("bf16")
    x = torch.randn(4, H).to(torch.bfloat16)
    ids = torch.randint(0, E, (4, 2))
    w = torch.rand(4, 2)
    torch.library.opcheck(compiled.moe, (x, ids, w, moe._handle))
    torch.library.opcheck(compiled.linear, (x, lin._handle))


def test_a_collected_module_is_named():
    lin = _linear("bf16")
    h = lin._handle
    del lin
    gc.collect()
    with pytest.raises(RuntimeError, match=f"handle {h} no longer exists"):
        compiled.linear(torch.zeros(1, H, dtype=torch.bfloat16), h)
