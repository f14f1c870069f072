"""Expert parallelism on the CPU (issue 42), backend="reference": EPMoE on 2 ranks against the single-process NVFP4MoE
on the same weights, run on the concatenation of both ranks' tokens.

- the all-gather transport on 2 gloo processes (spawned, joined with a timeout): random routings, an empty expert,
  every copy to one rank, ranks with different token counts; W4A16 and W4A4 (dynamic and static scales); top-2
  bit-identical, top-3 up to the combine's summation order; the capacity errors (tokens on the host, token copies on
  the device: NaN rows, the counter, check());
- the symm-mem protocol (counts, receive offsets, rows placed in the owner's buffer and back) on 2 threads of this
  process sharing plain tensors as the symmetric heap: bit-identical for any k.
"""
import os
import threading

import pytest
import torch

from nvfp4lib.formats import quantize
from nvfp4lib.nn import EPMoE, NVFP4MoE
from nvfp4lib.nn.ep_symm import SymmetricHeap, SymmMemTransport
from tests.ranks import free_port, run_ranks

E, H, INTER, W = 8, 64, 32, 2
TIMEOUT_S = 120


def _weights(seed=0):
    g = torch.Generator().manual_seed(seed)

    def one(n, k):
        return quantize((torch.randn(n, k, generator=g) / k**0.5).to(torch.bfloat16))

    return [one(INTER, H) for _ in range(E)], [one(INTER, H) for _ in range(E)], [one(H, INTER) for _ in range(E)]


def _inputs(case: str, k: int, seed: int):
    """Both ranks' (x, topk_ids, topk_weights), the same on every rank (drawn from the seed)."""
    g = torch.Generator().manual_seed(seed)
    counts = {"random": (5, 7), "uneven": (6, 1), "empty-expert": (7, 7), "one-rank": (7, 4), "full": (8, 8)}[case]
    experts = {"empty-expert": [e for e in range(E) if e != 3], "one-rank": list(range(E // 2, E))}.get(
        case, list(range(E)))
    out = []
    for t in counts:
        x = torch.randn(t, H, generator=g)
        ids = torch.stack([torch.tensor(experts)[torch.randperm(len(experts), generator=g)[:k]] for _ in range(t)])
        w = torch.softmax(torch.randn(t, k, generator=g), -1)
        out.append((x, ids.reshape(t, k), w))
    return out


def _expected(ws, inputs, rank, activations, input_scales=None):
    single = NVFP4MoE(*ws, activations=activations, backend="reference", quantizer="torch", input_scales=input_scales)
    x, ids, w = (torch.cat(p) for p in zip(*inputs))
    start = sum(p[0].shape[0] for p in inputs[:rank])
    return single(x, ids, w)[start:start + inputs[rank][0].shape[0]]


CASES = ("random", "uneven", "empty-expert", "one-rank", "full")


def _compare(got, want, k, exact: bool, what: str):
    if exact:
        assert torch.equal(got, want), f"{what}: max |diff| {(got - want).abs().max()}"
    else:  # fp32 sums of k terms in another order
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, msg=what)


# -- 2 gloo processes: the all-gather transport ----------------------------------------------------------------------

def _gloo_worker(rank: int, port: int) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=W)
    try:
        from nvfp4lib.nn import ep as ep_module

        ws = _weights()
        shipped, once = ep_module.GATHER_QUANTIZE_MAX_TOKENS, ep_module.GATHER_QUANTIZE_ONCE_MIN_TOKENS
        # W4A4 with a dynamic scale every way: x's rows quantized after the gather (decode sizes), each owned copy's
        # row (the once-form off: a threshold above the gather-quantize sizes) or each token once and its copies'
        # codes gathered (threshold 0; these steps' 16 tokens are under the shipped threshold); and NVFP4 rows sent
        # after an all-reduce of the amax (the knob at 0: larger steps)
        for activations, scales, most, least in (("bf16", None, shipped, once), ("nvfp4", None, shipped, shipped + 1),
                                                 ("nvfp4", None, shipped, 0), ("nvfp4", None, 0, once),
                                                 ("nvfp4", (0.01, 0.002), shipped, once)):
            ep_module.GATHER_QUANTIZE_MAX_TOKENS, ep_module.GATHER_QUANTIZE_ONCE_MIN_TOKENS = most, least
            for k in (2, 3):
                ep = EPMoE.shard(*ws, top_k=k, capacity=8, activations=activations, backend="reference",
                                 quantizer="torch", input_scales=scales)
                assert ep.quantize_gathered == (activations == "nvfp4" and scales is None and most > 0)
                for i, case in enumerate(CASES):
                    inputs = _inputs(case, k, seed=100 * k + i)
                    got = ep(*inputs[rank])
                    want = _expected(ws, inputs, rank, activations, scales)
                    _compare(got, want, k, exact=k == 2,
                             what=f"all-gather {activations} {scales} k={k} {case} gather-quantize<={most} "
                                  f"once>={least}")
        ep_module.GATHER_QUANTIZE_MAX_TOKENS, ep_module.GATHER_QUANTIZE_ONCE_MIN_TOKENS = shipped, once
        # capacity, host side: more tokens than the buffers hold (a shape: both ranks refuse before communicating)
        ep = EPMoE.shard(*ws, top_k=2, capacity=8, activations="bf16", backend="reference")
        with pytest.raises(ValueError, match="capacity = 8"):
            ep(torch.zeros(9, H), torch.zeros(9, 2, dtype=torch.int64), torch.ones(9, 2))
        # capacity, device side: 12 copies may reach a rank; every copy goes to rank 1's experts
        inputs = _inputs("one-rank", 2, seed=7)
        ep = EPMoE.shard(*ws, top_k=2, capacity=8, recv_capacity=12, activations="bf16", backend="reference")
        with pytest.raises(RuntimeError, match="10 token copies exceeded recv_capacity = 12"):
            ep(*inputs[rank])  # 7 + 4 tokens, 22 copies to rank 1: 10 dropped
        assert int(ep.overflow) == 0  # check() reset it
        ep.eager_check = False
        out = ep(*inputs[rank])
        dropped = torch.isnan(out).any(dim=1)
        nan_rows = dropped.sum().reshape(1)
        dist.all_reduce(nan_rows)
        assert int(nan_rows) > 0 and int(ep.overflow) == 10
        want = _expected(ws, inputs, rank, "bf16")
        assert torch.equal(out[~dropped], want[~dropped])  # the tokens whose copies all fit are exact
        with pytest.raises(RuntimeError, match="exceeded"):
            ep.check()
        # the symm-mem transport refuses the CPU, with a clear error
        with pytest.raises(ValueError, match="needs CUDA"):
            EPMoE.shard(*ws, top_k=2, capacity=8, transport="symm-mem", activations="bf16", backend="reference")
    finally:
        dist.destroy_process_group()


def test_all_gather_transport_on_two_gloo_processes():
    run_ranks(_gloo_worker, (free_port(),), W, TIMEOUT_S)


# -- the symm-mem protocol on 2 threads -------------------------------------------------------------------------------

class ThreadHeap(SymmetricHeap):
    """W ranks as threads of one process: buffers are plain tensors in a shared dict, the barrier a thread barrier."""

    def __init__(self, rank, world, shared, barrier):
        self.rank, self.world, self.shared, self._barrier = rank, world, shared, barrier

    def alloc(self, name, shape, dtype, device):
        self.shared[(name, self.rank)] = torch.full(shape, 77, dtype=dtype, device=device)  # garbage, not zeros
        self.barrier()

    def peer(self, rank, name):
        return self.shared[(name, rank)]

    def barrier(self):
        self._barrier.wait(timeout=60)


def _on_threads(fn):
    shared, barrier, errors = {}, threading.Barrier(W), []

    def run(rank):
        try:
            fn(rank, ThreadHeap(rank, W, shared, barrier))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append((rank, e))
            barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(W)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=TIMEOUT_S)
    assert not any(t.is_alive() for t in threads), "a rank thread hung"
    if errors:
        raise errors[0][1]


def symm_steps_on_two_threads(activations):
    """Every case at k = 2 and 3 through the symm-mem transport on 2 thread ranks, steps one after another on the same
    buffers, each bit-identical to the single-process layer (tests/test_ep_symm_triton.py runs it in Triton's form)."""
    ws = _weights()

    def rank_fn(rank, heap):
        for k in (2, 3):
            ep = EPMoE.shard(*ws, top_k=k, capacity=8, transport=SymmMemTransport(heap=heap),
                             activations=activations, backend="reference", quantizer="torch")
            for i, case in enumerate(CASES):
                inputs = _inputs(case, k, seed=100 * k + i)
                got = ep(*inputs[rank])  # steps one after another: the buffers are reused, never reset
                want = _expected(ws, inputs, rank, activations)
                _compare(got, want, k, exact=True, what=f"symm-mem {activations} k={k} {case}")

    _on_threads(rank_fn)


@pytest.mark.parametrize("activations", ["bf16", "nvfp4"])
def test_symm_mem_protocol_on_two_threads(activations):
    symm_steps_on_two_threads(activations)


def symm_overflow_on_two_threads():
    """A receive capacity too small for a step: the copies that do not fit come back NaN, the rest exact, and the
    overflow is counted and raised by check()."""
    ws = _weights()
    inputs = _inputs("one-rank", 2, seed=7)

    def rank_fn(rank, heap):
        ep = EPMoE.shard(*ws, top_k=2, capacity=8, recv_capacity=12, transport=SymmMemTransport(heap=heap),
                         activations="bf16", backend="reference", eager_check=False)
        out = ep(*inputs[rank])
        dropped = torch.isnan(out).any(dim=1)
        # rank 0's 14 copies come first in rank 1's buffer (12 fit), rank 1's 8 do not fit: both lose tokens
        assert int(ep.overflow) == 10 and bool(dropped.any())
        want = _expected(ws, inputs, rank, "bf16")
        assert torch.equal(out[~dropped], want[~dropped])
        with pytest.raises(RuntimeError, match="10 token copies exceeded"):
            ep.check()

    _on_threads(rank_fn)


def test_symm_mem_protocol_overflow_on_two_threads():
    symm_overflow_on_two_threads()
