"""NVFP4MoE with cute-hopper on a Hopper GPU (skipped without one), in both activation modes (W4A4 "nvfp4", W4A16
"bf16"): exact against the reference layer, and one CUDA graph replayed with new routing."""
import pytest
import torch

from nvfp4lib.bench.moe_bench import _graph_of
from nvfp4lib.nn import NVFP4MoE, reference_moe

pytestmark = pytest.mark.gpu


def _layer(e=8, h=256, i=128, seed=0, activations="nvfp4"):
    g = torch.Generator().manual_seed(seed)
    wg = (torch.randn(e, i, h, generator=g) * 0.05).to(torch.bfloat16)
    wu = (torch.randn(e, i, h, generator=g) * 0.05).to(torch.bfloat16)
    wd = (torch.randn(e, h, i, generator=g) * 0.05).to(torch.bfloat16)
    return NVFP4MoE.from_float(wg.cuda(), wu.cuda(), wd.cuda(), activations=activations, backend="cute-hopper")


def _routing(t, e, k, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).cuda()
    w = torch.softmax(torch.randn(t, k, generator=g), -1).cuda()
    return ids, w


@pytest.mark.parametrize("activations", ["nvfp4", "bf16"])
@pytest.mark.parametrize("t", [1, 16, 300])
def test_layer_matches_reference(t, activations):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs sm_90")
    layer = _layer(activations=activations)
    x = torch.randn(t, 256, device="cuda").to(torch.bfloat16)
    ids, w = _routing(t, 8, 2, t)
    got = layer(x, ids, w).float()
    ref = reference_moe(x, ids, w, layer.w_gate, layer.w_up, layer.w_down, activations=activations).float()
    err = ((got - ref).norm() / ref.norm()).item()
    assert err < 1e-2, err


@pytest.mark.parametrize("activations", ["nvfp4", "bf16"])
def test_graph_replay_with_new_routing(activations):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs sm_90")
    layer = _layer(activations=activations)
    t = 64
    x = torch.randn(t, 256, device="cuda").to(torch.bfloat16)
    ids, w = _routing(t, 8, 2, 1)
    graph, out = _graph_of(layer, x, ids, w)  # an eager call, then the capture
    for seed in range(2, 6):
        new_ids, new_w = _routing(t, 8, 2, seed)
        ids.copy_(new_ids)
        w.copy_(new_w)
        graph.replay()
        ref = reference_moe(x, ids, w, layer.w_gate, layer.w_up, layer.w_down, activations=activations).float()
        err = ((out.float() - ref).norm() / ref.norm()).item()
        assert err < 1e-2, (seed, err)


def test_triton_quantizer_gives_the_torch_bits_on_the_gpu():
    """nn.quant_triton compiled for the GPU (its interpreter check is tests/test_quant_triton.py): the same codes,
    scales and global scale as the torch form, and the same layer output."""
    pytest.importorskip("triton")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs sm_90")
    from nvfp4lib.nn.quant import quantize_rows
    from nvfp4lib.nn.quant_triton import quantize_rows_triton

    g = torch.Generator().manual_seed(5)
    x = (torch.randn(300, 2048, generator=g) * torch.pow(10.0, torch.empty(300, 2048).uniform_(-4, 4, generator=g)))
    # amax 4.53125: torch's CUDA division by a Python number (a reciprocal multiply) put amax / 2688 1 ulp high, so
    # the layer's quantization differed from the Triton form (and from the CPU) in a few codes, 4-8% of the output
    odd = torch.randn(8, 2048, generator=g).clamp(-4, 4)
    odd[3, 5] = 4.53125
    # the same shapes again from a misaligned address and with 1 row: launches after the first go through the
    # compiled launcher (kernels/common/triton_launch), whose key must tell these specialisations apart
    shifted = torch.empty(8 * 2048 + 1, device="cuda")[1:].view(8, 2048).copy_(odd)
    cases = (x.to(torch.bfloat16).cuda(), x.cuda(), torch.zeros(3, 64, device="cuda"), odd.cuda(), shifted,
             odd[:1].cuda(), odd.cuda(), shifted[:1])
    for t in cases:
        for gs in (None, torch.tensor([0.01], device="cuda")):
            want, got = quantize_rows(t, gs), quantize_rows_triton(t, gs)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1].view(torch.uint8), want[1].view(torch.uint8))
            assert torch.equal(got[2], want[2])
            cpu = quantize_rows(t.cpu(), None if gs is None else gs.cpu())  # the same bits on either device
            assert torch.equal(cpu[0], want[0].cpu()) and torch.equal(cpu[2], want[2].cpu())
            assert torch.equal(cpu[1].view(torch.uint8), want[1].view(torch.uint8).cpu())
    layer = _layer()
    fast = NVFP4MoE(layer.w_gate, layer.w_up, layer.w_down, backend="cute-hopper", quantizer="triton")
    xb = torch.randn(16, 256, device="cuda").to(torch.bfloat16)
    ids, w = _routing(16, 8, 2, 3)
    assert torch.equal(fast(xb, ids, w), layer(xb, ids, w))


def test_triton_routing_gives_the_torch_routing_on_the_gpu():
    """route() on a CUDA tensor takes the one-launch Triton form up to ROUTE_MAX_COPIES copies (the torch form past
    it): the CPU torch form's outputs element for element; unpermute's Triton form within fp32 rounding of the CPU's."""
    pytest.importorskip("triton")
    from nvfp4lib.nn.routing import route, unpermute
    from nvfp4lib.nn.routing_triton import ROUTE_MAX_COPIES

    g = torch.Generator().manual_seed(11)
    for t, k, e in ((1, 8, 256), (8, 8, 256), (64, 8, 128), (128, 8, 256), (3, 2, 8), (200, 8, 256)):
        ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
        want, got = route(ids, e), route(ids.cuda(), e)
        assert all(torch.equal(a.cpu(), b) for a, b in zip(got, want)), (t, k, e, t * k <= ROUTE_MAX_COPIES)
        y = torch.randn(t * k, 520, generator=g).to(torch.bfloat16)
        w = torch.rand(t, k, generator=g)
        for dtype in (torch.bfloat16, torch.float32):
            a, b = unpermute(y.cuda(), got, w.cuda(), dtype).cpu(), unpermute(y, want, w, dtype)
            assert a.dtype == b.dtype == dtype
            assert torch.allclose(a.double(), b.double(), rtol=1e-2 if dtype == torch.bfloat16 else 1e-6, atol=1e-6)


@pytest.mark.parametrize("activations", ["nvfp4", "bf16"])
@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe"])
def test_swapped_model_generates_greedily_under_a_cuda_graph(arch, activations):
    """A tiny random Mixtral / Qwen3-MoE model (bf16, on the GPU) with its MoE blocks swapped for NVFP4MoE: one CUDA
    graph of the forward over a fixed window of prompt + new tokens, replayed once per new token (the greedy token
    written into the captured input, so every replay routes differently), gives the eager loop's tokens."""
    pytest.importorskip("transformers")
    from nvfp4lib.nn.hf import NVFP4SparseMoeBlock, swap_moe_blocks, tiny_model

    torch.manual_seed(0)
    model = tiny_model(arch).to("cuda", torch.bfloat16).eval()
    assert swap_moe_blocks(model, activations=activations, backend="cute-hopper") == 2
    assert all(isinstance(layer.mlp, NVFP4SparseMoeBlock) for layer in model.model.layers)
    prompt, new = 5, 8
    start = torch.zeros(1, prompt + new, dtype=torch.long, device="cuda")
    start[0, :prompt] = torch.randint(0, 128, (prompt,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        eager = start.clone()
        for p in range(prompt, prompt + new):  # causal: the logits at p - 1 see only tokens < p
            eager[0, p] = model(eager).logits[0, p - 1].argmax()
        buf = start.clone()
        model(buf)  # warm-up (compiles)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = model(buf).logits
        for p in range(prompt, prompt + new):
            graph.replay()
            buf[0, p] = logits[0, p - 1].argmax()
    torch.cuda.synchronize()
    assert torch.equal(buf, eager), (buf.tolist(), eager.tolist())


@pytest.mark.parametrize("activations", ["nvfp4", "bf16"])
def test_decode_gemv_path_agrees_with_the_gemm_path_and_replays(activations):
    """Steps of at most gemv_max_tokens tokens take the GEMV path: against the reference and the grouped-GEMM path
    (the same layer, gemv_max_tokens=0), for T = 1..8 including every copy on one expert's block of experts, then in
    a CUDA graph replayed with new routings."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs sm_90")
    layer = _layer(e=16, activations=activations)
    layer.gemv_max_tokens = 8  # (the path is off by default: GEMV_MAX_TOKENS = 0)
    for t in (1, 3, 8):
        x = torch.randn(t, 256, device="cuda").to(torch.bfloat16)
        for ids, w in (_routing(t, 16, 4, t), (torch.arange(4, device="cuda").repeat(t, 1), torch.full(
                (t, 4), 0.25, device="cuda"))):
            assert layer._gemv_step(x)
            got = layer(x, ids, w).float()
            layer.gemv_max_tokens = 0
            gemm = layer(x, ids, w).float()
            layer.gemv_max_tokens = 8
            ref = reference_moe(x, ids, w, layer.w_gate, layer.w_up, layer.w_down, activations=activations).float()
            assert ((got - ref).norm() / ref.norm()).item() < 1e-2
            assert ((got - gemm).norm() / gemm.norm()).item() < 1e-2
    x = torch.randn(2, 256, device="cuda").to(torch.bfloat16)
    ids, w = _routing(2, 16, 4, 7)
    graph, out = _graph_of(layer, x, ids, w)  # an eager call, then the capture
    for seed in range(8, 12):
        new_ids, new_w = _routing(2, 16, 4, seed)
        ids.copy_(new_ids)
        w.copy_(new_w)
        out.fill_(float("nan"))
        graph.replay()
        ref = reference_moe(x, ids, w, layer.w_gate, layer.w_up, layer.w_down, activations=activations).float()
        assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2, seed


def _same_bits(monkeypatch, activations: str, want_knobs: dict, got_knobs: dict):
    """A layer run with ``got_knobs`` ({(module, name): value}, set around each of its calls) gives the bits of the same
    layer run with ``want_knobs``: eagerly for T = 1, 8, 64, 300 and 600 (past the one-launch routing) with random
    routings and every copy on one expert, and in a CUDA graph captured with ``got_knobs`` and replayed with new
    activations and routings. ``activations``: "nvfp4", "nvfp4-static" (static activation scales) or "bf16"."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs sm_90")

    def use(knobs):
        for (module, name), value in knobs.items():
            monkeypatch.setattr(module, name, value)

    mode = activations.split("-")[0]
    scales = dict(input_scales=(0.004, 0.0005)) if activations.endswith("static") else {}
    g = torch.Generator().manual_seed(5)
    w3 = [(torch.randn(16, *s, generator=g) * 0.05).to(torch.bfloat16).cuda() for s in ((128, 256), (128, 256),
                                                                                          (256, 128))]
    use(want_knobs)
    plain = NVFP4MoE.from_float(*w3, activations=mode, **scales)
    use(got_knobs)
    tried = NVFP4MoE.from_float(*w3, activations=mode, **scales)
    cases = []
    for t in (1, 8, 64, 300, 600):
        x = torch.randn(t, 256, device="cuda").to(torch.bfloat16)
        cases.append((x, *_routing(t, 16, 2, t)))
        cases.append((x, torch.full((t, 2), 3, device="cuda"), torch.full((t, 2), 0.5, device="cuda")))
    for x, ids, w in cases:
        use(got_knobs)
        got = tried(x, ids, w)
        use(want_knobs)
        want = plain(x, ids, w)
        assert torch.equal(got, want), (x.shape[0], ids[0].tolist())
    ref_of = [plain(*c) for c in cases[:4]]
    use(got_knobs)  # (read per call by the Triton launches and the layer)
    x, ids, w = (c.clone() for c in cases[2])
    graph, out = _graph_of(tried, x, ids, w)  # an eager call, then the capture
    for (nx, nids, nw), ref in zip(cases[:4], ref_of):
        if nx.shape[0] != x.shape[0]:
            continue
        x.copy_(nx)
        ids.copy_(nids)
        w.copy_(nw)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, ref)


@pytest.mark.parametrize("activations,gemm", [("nvfp4", False), ("bf16", False), ("nvfp4-static", False),
                                              ("nvfp4", True), ("bf16", True)])
def test_chained_launches_give_the_same_bits(activations, gemm, monkeypatch):
    """kernels.common.pdl.CHAIN: the layer's kernels launched chained (each waits for the one before, then lets the
    next launch; the amax words cleared by the routing launch) give the unchained layer's bits (:func:`_same_bits`);
    W4A4 with per-call and static activation scales, and W4A16; with CHAIN_GEMM (the GEMMs letting the next kernel
    launch) too."""
    from nvfp4lib.kernels.common import pdl

    _same_bits(monkeypatch, activations, {(pdl, "CHAIN_GEMM"): gemm, (pdl, "CHAIN"): False},
               {(pdl, "CHAIN_GEMM"): gemm, (pdl, "CHAIN"): True})


@pytest.mark.parametrize("activations,chain", [("nvfp4", True), ("nvfp4-static", True), ("nvfp4", False)])
def test_quantizing_into_the_operand_gives_the_same_bits(activations, chain, monkeypatch):
    """nn.moe.QUANT_TO_OPERAND: W4A4 quantizations writing the GEMMs' fp16 operands (the GEMMs run without their
    prologues) give the bits of codes, scales and the prologue (:func:`_same_bits`), with per-call and static
    activation scales, chained and not."""
    from nvfp4lib.kernels.common import pdl
    from nvfp4lib.nn import moe

    _same_bits(monkeypatch, activations, {(pdl, "CHAIN"): chain, (moe, "QUANT_TO_OPERAND"): False},
               {(pdl, "CHAIN"): chain, (moe, "QUANT_TO_OPERAND"): True})


def test_w4a16_gemms_letting_the_next_kernel_launch_give_the_same_bits(monkeypatch):
    """kernels.common.pdl.CHAIN_GEMM_A16: W4A16's GEMMs letting the next kernel launch at their mainloop's end (the down
    GEMM's set-up under the gate/up GEMM's epilogue) give the bits of GEMMs that do not (:func:`_same_bits`)."""
    from nvfp4lib.kernels.common import pdl

    _same_bits(monkeypatch, "bf16", {(pdl, "CHAIN_GEMM_A16"): False}, {(pdl, "CHAIN_GEMM_A16"): True})


@pytest.mark.parametrize("activations", ["bf16", "nvfp4", "nvfp4-static"])
def test_the_down_gemm_and_the_unpermute_in_one_launch_give_the_same_bits(activations, monkeypatch):
    """nn.moe.COMBINE_IN_GEMM: the down GEMM's column blocks summing the copies themselves (PreparedWeights.combine)
    give the bits of the down GEMM then the un-permute launch (:func:`_same_bits`: T = 1 and 8 take it, every copy on
    one expert among the routings, graph replays with new routings; larger steps the two launches)."""
    from nvfp4lib.nn import moe

    _same_bits(monkeypatch, activations, {(moe, "COMBINE_IN_GEMM"): False}, {(moe, "COMBINE_IN_GEMM"): True})


def test_combine_on_the_gpu_is_the_call_then_the_sum():
    """PreparedWeights.combine on cute-hopper (W4A16, one call per case): the same bits as the call then
    routing.weighted_rows (the Triton un-permute), with copies lost (row -1), empty groups, every copy in one group,
    a split-K call, and the counters left at zero for the next call (the same result twice)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs sm_90")
    from nvfp4lib.formats import quantize
    from nvfp4lib.nn.routing import weighted_rows
    from nvfp4lib.serving import prepare_weights

    g = torch.Generator().manual_seed(3)
    b = [quantize((torch.randn(512, 2048, generator=g) * 0.05).cuda()) for _ in range(8)]  # (16 K tiles)
    w = prepare_weights(b, activations="bf16", out_dtype=torch.bfloat16)
    for t, k, counts in ((1, 2, [0, 1, 0, 0, 0, 0, 1, 0]), (8, 4, [0] * 7 + [32]), (16, 4, [8] * 8),
                         (3, 8, [3, 0, 6, 0, 3, 6, 0, 6])):
        rows = t * k
        offsets = torch.tensor([0] + list(torch.tensor(counts).cumsum(0)), dtype=torch.int32, device="cuda")
        a = (torch.randn(rows, 2048, generator=g) * 0.5).to(torch.bfloat16).cuda()
        row = torch.randperm(rows, generator=g).cuda()
        row[1::3] = -1
        weights = torch.rand(t, k, generator=g).cuda()
        want = weighted_rows(w(a, offsets), row, weights, torch.bfloat16)
        for _ in range(2):
            got = w.combine(a, offsets, row, weights, out_dtype=torch.bfloat16)
            torch.cuda.synchronize()
            assert torch.equal(got, want), (t, k)


@pytest.mark.parametrize("activations", ["bf16", "nvfp4"])
def test_descriptors_asked_for_before_the_tile_search_give_the_same_bits(activations, monkeypatch):
    """hopper_varlen.kernel.EARLY_DESCRIPTORS: the GEMMs asking for their TMA descriptors at entry give the bits of
    GEMMs that ask after the tile search (:func:`_same_bits`), in both modes."""
    from nvfp4lib.kernels.hopper_varlen import kernel

    _same_bits(monkeypatch, activations, {(kernel, "EARLY_DESCRIPTORS"): False}, {(kernel, "EARLY_DESCRIPTORS"): True})


@pytest.mark.parametrize("activations", ["nvfp4", "nvfp4-static"])
def test_the_amax_found_by_the_routing_launch_gives_the_same_bits(activations, monkeypatch):
    """nn.routing.AMAX_IN_ROUTE: W4A4's routing launch finding x's amax (no amax launch before the first quantization)
    gives the bits of the amax launch (:func:`_same_bits`: T up to 600, past the routing program's tile; static scales
    unaffected)."""
    from nvfp4lib.nn import routing

    _same_bits(monkeypatch, activations, {(routing, "AMAX_IN_ROUTE"): False}, {(routing, "AMAX_IN_ROUTE"): True})


def test_routing_and_gathering_in_one_launch_give_the_same_bits(monkeypatch):
    """nn.routing.ROUTE_GATHER: W4A16's routing and gather in one launch give the bits of the two launches
    (:func:`_same_bits`: every copy on one expert among the routings, graph replays with new routings)."""
    from nvfp4lib.nn import routing

    _same_bits(monkeypatch, "bf16", {(routing, "ROUTE_GATHER"): False}, {(routing, "ROUTE_GATHER"): True})


def test_prewait_stages_give_the_same_bits(monkeypatch):
    """hopper_varlen.kernel.PREWAIT_STAGES (W4A16 decode tilings): GEMMs asking for only 2 stages' weights before
    their wait (the rest with their activations after it) give the bits of GEMMs asking for all their first stages
    (:func:`_same_bits`, split-K decode calls among them)."""
    from nvfp4lib.kernels.hopper_varlen import kernel

    _same_bits(monkeypatch, "bf16", {(kernel, "PREWAIT_STAGES"): 0}, {(kernel, "PREWAIT_STAGES"): 2})


@pytest.mark.parametrize("activations", ["nvfp4", "bf16"])
def test_timeline_stamps_every_tile_in_order(activations):
    """moe-bench --timeline (bench.timeline, kernel.TIMELINE): GEMMs built with the stamps still give the reference
    layer's result; in a graph replay every CTA with a tile stamps its six clock64 stamps in order and its global
    start before its end, in both GEMMs, and the summary's phases are not negative."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs sm_90")
    from nvfp4lib.bench.timeline import Timeline

    tl = Timeline("cuda")
    t = 8
    x = torch.randn(t, 256, device="cuda").to(torch.bfloat16)
    ids, w = _routing(t, 8, 2, 3)
    with tl.building():
        layer = _layer(activations=activations)
        graph, out = _graph_of(layer, x, ids, w)
    tl.clear()
    graph.replay()
    torch.cuda.synchronize()
    ref = reference_moe(x, ids, w, layer.w_gate, layer.w_up, layer.w_down, activations=activations).float()
    assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2
    b = tl.buf.cpu()
    for r in range(2):
        done = b[r][(b[r, :, 0] != 0) & (b[r, :, 5] != 0)]
        assert len(done), f"GEMM {r} stamped no tile"
        assert bool((done[:, 1:6] >= done[:, 0:5]).all()) and bool((done[:, 7] >= done[:, 6]).all())
    s = tl.summary()
    assert set(s) == {"gate_up", "down"}
    assert all(v[1] >= 0 for g in s.values() for v in g["phases"].values())
