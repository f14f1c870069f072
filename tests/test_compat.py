"""The GPU MODE harness tuples (nvfp4_group_gemm, nvfp4_dual_gemm) through nvfp4lib.compat, on the CPU.

The tuples are built here independently of compat: the reordered scales by the task's index rule
(row i, scale column j -> (i % 32, i % 128 // 32, i // 128, j % 4, j // 4, l)), their padding NaN. What the task
keeps on the GPU simply sits on the CPU here, and the reference backend computes.
"""
import pytest
import torch

from nvfp4lib import compat, get_problem, make_inputs
from nvfp4lib.compat import custom_kernel, custom_kernel_dual, dual_operands, group_operands, study_tuple
from nvfp4lib.formats import NVFP4Tensor, scales_cute_view, swizzle_scales, unswizzle_scales
from nvfp4lib.kernels.hopper_varlen.gather import FIELDS, F
from nvfp4lib.reference import reference_grouped_gemm

FP4 = torch.float4_e2m1fn_x2
NAN_E4M3 = 0x7F


def _ceil(a, b):
    return -(-a // b)


def _operand(rows, k, gen):
    """Codes as the task draws them (sign and two low bits of each nibble), scales from {1, 2}, global scale 1."""
    data = torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8, generator=gen) & 0xBB
    scales = torch.randint(1, 3, (rows, k // 16), generator=gen).to(torch.float8_e4m3fn)
    return NVFP4Tensor(data, scales, 1.0)


def _reordered(scales, pad=NAN_E4M3):
    """[rows, cols] E4M3 -> the task's 6-d (32, 4, rest_m, 4, rest_k, 1) tensor over (1, rest_m, rest_k, 32, 4, 4)
    storage, filled element by element with the task's index rule; everything else ``pad``."""
    rows, cols = scales.shape
    store = torch.full((1, _ceil(rows, 128), _ceil(cols, 4), 32, 4, 4), pad, dtype=torch.uint8)
    six = store.permute(3, 4, 1, 5, 2, 0)
    i = torch.arange(rows)[:, None].expand(rows, cols)
    j = torch.arange(cols)[None, :].expand(rows, cols)
    six[i % 32, (i % 128) // 32, i // 128, j % 4, j // 4, torch.zeros_like(i)] = scales.view(torch.uint8)
    return six.view(torch.float8_e4m3fn)


def _codes(t):
    return t.data.unsqueeze(0).permute(1, 2, 0).view(FP4)  # [rows, K/2, 1] over (1, rows, K/2)


def _out(m, n):
    return torch.full((1, m, n), float("nan"), dtype=torch.float16).permute(1, 2, 0)


def _two_batches(t):
    """``t`` with L = 2 (torch cannot concatenate float4 tensors: through their bytes)."""
    if t.dtype == FP4:
        return torch.cat([t.view(torch.uint8)] * 2, dim=2).view(FP4)
    return torch.cat([t] * 2, dim=2)


def _plain(t, nan_plain):
    s = t.scales.unsqueeze(-1)
    return torch.full_like(s.view(torch.uint8), NAN_E4M3).view(torch.float8_e4m3fn) if nan_plain else s


def _group_tuple(a, b, nan_plain=False):
    abc = [(_codes(x), _codes(w), _out(x.shape[0], w.shape[0])) for x, w in zip(a, b)]
    plain = [(_plain(x, nan_plain), _plain(w, nan_plain)) for x, w in zip(a, b)]
    perm = [(_reordered(x.scales), _reordered(w.scales)) for x, w in zip(a, b)]
    sizes = [(x.shape[0], w.shape[0], x.shape[1], 1) for x, w in zip(a, b)]
    return abc, plain, perm, sizes


def _dual_tuple(a, b1, b2, nan_plain=False):
    ts = (a, b1, b2)
    return (*(_codes(t) for t in ts), *(_plain(t, nan_plain) for t in ts), *(_reordered(t.scales) for t in ts),
            _out(a.shape[0], b1.shape[0]))


def _group(m, n, k, seed=0):
    gen = torch.Generator().manual_seed(seed)
    n = n if isinstance(n, (list, tuple)) else [n] * len(m)
    k = k if isinstance(k, (list, tuple)) else [k] * len(m)
    return [_operand(mi, ki, gen) for mi, ki in zip(m, k)], [_operand(ni, ki, gen) for ni, ki in zip(n, k)]


# --------------------------------------------------------------------------- the scale layout


@pytest.mark.parametrize("rows,cols", [(1, 4), (72, 16), (130, 6), (296, 448), (128, 8)])
def test_swizzle_roundtrip_and_task_layout(rows, cols):
    s = torch.randint(0, 0x7F, (rows, cols), dtype=torch.uint8).view(torch.float8_e4m3fn)
    blocked = swizzle_scales(s)
    assert torch.equal(unswizzle_scales(blocked, rows, cols).view(torch.uint8), s.view(torch.uint8))
    # formats' 128x4 layout is the task's: its 6-d view equals the task's element-by-element reordering
    ours = scales_cute_view(blocked, rows, cols)
    assert torch.equal(ours.view(torch.uint8), _reordered(s, pad=0).view(torch.uint8))


# --------------------------------------------------------------------------- nvfp4_group_gemm


@pytest.mark.parametrize("m,n,k", [
    ((40, 76, 168), 256, 512),              # shared N, K: prepared weights; M not multiples of 128
    ((96, 128), (128, 256), (256, 512)),   # the task's first test case: ragged N and K, the one-shot path
    ((0, 130), 64, 96),                      # an empty group, K/16 = 6 (not a multiple of 4)
])
def test_group_matches_reference(m, n, k):
    a, b = _group(m, n, k)
    data = _group_tuple(a, b)
    out = custom_kernel(data, backend="reference")
    assert len(out) == len(a)
    for g, (o, r) in enumerate(zip(out, reference_grouped_gemm(a, b))):
        assert o is data[0][g][2]  # the harness's own c, written in place
        assert o.shape == (a[g].shape[0], b[g].shape[0], 1)
        assert torch.equal(o[..., 0], r)


def test_group_never_reads_plain_scales():
    a, b = _group((72, 200), 128, 256, seed=1)
    out = custom_kernel(_group_tuple(a, b, nan_plain=True), backend="reference")
    for o, r in zip(out, reference_grouped_gemm(a, b)):
        assert torch.equal(o[..., 0], r)
    # the plain scales need not even be tensors
    abc, _, perm, sizes = _group_tuple(a, b)
    out = custom_kernel((abc, [(None, None)] * 2, perm, sizes), backend="reference")
    assert all(torch.equal(o[..., 0], r) for o, r in zip(out, reference_grouped_gemm(a, b)))


def test_group_operands_recover_scales():
    a, b = _group((33, 129), 80, 192, seed=2)
    ga, gb, gc = group_operands(_group_tuple(a, b, nan_plain=True))
    for x, y in zip(ga + gb, a + b):
        assert torch.equal(x.data, y.data)
        assert torch.equal(x.scales.view(torch.uint8), y.scales.view(torch.uint8))
        assert x.scales.is_contiguous() and float(x.global_scale) == 1.0
    assert [tuple(c.shape) for c in gc] == [(33, 80), (129, 80)]


def _replace(data, g, slot, value):
    abc, plain, perm, sizes = (list(x) for x in data)
    target = {"abc": abc, "perm": perm}[slot[0]]
    entry = list(target[g])
    entry[slot[1]] = value
    target[g] = tuple(entry)
    return abc, plain, perm, sizes


def test_group_errors():
    a, b = _group((40, 72), 128, 256)
    data = _group_tuple(a, b)
    abc, plain, perm, sizes = data
    cases = [
        (TypeError, "nvfp4_group_gemm tuple", (abc, plain, sizes)),
        (TypeError, "nvfp4_group_gemm tuple", [abc[0]]),
        (ValueError, "group counts differ", (abc, plain[:1], perm, sizes)),
        (ValueError, "at least one group", ([], [], [], [])),
        (TypeError, r"abc_tensors\[1\] must be \(a, b, c\)", (abc[:1] + [abc[1][:2]], plain, perm, sizes)),
        (ValueError, "L = 2", (abc, plain, perm, [sizes[0], (72, 128, 256, 2)])),
        (ValueError, r"a\[1\] has shape", (abc, plain, perm, [sizes[0], (73, 128, 256, 1)])),
        (TypeError, "4 integers", (abc, plain, perm, [sizes[0], (72, 128, 256)])),
        (ValueError, "multiple of 16", (abc, plain, perm, [sizes[0], (72, 128, 100, 1)])),
        (TypeError, r"a\[0\] must be .*float4_e2m1fn_x2", _replace(data, 0, ("abc", 0), abc[0][0].view(torch.int8))),
        (TypeError, r"c\[1\] must be torch.float16", _replace(data, 1, ("abc", 2), abc[1][2].float())),
        (ValueError, "only L = 1", _replace(data, 0, ("abc", 1), _two_batches(abc[0][1]))),
        (TypeError, r"sfb_reordered\[0\] must be torch.float8_e4m3fn",
         _replace(data, 0, ("perm", 1), perm[0][1].view(torch.uint8))),
        (ValueError, r"sfa_reordered\[1\] has shape", _replace(data, 1, ("perm", 0), perm[1][0][:, :, :, :, :1])),
        (ValueError, r"sfa_reordered\[1\] is on meta",
         _replace(data, 1, ("perm", 0), torch.empty(perm[1][0].shape, dtype=torch.float8_e4m3fn, device="meta"))),
    ]
    for exc, match, bad in cases:
        with pytest.raises(exc, match=match):
            custom_kernel(bad, backend="reference")
    with pytest.raises(ValueError, match="needs them on a CUDA GPU"):
        custom_kernel(data, backend="cute-hopper")  # the codes are on the CPU
    with pytest.raises(ValueError, match="not supported"):
        custom_kernel(data, backend="triton")
    # nothing was written by a refused call
    assert all(torch.isnan(c).all() for _, _, c in abc)


# --------------------------------------------------------------------------- nvfp4_dual_gemm


@pytest.mark.parametrize("m,n,k", [(256, 128, 256), (72, 96, 192)])
def test_dual_matches_reference(m, n, k):
    gen = torch.Generator().manual_seed(m)
    a, b1, b2 = _operand(m, k, gen), _operand(n, k, gen), _operand(n, k, gen)
    data = _dual_tuple(a, b1, b2, nan_plain=True)
    out = custom_kernel_dual(data, backend="reference")
    assert out is data[9] and out.shape == (m, n, 1)
    (ref,) = reference_grouped_gemm([a], [b1], [b2])
    assert torch.equal(out[..., 0], ref)


def test_dual_errors():
    gen = torch.Generator().manual_seed(5)
    a, b1, b2 = _operand(64, 256, gen), _operand(128, 256, gen), _operand(128, 256, gen)
    data = _dual_tuple(a, b1, b2)

    def swap(i, value):
        return data[:i] + (value,) + data[i + 1:]

    cases = [
        # the task.yml's description omits the reordered scales; generate_input gives all ten
        (TypeError, "nvfp4_dual_gemm tuple", data[:6] + data[9:]),
        (ValueError, "only L = 1", swap(0, _two_batches(data[0]))),
        (ValueError, "only L = 1", swap(9, _two_batches(data[9]))),
        (ValueError, r"b2 has shape", swap(2, _codes(_operand(64, 256, gen)))),
        (ValueError, r"b1 has shape", swap(1, _codes(_operand(128, 512, gen)))),
        (TypeError, r"c must be torch.float16", swap(9, data[9].float())),
        (ValueError, r"sfb2_reordered has shape", swap(8, _reordered(_operand(256, 256, gen).scales))),
        (ValueError, "must be 3-d", swap(0, data[0][..., 0])),
    ]
    for exc, match, bad in cases:
        with pytest.raises(exc, match=match):
            custom_kernel_dual(bad, backend="reference")
    with pytest.raises(ValueError, match="needs them on a CUDA GPU"):
        custom_kernel_dual(data, backend="cute-hopper")
    x, y, z, c = dual_operands(data)
    assert torch.equal(z.scales.view(torch.uint8), b2.scales.view(torch.uint8)) and c.shape == (64, 128)


# --------------------------------------------------------------------------- study_tuple


def test_study_tuple_matches_task_format():
    x = make_inputs(get_problem("C1"), seed=3)
    built = study_tuple(x)
    ref = _group_tuple(x.a, x.b)
    for (ga, gb, gc), (ra, rb, rc) in zip(built[0], ref[0]):
        assert ga.dtype == FP4 and ga.shape == ra.shape and ga.stride() == ra.stride()
        assert torch.equal(ga.view(torch.uint8), ra.view(torch.uint8))
        assert torch.equal(gb.view(torch.uint8), rb.view(torch.uint8))
        assert gc.shape == rc.shape and gc.stride() == rc.stride() and gc.dtype == torch.float16
    for (pa, _), (qa, _) in zip(built[1], ref[1]):
        assert pa.device.type == "cpu" and torch.equal(pa.view(torch.uint8), qa.view(torch.uint8))
    for (sa, _), (ra, _) in zip(built[2], ref[2]):
        assert sa.shape == ra.shape and sa.stride() == ra.stride()
    assert built[3] == ref[3]
    out = custom_kernel(built, backend="reference")
    assert all(torch.equal(o[..., 0], r) for o, r in zip(out, reference_grouped_gemm(x.a, x.b)))


def test_study_tuple_refusals():
    x = make_inputs(get_problem("C1"), seed=3, mode="gaussian")  # amax-based global scales
    with pytest.raises(ValueError, match="global scale"):
        study_tuple(x)
    dual = make_inputs(get_problem("S4").with_dual(), seed=3)
    with pytest.raises(ValueError, match="one GEMM"):
        study_tuple(type(dual)(dual.problem, dual.a, dual.a, dual.a, 3, "uniform"))  # unit scales, two groups


def test_study_tuple_dual():
    from nvfp4lib.problems import GroupedInputs, GroupedProblem

    gen = torch.Generator().manual_seed(7)
    a, b1, b2 = _operand(72, 192, gen), _operand(96, 192, gen), _operand(96, 192, gen)
    x = GroupedInputs(GroupedProblem("D1", (72,), (96,), (192,), dual=True), [a], [b1], [b2], 7, "uniform")
    built = study_tuple(x)
    ref = _dual_tuple(a, b1, b2)
    assert len(built) == 10
    for got, want in zip(built[:9], ref[:9]):
        assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
    out = custom_kernel_dual(built, backend="reference")
    assert torch.equal(out[..., 0], reference_grouped_gemm([a], [b1], [b2])[0])


# --------------------------------------------------------------------------- the tables read in place


def _dual(m, n, k, seed=0):
    gen = torch.Generator().manual_seed(seed)
    a, b1, b2 = _operand(m, k, gen), _operand(n, k, gen), _operand(n, k, gen)
    return (a, b1, b2), _dual_tuple(a, b1, b2)


def _ones_at(device):
    return compat._ONES[device].data_ptr()


@pytest.mark.parametrize("m,n,k", [(256, 512, 256), (72, 96, 192), (1, 8, 16), (130, 264, 2880)])
def test_dual_table_points_at_the_task_tensors(m, n, k):
    _, data = _dual(m, n, k)
    table, tm, tn, tk, c, device = compat._fast_dual(data)
    assert (tm, tn, tk, device) == (m, n, k, data[0].device) and len(table) == F
    gs = _ones_at(device)
    ta, tb1, tb2, _, _, _, sa, sb1, sb2, tc = data
    assert table[:10] == [ta.data_ptr(), sa.data_ptr(), m, tb1.data_ptr(), sb1.data_ptr(), tb2.data_ptr(),
                          sb2.data_ptr(), gs, gs, gs]
    assert dict(zip(FIELDS, table))["b2_codes"] == tb2.data_ptr() and not any(table[10:])
    assert c.shape == (m, n) and c.data_ptr() == tc.data_ptr() and c.is_contiguous()
    assert float(compat._ONES[device]) == 1.0


def test_group_table_points_at_each_groups_tensors():
    a, b = _group((40, 0, 130), 64, 96)
    data = _group_tuple(a, b)
    table, ms, n, k, cs, _ = compat._fast_group(data)
    assert (ms, n, k, len(table)) == ([40, 0, 130], 64, 96, 3 * F)
    for g, ((ta, tb, tc), (sa, sb)) in enumerate(zip(data[0], data[2])):
        row = dict(zip(FIELDS, table[g * F:(g + 1) * F]))
        assert (row["a_codes"], row["a_scales"], row["a_rows"]) == (ta.data_ptr(), sa.data_ptr(), ms[g])
        assert row["b_codes"] == row["b2_codes"] == tb.data_ptr()
        assert row["b_scales"] == row["b2_scales"] == sb.data_ptr()
        assert cs[g] is tc
    a, b = _group((40, 72), (64, 128), 96)  # groups differing in N: no one table
    assert compat._fast_group(_group_tuple(a, b)) is None


def _misaligned_codes(t):
    """``t``'s codes in the task's layout, one byte past an 8-byte boundary."""
    rows, half, _ = t.shape
    buf = torch.zeros(rows * half + 1, dtype=torch.uint8)
    buf[1:] = t.view(torch.uint8).flatten()
    return buf[1:].view(rows, half, 1).view(FP4)


def _wide_rows(t):
    """``t`` with rows farther apart than their width (not row-major): the same values."""
    wide = torch.zeros((t.shape[0], t.shape[1] + 8, 1), dtype=torch.uint8)
    wide[:, : t.shape[1]] = t.view(torch.uint8)
    return wide[:, : t.shape[1]].view(t.dtype)


def _offset_out(c):
    """A NaN c [M, N, 1] that starts 8 bytes past a 16-byte boundary."""
    m, n, _ = c.shape
    return torch.full((m * n + 4,), float("nan"), dtype=torch.float16)[4:].view(m, n, 1)


@pytest.mark.parametrize("slot,change", [
    (6, lambda t: t.contiguous()),                        # sfa_reordered as a plain 6-d tensor (other strides)
    (8, lambda t: t.contiguous()),                        # sfb2_reordered likewise
    (2, _misaligned_codes),                               # b2's codes not 8-byte aligned (the gather reads pairs)
    (1, _wide_rows),                                      # b1's rows padded
    (0, _wide_rows),                                      # a's rows padded
    (9, lambda c: c.permute(1, 0, 2).contiguous().permute(1, 0, 2)),  # c column-major
    (9, _offset_out),                                     # c not 16-byte aligned (the GEMM writes it directly)
])
def test_dual_non_canonical_layouts_fall_back_and_stay_exact(slot, change):
    (a, b1, b2), data = _dual(72, 96, 192, seed=slot)
    assert compat._fast_dual(data) is not None
    bad = data[:slot] + (change(data[slot]),) + data[slot + 1:]
    assert compat._fast_dual(bad) is None
    out = custom_kernel_dual(bad, backend="reference")
    assert out is bad[9] and torch.equal(out[..., 0], reference_grouped_gemm([a], [b1], [b2])[0])


def test_dual_shapes_the_kernel_cannot_take_fall_back():
    _, data = _dual(64, 100, 192)  # N not a multiple of 8: the kernel stores rows in 16-byte chunks
    assert compat._fast_dual(data) is None
    assert compat._fast_dual(data[:9]) is None  # not the task's tuple: the checked path names the problem
    _, data = _dual(64, 96, 192)
    assert compat._fast_dual(data[:2] + (data[2].view(torch.int8),) + data[3:]) is None  # not the task's dtype


def test_study_tuple_folds_power_of_two_global_scales():
    from nvfp4lib.problems import GroupedInputs, GroupedProblem

    x = make_inputs(GroupedProblem("D2", (40,), (64,), (256,), dual=True), seed=4, mode="uniform")
    assert float(x.b[0].global_scale) == 2.0**-8  # the dual problems' uniform weights
    built = study_tuple(x)
    assert compat._fast_dual(built) is not None
    out = custom_kernel_dual(built, backend="reference")
    assert torch.equal(out[..., 0], reference_grouped_gemm(x.a, x.b, x.b2)[0])
    for gs in (0.75, 2.0**-20):  # not a power of two; products below E4M3's range
        w = NVFP4Tensor(x.b[0].data, x.b[0].scales, gs)
        with pytest.raises(ValueError, match=r"b\[0\] has global scale"):
            study_tuple(GroupedInputs(x.problem, x.a, [w], x.b2, 4, "uniform"))
