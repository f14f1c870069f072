"""W4A16 on a Hopper GPU (skipped without one): cute-hopper with bf16 activations (``activations="bf16"``, the
``vl_a16_`` configs: no prologue, bf16 straight into wgmma) against the reference backend's exact semantics, on the
S1-S4 shapes and their dual forms, empty groups, T = 1, K off the tile, one CUDA graph replayed for any split, and
torch.compile with opcheck."""
import pytest
import torch

from nvfp4lib.formats import dequantize
from nvfp4lib.kernels.hopper_varlen.config import CONFIGS
from nvfp4lib.problems import BENCHMARK, DUAL, GroupedProblem, make_inputs
from nvfp4lib.reference import relative_error
from nvfp4lib.serving import prepare_weights

pytestmark = pytest.mark.gpu
# the kernel sums in fp32 in another order than the reference's matmul; both round once to fp16
TOL = 1e-3


@pytest.fixture(autouse=True)
def _sm90():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs sm_90")


def poison_allocator(nbytes: int) -> None:
    """NaN in the caching allocator's next block of this size: an output element the kernel does not write reads NaN."""
    junk = torch.full((nbytes // 2 + 1024,), float("nan"), dtype=torch.float16, device="cuda")
    del junk


def bf16_rows(inp) -> list[torch.Tensor]:
    """The problem's activations as bf16 rows (its NVFP4 values, rounded to bf16 where the global scale needs it)."""
    return [dequantize(a).to(torch.bfloat16) for a in inp.a]


def check(w, ref, xs, what):
    outs = w(xs)
    want = ref(xs)
    assert [tuple(o.shape) for o in outs] == [tuple(r.shape) for r in want]
    err = relative_error(outs, want)
    assert err <= TOL, f"{what}: {err}"


@pytest.mark.parametrize("config", ["vl_a16_m128_t128_k128_s3_e", "vl_a16_m128_t256_k128_s3_v32_e",
                                    "vl_a16_m256_t16_k128_s4_e_b2"])
def test_decode_is_exact_for_every_code_and_finite_scale_on_the_gpu(config):
    """The hardware's view of the bf16 decode (e.g. the bf16 subnormal that code ±0.5 passes through): weights holding
    all 16 codes in every 16-element block and all 254 finite E4M3 scales (signed, subnormal, zero) in turn, times
    one-hot bf16 rows: C = Wᵀ, each element one product, exact in fp16 (2^-10 .. 2688, ≤ 6 significant bits)."""
    from tests.exact_weights import every_code_weights

    k = 256
    w = every_code_weights(256, k)
    prepared = prepare_weights([w], config=config, activations="bf16")
    eye = torch.eye(k, dtype=torch.bfloat16, device="cuda")
    c = prepared(eye, torch.tensor([0, k], dtype=torch.int32, device="cuda"))
    assert torch.equal(c.float(), dequantize(w).T.contiguous())


def _problem_configs():
    out = []
    for name, cfg in CONFIGS.items():
        if cfg.act == "bf16":
            for p in (DUAL if cfg.dual else BENCHMARK):
                out.append((name, p))
    return out


@pytest.mark.parametrize("mode", ["uniform", "gaussian"])
@pytest.mark.parametrize("config,prob", [pytest.param(c, p, id=f"{c}-{p.name}",
                                                      marks=pytest.mark.xdist_group(f"{c}-{p.name}"))
                                         for c, p in _problem_configs()])
def test_packed_form_is_exact(config, prob, mode):
    inp = make_inputs(prob, seed=1111, mode=mode, device="cuda")
    w = prepare_weights(inp.b, inp.b2, config=config, activations="bf16")
    ref = prepare_weights(inp.b, inp.b2, backend="reference", activations="bf16")
    xs = bf16_rows(inp)
    x = torch.cat(xs)
    offsets = torch.tensor([0] + [int(t) for t in torch.cumsum(torch.tensor(prob.m), 0)], dtype=torch.int32,
                           device="cuda")
    poison_allocator(x.shape[0] * prob.n[0] * 2)
    c = w(x, offsets)
    want = ref(x, offsets)
    err = relative_error([c], [want])
    assert err <= TOL, f"{config} {prob.name} {mode}: {err}"


@pytest.mark.parametrize("dual", [False, True])
@pytest.mark.parametrize("m", [(0, 5, 0, 130), (1,), (0, 0), (7, 0, 300, 1, 64)])
def test_list_form_is_exact_with_empty_groups_and_one_row(m, dual):
    """K = 2880: the last 128-K tile reads 64 columns past K (TMA zero-fills them; the packed weights are zero)."""
    prob = GroupedProblem.uniform_nk("edge", m, 256, 2880)
    if dual:
        prob = prob.with_dual()
    inp = make_inputs(prob, seed=3, mode="gaussian", device="cuda")
    w = prepare_weights(inp.b, inp.b2, activations="bf16")
    ref = prepare_weights(inp.b, inp.b2, backend="reference", activations="bf16")
    check(w, ref, bf16_rows(inp), f"m={m} dual={dual}")


@pytest.mark.parametrize("config", [n for n, c in CONFIGS.items() if c.act == "bf16" and not c.dual])
def test_every_single_config_on_one_row(config):
    prob = GroupedProblem.uniform_nk("t1", (0, 1, 0), 512, 1024)
    inp = make_inputs(prob, seed=9, mode="gaussian", device="cuda")
    w = prepare_weights(inp.b, None, config=config, activations="bf16")
    ref = prepare_weights(inp.b, None, backend="reference", activations="bf16")
    check(w, ref, bf16_rows(inp), config)


@pytest.mark.long_gpu
@pytest.mark.parametrize("dual", [False, True])
@pytest.mark.parametrize("groups", [8, 64])
def test_graph_replays_any_split(groups, dual):
    """One capture at T = 512 bf16 rows; 50 replays with new offsets (empty groups included), each exact."""
    gen = torch.Generator().manual_seed(groups)
    rows, n, k = 512, 256, 512
    prob = GroupedProblem.uniform_nk("g", (rows,) + (0,) * (groups - 1), n, k)
    if dual:
        prob = prob.with_dual()
    inp = make_inputs(prob, seed=groups, mode="gaussian", device="cuda")
    w = prepare_weights(inp.b, inp.b2, activations="bf16")
    ref = prepare_weights(inp.b, inp.b2, backend="reference", activations="bf16")
    x = bf16_rows(inp)[0]
    offsets = torch.zeros(groups + 1, dtype=torch.int32, device="cuda")
    offsets[1:] = rows
    w(x, offsets)  # compile, warm up
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        c = w(x, offsets)
    for it in range(50):
        cuts = torch.sort(torch.randint(0, rows + 1, (groups - 1,), generator=gen)).values
        if it % 3 == 0:  # some all-in-one-group splits
            cuts = torch.full((groups - 1,), int(torch.randint(0, rows + 1, (1,), generator=gen)))
        offs = torch.cat([torch.tensor([0]), cuts, torch.tensor([rows])]).to(torch.int32)
        offsets.copy_(offs)
        c.fill_(float("nan"))
        g.replay()
        err = relative_error([c], [ref(x, offsets)])
        assert err <= TOL, f"replay {it}: split {offs.tolist()}: {err}"


def test_torch_compile_and_opcheck():
    inp = make_inputs(BENCHMARK[3], seed=5, mode="gaussian", device="cuda")
    w = prepare_weights(inp.b, None, activations="bf16")
    x = torch.cat(bf16_rows(inp))
    offsets = torch.tensor([0, 128, 512], dtype=torch.int32, device="cuda")
    eager = w(x, offsets)
    f = torch.compile(lambda x, o: w(x, o), fullgraph=True)
    assert torch.equal(f(x, offsets), eager)
    torch.library.opcheck(torch.ops.nvfp4lib.grouped_mm_a16, (x, offsets, w.handle),
                          test_utils=("test_schema", "test_faketensor"))


def test_bad_inputs_are_refused():
    inp = make_inputs(BENCHMARK[3], seed=5, mode="gaussian", device="cuda")
    w = prepare_weights(inp.b, None, activations="bf16")
    x = torch.cat(bf16_rows(inp))
    offsets = torch.tensor([0, 128, 512], dtype=torch.int32, device="cuda")
    with pytest.raises(TypeError, match="bfloat16"):
        w(x.half(), offsets)
    with pytest.raises(ValueError, match="device"):
        w(x, offsets.cpu())
    with pytest.raises(ValueError, match="device"):
        w(x.cpu(), offsets)
    with pytest.raises(ValueError, match="contiguous"):
        w(torch.cat([x, x], 1)[:, :1536], offsets)
    with pytest.raises(ValueError, match="K="):
        w(x[:, :1024].contiguous(), offsets)
    with pytest.raises(ValueError, match="bf16 activations"):
        prepare_weights(inp.b, None, config="vl_a16_m128_t128_k128_s3_e")  # activations="nvfp4"
