"""Split-K at decode on a Hopper GPU (skipped without one): the ``_x`` configs, whose calls split each tile's K over
several CTAs where the tiles alone leave SMs idle (:func:`~nvfp4lib.kernels.hopper_varlen.config.choose_splits`); the
last CTA of a tile adds the slices in slice order and runs the epilogue. Exact against the reference for both
activation types, single and dual (W4A4: the eager fused call and the captured two-kernel call); bit-identical call
after call; every tile counter back to zero after each call; one CUDA graph replayed with new routings (empty groups,
all rows in one group); a call with many tiles runs unsplit."""
import pytest
import torch

from nvfp4lib.formats import dequantize
from nvfp4lib.kernels.hopper_varlen.config import CONFIGS
from nvfp4lib.problems import GroupedProblem, make_inputs
from nvfp4lib.reference import relative_error
from nvfp4lib.serving import prepare_weights

pytestmark = pytest.mark.gpu
TOL = 1e-3  # fp32 sums in another order than the reference's, one rounding to the output type
SPLIT = [n for n, c in CONFIGS.items() if c.split_k]
# (groups, N, K, rows): 4 rows over 64 groups (32 CTAs: 4 slices; dual 2), 2 rows over 8 groups (16 CTAs: 8
# slices; dual 4), K off the 128 tile (9 K tiles: 2 slices of 5 and 4), and two CTAs per SM by the "pair" rule
# (64 CTAs: 4 slices of 16 K tiles, where "idle" takes 2; dual 128 CTAs: 2 slices of 32, where "idle" takes none)
SHAPES = [(64, 1024, 4096, 4), (8, 1024, 4096, 2), (8, 512, 1040, 3), (8, 4096, 8192, 2)]


@pytest.fixture(autouse=True)
def _sm90():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs sm_90")


def _layer(config: str, groups: int, n: int, k: int, rows: int, seed: int):
    cfg = CONFIGS[config]
    prob = GroupedProblem.uniform_nk("x", (rows,) + (0,) * (groups - 1), n, k)
    if cfg.dual:
        prob = prob.with_dual()
    inp = make_inputs(prob, seed=seed, mode="gaussian", device="cuda")
    w = prepare_weights(inp.b, inp.b2, config=config, activations=cfg.act)
    ref = prepare_weights(inp.b, inp.b2, backend="reference", activations=cfg.act)
    x = inp.a[0] if cfg.act == "nvfp4" else dequantize(inp.a[0]).to(torch.bfloat16)
    return w, ref, x


def _offsets(rows: int, groups: int, gen: torch.Generator, one_group: bool) -> torch.Tensor:
    if one_group:
        cuts = torch.full((groups - 1,), int(torch.randint(0, groups, (1,), generator=gen)))
        cuts = (torch.arange(groups - 1) >= cuts).to(torch.int64) * rows
    else:
        cuts = torch.sort(torch.randint(0, rows + 1, (groups - 1,), generator=gen)).values
    return torch.cat([torch.tensor([0]), cuts, torch.tensor([rows])]).to(torch.int32).cuda()


def _counters_zero(w, config: str) -> bool:
    splits = w.impl.runner(config)._splits
    return all(int(c.abs().sum()) == 0 for _, c in splits._by_stream.values())


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("config", SPLIT)
def test_split_calls_are_exact_deterministic_and_leave_the_counters_at_zero(config, shape):
    groups, n, k, rows = shape
    w, ref, x = _layer(config, groups, n, k, rows, seed=7)
    runner = w.impl.runner(config)
    assert runner.slices(rows) > 1, "the shape must split"
    gen = torch.Generator().manual_seed(rows)
    for it in range(6):
        offsets = _offsets(rows, groups, gen, one_group=it % 3 == 0)
        first = w(x, offsets).clone()
        again = w(x, offsets)
        torch.cuda.synchronize()
        assert torch.equal(first.view(torch.int16), again.view(torch.int16)), f"{config} call {it}: not repeatable"
        err = relative_error([first], [ref(x, offsets)])
        assert err <= TOL, f"{config} {shape} call {it}: offsets {offsets.tolist()}: {err}"
        assert _counters_zero(w, config), f"{config} call {it}: a tile counter was left non-zero"


@pytest.mark.parametrize("config", SPLIT)
def test_graph_replays_new_routings_with_split_k(config):
    """One capture at T = 4 rows over 64 groups (2-4 slices per tile), 40 replays with new offsets, each exact; the
    counters at zero after them."""
    groups, n, k, rows = SHAPES[0]
    w, ref, x = _layer(config, groups, n, k, rows, seed=11)
    gen = torch.Generator().manual_seed(5)
    offsets = _offsets(rows, groups, gen, one_group=False)
    w(x, offsets)  # compile, warm up
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        c = w(x, offsets)
    for it in range(40):
        offsets.copy_(_offsets(rows, groups, gen, one_group=it % 4 == 0))
        c.fill_(float("nan"))
        g.replay()
        err = relative_error([c], [ref(x, offsets)])
        assert err <= TOL, f"replay {it}: offsets {offsets.tolist()}: {err}"
    torch.cuda.synchronize()
    assert _counters_zero(w, config)


@pytest.mark.parametrize("config", SPLIT)
def test_many_tiles_run_unsplit_and_exact(config):
    groups, n, k, rows = 8, 1024, 1024, 512  # (39 token tiles: 156 CTAs of the two-block tiles)
    w, ref, x = _layer(config, groups, n, k, rows, seed=3)
    assert w.impl.runner(config).slices(rows) == 1
    offsets = _offsets(rows, groups, torch.Generator().manual_seed(1), one_group=False)
    assert relative_error([w(x, offsets)], [ref(x, offsets)]) <= TOL
