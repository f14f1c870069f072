"""The torch peers against the exact reference (CPU here; tests/gpu covers CUDA)."""
import pytest
import torch

from nvfp4lib import get_problem, make_inputs
from nvfp4lib.bench.backends import prepare
from nvfp4lib.bench.harness import check_runner
from nvfp4lib.bench.peers.torch_peers import E2M1_LUT, dequant16, probe_scaled_mm_fp4
from nvfp4lib.formats import dequantize
from nvfp4lib.reference import reference_grouped_gemm


def test_dequant16_is_exact():
    x = make_inputs(get_problem("C1"), seed=4, mode="gaussian").b[0]
    d = dequant16(x.data, x.scales, torch.bfloat16).float()
    assert torch.equal(d * x.global_scale, dequantize(x))
    assert E2M1_LUT.numel() == 16


@pytest.mark.parametrize("backend", ["torch-bf16", "torch-dequant"])
@pytest.mark.parametrize("name", ["C4", "C9", "E1-empty-group"])
@pytest.mark.parametrize("dual", [False, True])
@pytest.mark.parametrize("mode", ["uniform", "gaussian"])
def test_torch_peers_match_the_reference(backend, name, dual, mode):
    p = get_problem(name).with_dual(dual)
    x = make_inputs(p, seed=5, mode=mode)
    ref = reference_grouped_gemm(x.a, x.b, x.b2)
    assert check_runner(prepare(x.a, x.b, x.b2, backend=backend), ref) <= 1e-3


@pytest.mark.parametrize("strategy", ["loop", "streams"])
def test_launch_strategies_on_cpu(strategy):
    x = make_inputs(get_problem("E1-empty-group"), seed=1)
    ref = reference_grouped_gemm(x.a, x.b)
    r = prepare(x.a, x.b, backend="torch-bf16", strategy=strategy)
    assert check_runner(r, ref) <= 1e-3
    assert r.outputs[0].shape == (0, 256)


def test_bad_strategy_and_graph_without_cuda():
    x = make_inputs(get_problem("C1"), seed=1)
    with pytest.raises(ValueError, match="unknown strategy"):
        prepare(x.a, x.b, backend="torch-bf16", strategy="threads")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA graphs"):
            prepare(x.a, x.b, backend="torch-bf16", graph=True)


@pytest.mark.slow
def test_torch_compile_matches_the_reference():
    p = get_problem("C4").with_dual()
    x = make_inputs(p, seed=6, mode="gaussian")
    ref = reference_grouped_gemm(x.a, x.b, x.b2)
    assert check_runner(prepare(x.a, x.b, x.b2, backend="torch-compile"), ref) <= 1e-3


@pytest.mark.parametrize("dual", [False, True])
def test_bf16_predequant_peer_matches_the_reference_at_its_bf16_tolerance(dual):
    """Both operands dequantized once at prepare with their global scales folded in (here not 1); per call
    torch._grouped_mm alone (and silu*up for the dual form), a bf16 result."""
    from nvfp4lib.formats import quantize
    from nvfp4lib.problems import GroupedProblem

    x = make_inputs(GroupedProblem.uniform_nk("small", (3, 9), 64, 128, dual=dual), seed=2, mode="gaussian")
    gen = torch.Generator().manual_seed(3)

    def q(rows, gs):  # global scales far from 1: a peer that dropped them would be off by orders of magnitude
        return quantize(torch.randn(rows, 128, generator=gen) * gs, global_scale=gs / 448)

    a = [q(int(t.shape[0]), 3.0 + g) for g, t in enumerate(x.a)]
    b = [q(64, 0.25 * (g + 1)) for g in range(len(x.b))]
    b2 = [q(64, 5.0 + g) for g in range(len(x.b))] if dual else None
    ref = reference_grouped_gemm(a, b, b2)
    runner = prepare(a, b, b2, backend="torch-bf16-predequant")
    assert "global scales folded in" in runner.notes and runner.outputs[0].dtype == torch.bfloat16
    assert check_runner(runner, ref) <= runner.tolerance


def test_grouped_mm_refuses_ragged_k():
    x = make_inputs(get_problem("C1"), seed=1)
    with pytest.raises((ValueError, RuntimeError)):
        prepare(x.a, x.b, backend="torch-grouped-mm")


def test_scaled_mm_probe_reports():
    info = probe_scaled_mm_fp4()
    assert set(info) >= {"supported", "error", "torch"}
    if not torch.cuda.is_available():
        assert info["supported"] is False and info["error"]


def test_graphed_runner_keeps_what_the_graph_reads_alive():
    # A CUDA graph replays raw addresses: the un-graphed runner (its weights, buffers) must outlive it.
    import gc
    import weakref

    from nvfp4lib.bench.launch import per_group
    from nvfp4lib.runner import Runner

    x = make_inputs(get_problem("C1"), seed=1)
    r = per_group(lambda a, b, b2, **k: prepare(a, b, b2, backend="torch-bf16"), x.a, x.b, None,
                  out_dtype=torch.float16, streams=False)
    assert isinstance(r, Runner) and r.keepalive
    ref = weakref.ref(r.keepalive[0])
    gc.collect()
    assert ref() is not None


@pytest.mark.parametrize("backend", ["triton", "torch-grouped-mm-fused"])
def test_triton_peers_refuse_without_cuda(backend, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x = make_inputs(get_problem("E1-empty-group"), seed=1)
    with pytest.raises(RuntimeError, match="CUDA"):
        prepare(x.a, x.b, backend=backend)


def test_fp16_decode_is_exact_for_every_code_and_scale():
    """The Triton peers' decode (code bits into an fp16, times E4M3 scale × 2^7): all 16 codes × 254 finite
    scales give value × scale × 2^-7 exactly."""
    from nvfp4lib.bench.peers.triton_groups import check_decode_exhaustively

    assert check_decode_exhaustively() == 16 * 254


def test_inline_ptx_decode_places_the_bits_as_the_portable_form():
    """The GPU decode's inline PTX (replayed instruction by instruction) against the portable form, on every byte
    value in every position of the 32-bit word."""
    from nvfp4lib.bench.peers.triton_groups import decode_reference, emulate_ptx

    for pos in range(4):
        for byte in range(256):
            w = byte << 8 * pos | 0x5A << 8 * ((pos + 1) % 4)  # a neighbour byte, so that no bits may leak
            got = [emulate_ptx(w)[i] >> 16 * h & 0xFFFF for i in (0, 1, 2, 3) for h in (0, 1)]
            lo_hi = decode_reference(torch.tensor([(w >> 8 * j) & 0xFF for j in range(4)] + [0] * 4,
                                                  dtype=torch.uint8), torch.tensor([0x38], dtype=torch.uint8))
            want = (lo_hi * 2.0 ** -7).view(torch.int16).to(torch.int32) & 0xFFFF  # value × 2^-14: the bits alone
            assert got == [int(want[2 * j + nib]) for nib in (0, 1) for j in range(4)], (pos, byte)


# The Triton kernels run on the CPU in Triton's interpreter (TRITON_INTERPRET=1, read when the kernels are defined):
# each case runs in its own process. Ragged M (rows past M clamped, never stored), empty groups, ragged N and K
# (masked K loads), the dual form, and the swapped operand order.
_INTERPRETED = """
import sys, torch
from nvfp4lib import get_problem, make_inputs
from nvfp4lib.bench.backends import prepare
from nvfp4lib.bench import check_runner
from nvfp4lib.reference import reference_grouped_gemm
from nvfp4lib.problems import GroupedProblem
from nvfp4lib.peers.triton_nvfp4 import Candidate
backend, name, dual, cand = sys.argv[1], sys.argv[2], sys.argv[3] == "1", eval(sys.argv[4])
p = (get_problem(name) if name[0] in "CE" else GroupedProblem.uniform_nk("small", eval(name), 64, 512)).with_dual(dual)
x = make_inputs(p, seed=5, mode="gaussian")
ref = reference_grouped_gemm(x.a, x.b, x.b2)
opts = {"candidates": [cand]} if backend == "triton" else {}
r = prepare(x.a, x.b, x.b2, backend=backend, **opts)
err = check_runner(r, ref)
assert err <= (r.tolerance or 1e-3), err
assert [tuple(o.shape) for o in r.outputs] == [tuple(o.shape) for o in ref]
if backend == "torch-grouped-mm-fused":  # the decoded activations are exactly the torch dequantization
    from nvfp4lib.peers.torch_peers import _dq_cat
    decoded = r.keepalive[1][: sum(p.m)]
    assert torch.equal(decoded, _dq_cat(x.a))
print("ok", err)
"""

_CASES = [
    ("triton", "E1-empty-group", False, "Candidate(32, 64, 64, 4, 1)"),
    ("triton", "C4", True, "Candidate(32, 64, 64, 4, 1)"),
    ("triton", "E3-ragged", False, "Candidate(32, 64, 128, 4, 1, True)"),
    ("triton", "C9", True, "Candidate(16, 32, 64, 4, 1, True)"),
    ("torch-grouped-mm-fused", "(3, 0, 40)", False, "None"),
    ("torch-grouped-mm-fused", "(17, 9)", True, "None"),
    ("torch-grouped-mm-fused", "(0, 0)", False, "None"),
]


@pytest.mark.slow
@pytest.mark.parametrize("backend, name, dual, cand", _CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in _CASES])
def test_triton_peers_are_exact_in_the_interpreter(backend, name, dual, cand):
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("triton")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run([sys.executable, "-c", _INTERPRETED, backend, name, "1" if dual else "0", cand], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]
