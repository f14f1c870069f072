"""The one-launch Triton routing and un-permute (nn/routing_triton.py) against the torch forms: the same routing
element for element, the same weighted sums to fp32 rounding (Triton's interpreter on the CPU; skipped where Triton
is missing)."""
import os

import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
    pytest.skip("Triton on the CPU needs TRITON_INTERPRET=1", allow_module_level=True)

from nvfp4lib.nn.routing import Routing, route, unpermute  # noqa: E402
from nvfp4lib.nn.routing_triton import ROUTE_MAX_COPIES, route_gather_triton, route_triton, unpermute_triton  # noqa: E402,E501

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _ids(t, k, e, seed, allowed=None):
    g = torch.Generator().manual_seed(seed)
    pool = torch.tensor(list(allowed if allowed is not None else range(e)))
    return torch.stack([pool[torch.randperm(len(pool), generator=g)[:k]] for _ in range(t)])


@pytest.mark.parametrize("t,k,e,allowed", [(1, 8, 256, None), (8, 8, 256, None), (16, 8, 128, range(0, 128, 5)),
                                           (3, 2, 8, None), (18, 7, 256, range(7)), (32, 4, 16, range(0, 16, 3))])
def test_route_gives_the_torch_form(t, k, e, allowed):
    ids = _ids(t, k, e, seed=t * 31 + e, allowed=allowed)
    want = route(ids, e)  # the torch form (a CPU tensor)
    for dtype in (torch.int64, torch.int32):
        got = route_triton(ids.to(DEV, dtype), e)
        for name, a, b in zip(Routing._fields, got, want):
            assert a.dtype == b.dtype and torch.equal(a.cpu(), b), name


@pytest.mark.parametrize("t,k,e,h,dtype", [(1, 8, 128, 2048, torch.bfloat16), (8, 8, 256, 300, torch.bfloat16),
                                           (5, 3, 8, 7, torch.bfloat16), (16, 8, 128, 33, torch.float32)])
def test_route_gather_gives_route_then_gather(t, k, e, h, dtype):
    # h 7: rows of 14 bytes, not whole words (moved as elements); 300 and 2048: as words
    ids = _ids(t, k, e, seed=t * 7 + h)
    x = torch.randn(t, h).to(dtype)
    want = route(ids, e)
    token, offsets, row, rows = route_gather_triton(ids.to(DEV), e, x.to(DEV))
    for name, a, b in zip(Routing._fields, (token, offsets, row), want):
        assert a.dtype == b.dtype and torch.equal(a.cpu(), b), name
    assert rows.dtype == dtype and torch.equal(rows.cpu(), x[want.token])


def test_route_gather_skips_copies_outside_the_experts():
    # ids past the experts (or negative) form the sink group of route_local: row -1, token -1, their rows unwritten
    ids = torch.tensor([[0, 5], [9, 1], [-1, 0]])
    x = torch.arange(9, dtype=torch.float32).view(3, 3)
    token, offsets, row, rows = route_gather_triton(ids.to(DEV), 6, x.to(DEV))
    assert offsets.cpu().tolist() == [0, 2, 3, 3, 3, 3, 4]
    assert row.cpu().tolist() == [0, 3, -1, 2, -1, 1]
    assert token.cpu().tolist() == [0, 2, 1, 0, -1, -1]
    assert torch.equal(rows[:4].cpu(), x[[0, 2, 1, 0]])
    with pytest.raises(ValueError, match=r"x must be \[T=3"):
        route_gather_triton(ids.to(DEV), 6, x[:2].to(DEV))
    token, offsets, row, rows = route_gather_triton(torch.zeros(0, 8, dtype=torch.int64, device=DEV), 4,
                                                    torch.zeros(0, 16, device=DEV))
    assert rows.shape == (0, 16) and offsets.cpu().tolist() == [0] * 5


@pytest.mark.parametrize("t,h,dtype", [(1, 2048, torch.bfloat16), (3, 4096, torch.bfloat16), (2, 7168, torch.bfloat16),
                                       (5, 48, torch.float32)])
def test_route_finds_the_amax_and_the_quantizer_then_skips_its_launch(t, h, dtype):
    """routing.AMAX_IN_ROUTE: the routing launch writes amax(|x|)'s float bits into the word (the words it clears
    untouched otherwise), and the quantization given that word (amax_ready) gives the bits of one that finds it."""
    from nvfp4lib.nn.quant_triton import quantize_to_operand
    from nvfp4lib.nn.routing import amax_tile

    ids = _ids(t, 4, 16, seed=t + h)
    x = (torch.randn(t, h) * 3).to(dtype)
    x[t - 1, h // 2] = -40.0  # the amax, negative
    words = torch.full((2,), 7, dtype=torch.int32, device=DEV)
    assert amax_tile(x) is not None
    got = route_triton(ids.to(DEV), 16, clear=words[1:], amax_of=(x.to(DEV), words[:1]))
    for name, a, b in zip(Routing._fields, got, route(ids, 16)):
        assert torch.equal(a.cpu(), b), name
    assert words[1].item() == 0 and words[:1].view(torch.float32).item() == 40.0
    want = quantize_to_operand(x.to(DEV), h, None, got[0])
    ready = quantize_to_operand(x.to(DEV), h, None, got[0], amax_word=words[:1], amax_ready=True)
    assert all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(want, ready))


def test_route_refuses_an_amax_tile_too_large():
    from nvfp4lib.nn.routing import AMAX_ROUTE_ELEMENTS, amax_tile

    big = torch.zeros(4, AMAX_ROUTE_ELEMENTS // 2)
    assert amax_tile(big) is None and amax_tile(torch.zeros(1, 40)) is None  # (40: not whole 16-column blocks)
    word = torch.zeros(1, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="amax_of"):
        route(torch.zeros(4, 2, dtype=torch.int64, device=DEV), 8, amax_of=(big.to(DEV), word))
    with pytest.raises(ValueError, match="amax_of"):
        route_triton(torch.zeros(4, 2, dtype=torch.int64, device=DEV), 8, amax_of=(big.to(DEV), word))


def test_route_limits():
    with pytest.raises(ValueError, match="at most"):
        route_triton(torch.zeros(ROUTE_MAX_COPIES // 8 + 1, 8, dtype=torch.int64, device=DEV), 16)
    token, offsets, row = route_triton(torch.zeros(0, 8, dtype=torch.int64, device=DEV), 4)
    assert token.numel() == 0 and row.numel() == 0 and offsets.cpu().tolist() == [0] * 5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_unpermute_sums_the_weighted_copies(dtype):
    t, k, e, n = 6, 4, 16, 300  # n: not a multiple of the column block
    ids = _ids(t, k, e, seed=3)
    r = route(ids, e)
    y = torch.randn(t * k, n).to(torch.bfloat16)
    w = torch.rand(t, k)
    want = (y.double()[r.row].view(t, k, n) * w.double()[..., None]).sum(1)
    got = unpermute_triton(y.to(DEV), r.row.to(DEV), w.to(DEV), dtype).cpu()
    assert got.dtype == dtype
    assert torch.allclose(got.double(), want.to(dtype).double(), rtol=1e-2 if dtype == torch.bfloat16 else 1e-6,
                          atol=1e-6)
    again = unpermute_triton(y.to(DEV), r.row.to(DEV), w.to(DEV), dtype).cpu()
    assert torch.equal(got, again)  # deterministic
    torch_form = unpermute(y, r, w, dtype)  # CPU: the torch form, the same sums to fp32 rounding
    assert torch.allclose(got.double(), torch_form.double(), rtol=1e-2 if dtype == torch.bfloat16 else 1e-6, atol=1e-6)


def test_gather_rows_gives_index_select():
    from nvfp4lib.nn.routing import gather_rows
    from nvfp4lib.nn.routing_triton import gather_rows_triton

    x = torch.randn(5, 2500, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    index = torch.tensor([3, 3, 0, 4, 1, 2, 0])
    assert torch.equal(gather_rows_triton(x.to(DEV), index.to(DEV)).cpu(), x.index_select(0, index))
    assert torch.equal(gather_rows(x, index), x.index_select(0, index))  # the CPU form
    assert gather_rows_triton(x.to(DEV), index[:0].to(DEV)).shape == (0, 2500)


def test_negative_rows_add_zero_times_their_weight():
    """weighted_rows' contract (the expert-parallel combine): a copy with a negative row adds 0 · its weight, whatever
    the row it would have read holds; a NaN weight there gives NaN (a lost copy). Both forms."""
    from nvfp4lib.nn.routing import weighted_rows

    t, k, n = 5, 3, 70
    y = torch.randn(t * k, n)
    y[0] = float("nan")  # the row a clamped index would read
    row = torch.arange(t * k)
    row[[0, 4, 8]] = -1
    w = torch.rand(t, k)
    w[2, 2] = float("nan")
    row[8] = -1  # copy (2, 2): negative row, NaN weight
    want = torch.where((row < 0).view(t, k, 1), 0.0, y.view(t, k, n).double()) * w.double()[..., None]
    want = want.sum(1)
    got = unpermute_triton(y.to(DEV), row.to(DEV), w.to(DEV), torch.float32).cpu()
    torch_form = weighted_rows(y, row, w)  # a CPU tensor: the torch form
    for out in (got, torch_form):
        assert out[2].isnan().all() and not out[[0, 1, 3, 4]].isnan().any()
        assert torch.allclose(out[[0, 1, 3, 4]].double(), want[[0, 1, 3, 4]], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype,cols", [(torch.bfloat16, 300), (torch.uint8, 4032)])
def test_put_rows_writes_each_row_to_its_peer_only(dtype, cols):
    """put_rows_triton against the torch form of ep_symm.put_rows: W = 3 peers (plain tensors standing in for the
    peers' symmetric buffers, each with its dump row last), rows with no destination skipped."""
    from nvfp4lib.nn import ep_symm
    from nvfp4lib.nn.routing_triton import put_rows_triton

    g = torch.Generator().manual_seed(5)
    n, rows, world = 11, 9, 3
    src = torch.randint(0, 255, (n, cols), generator=g).to(dtype).to(DEV)
    src_index = torch.randperm(n, generator=g).to(DEV)
    slot = torch.randperm(world * (rows - 1), generator=g)[:n]  # a distinct (peer, row) per source row
    dst_rank, dst_row = (slot // (rows - 1)).to(DEV), (slot % (rows - 1)).to(DEV)
    dst_row[[3, 7]] = -1
    want = [torch.zeros(rows, cols, dtype=dtype, device=DEV) for _ in range(world)]
    got = [torch.zeros(rows, cols, dtype=dtype, device=DEV) for _ in range(world)]
    ep_symm.put_rows(src, src_index, dst_rank, dst_row, want)  # the torch form (the knob is off)
    put_rows_triton(src, src_index, dst_rank, dst_row,
                    torch.tensor([t.data_ptr() for t in got], dtype=torch.int64, device=DEV))
    for w, t in zip(want, got):
        assert torch.equal(w[:-1].cpu(), t[:-1].cpu())  # the dump row (last) is the torch form's scratch
        assert not t[-1].any()  # the one-launch form writes nothing it was not asked to


@pytest.mark.parametrize("world,rank,t,k,e", [(2, 0, 3, 8, 256), (2, 1, 64, 8, 128), (4, 3, 5, 2, 8)])
def test_route_local_reads_the_gathered_rows_in_place(world, rank, t, k, e):
    """The all-gather transport's routing (routing.route_local): ids read in place from byte rows (a row stride),
    padding rows (ids -1) and other ranks' copies after this rank's with row and token -1; the Triton form gives the
    torch form element for element, and the torch form is the plain route of the local copies."""
    from nvfp4lib.nn.routing import route_local

    g = torch.Generator().manual_seed(world * 100 + t)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(world * t)])
    ids[-2:] = -1  # padding rows
    rows = torch.zeros(world * t, 40 + 4 * k, dtype=torch.uint8)
    rows.view(torch.int32)[:, 10:10 + k] = ids.to(torch.int32)
    in_place = rows.to(DEV).view(torch.int32)[:, 10:10 + k]
    n_local = e // world
    want = route_local(ids, n_local, rank * n_local)  # a CPU tensor: the torch form
    got = route_local(in_place, n_local, rank * n_local)
    for name, a, b in zip(Routing._fields, got, want):
        assert torch.equal(a.cpu(), b), name
    local = ids.reshape(-1) - rank * n_local
    own = (local >= 0) & (local < n_local)
    assert int(want.offsets[-1]) == int(own.sum()) and bool((want.row[~own] == -1).all())
    plain = route(local[own].view(-1, 1), n_local)  # this rank's copies alone, in the same order
    assert torch.equal(want.offsets, plain.offsets) and torch.equal(want.row[own], plain.row)
    assert bool((want.token[int(own.sum()):] == -1).all())


@pytest.mark.parametrize("parts", [(56,), (32, 4)])
def test_pack_rows_gives_the_concatenation_with_padding(parts):
    from nvfp4lib.nn.routing_triton import pack_rows_triton

    g = torch.Generator().manual_seed(2)
    t, k, cap = 3, 4, 5
    payload = tuple(torch.randint(0, 256, (t, n), generator=g, dtype=torch.uint8) for n in parts)
    ids = torch.randint(0, 64, (t, k), generator=g)
    w = torch.rand(t, k, generator=g).to(torch.bfloat16)
    got = pack_rows_triton(tuple(p.to(DEV) for p in payload), ids.to(DEV), w.to(DEV), cap).cpu()
    live = torch.cat([*payload, ids.to(torch.int32).view(torch.uint8), w.float().view(torch.uint8)], 1)
    pad = torch.zeros(cap - t, live.shape[1], dtype=torch.uint8)
    pad[:, sum(parts):sum(parts) + 4 * k] = 255  # expert ids -1
    assert torch.equal(got, torch.cat([live, pad]))
    assert pack_rows_triton((torch.zeros(t, 6, dtype=torch.uint8, device=DEV),), ids.to(DEV), w.to(DEV), cap) is None


def test_gather_skips_negative_indices_and_reads_strided_rows():
    from nvfp4lib.nn.routing_triton import gather_rows_triton

    x = torch.randint(0, 256, (6, 48), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    index = torch.tensor([4, -1, 0, 5, -1])
    got = gather_rows_triton(x.to(DEV)[:, 8:40], index.to(DEV)).cpu()  # a row stride of 48 bytes, 32 bytes a row
    keep = index >= 0
    assert torch.equal(got[keep], x[:, 8:40][index[keep]])


def test_unpermute_reads_strided_weights():
    t, k, n = 4, 3, 20
    y = torch.randn(t * k, n)
    row = torch.randperm(t * k)
    w_rows = torch.rand(t, k + 5)
    got = unpermute_triton(y.to(DEV), row.to(DEV), w_rows.to(DEV)[:, 2:2 + k], torch.float32).cpu()
    want = unpermute_triton(y.to(DEV), row.to(DEV), w_rows[:, 2:2 + k].contiguous().to(DEV), torch.float32).cpu()
    assert torch.equal(got, want)
