"""nvfp4lib.hf on a Hopper GPU (skipped without one): checkpoints loaded on the cute-hopper backend against the same
checkpoint on the CPU reference backend (each NVFP4 module on the GPU model's own inputs, then the whole model within
the CPU model's own one-ulp spread), greedy decoding with the whole model under one CUDA graph identical to eager
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
from nvfp4lib.hf.compare import module_errors, one_ulp_spread, rel_err  # noqa: E402

# The module's fixtures build checkpoints and models lazily, per architecture: each architecture's tests run in one
# pytest-xdist worker (--dist loadgroup), which builds only what they use, so that the three run side by side (one
# worker for the whole file did not finish inside a 10-minute command)
pytestmark = pytest.mark.gpu


def _group(arch: str):
    return pytest.mark.xdist_group(f"test_hf_gpu_{arch}")


def _sm90():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs sm_90")


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


ARCH_FMT = [pytest.param(a, f, marks=_group(a), id=f"{a}-{f}")
            for a, f in (("qwen3_moe", "modelopt"), ("mixtral", "compressed-tensors"), ("deepseek_v3", "modelopt"))]
# The inputs, by the kernel configs their row counts run (tuning.PREFERENCE): "rows4", 2 sequences of 2 tokens, runs
# the Linears and the experts' down GEMM on the decode tiles (16 tokens; ~3 s to compile per weight shape; these
# small layers' gate/up weights are packed in 128-row tiles, whose configs have 128-token tiles); "rows48", 2 of 24,
# runs the Linears on the 256-token tiles with 32-token steps (~30 s per shape): the input the whole-model test has
# always used (an H100 measured DeepSeek-V3 W4A4 at 0.126 with it).
INPUTS = {"rows4": (2, 2), "rows48": (2, 24)}
# Each NVFP4 module on the same input: the kernel-against-reference tolerance of tests/gpu/test_moe_gpu.py. W4A16 is
# bf16 rounding (~1e-3: the kernel's fp32 sums in another order, rounded once to bf16, and the experts' bf16
# intermediate); W4A4 adds the E2M1 codes of the experts' intermediate that a one-ulp difference moves. A static scale
# applied 1.5x off measures 0.08 (tests/test_hf_compare.py); a wrong kernel is O(1).
MODULE_TOL = 1e-2


@pytest.fixture(scope="module")
def compared(ckpts):
    """Per (arch, format, activations, input): the checkpoint loaded on the GPU (cute-hopper) and on the CPU
    (reference; one pair of models held at a time), one forward of the GPU model with every NVFP4 module's calls
    recorded and replayed through the CPU model's module of the same name (:func:`nvfp4lib.hf.compare.module_errors`),
    the CPU model's logits, the hidden states' distance per layer, and the CPU model's one-ulp spread
    (:func:`~nvfp4lib.hf.compare.one_ulp_spread`)."""
    models, done = {}, {}

    def get(arch, fmt, activations, inputs="rows48"):
        key = (arch, fmt, activations)
        if key + (inputs,) in done:
            return done[key + (inputs,)]
        if key not in models:
            models.clear()
            torch.cuda.empty_cache()
            path = ckpts(arch, fmt)
            models[key] = (from_pretrained(path, device="cuda", activations=activations),
                           from_pretrained(path, device="cpu", activations=activations))
        gpu, cpu = models[key]
        ids = torch.randint(0, 512, INPUTS[inputs], generator=torch.Generator().manual_seed(0))
        got, errors = module_errors(gpu, cpu, ids.cuda(), output_hidden_states=True)
        with torch.no_grad():
            want = cpu(ids, output_hidden_states=True)
        done[key + (inputs,)] = c = dict(
            got=got.logits.float().cpu(), want=want.logits.float(), errors=errors, spread=one_ulp_spread(cpu, ids),
            layers=[rel_err(a, b) for a, b in zip(got.hidden_states, want.hidden_states)])
        return c

    return get


def _summary(c) -> str:
    worst = "\n  ".join(str(e) for e in c["errors"][:4])
    return (f"logits rel_err GPU vs CPU {rel_err(c['got'], c['want']):.3g}; the CPU model's one-ulp spread "
            f"{', '.join(f'{s:.3g}' for s in c['spread'])}; hidden states per layer (embeddings first) "
            f"{', '.join(f'{g:.3g}' for g in c['layers'])}; worst modules on the same input:\n  {worst}")


@pytest.mark.parametrize("inputs", list(INPUTS))
@pytest.mark.parametrize("activations", ["nvfp4", "bf16"])
@pytest.mark.parametrize("arch,fmt", ARCH_FMT)
def test_each_module_matches_the_reference_on_the_same_input(compared, arch, fmt, activations, inputs):
    """The exactness test of the loaded model: teacher forced, each NVFP4Linear and NVFP4MoE of the GPU model against
    the CPU model's on the input the GPU module saw (routing included), so a module that computes something else
    (a kernel config, a shape such as DeepSeek-V3's kv_a_proj_with_mqa, N = kv_lora_rank + rope = 144, a static
    scale) is named here, while rounding that the layers after it amplify is not counted. Run with ``-rA`` to see
    every case's numbers."""
    _sm90()
    c = compared(arch, fmt, activations, inputs)
    print(f"{arch} {fmt} {activations} {inputs}: {_summary(c)}")
    assert len(c["errors"]) >= 3  # attention projections and experts of every layer were called
    worst = c["errors"][0]
    assert worst.rel_err < MODULE_TOL, f"{worst}\n{_summary(c)}"


@pytest.mark.parametrize("activations", ["nvfp4", "bf16"])
@pytest.mark.parametrize("arch,fmt", ARCH_FMT)
def test_loaded_model_matches_the_reference_backend(compared, arch, fmt, activations):
    """The whole model, GPU against CPU, a sanity bound (the exactness test is the one above, module by module).
    W4A16: within bf16 noise (2e-2). W4A4 re-quantizes each layer's input to FP4: where the GPU's bf16 (its attention,
    the kernels' summation order) rounds an element one ulp from the CPU's, an E2M1 code or a block scale moves a whole
    step, and the layers after spread it. How far that goes is measured here, on the CPU model itself: its logits'
    distance when every input embedding moves by one ulp is the W4A4 bound. On the CPU, at these sizes drawn with
    ``make_checkpoint(device="cpu")`` and seeds 0-7, that spread is 0.194-0.209 for DeepSeek-V3, 0.179-0.189 for
    Qwen3-MoE and 0.143-0.151 for Mixtral, as large as W4A4's own error against the W4A16 model (0.17-0.19, 0.18-0.19,
    0.14-0.15), while one ulp moves W4A16 by 0.009-0.049 (tests/test_hf_compare.py checks these relations). The
    0.126 that an H100 measured for DeepSeek-V3 W4A4 (0.058 for Qwen3-MoE), above the earlier fixed bound of 0.1, is
    within that; a broken module or scale moves the logits by O(1)."""
    _sm90()
    c = compared(arch, fmt, activations)
    err = rel_err(c["got"], c["want"])
    bound = max(c["spread"]) if activations == "nvfp4" else 2e-2
    assert err <= bound, _summary(c)
@_group("qwen3_moe")
@pytest.mark.parametrize("activations", ["nvfp4", "bf16"])
def test_cuda_graph_generation_matches_eager(ckpts, activations):
    _sm90()
    model = from_pretrained(ckpts("qwen3_moe", "modelopt"), device="cuda", activations=activations)
    prompt = torch.tensor([[3, 14, 15, 92, 65]] * 4)
    eager, _ = generate(model, prompt, 32)
    graphed, stats = generate(model, prompt, 32, cuda_graph=True)
    assert torch.equal(eager, graphed)
    assert stats["tokens_per_s"] > 0 and stats["peak_memory_gib"] > 0


@_group("peak_memory")
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


@_group("qwen3_moe")
@pytest.mark.parametrize("activations", ["nvfp4", "bf16"])
def test_compiled_forward_matches_eager(ckpts, activations):
    """torch.compile over the loaded model: the NVFP4 modules are one opaque op each (nvfp4lib.nn.compiled) running
    their eager forward, Inductor compiles the rest. The logits against the eager model's: W4A16 within bf16 noise
    (Inductor rounds its fused norms once, in fp32); W4A4 within the one-ulp spread that
    test_loaded_model_matches_the_reference_backend documents for Qwen3-MoE at these sizes (0.18-0.19 on the CPU), as
    a changed rounding before a quantization moves E2M1 codes; a missing or wrong op is O(1)."""
    _sm90()
    model = from_pretrained(ckpts("qwen3_moe", "modelopt"), device="cuda", activations=activations)
    ids = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(0)).cuda()
    with torch.no_grad():
        want = model(input_ids=ids, use_cache=False).logits.float()
        got = torch.compile(model, dynamic=False)(input_ids=ids, use_cache=False).logits.float()
    err = rel_err(got, want)
    print(f"qwen3_moe {activations}: compiled against eager logits rel_err {err:.3g}")
    assert err <= (0.25 if activations == "nvfp4" else 2e-2)


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
