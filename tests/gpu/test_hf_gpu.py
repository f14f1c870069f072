"""nvfp4lib.hf on a Hopper GPU (skipped without one): checkpoints loaded on the cute-hopper backend against the same
checkpoint on the CPU reference backend, greedy decoding with the whole model under one CUDA graph identical to eager
decoding, and peak memory while loading within 1.15x of the loaded model's footprint.

``NVFP4LIB_HF_BIG=1`` adds the Qwen3-30B-A3B-shaped run (a ~17 GB random checkpoint written to a temporary folder,
loaded, 128 tokens decoded under a CUDA graph at batch 1 and 8), printing its stats rows.
"""
import json
import os

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from nvfp4lib.hf import from_pretrained, generate, make_checkpoint  # noqa: E402

pytestmark = pytest.mark.gpu


def _sm90():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs sm_90")


def rel_err(a, b):
    return float((a.float().cpu() - b.float().cpu()).norm() / b.float().cpu().norm())


# big enough for the kernels' tiles to matter (N, K multiples of 8 and 16), small enough to write in seconds
MEDIUM = dict(layers=2, hidden=256, experts=16, moe_intermediate=128, heads=4, kv_heads=2, head_dim=64, vocab=512,
              top_k=4)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_gpu")
    made = {}

    def get(arch, fmt, **kw):
        key = (arch, fmt, tuple(sorted(kw.items())))
        if key not in made:
            made[key] = make_checkpoint(root / f"{arch}-{fmt}-{len(made)}", arch=arch, fmt=fmt, device="cuda",
                                        shard_bytes=1 << 20, **{**MEDIUM, **kw})
        return made[key]

    return get


@pytest.mark.parametrize("activations", ["nvfp4", "bf16"])
@pytest.mark.parametrize("arch,fmt", [("qwen3_moe", "modelopt"), ("mixtral", "compressed-tensors"),
                                      ("deepseek_v3", "modelopt")])
def test_loaded_model_matches_the_reference_backend(ckpts, arch, fmt, activations):
    _sm90()
    path = ckpts(arch, fmt)
    gpu = from_pretrained(path, device="cuda", activations=activations)
    cpu = from_pretrained(path, device="cpu", activations=activations)
    ids = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, want = gpu(ids.cuda()).logits, cpu(ids).logits
    # W4A4 quantizes each layer's input: the GPU's and the CPU's bf16 attention round differently, and an element
    # near a rounding boundary of E2M1 then lands one code apart (an H100 run measured 0.058 for Qwen3 at two layers);
    # W4A16 has no such step. A wrong kernel is off by O(1).
    assert rel_err(got, want) < (1e-1 if activations == "nvfp4" else 2e-2)


@pytest.mark.parametrize("activations", ["nvfp4", "bf16"])
def test_cuda_graph_generation_matches_eager(ckpts, activations):
    _sm90()
    model = from_pretrained(ckpts("qwen3_moe", "modelopt"), device="cuda", activations=activations)
    prompt = torch.tensor([[3, 14, 15, 92, 65]] * 4)
    eager, _ = generate(model, prompt, 32)
    graphed, stats = generate(model, prompt, 32, cuda_graph=True)
    assert torch.equal(eager, graphed)
    assert stats["tokens_per_s"] > 0 and stats["peak_memory_gib"] > 0


def test_peak_memory_while_loading(ckpts):
    """16 layers: one layer's experts in transit (their NVFP4 tensors while the serving path packs its copy) is
    1/16 of the experts."""
    _sm90()
    path = ckpts("qwen3_moe", "compressed-tensors", layers=16, hidden=512, experts=32, moe_intermediate=256)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    model = from_pretrained(path, device="cuda", activations="nvfp4")
    torch.cuda.synchronize()
    footprint = torch.cuda.memory_allocated() - base
    peak = torch.cuda.max_memory_allocated() - base
    print(f"footprint {footprint / 2**20:.1f} MiB, peak while loading {peak / 2**20:.1f} MiB "
          f"({peak / footprint:.3f}x)")
    assert peak <= 1.15 * footprint
    del model


@pytest.mark.skipif(os.environ.get("NVFP4LIB_HF_BIG") != "1", reason="set NVFP4LIB_HF_BIG=1 (writes ~17 GB)")
@pytest.mark.long_gpu
@pytest.mark.parametrize("fmt", ["modelopt"])
def test_qwen3_30b_a3b_shape(tmp_path, fmt):
    _sm90()
    path = make_checkpoint(tmp_path / "qwen3-30b-a3b", preset="qwen3-30b-a3b", fmt=fmt, device="cuda")
    rows = []
    for activations in ("nvfp4", "bf16"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        model = from_pretrained(path, device="cuda", activations=activations, progress=True)
        footprint = torch.cuda.memory_allocated() - base
        load_peak = torch.cuda.max_memory_allocated() - base
        assert load_peak <= 1.15 * footprint
        for batch in (1, 8):
            prompt = torch.randint(0, 151936, (batch, 16), generator=torch.Generator().manual_seed(batch))
            _, stats = generate(model, prompt, 128, cuda_graph=True)
            stats.update(footprint_gib=footprint / 2**30, load_peak_gib=load_peak / 2**30)
            rows.append(stats)
            print(json.dumps(stats))
        del model
    assert all(r["tokens_per_s"] > 0 for r in rows)
