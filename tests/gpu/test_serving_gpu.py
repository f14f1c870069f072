"""The serving path on a Hopper GPU (skipped without one): prepared weights, both call forms exact against the
reference, any split of the rows replayed from one CUDA graph, torch.compile and opcheck."""
import os

import pytest
import torch

from nvfp4lib.bench.calls import pack_rows as packed
from nvfp4lib.formats import NVFP4Tensor
from nvfp4lib.kernels.hopper_varlen.config import CONFIGS
from nvfp4lib.problems import BENCHMARK, DUAL, GroupedProblem, make_inputs
from nvfp4lib.reference import reference_grouped_gemm, relative_error
from nvfp4lib.serving import prepare_weights

pytestmark = pytest.mark.gpu
TOL = 1e-3
FULL = os.environ.get("NVFP4LIB_GPU_FULL") == "1"  # every config on every benchmark shape, both input modes


@pytest.fixture(autouse=True)
def _sm90():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs sm_90")


def poison_allocator(nbytes: int) -> None:
    """Leave NaN in the caching allocator's next block of this size: an output element the kernel does not write
    then reads NaN (the output is allocated inside the call)."""
    junk = torch.full((nbytes // 2 + 1024,), float("nan"), dtype=torch.float16, device="cuda")
    del junk


def _problem_configs():
    out = []
    for name, cfg in CONFIGS.items():
        if cfg.act != "nvfp4":  # the bf16-activation configs: tests/gpu/test_a16_gpu.py
            continue
        for p in (DUAL if cfg.dual else BENCHMARK):
            if FULL or p.name.split("-")[0] in ("S2", "S4"):  # eight uneven groups; two groups, short K
                out.append((name, p))
    return out


@pytest.mark.parametrize("mode", ["uniform", "gaussian"] if FULL else ["gaussian"])
@pytest.mark.parametrize("config,prob", [pytest.param(c, p, id=f"{c}-{p.name}",
                                                      marks=pytest.mark.xdist_group(f"{c}-{p.name}"))
                                         for c, p in _problem_configs()])
def test_packed_form_is_exact(config, prob, mode):
    inp = make_inputs(prob, seed=1111, mode=mode, device="cuda")
    w = prepare_weights(inp.b, inp.b2, config=config)
    ap, offsets, gs = packed(inp.a)
    ref = reference_grouped_gemm(inp.a, inp.b, inp.b2)
    poison_allocator(ap.shape[0] * prob.n[0] * 2)
    c = w(ap, offsets, global_scale=gs)
    outs = [c[int(o): int(o) + t.shape[0]] for o, t in zip(offsets[:-1].tolist(), inp.a)]
    err = relative_error(outs, ref)
    assert err <= TOL, f"{config} {prob.name} {mode}: {err}"


@pytest.mark.parametrize("raw", [False, True])
@pytest.mark.parametrize("config", ["vl_m128_t16_k128_s5_e_x", "vl_m128_t32_k128_s4_e", "vl_m128_t128_k128_s3_e",
                                    "vl_m256_t32_k128_s4_e_b2"])
def test_decode_is_exact_for_every_code_and_finite_scale(config, raw):
    """The hardware's view of the fp16 weight decode, with and without the scale's 2^7 (hopper_varlen.kernel.RAW_SCALE:
    then products below 2^-14 reach wgmma as fp16 subnormals): weights holding all 16 codes in every block and all 254
    finite E4M3 scales (signed, subnormal, zero) in turn, times one-hot NVFP4 rows (1.0, scale 1, global scale 1):
    C = Wᵀ, each element one product, exact in fp16 (2^-10 .. 2688, at most 6 significant bits)."""
    from nvfp4lib.formats import dequantize, pack_e2m1
    from nvfp4lib.kernels.hopper_varlen.runner import build_setting
    from tests.exact_weights import every_code_weights

    k = 256
    w = every_code_weights(256, k)
    one_hot = pack_e2m1((torch.eye(k) * 2).to(torch.uint8))  # code 2: 1.0
    x = NVFP4Tensor(one_hot, torch.full((k, k // 16), 0x38, dtype=torch.uint8).view(torch.float8_e4m3fn),
                    1.0).to("cuda")
    with build_setting(raw_scale=raw):
        c = prepare_weights([w], config=config)([x])[0]
    assert torch.equal(c.float(), dequantize(w).T.contiguous())


@pytest.mark.parametrize("dual", [False, True])
@pytest.mark.parametrize("m", [(0, 5, 0, 130), (1,), (0, 0), (7, 0, 300, 1, 64)])
def test_list_form_is_exact_with_empty_groups(m, dual):
    prob = GroupedProblem.uniform_nk("edge", m, 256, 2880)
    if dual:
        prob = prob.with_dual()
    inp = make_inputs(prob, seed=3, mode="gaussian", device="cuda")
    w = prepare_weights(inp.b, inp.b2)
    outs = w(inp.a)
    ref = reference_grouped_gemm(inp.a, inp.b, inp.b2)
    assert [tuple(o.shape) for o in outs] == [tuple(r.shape) for r in ref]
    assert relative_error(outs, ref) <= TOL


def test_prepared_weights_on_two_streams_at_once():
    """One set of prepared weights serving two streams at once, each with its own activations: both exact. The
    prologue's fp16 rows are per stream; one buffer shared by both would let one call's prologue overwrite the other's
    rows while its GEMM reads them."""
    prob = BENCHMARK[2]
    sets = [make_inputs(prob, seed=40 + s, mode="gaussian", device="cuda") for s in range(2)]
    w = prepare_weights(sets[0].b)
    refs = [reference_grouped_gemm(x.a, sets[0].b) for x in sets]
    forms = [packed(x.a) for x in sets]
    w(forms[0][0], forms[0][1], global_scale=forms[0][2])  # compiled before the race
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream() for _ in sets]
    outs = [[], []]
    for _ in range(6):
        for i, s in enumerate(streams):
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                ap, offsets, gs = forms[i]
                outs[i].append(w(ap, offsets, global_scale=gs))
    torch.cuda.synchronize()
    for i, x in enumerate(sets):
        bounds = forms[i][1].tolist()
        for c in outs[i]:
            assert relative_error([c[o: o + t.shape[0]] for o, t in zip(bounds[:-1], x.a)], refs[i]) <= TOL


@pytest.mark.long_gpu
@pytest.mark.parametrize("groups", [8, 64, 256])
def test_graph_replays_any_split(groups):
    """One capture at T = 512 rows; 100 replays with random splits (empty groups included), each exact."""
    gen = torch.Generator().manual_seed(groups)
    rows, n, k = 512, 256, 512
    prob = GroupedProblem.uniform_nk("g", (rows,) + (0,) * (groups - 1), n, k)
    inp = make_inputs(prob, seed=groups, mode="gaussian", device="cuda")
    w = prepare_weights(inp.b, None)
    ap = inp.a[0]
    offsets = torch.zeros(groups + 1, dtype=torch.int32, device="cuda")
    offsets[1:] = rows
    w(ap, offsets)  # compile, warm up
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        c = w(ap, offsets)
    for it in range(100):
        cuts = torch.sort(torch.randint(0, rows + 1, (groups - 1,), generator=gen)).values
        if it % 3 == 0:  # some all-in-one-group splits
            cuts = torch.full((groups - 1,), int(torch.randint(0, rows + 1, (1,), generator=gen)))
        offs = torch.cat([torch.tensor([0]), cuts, torch.tensor([rows])]).to(torch.int32)
        offsets.copy_(offs)
        c.fill_(float("nan"))
        g.replay()
        a_parts = [NVFP4Tensor(ap.data[lo:hi], ap.scales[lo:hi], ap.global_scale)
                   for lo, hi in zip(offs[:-1].tolist(), offs[1:].tolist())]
        ref = reference_grouped_gemm(a_parts, inp.b, None)
        outs = [c[lo:hi] for lo, hi in zip(offs[:-1].tolist(), offs[1:].tolist())]
        err = relative_error(outs, ref)
        assert err <= TOL, f"replay {it}: split {offs.tolist()}: {err}"


@pytest.mark.parametrize("dual", [False, True])
def test_fused_call_is_exact_call_after_call(monkeypatch, dual):
    """The call as one kernel (FUSED_PROLOGUE, off by default): its counters carry over from call to call on a stream
    (an epoch per call, no reset), so many calls in a row with a new row count each (the list form, empty groups
    included), two streams at once, and graph replays of random splits must all be exact."""
    from nvfp4lib.kernels.hopper_varlen import kernel

    monkeypatch.setattr(kernel, "FUSED_PROLOGUE", True)
    gen = torch.Generator().manual_seed(11)
    base = GroupedProblem.uniform_nk("f", (64, 0, 200, 37), 512, 1024)
    base = base.with_dual() if dual else base
    inp = make_inputs(base, seed=11, mode="gaussian", device="cuda")
    w = prepare_weights(inp.b, inp.b2)
    for it in range(8):
        m = [int(v) * int(torch.rand(1, generator=gen) > 0.25) for v in torch.randint(0, 300, (4,), generator=gen)]
        prob = GroupedProblem.uniform_nk("f", tuple(m), 512, 1024)
        a = make_inputs(prob.with_dual() if dual else prob, seed=100 + it, mode="gaussian", device="cuda").a
        err = relative_error(w(a), reference_grouped_gemm(a, inp.b, inp.b2))
        assert err <= TOL, f"call {it}, rows {m}: {err}"
    streams = [torch.cuda.Stream() for _ in range(2)]
    ap, offsets, gs = packed(inp.a)
    outs = []
    for _ in range(4):
        for s in streams:
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                outs.append(w(ap, offsets, global_scale=gs))
    torch.cuda.synchronize()
    ref = reference_grouped_gemm(inp.a, inp.b, inp.b2)
    bounds = offsets.tolist()
    for c in outs:
        assert relative_error([c[o: o + t.shape[0]] for o, t in zip(bounds[:-1], inp.a)], ref) <= TOL
    rows = ap.shape[0]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        c = w(ap, offsets, global_scale=gs[:1].clone())
    for it in range(10):
        cuts = torch.sort(torch.randint(0, rows + 1, (3,), generator=gen)).values
        offs = torch.cat([torch.tensor([0]), cuts, torch.tensor([rows])]).to(torch.int32)
        offsets.copy_(offs)
        c.fill_(float("nan"))
        g.replay()
        parts = [NVFP4Tensor(ap.data[lo:hi], ap.scales[lo:hi], inp.a[0].global_scale)
                 for lo, hi in zip(offs[:-1].tolist(), offs[1:].tolist())]
        err = relative_error([c[lo:hi] for lo, hi in zip(offs[:-1].tolist(), offs[1:].tolist())],
                             reference_grouped_gemm(parts, inp.b, inp.b2))
        assert err <= TOL, f"replay {it}: split {offs.tolist()}: {err}"


@pytest.mark.parametrize("dual", [False, True])
def test_eager_calls_run_fused_captured_calls_two_kernels(monkeypatch, dual):
    """EAGER_FUSED (on by default): calls not under capture run the fused kernel (compiled on the first), a CUDA-graph
    capture the two kernels; eager calls before and after a capture and replays of new splits are all exact."""
    from nvfp4lib.kernels.hopper_varlen import kernel

    monkeypatch.setattr(kernel, "EAGER_FUSED", True)
    monkeypatch.setattr(kernel, "FUSED_PROLOGUE", False)
    base = GroupedProblem.uniform_nk("e", (64, 0, 200, 37), 512, 1024)
    base = base.with_dual() if dual else base
    inp = make_inputs(base, seed=12, mode="gaussian", device="cuda")
    w = prepare_weights(inp.b, inp.b2)
    ap, offsets, gs = packed(inp.a)
    ref = reference_grouped_gemm(inp.a, inp.b, inp.b2)
    bounds = offsets.tolist()

    def check(c, what):
        assert relative_error([c[o: o + t.shape[0]] for o, t in zip(bounds[:-1], inp.a)], ref) <= TOL, what

    check(w(ap, offsets, global_scale=gs), "first eager call")
    (runner,) = w.impl._runners.values()
    assert runner._eager is not None and runner._eager is not runner._call
    fused_calls = []
    fused = runner._eager
    runner._eager = lambda *args: (fused_calls.append(1), fused(*args))[1]
    check(w(ap, offsets, global_scale=gs), "second eager call")
    assert len(fused_calls) == 1
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        c = w(ap, offsets, global_scale=gs)
    assert len(fused_calls) == 1, "the capture ran the fused kernel"
    c.fill_(float("nan"))
    g.replay()
    check(c, "replay")
    check(w(ap, offsets, global_scale=gs), "eager call after the capture")
    assert len(fused_calls) == 2


@pytest.mark.parametrize("dual", [False, True])
def test_small_captured_calls_run_the_fused_kernel_with_fuse_max_rows(monkeypatch, dual):
    """FUSE_MAX_ROWS (off as shipped): a captured call of at most that many rows runs the fused kernel, compiled when
    the runner is made (not in the capture); its replays with new splits of the rows (an empty group, all rows in one)
    exact; a call past the limit keeps the two kernels under capture."""
    from nvfp4lib.kernels.hopper_varlen import kernel

    monkeypatch.setattr(kernel, "FUSE_MAX_ROWS", 64)
    monkeypatch.setattr(kernel, "FUSED_PROLOGUE", False)
    base = GroupedProblem.uniform_nk("e", (5, 0, 30, 1), 512, 1024)
    base = base.with_dual() if dual else base
    inp = make_inputs(base, seed=21, mode="gaussian", device="cuda")
    # bf16 out: the dual products of gaussian inputs pass fp16's range in some splits (inf in both: no check)
    w = prepare_weights(inp.b, inp.b2, out_dtype=torch.bfloat16)
    ref = prepare_weights(inp.b, inp.b2, backend="reference", out_dtype=torch.bfloat16)
    ap, offsets, gs = packed(inp.a)
    rows = ap.data.shape[0]
    first = w(ap, offsets, global_scale=gs)
    (runner,) = w.impl._runners.values()
    assert runner._eager is not None and runner.fused(rows, True) and not runner.fused(65, True)
    assert relative_error([first], [ref(ap, offsets, global_scale=gs)]) <= TOL
    fused_calls = []
    fused = runner._eager
    runner._eager = lambda *args: (fused_calls.append(1), fused(*args))[1]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        c = w(ap, offsets, global_scale=gs)
    assert len(fused_calls) == 1, "the capture did not run the fused kernel"
    for split in ([0, 36, 36, 36, 36], [0, 0, 12, 20, 36], [0, 1, 2, 3, 36]):
        offsets.copy_(torch.tensor(split, dtype=torch.int32))
        c.fill_(float("nan"))
        g.replay()
        assert relative_error([c], [ref(ap, offsets, global_scale=gs)]) <= TOL, split


def test_torch_compile_and_opcheck():
    inp = make_inputs(BENCHMARK[3], seed=5, mode="gaussian", device="cuda")
    w = prepare_weights(inp.b, None)
    ap, offsets, gs = packed(inp.a)
    eager = w(ap, offsets, global_scale=gs)
    f = torch.compile(lambda x, o: w(x, o, global_scale=gs), fullgraph=True)
    assert torch.equal(f(ap, offsets), eager)
    torch.library.opcheck(torch.ops.nvfp4lib.grouped_mm, (ap.data, ap.scales.view(torch.uint8), gs, offsets,
                                                          w.handle), test_utils=("test_schema", "test_faketensor"))


def test_bad_inputs_are_refused():
    inp = make_inputs(BENCHMARK[3], seed=5, mode="gaussian", device="cuda")
    w = prepare_weights(inp.b, None)
    ap, offsets, gs = packed(inp.a)
    with pytest.raises(TypeError, match="int32"):
        w(ap, offsets.long())
    with pytest.raises(ValueError, match="device"):
        w(ap, offsets.cpu())
    with pytest.raises(ValueError, match=r"\[G\+1\]"):
        w(ap, offsets[:-1])
    other = make_inputs(GroupedProblem.uniform_nk("k", (8, 8), 4096, 1024), seed=1, device="cuda")
    with pytest.raises(ValueError, match="K="):
        w(other.a)
