"""nvfp4lib.hf.compare on the CPU (reference backend): the teacher-forced per-module comparison names the one module
that computes something else, and W4A4's amplification of a one-ulp change, which is what the GPU test
(tests/gpu/test_hf_gpu.py) bounds the whole model by.

The model is DeepSeek-V3 at the GPU test's sizes (MLA attention projections with N = kv_lora_rank + rope = 144,
shared experts, a dense first layer), drawn on the CPU with seed 0.
"""
import pytest
import torch

pytestmark = [pytest.mark.xdist_group("test_hf_compare"), pytest.mark.slow]

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from nvfp4lib.hf import from_pretrained, make_checkpoint  # noqa: E402
from nvfp4lib.hf.compare import module_errors, nvfp4_modules, one_ulp, one_ulp_spread, rel_err  # noqa: E402
from nvfp4lib.nn import NVFP4Linear, NVFP4MoE  # noqa: E402

# the GPU test's MEDIUM sizes
SIZES = dict(layers=2, hidden=256, experts=16, moe_intermediate=128, heads=4, kv_heads=2, head_dim=64, vocab=512,
             top_k=4)
IDS = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("compare") / "deepseek", arch="deepseek_v3", fmt="modelopt",
                           shard_bytes=1 << 20, **SIZES)


def test_module_errors_name_the_module_that_differs(deepseek):
    model = from_pretrained(deepseek, device="cpu", activations="nvfp4")
    ref = from_pretrained(deepseek, device="cpu", activations="nvfp4")
    report = model.nvfp4_load_report
    out, errors = module_errors(model, ref, IDS)
    assert out.logits.shape == (2, 24, 512)
    # every NVFP4 module was called once and compared: the same backend gives the same bits
    assert len(errors) == len(nvfp4_modules(model)) == report["expert_layers"] + report["nvfp4_linears"]
    assert all(e.calls == 1 and e.rel_err == 0.0 and e.max_abs == 0.0 for e in errors)
    # A static activation scale applied 1.5x off, in one MLA projection and then in one expert layer's down input:
    # that module, and only it, differs on the same input, although every layer after it sees other activations.
    lin = "model.layers.1.self_attn.kv_a_proj_with_mqa"
    moe = "model.layers.1.mlp.experts.moe"
    assert isinstance(model.get_submodule(lin), NVFP4Linear) and isinstance(model.get_submodule(moe), NVFP4MoE)
    for name in (lin, moe):
        m = model.get_submodule(name)
        if name == lin:
            m.input_scale = m.input_scale * 1.5
        else:
            m.input_scales = (m.input_scales[0], m.input_scales[1] * 1.5)
        out_bad, errors = module_errors(model, ref, IDS)
        assert errors[0].name == name and errors[0].rel_err > 1e-2, errors[0]  # the GPU test's MODULE_TOL
        assert all(e.rel_err == 0.0 for e in errors[1:]), [str(e) for e in errors[1:3]]
        assert rel_err(out_bad.logits, out.logits) > 0  # while the model's output moved
        model = from_pretrained(deepseek, device="cpu", activations="nvfp4")
    with pytest.raises(ValueError, match="the reference has no NVFP4Linear at 'model.layers.0.self_attn.q_a_proj'"):
        module_errors(model, ref.model, IDS)  # names one level down: 'layers.0...'
    with pytest.raises(ValueError, match="no NVFP4Linear or NVFP4MoE"):
        module_errors(torch.nn.Linear(4, 4), ref, torch.ones(4))


def test_w4a4_amplifies_a_one_ulp_change(deepseek):
    """Every input embedding moved by one bf16 ulp (seeds 0-2) moves the W4A4 logits by 0.197-0.205 on this model,
    as much as W4A4's whole error against the W4A16 model (0.188), and W4A16's by 0.009-0.043 (routing near-ties
    included): W4A4 re-quantizes every layer's input, so a one-ulp difference moves E2M1 codes and block scales by a
    whole step, and the later layers spread it. The relations, not the numbers, are checked."""
    w4a4 = from_pretrained(deepseek, device="cpu", activations="nvfp4")
    w4a16 = from_pretrained(deepseek, device="cpu", activations="bf16")
    with torch.no_grad():
        quant_err = rel_err(w4a4(IDS).logits, w4a16(IDS).logits)
    a4, a16 = one_ulp_spread(w4a4, IDS), one_ulp_spread(w4a16, IDS)
    assert min(a4) > quant_err / 2, (a4, quant_err)
    assert max(a16) < min(a4) / 2, (a16, a4)


def test_one_ulp_moves_each_nonzero_element_one_step():
    x = torch.tensor([0.0, 1.0, -1.0, 3.140625, -0.0, 1e-3, 448.0], dtype=torch.bfloat16)
    y = one_ulp(x, seed=0)
    steps = (y.view(torch.int16).int() - x.view(torch.int16).int()).abs()
    assert steps.tolist() == [0, 1, 1, 1, 0, 1, 1]
    assert torch.equal(torch.signbit(y), torch.signbit(x))
    assert not torch.equal(one_ulp(torch.ones(64, dtype=torch.bfloat16), 0),
                           one_ulp(torch.ones(64, dtype=torch.bfloat16), 1))
    with pytest.raises(TypeError, match="bf16 or fp16"):
        one_ulp(torch.ones(3), 0)
