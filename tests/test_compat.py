import pytest
import torch

from nvfp4lib import get_problem, make_inputs
from nvfp4lib.compat import custom_kernel, from_study_inputs
from nvfp4lib.reference import reference_grouped_gemm


def _harness_data(problem, four=False):
    x = make_inputs(problem, seed=3, mode="uniform")
    fp4 = getattr(torch, "float4_e2m1fn_x2", None)
    abc, sf, sizes = [], [], []
    for a, b in zip(x.a, x.b):
        ad = a.data.unsqueeze(-1)
        bd = b.data.unsqueeze(-1)
        if fp4 is not None:
            ad, bd = ad.view(fp4), bd.view(fp4)
        abc.append((ad, bd, torch.full((a.shape[0], b.shape[0], 1), float("nan"), dtype=torch.float16)))
        sf.append((a.scales.unsqueeze(-1), b.scales.unsqueeze(-1)))
        sizes.append((a.shape[0], b.shape[0], a.shape[1], 1))
    data = (abc, sf, sf, sizes) if four else (abc, sf, sizes)
    return x, data


@pytest.mark.parametrize("four", [False, True])
def test_harness_roundtrip(four):
    x, data = _harness_data(get_problem("C4"), four)
    a, b, c = from_study_inputs(data)
    assert all(torch.equal(p.data, q.data) for p, q in zip(a, x.a))
    out = custom_kernel(data, backend="reference")
    for o, r in zip(out, reference_grouped_gemm(x.a, x.b)):
        assert torch.equal(o[..., 0], r)


def test_harness_errors():
    _, (abc, sf, sizes) = _harness_data(get_problem("C1"))
    with pytest.raises(ValueError, match="problem size"):
        from_study_inputs((abc, sf, [(1, 2, 3, 1)] * len(abc)))
    with pytest.raises(ValueError, match="group counts"):
        from_study_inputs((abc, sf[:1], sizes))
    with pytest.raises(TypeError, match="scales"):
        from_study_inputs((abc, [(s[0].float(), s[1]) for s in sf], sizes))
    with pytest.raises(ValueError, match="L = 1"):
        from_study_inputs(([(a.expand(-1, -1, 2), b, c) for a, b, c in abc], sf, sizes))
