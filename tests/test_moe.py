"""nvfp4lib.nn on the CPU (backend="reference"): the device quantizer is bit-exact against formats.quantize, routing
is a stable sort with the right offsets, and NVFP4MoE matches the exact reference in both activation modes, on the
shapes that break MoE layers (E=256 top-8, one hot expert, empty experts, T=1), eagerly and under torch.compile."""
import importlib.util

import pytest
import torch
import torch.nn.functional as F

from nvfp4lib.formats import dequantize, quantize
from nvfp4lib.nn import NVFP4MoE, quantize_rows, reference_moe
from nvfp4lib.nn.routing import route, unpermute

# a module fixture shared by this file's tests: they run in one pytest-xdist worker, so it is built once
pytestmark = pytest.mark.xdist_group("test_moe")

# The layer rounds the down GEMM's output and its own output to bf16 (and sums the intermediate in another order
# before its bf16 rounding); measured against the fp32 reference: 1.7e-3 to 2.6e-3 normwise on every case here.
TOL = 1e-2
H, INTER = 64, 32


def bits(t):
    return t.view(torch.uint8)


def make_layer(experts, activations="nvfp4", seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = ((INTER, H), (INTER, H), (H, INTER))
    w = [torch.randn(experts, *s, generator=g).mul(0.1).to(torch.bfloat16) for s in shapes]
    return NVFP4MoE.from_float(*w, activations=activations, backend="reference")


def make_inputs(t, k, experts, seed=1, allowed=None):
    """x [t, H] bf16, distinct expert ids per token drawn from ``allowed`` (default all), softmax weights."""
    g = torch.Generator().manual_seed(seed)
    allowed = torch.arange(experts) if allowed is None else torch.as_tensor(allowed)
    x = torch.randn(t, H, generator=g).to(torch.bfloat16)
    ids = torch.stack([allowed[torch.randperm(len(allowed), generator=g)[:k]] for _ in range(t)])
    w = torch.randn(t, k, generator=g).softmax(-1)
    return x, ids, w


def rel_err(out, ref):
    return float((out.detach().float() - ref).norm() / ref.norm())


def check(layer, x, ids, w):
    out = layer(x, ids, w)
    assert out.dtype == x.dtype and out.shape == x.shape
    ref = reference_moe(x, ids, w, layer.w_gate, layer.w_up, layer.w_down, activations=layer.activations)
    err = rel_err(out, ref)
    assert err < TOL, err
    return out


# -- the device quantizer ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("given", [False, True])
def test_quantize_rows_matches_formats_bit_for_bit(dtype, given):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(5, 7, 96, generator=g) * torch.logspace(-4, 3, 96)).to(dtype)
    x[0, 0, :16] = 0.0  # a zero block: zero scale, +0 codes
    x[0, 1, :16] = -0.0
    x[1, 2, 16:32] = 1e-6  # a block whose scale is E4M3-subnormal or flushes to zero
    x[2, 3, 5] = -x.abs().max() * 2  # the amax, negative
    gs = torch.tensor(0.0173) if given else None
    codes, scales, gdev = quantize_rows(x, None if gs is None else gs.reshape(1))
    ref = quantize(x, global_scale=gs)
    assert torch.equal(codes, ref.data)
    assert torch.equal(bits(scales), bits(ref.scales))
    assert gdev.shape == (1,) and torch.equal(gdev[0], ref.global_scale)


def test_quantize_rows_all_zero_and_compiled():
    codes, scales, g = quantize_rows(torch.zeros(3, 32))
    assert float(g) == 1.0 and not codes.any() and not bits(scales).any()
    x = torch.randn(40, 128).to(torch.bfloat16) * 5
    ref = quantize(x)
    c, s, g = torch.compile(quantize_rows, fullgraph=True)(x)
    assert torch.equal(c, ref.data) and torch.equal(bits(s), bits(ref.scales)) and torch.equal(g[0], ref.global_scale)


# -- routing -----------------------------------------------------------------------------------------------------------
def test_route_is_a_stable_sort_with_bincount_offsets():
    _, ids, _ = make_inputs(50, 4, 16, allowed=range(0, 16, 3))  # experts 1, 2, 4, ... get nothing
    r = route(ids, 16)
    flat = ids.reshape(-1)
    counts = torch.bincount(flat, minlength=16)
    assert r.offsets.dtype == torch.int32
    assert torch.equal(r.offsets, F.pad(torch.cumsum(counts, 0), (1, 0)).to(torch.int32))
    copy = torch.argsort(flat, stable=True)
    assert torch.equal(r.token, copy // 4)
    assert torch.equal(r.row[copy], torch.arange(200))
    y = torch.randn(200, 8)
    w = torch.rand(50, 4)
    want = (y[r.row].view(50, 4, 8) * w[..., None]).sum(1)
    assert torch.equal(unpermute(y, r, w), want)


# -- the layer against the reference ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def layers():
    return {a: make_layer(256, a) for a in ("nvfp4", "bf16")}


@pytest.mark.parametrize("activations", ["nvfp4", "bf16"])
@pytest.mark.parametrize("case", ["e256_top8", "one_expert", "empty_experts", "t1"])
def test_layer_matches_reference(layers, activations, case):
    layer = layers[activations]
    if case == "e256_top8":
        x, ids, w = make_inputs(48, 8, 256)
    elif case == "one_expert":
        x, ids, w = make_inputs(33, 1, 256, allowed=[117])
    elif case == "empty_experts":
        x, ids, w = make_inputs(40, 8, 256, allowed=[0, 3, 9, 64, 100, 200, 254, 255, 31, 77])
    else:
        x, ids, w = make_inputs(1, 8, 256)
    out = check(layer, x, ids, w)
    assert torch.equal(out, layer(x, ids, w))  # deterministic: same bits twice


def test_reference_is_the_per_token_formula():
    """The reference (W4A16: no activation quantization) against the formula written token by token."""
    layer = make_layer(6, "bf16")
    x, ids, w = make_inputs(9, 2, 6)
    wg, wu, wd = ([dequantize(t) for t in ws] for ws in (layer.w_gate, layer.w_up, layer.w_down))
    want = torch.zeros(9, H)
    for t in range(9):
        for j in range(2):
            e = int(ids[t, j])
            h = (F.silu(x[t].float() @ wg[e].T) * (x[t].float() @ wu[e].T)).to(torch.bfloat16).float()
            want[t] += w[t, j] * (h @ wd[e].T)
    got = reference_moe(x, ids, w, layer.w_gate, layer.w_up, layer.w_down, activations="bf16")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)



def test_static_scales_calibrated_on_the_batch_give_the_dynamic_reference():
    """calibrate_input_scales: the global scales W4A4 computes for a batch and its intermediate; the reference with
    them as static scales is the dynamic reference, bit for bit; with other scales it differs, and the layer built with
    those scales matches the reference given them."""
    from nvfp4lib.nn import calibrate_input_scales

    layer = make_layer(6, "nvfp4")
    x, ids, w = make_inputs(9, 2, 6)
    ws = (layer.w_gate, layer.w_up, layer.w_down)
    scales = calibrate_input_scales(x, ids, layer.w_gate, layer.w_up)
    assert all(isinstance(v, float) and v > 0 for v in scales)
    dynamic = reference_moe(x, ids, w, *ws)
    assert torch.equal(reference_moe(x, ids, w, *ws, input_scales=scales), dynamic)
    other = (scales[0] * 3.0, scales[1] * 0.37)
    ref = reference_moe(x, ids, w, *ws, input_scales=other)
    assert not torch.equal(ref, dynamic)
    static = NVFP4MoE(*ws, backend="reference", input_scales=other)
    assert rel_err(static(x, ids, w), ref) < TOL

def test_w4a4_error_against_unquantized_activations():
    """What NVFP4 activations cost: W4A4 against W4A16 on the same weights (measured 0.15 normwise)."""
    layer = make_layer(16, "nvfp4")
    x, ids, w = make_inputs(64, 4, 16)
    a4 = reference_moe(x, ids, w, layer.w_gate, layer.w_up, layer.w_down, activations="nvfp4")
    a16 = reference_moe(x, ids, w, layer.w_gate, layer.w_up, layer.w_down, activations="bf16")
    assert 0.05 < rel_err(a4, a16) < 0.3


class _Router(torch.nn.Module):
    """A model that calls the layer: softmax top-k routing in front of it, as an MoE block does."""

    def __init__(self, moe, k):
        super().__init__()
        self.moe, self.k = moe, k
        self.router = torch.nn.Linear(H, moe.experts, bias=False, dtype=torch.bfloat16)

    def routing(self, x):
        w, ids = torch.topk(self.router(x).float().softmax(-1), self.k, dim=-1)
        return ids, w / w.sum(-1, keepdim=True)

    def forward(self, x):
        return self.moe(x, *self.routing(x))


@pytest.mark.parametrize("activations", ["nvfp4", "bf16"])
def test_torch_compile_fullgraph(activations):
    torch.manual_seed(0)
    model = _Router(make_layer(8, activations), k=2)
    x, _, _ = make_inputs(24, 2, 8)
    out = torch.compile(model, fullgraph=True)(x)
    ids, w = model.routing(x)
    ref = reference_moe(x, ids, w, model.moe.w_gate, model.moe.w_up, model.moe.w_down, activations=activations)
    assert rel_err(out, ref) < TOL
    if activations == "nvfp4":
        # the traced quantizer and routing give the eager bits (the W4A16 reference path fuses silu·up in fp32,
        # so it differs from eager by bf16 roundings)
        assert torch.equal(torch.compile(model.moe, fullgraph=True)(x, ids, w), model.moe(x, ids, w))


def test_refusals():
    if not torch.cuda.is_available():  # W4A16 on cute-hopper exists: with no GPU it stops at the device check
        with pytest.raises(RuntimeError, match="cute-hopper needs"):
            w = torch.randn(2, INTER, H).to(torch.bfloat16)
            NVFP4MoE.from_float(w, w, w.transpose(1, 2), activations="bf16", backend="cute-hopper")
    with pytest.raises(ValueError, match="activations"):
        make_layer(2, "int8")
    w = torch.randn(2, INTER, H).to(torch.bfloat16)
    with pytest.raises(ValueError, match="quantizer must be one of"):
        NVFP4MoE.from_float(w, w, w.transpose(1, 2), backend="reference", quantizer="cuda")
    from nvfp4lib.nn.moe import resolve_quantizer

    assert NVFP4MoE.from_float(w, w, w.transpose(1, 2), backend="reference").quantizer == "torch"  # auto, on the CPU
    assert resolve_quantizer("torch", "cuda") == "torch"
    if importlib.util.find_spec("triton") is not None:
        assert resolve_quantizer("auto", "cuda") == "triton" and resolve_quantizer("auto", "cpu") == "torch"
    else:
        assert resolve_quantizer("auto", "cuda") == "torch"
        with pytest.raises(ValueError, match="needs Triton"):
            resolve_quantizer("triton", "cuda")
    layer = make_layer(4)
    x, ids, w = make_inputs(3, 2, 4)
    with pytest.raises(ValueError, match="topk_weights"):
        layer(x, ids, w[:, :1])
    with pytest.raises(ValueError, match="x must be"):
        layer(x[:, :32], ids, w)
