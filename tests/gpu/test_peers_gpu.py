"""Every peer backend against the exact reference on a CUDA GPU (skipped without one): on a covering set of
problems, or every problem of the correctness, edge and benchmark suites with ``NVFP4LIB_GPU_FULL=1``."""
import os

import pytest
import torch

from nvfp4lib.bench.backends import prepare
from nvfp4lib.bench.harness import check_runner
from nvfp4lib.problems import BENCHMARK, CORRECTNESS, EDGE, make_inputs
from nvfp4lib.reference import reference_grouped_gemm

pytestmark = pytest.mark.gpu

PEERS = [("torch-bf16", {}), ("torch-bf16", {"graph": True}), ("torch-bf16", {"strategy": "streams"}),
         ("torch-dequant", {}), ("triton", {}), ("triton", {"graph": True})]
FULL = os.environ.get("NVFP4LIB_GPU_FULL") == "1"
COVER = {"C4", "C9", "E1-empty-group", "E3-ragged", "E4-2880", "S2", "S4"}
PROBLEMS = [p for p in CORRECTNESS + EDGE + BENCHMARK if FULL or p.name in COVER]
# torch._grouped_mm peers need one N and one K for all groups
UNIFORM = [p for p in PROBLEMS if len(set(p.n)) == 1 and len(set(p.k)) == 1]


@pytest.mark.parametrize("backend, opts", PEERS, ids=[f"{b}-{o}" for b, o in PEERS])
@pytest.mark.parametrize("prob", PROBLEMS, ids=[p.name for p in PROBLEMS])
@pytest.mark.parametrize("dual", [False, True])
def test_peer_is_exact(backend, opts, prob, dual):
    p = prob.with_dual(dual)
    x = make_inputs(p, seed=1111, mode="gaussian", device="cuda")
    ref = reference_grouped_gemm(x.a, x.b, x.b2)
    r = prepare(x.a, x.b, x.b2, backend=backend, **opts)
    assert check_runner(r, ref) <= (r.tolerance or 1e-3)


@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("prob", UNIFORM, ids=[p.name for p in UNIFORM])
@pytest.mark.parametrize("dual", [False, True])
def test_bf16_predequant_within_its_stated_tolerance(prob, dual, graph):
    """The fair bf16 peer: global scales folded into the bf16 operands, one torch._grouped_mm per product."""
    p = prob.with_dual(dual)
    x = make_inputs(p, seed=1111, mode="gaussian", device="cuda")
    ref = reference_grouped_gemm(x.a, x.b, x.b2)
    r = prepare(x.a, x.b, x.b2, backend="torch-bf16-predequant", graph=graph)
    assert check_runner(r, ref) <= r.tolerance


@pytest.mark.parametrize("prob", BENCHMARK, ids=[p.name for p in BENCHMARK])
def test_grouped_mm_within_its_stated_tolerance(prob):
    x = make_inputs(prob, seed=1111, mode="uniform", device="cuda")
    ref = reference_grouped_gemm(x.a, x.b)
    r = prepare(x.a, x.b, backend="torch-grouped-mm")
    assert r.tolerance and check_runner(r, ref) <= r.tolerance


@pytest.mark.parametrize("prob", UNIFORM, ids=[p.name for p in UNIFORM])
@pytest.mark.parametrize("dual", [False, True])
@pytest.mark.parametrize("graph", [False, True])
def test_fused_peer_within_its_stated_tolerance(prob, dual, graph):
    """torch-grouped-mm-fused: its one-launch Triton decode gives exactly the torch dequantization; the rest is
    torch._grouped_mm's bf16 result (4e-3)."""
    from nvfp4lib.bench.peers.torch_peers import _dq_cat

    p = prob.with_dual(dual)
    x = make_inputs(p, seed=1111, mode="gaussian", device="cuda")
    ref = reference_grouped_gemm(x.a, x.b, x.b2)
    r = prepare(x.a, x.b, x.b2, backend="torch-grouped-mm-fused", graph=graph)
    assert r.tolerance == 4e-3 and check_runner(r, ref) <= r.tolerance
    inner = r.keepalive[0] if graph else r
    assert torch.equal(inner.keepalive[1][: sum(p.m)], _dq_cat(x.a))


@pytest.mark.parametrize("dual", [False, True])
@pytest.mark.parametrize("name", ["C4", "E3-ragged", "E4-2880"])
def test_every_triton_candidate_is_exact(name, dual):
    """Each block-size candidate (swap or not) on ragged M, N and K; the prepare-time choice is cached per problem."""
    from nvfp4lib.bench.peers.triton_nvfp4 import CANDIDATES

    p = next(q for q in PROBLEMS if q.name == name).with_dual(dual)
    x = make_inputs(p, seed=1111, mode="gaussian", device="cuda")
    ref = reference_grouped_gemm(x.a, x.b, x.b2)
    for cand in CANDIDATES[dual]:
        r = prepare(x.a, x.b, x.b2, backend="triton", candidates=[cand])
        assert check_runner(r, ref) <= 1e-3, cand.name
    first = prepare(x.a, x.b, x.b2, backend="triton")
    again = prepare(x.a, x.b, x.b2, backend="triton")
    assert again.info["config"] == first.info["config"] and not again.info["timed_us"]


def test_triton_ptx_and_portable_decode_agree_bit_for_bit():
    from nvfp4lib.bench.peers import triton_nvfp4

    p = BENCHMARK[3].with_dual()
    x = make_inputs(p, seed=1111, mode="gaussian", device="cuda")
    cand = triton_nvfp4.CANDIDATES[True][0]
    outs = []
    for asm in (True, False):
        triton_nvfp4.DECODE_ASM = asm
        try:
            outs.append([o.clone() for o in prepare(x.a, x.b, x.b2, backend="triton", candidates=[cand])()])
        finally:
            triton_nvfp4.DECODE_ASM = True
    assert all(torch.equal(u, v) for u, v in zip(*outs))
