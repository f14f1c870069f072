"""EPMoE on 2 GPUs (issue 42; skipped with fewer, or off Hopper): both transports, W4A4 and W4A16, eager and one CUDA
graph replayed with new routings (random, an empty expert, every copy to one rank), against the single-GPU NVFP4MoE
on the concatenated batch of both ranks, and the device-side capacity check. Each (transport, activations) runs in 2
fresh processes (NCCL, one GPU each), eager calls then the graph in the same pair (the kernels compile once per
process; with a process pair per form the suite did not finish in 270 s on the 2-GPU machine), joined with a timeout:
one transport per process (a probe mixing both in one process hung).

Tolerances: the expert GEMMs may pick another tuned config for the EP layer's row count than for the single-GPU one
(another fp32 accumulation order: one bf16 ulp here and there; in W4A4 an ulp of the intermediate can move a code), so
W4A16 is held to 2e-3 normwise and W4A4 to 1e-2 (tests/gpu/test_moe_gpu.py's tolerance against the reference); each
case also prints whether it came out bit-identical.
"""
import faulthandler
import os
import time

import pytest
import torch

from tests.ranks import free_port, run_ranks

pytestmark = pytest.mark.gpu

E, H, INTER, W, CAP = 8, 256, 128, 2, 64
# each rank pair is joined within this many seconds; under an outer time limit set it below that limit, so that pytest
# still writes which test failed and why
TIMEOUT_S = int(os.environ.get("NVFP4LIB_EP_TEST_TIMEOUT_S", "300"))
TOL = {"bf16": 2e-3, "nvfp4": 1e-2}


def _needs_two_hoppers():
    if not torch.cuda.is_available() or torch.cuda.device_count() < W:
        pytest.skip(f"needs {W} GPUs")
    if torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("needs sm_90 (the cute-hopper backend)")


def _inputs(case: str, k: int, seed: int, t: int):
    """Both ranks' (x, ids, weights) on the CPU, the same on every rank; ``t`` tokens each."""
    g = torch.Generator().manual_seed(seed)
    experts = {"empty-expert": [e for e in range(E) if e not in (2, 5)], "one-rank": list(range(E // 2, E))}.get(
        case, list(range(E)))
    out = []
    for _ in range(W):
        x = torch.randn(t, H, generator=g).to(torch.bfloat16)
        ids = torch.stack([torch.tensor(experts)[torch.randperm(len(experts), generator=g)[:k]] for _ in range(t)])
        w = torch.softmax(torch.randn(t, k, generator=g), -1)
        out.append((x, ids, w))
    return out


def _rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def _worker(rank: int, port: int, transport: str, activations: str, put_rows: str = "shipped") -> None:
    import torch.distributed as dist

    from nvfp4lib.formats import quantize
    from nvfp4lib.nn import EPMoE, NVFP4MoE, ep_symm

    if put_rows != "shipped":  # this process's knobs (the symm-mem transport's index arithmetic and row writes)
        ep_symm.PUT_ROWS_TRITON = ep_symm.PLAN_TRITON = put_rows == "triton"
    # eager calls on the same kernels as the captured ones (the serving kernel's EAGER_FUSED off): W4A4 then compiles
    # each GEMM's config once per process, not twice (the fused eager kernel is tested in test_serving_gpu.py); the
    # suite did not finish inside the device's limits with both forms compiled in every process
    from nvfp4lib.kernels.hopper_varlen import kernel as varlen_kernel

    varlen_kernel.EAGER_FUSED = False

    # a rank that hangs prints where, before the test's join gives up on it
    faulthandler.dump_traceback_later(max(TIMEOUT_S - 20, 10), exit=False)
    t_start = time.monotonic()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", rank=rank, world_size=W, device_id=dev)
    try:
        g = torch.Generator().manual_seed(0)
        ws = [[quantize((torch.randn(n, kk, generator=g) * 0.05).to(torch.bfloat16).to(dev)) for _ in range(E)]
              for n, kk in ((INTER, H), (INTER, H), (H, INTER))]
        single = NVFP4MoE(*ws, activations=activations, backend="cute-hopper")
        k, t = 2, 48
        ep = EPMoE.shard(*ws, top_k=k, capacity=CAP, transport=transport, activations=activations,
                         backend="cute-hopper")
        cases = ["random", "empty-expert", "one-rank", "random"]

        def want_of(inputs):
            x, ids, w = (torch.cat(p).to(dev) for p in zip(*inputs))
            return single(x, ids, w)[rank * t:(rank + 1) * t]

        def check(form, case, got, want):
            err = _rel(got, want)
            print(f"rank {rank} {transport} {activations} {form} {case}: rel err {err:.3g}, "
                  f"bit-identical {torch.equal(got, want)}", flush=True)
            assert torch.isfinite(got).all() and err <= TOL[activations], (form, case, err)

        for i, case in enumerate(cases):  # eager calls
            inputs = _inputs(case, k, seed=10 + i, t=t)
            check("eager", case, ep(*[p.to(dev) for p in inputs[rank]]), want_of(inputs))
        # one CUDA graph, replayed with each case's inputs copied in
        x = torch.zeros(t, H, dtype=torch.bfloat16, device=dev)
        ids = torch.zeros(t, k, dtype=torch.int64, device=dev)
        ids[:, 1] = 1
        w = torch.full((t, k), 0.5, device=dev)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            ep(x, ids, w)  # warm on the capture's side stream: its first collectives
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = ep(x, ids, w)
        for i, case in enumerate(cases):
            inputs = _inputs(case, k, seed=20 + i, t=t)
            for dst, src in zip((x, ids, w), inputs[rank]):
                dst.copy_(src.to(dev))
            out.fill_(float("nan"))
            graph.replay()
            got = out.clone()
            ep.check()
            check("graphed", case, got, want_of(inputs))
        # free the graph before the process group goes: with the all-gather transport (NCCL collectives captured in
        # it) both ranks finished every check and the barrier within 46 s, then did not leave destroy_process_group
        # within 280 s (2x H200); the symm-mem transport's graph holds no NCCL collective and left at once. Freeing the
        # graph first is the likely cure, not yet run on the GPUs
        graph.reset()
        del graph
        print(f"rank {rank} {transport} {activations}: eager and graphed cases done in "
              f"{time.monotonic() - t_start:.0f} s; the capacity check next", flush=True)
        # the device-side capacity: 2·48 copies to rank 1 do not fit 120 copies a rank
        small = EPMoE.shard(*ws, top_k=k, capacity=CAP, recv_capacity=120, transport=transport,
                            activations=activations, backend="cute-hopper", eager_check=False)
        inputs = _inputs("one-rank", k, seed=99, t=t)
        got = small(*[p.to(dev) for p in inputs[rank]])
        assert int(small.overflow) == 2 * t * k - 120
        nan_rows = torch.isnan(got).any(dim=1).sum().reshape(1)
        dist.all_reduce(nan_rows)
        assert int(nan_rows) > 0
        with pytest.raises(RuntimeError, match="exceeded recv_capacity = 120"):
            small.check()
        torch.cuda.synchronize()
        dist.barrier()
        print(f"rank {rank} {transport} {activations}: done in {time.monotonic() - t_start:.0f} s", flush=True)
    finally:
        dist.destroy_process_group()  # (the stack dump stays armed through it: where the all-gather cases hung)
        faulthandler.cancel_dump_traceback_later()


@pytest.mark.parametrize("activations", ["nvfp4", "bf16"])
@pytest.mark.parametrize("transport", ["all-gather", "symm-mem"])
def test_ep_two_gpus(transport, activations):
    _needs_two_hoppers()
    run_ranks(_worker, (free_port(), transport, activations), W, TIMEOUT_S)


def test_ep_two_gpus_put_rows_torch_form():
    """The symm-mem transport in its torch form (nn.ep_symm.PLAN_TRITON and PUT_ROWS_TRITON off; the shipped Triton
    form runs in test_ep_two_gpus), W4A4: the same checks (eager, graphed, the capacity's NaN rows)."""
    _needs_two_hoppers()
    run_ranks(_worker, (free_port(), "symm-mem", "nvfp4", "torch"), W, TIMEOUT_S)
