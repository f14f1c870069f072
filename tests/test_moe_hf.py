"""nvfp4lib.nn.hf on tiny randomly initialised Mixtral and Qwen3-MoE models (CPU, backend="reference", no download;
skipped without transformers): the swapped block keeps the router and reproduces the block on NVFP4 weights, and the
swapped model's logits stay within the NVFP4 quantization error of the original's."""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from nvfp4lib.formats import dequantize, quantize  # noqa: E402
from nvfp4lib.nn.hf import NVFP4SparseMoeBlock, swap_moe_blocks, tiny_model  # noqa: E402

MODELS = {arch: (lambda arch=arch: tiny_model(arch)) for arch in ("mixtral", "qwen3_moe")}


def rel_err(out, ref):
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def fake_quantized(block):
    """A copy of the original block whose expert weights are their NVFP4 values (dequantized, expert by expert)."""
    fake = copy.deepcopy(block)
    gu = fake.experts.gate_up_proj
    inter = gu.shape[1] // 2
    with torch.no_grad():
        for w, rows in ((gu, slice(0, inter)), (gu, slice(inter, None)), (fake.experts.down_proj, slice(None))):
            for e in range(w.shape[0]):
                w[e, rows] = dequantize(quantize(w[e, rows]))
    return fake


@pytest.mark.parametrize("arch", MODELS)
def test_swapped_block_is_the_block_on_nvfp4_weights(arch):
    """W4A16 swap against the original block on the same NVFP4 weights: only the layer's bf16 roundings differ
    (measured 2.3e-3 / 2.4e-3 for Mixtral / Qwen3). Inputs are scaled so that silu is far from linear: a gate/up
    mix-up then shows (measured 0.86 / 0.94)."""
    torch.manual_seed(0)
    block = MODELS[arch]().eval().model.layers[0].mlp
    swapped = NVFP4SparseMoeBlock.from_block(block, activations="bf16", backend="reference")
    assert swapped.gate is block.gate
    h = torch.randn(2, 16, 64) * 10
    with torch.no_grad():
        err = rel_err(swapped(h), fake_quantized(block)(h))
    assert err < 1e-2, err


@pytest.mark.parametrize("activations", ["nvfp4", "bf16"])
@pytest.mark.parametrize("arch", MODELS)
def test_swapped_model_logits(arch, activations):
    """Logits of the swapped model against the unswapped one. Measured normwise relative errors (seed 0, fp32 model):
    Mixtral 0.018 (W4A4) / 0.016 (W4A16), Qwen3-MoE 0.012 / 0.008; a bf16 model measures the same within 0.003.
    (At this init the MoE blocks add little to the residual stream; a block alone is off by 0.16-0.24 in W4A4.)"""
    torch.manual_seed(0)
    model = MODELS[arch]().eval()
    ids = torch.randint(0, 128, (2, 16))
    with torch.no_grad():
        ref = model(ids).logits
        swapped = copy.deepcopy(model)
        assert swap_moe_blocks(swapped, activations=activations, backend="reference") == 2
        assert all(isinstance(layer.mlp, NVFP4SparseMoeBlock) for layer in swapped.model.layers)
        out = swapped(ids, output_router_logits=True)
    err = rel_err(out.logits, ref)
    assert err < 0.05, err
    assert len(out.router_logits) == 2  # the kept routers are still recorded (load-balancing loss)


def test_tiny_model_knows_its_architectures():
    assert tiny_model("qwen3_moe", num_hidden_layers=1).config.num_hidden_layers == 1
    with pytest.raises(ValueError, match="arch"):
        tiny_model("llama")


def test_swap_refuses_a_model_without_moe_blocks():
    with pytest.raises(ValueError, match="no MixtralSparseMoeBlock"):
        swap_moe_blocks(torch.nn.Sequential(torch.nn.Linear(4, 4)), backend="reference")
