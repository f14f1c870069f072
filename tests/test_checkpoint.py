"""nvfp4lib.hf's checkpoint formats on the CPU (skipped without transformers/safetensors): each stored tensor decodes
per its format's formula (tensors from the project's writer and hand-built ones that follow the exporters' arithmetic:
bf16 weight_scale_2, zero blocks, low nibble = even element), and bad checkpoints fail naming the file and the
tensor."""
import json
import shutil

import pytest
import torch

# a module fixture shared by this file's tests: they run in one pytest-xdist worker, so it is built once
pytestmark = pytest.mark.xdist_group("test_checkpoint")

pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from nvfp4lib.formats import E2M1_VALUES, dequantize  # noqa: E402
from nvfp4lib.hf import CheckpointError, from_pretrained, make_checkpoint  # noqa: E402
from nvfp4lib.hf.checkpoint import Checkpoint, read_nvfp4, read_scheme  # noqa: E402

TABLE = torch.tensor(E2M1_VALUES, dtype=torch.float64)


def formula(fmt, codes, scale, glob):
    """The format's own decoding, in float64 from the stored tensors: unpack (element 2j = low nibble), then
    e2m1 · weight_scale · weight_scale_2 (ModelOpt) or e2m1 · weight_scale / weight_global_scale
    (compressed-tensors)."""
    n, half = codes.shape
    e = torch.empty(n, 2 * half, dtype=torch.float64)
    e[:, 0::2] = TABLE[(codes & 0xF).long()]
    e[:, 1::2] = TABLE[(codes >> 4).long()]
    s = scale.to(torch.float64).repeat_interleave(16, dim=1)
    g = glob.to(torch.float64).reshape(())
    return e * s * g if fmt == "modelopt" else e * s / g


def exporter_encode(w: torch.Tensor, fmt: str, g_dtype=torch.float32):
    """Codes, block scales and the stored per-tensor scale of ``w`` as the exporters compute them (nearest E2M1 value
    of w / (block scale · global), block scale = e4m3(block amax / 6 / global)); written apart from formats.quantize."""
    w = w.to(torch.float32)
    amax = w.abs().max()
    if fmt == "modelopt":
        stored = (amax / (6 * 448)).to(g_dtype)
        glob = stored.to(torch.float32)
    else:
        stored = ((6 * 448) / amax).reshape(1)
        glob = 1 / stored.reshape(())
    blocks = w.reshape(w.shape[0], -1, 16)
    bs = (blocks.abs().amax(-1) / 6 / glob).clamp(max=448).to(torch.float8_e4m3fn)
    denom = bs.to(torch.float32).unsqueeze(-1) * glob
    y = torch.where(denom > 0, blocks / torch.where(denom > 0, denom, 1), 0).reshape(w.shape)
    idx = (y.abs().unsqueeze(-1) - TABLE[:8].float()).abs().argmin(-1).to(torch.uint8)
    codes = idx | (torch.signbit(y) & (idx > 0)).to(torch.uint8) << 3
    return codes[:, 0::2] | (codes[:, 1::2] << 4), bs, stored


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """One tiny checkpoint per (arch, format), written once for the module."""
    root = tmp_path_factory.mktemp("ckpt")
    made = {}

    def get(arch="qwen3_moe", fmt="modelopt", **kw):
        key = (arch, fmt, tuple(sorted(kw.items())))
        if key not in made:
            made[key] = make_checkpoint(root / f"{arch}-{fmt}-{len(made)}", arch=arch, fmt=fmt, shard_bytes=20_000,
                                        **kw)
        return made[key]

    return get


def _all_tensors(path):
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(safetensors_torch.load_file(str(f)))
    return out


def _rewrite(src, dst, edit, config_edit=None):
    """A copy of checkpoint ``src`` at ``dst`` with its tensors edited (``edit(dict)``), written as one
    model.safetensors (no index)."""
    shutil.copytree(src, dst)
    tensors = _all_tensors(dst)
    for f in list(dst.glob("*.safetensors")) + [dst / "model.safetensors.index.json"]:
        f.unlink()
    edit(tensors)
    safetensors_torch.save_file(tensors, str(dst / "model.safetensors"))
    if config_edit:
        for name, fn in config_edit.items():
            d = json.loads((dst / name).read_text())
            fn(d)
            (dst / name).write_text(json.dumps(d))
    return dst


@pytest.mark.parametrize("fmt", ["modelopt", "compressed-tensors"])
def test_writer_tensors_decode_per_the_formula(tiny, fmt):
    """Every quantized module of a written checkpoint: read_nvfp4 then dequantize (float64) against the formula from
    the raw tensors. ModelOpt's product is exact; compressed-tensors' division becomes a multiplication by the float32
    reciprocal: within 2**-24 relative."""
    path = tiny("qwen3_moe", fmt)
    ck, scheme = Checkpoint(path), read_scheme(path)
    f = scheme.fields
    mods = sorted({n.rsplit(".", 1)[0] for n in ck.names if n.endswith("." + f["scales"])})
    assert len(mods) == 2 * (4 + 8 * 3)  # 2 layers: q, k, v, o and 8 experts x 3
    for mod in mods:
        w, a = read_nvfp4(ck, scheme, mod, "cpu")
        ref = formula(fmt, *(ck.get(f"{mod}.{f[k]}") for k in ("codes", "scales", "global")))
        got = dequantize(w, torch.float64)
        if fmt == "modelopt":
            assert torch.equal(got, ref), mod
        else:
            assert torch.allclose(got, ref, rtol=2**-24, atol=0), mod
        assert a is not None and float(a) > 0


@pytest.mark.parametrize("fmt,g_dtype", [("modelopt", torch.float32), ("modelopt", torch.bfloat16),
                                         ("compressed-tensors", torch.float32)])
def test_hand_built_tensors_decode_per_the_formula(tmp_path, fmt, g_dtype):
    """A hand-built module (exporters' arithmetic, a zero block, bf16 weight_scale_2 where ModelOpt checkpoints have
    one) decodes per the formula; and the nibble order is the on-disk one (element 2j in the low nibble)."""
    torch.manual_seed(0)
    w = torch.randn(32, 64) * 0.05
    w[3, 16:32] = 0  # a zero block: scale 0, codes 0
    codes, bs, stored = exporter_encode(w, fmt, g_dtype)
    names = {"modelopt": ("weight", "weight_scale", "weight_scale_2", "input_scale"),
             "compressed-tensors": ("weight_packed", "weight_scale", "weight_global_scale", "input_global_scale")}[fmt]
    tensors = dict(zip(names, (codes, bs, stored, torch.tensor(0.01))))
    safetensors_torch.save_file({f"m.{k}": v for k, v in tensors.items()}, str(tmp_path / "model.safetensors"))
    qc = ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16} if fmt == "modelopt" else
          {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "config_groups": {
              "g": {"weights": {"num_bits": 4, "type": "float", "group_size": 16}}}})
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": qc}))
    ck, scheme = Checkpoint(tmp_path), read_scheme(tmp_path)
    wt, a = read_nvfp4(ck, scheme, "m", "cpu", (32, 64))
    got, ref = dequantize(wt, torch.float64), formula(fmt, codes, bs, stored)
    if fmt == "modelopt":
        assert torch.equal(got, ref)
        assert float(a) == pytest.approx(0.01)
    else:
        assert torch.allclose(got, ref, rtol=2**-24, atol=0)
        assert float(a) == pytest.approx(100.0)  # the dequantizing global: 1 / input_global_scale
    assert float(got[3, 16:32].abs().max()) == 0.0
    # the exporter's encoding is the nearest NVFP4 value, so the decoded tensor is close to w: with element 2j read
    # from the high nibble instead, it would be off by ~1.4
    assert float((got.float() - w).norm() / w.norm()) < 0.15


def test_power_of_two_global_is_exact_for_compressed_tensors(tmp_path):
    codes = torch.randint(0, 256, (16, 8), dtype=torch.uint8)
    bs = torch.full((16, 1), 2.0).to(torch.float8_e4m3fn)
    safetensors_torch.save_file({"m.weight_packed": codes, "m.weight_scale": bs,
                                 "m.weight_global_scale": torch.tensor([256.0])}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
        "config_groups": {"g": {"weights": {"num_bits": 4, "type": "float", "group_size": 16}}}}}))
    w, a = read_nvfp4(Checkpoint(tmp_path), read_scheme(tmp_path), "m", "cpu")
    assert a is None
    assert torch.equal(dequantize(w, torch.float64), formula("compressed-tensors", codes, bs, torch.tensor([256.0])))


def test_sharded_index_and_config_only_modelopt(tiny, tmp_path):
    path = tiny("qwen3_moe", "modelopt")
    assert len(list(path.glob("model-*-of-*.safetensors"))) > 1
    assert json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    # ModelOpt's config.json form (quantization_config, quant_method "modelopt") without hf_quant_config.json
    alt = tmp_path / "alt"
    shutil.copytree(path, alt)
    (alt / "hf_quant_config.json").unlink()
    assert read_scheme(alt).format == "modelopt"
    model = from_pretrained(alt, device="cpu", activations="bf16")
    assert model.nvfp4_load_report["expert_layers"] == 2


def _expect(src, tmp_path, match, edit=lambda t: None, config_edit=None):
    bad = _rewrite(src, tmp_path / "bad", edit, config_edit)
    with pytest.raises(CheckpointError, match=match):
        from_pretrained(bad, device="cpu")


E0 = "model.layers.0.mlp.experts.3.up_proj"


def test_error_missing_tensor(tiny, tmp_path):
    _expect(tiny(), tmp_path, rf"missing tensor '{E0}.weight_scale_2'", lambda t: t.pop(f"{E0}.weight_scale_2"))


def test_error_missing_plain_tensor(tiny, tmp_path):
    _expect(tiny("mixtral", "modelopt"), tmp_path, r"missing tensor 'model.layers.1.block_sparse_moe.gate.weight'",
            lambda t: t.pop("model.layers.1.block_sparse_moe.gate.weight"))


def test_error_missing_expert(tiny, tmp_path):
    def edit(t):
        for k in [k for k in t if k.startswith(E0 + ".")]:
            t.pop(k)
    _expect(tiny(), tmp_path, rf"missing tensor {E0}\.weight", edit)


def test_error_wrong_dtype(tiny, tmp_path):
    def edit(t):
        t[f"{E0}.weight_scale"] = t[f"{E0}.weight_scale"].to(torch.bfloat16)
    _expect(tiny(), tmp_path, rf"model.safetensors: tensor '{E0}.weight_scale'.*float8_e4m3fn", edit)


def test_error_wrong_shape(tiny, tmp_path):
    def edit(t):
        t["model.layers.1.self_attn.o_proj.weight"] = t["model.layers.1.self_attn.o_proj.weight"][:48].clone()
        t["model.layers.1.self_attn.o_proj.weight_scale"] = t["model.layers.1.self_attn.o_proj.weight_scale"][:48]
    _expect(tiny(), tmp_path, r"o_proj.weight'.*\[48, 64\] weight but the model's layer is \[64, 64\]", edit)


def test_error_k_not_a_multiple_of_16(tiny, tmp_path):
    def edit(t):
        t[f"{E0}.weight"] = t[f"{E0}.weight"][:, :28].contiguous()
    _expect(tiny(), tmp_path, r"K = 56 .* not a positive multiple of 16", edit)


def test_error_unknown_algo_and_format(tiny, tmp_path):
    def algo(d):
        d["quantization"]["quant_algo"] = "FP8"
    _expect(tiny(), tmp_path, r"hf_quant_config.json: quant_algo is 'FP8'", config_edit={"hf_quant_config.json": algo})

    def fmt(d):
        d["quantization_config"]["format"] = "float-quantized"
        d["quantization_config"]["config_groups"]["group_0"]["format"] = "float-quantized"
    src = tiny("qwen3_moe", "compressed-tensors")
    bad = _rewrite(src, tmp_path / "bad2", lambda t: None, {"config.json": fmt})
    with pytest.raises(CheckpointError, match=r"config.json.*'float-quantized'"):
        from_pretrained(bad, device="cpu")


def test_error_quantized_module_not_supported(tiny, tmp_path):
    def edit(t):
        t["model.norm.weight_scale"] = torch.zeros(1, 4).to(torch.float8_e4m3fn)
    _expect(tiny(), tmp_path, r"'model.norm'.*is a Qwen3MoeRMSNorm.*not supported", edit)


def test_error_excluded_but_quantized(tiny, tmp_path):
    def cfg(d):
        d["quantization"]["exclude_modules"] = ["lm_head", "*.self_attn.o_proj"]
    _expect(tiny(), tmp_path, r"'model.layers.0.self_attn.o_proj' is stored quantized .* excludes it",
            config_edit={"hf_quant_config.json": cfg})


def test_error_unexpected_tensor_and_unquantized_experts(tiny, tmp_path):
    def edit(t):
        t["model.layers.0.mlp.extra.weight"] = torch.zeros(2, 2, dtype=torch.bfloat16)
    _expect(tiny(), tmp_path, r"'model.layers.0.mlp.extra.weight' has no place", edit)

    def bf16_experts(t):
        for k in [k for k in t if ".experts." in k and k.startswith("model.layers.1.")]:
            t.pop(k)
        for e in range(8):
            for p, shape in (("gate_proj", (32, 64)), ("up_proj", (32, 64)), ("down_proj", (64, 32))):
                t[f"model.layers.1.mlp.experts.{e}.{p}.weight"] = torch.zeros(shape, dtype=torch.bfloat16)
    bad = _rewrite(tiny(), tmp_path / "bad3", bf16_experts)
    with pytest.raises(CheckpointError, match=r"experts under 'model.layers.1.mlp.experts' are stored unquantized"):
        from_pretrained(bad, device="cpu")


def test_not_a_quantized_checkpoint_and_not_read_tensors(tiny, tmp_path):
    def cfg(d):
        d.pop("quantization_config")
    bad = _rewrite(tiny("qwen3_moe", "compressed-tensors"), tmp_path / "plain", lambda t: None,
                   {"config.json": cfg})
    with pytest.raises(CheckpointError, match="not a quantized checkpoint"):
        from_pretrained(bad, device="cpu")

    def extra(t):  # a layer past num_hidden_layers (DeepSeek-V3's MTP layer) and FP8 KV-cache scales: reported
        t["model.layers.2.mlp.gate.weight"] = torch.zeros(8, 64, dtype=torch.bfloat16)
        t["model.layers.0.self_attn.k_proj.k_scale"] = torch.tensor(1.0)
    ok = _rewrite(tiny(), tmp_path / "extra", extra)
    model = from_pretrained(ok, device="cpu", activations="bf16")
    assert len(model.nvfp4_load_report["not_read"]) == 2
    with pytest.raises(ValueError, match="ep_group needs ep_capacity"):  # expert parallelism needs its buffer size
        from_pretrained(ok, device="cpu", ep_group=object())
