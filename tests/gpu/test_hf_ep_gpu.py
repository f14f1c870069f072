"""Expert-parallel loading (issue 42) on 2 GPUs (skipped with fewer, or off Hopper): ``from_pretrained(...,
ep_group=)`` on the cute-hopper backend against the single-GPU model loaded in the same process, per transport,
W4A4 and W4A16, Qwen3-MoE (ModelOpt) and Mixtral (compressed-tensors). Each case runs in 2 fresh processes (NCCL, one
GPU each), joined with a timeout, as tests/gpu/test_ep_gpu.py does.

Each case checks: every MoE layer holds E/W experts and the EP model takes less GPU memory than the single-GPU one;
the EP model's logits on each rank's batch against the single-GPU model's on those sequences; greedy decoding of the
EP model under one CUDA graph per step (the transports' collectives captured with the rest) identical to its eager
decoding. Tolerances (normwise relative, the logits): tests/gpu/test_hf_gpu.py's, 2e-2 (W4A16) and 1e-1 (W4A4): the
EP layer's GEMMs run another row count than the single-GPU layer's (another tuned config may sum in another fp32
order) and the all-gather transport sums top-4 copies in another order (one bf16 ulp here and there), which W4A4's
re-quantization of every layer's input can turn into a whole E2M1 step; a wrong expert or scale is off by O(1). Each
case prints its errors and whether the logits came out bit-identical.
"""
import os
from datetime import timedelta

import pytest
import torch

from tests.ranks import free_port, run_ranks

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

pytestmark = pytest.mark.gpu

W, CAP = 2, 64
# each rank pair is joined within this many seconds; under an outer time limit set it below that limit, so that pytest
# still writes which test failed and why
TIMEOUT_S = int(os.environ.get("NVFP4LIB_EP_TEST_TIMEOUT_S", "300"))
TOL = {"bf16": 2e-2, "nvfp4": 1e-1}
MEDIUM = dict(layers=2, hidden=256, experts=16, moe_intermediate=128, heads=4, kv_heads=2, head_dim=64, vocab=512,
              top_k=4)
CASES = [("all-gather", "nvfp4", "qwen3_moe", "modelopt"), ("all-gather", "bf16", "mixtral", "compressed-tensors"),
         ("symm-mem", "nvfp4", "mixtral", "compressed-tensors"), ("symm-mem", "bf16", "qwen3_moe", "modelopt")]


def _needs_two_hoppers():
    if not torch.cuda.is_available() or torch.cuda.device_count() < W:
        pytest.skip(f"needs {W} GPUs")
    if torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("needs sm_90 (the cute-hopper backend)")


def _rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm())


def _loaded(dev, **kw):
    """A loaded model and the GPU memory it took."""
    from nvfp4lib.hf import from_pretrained

    torch.cuda.synchronize(dev)
    base = torch.cuda.memory_allocated(dev)
    model = from_pretrained(device=dev, **kw)
    torch.cuda.synchronize(dev)
    return model, torch.cuda.memory_allocated(dev) - base


def _worker(rank: int, port: int, path: str, transport: str, activations: str) -> None:
    import torch.distributed as dist

    from nvfp4lib.hf import generate
    from nvfp4lib.hf.modules import NVFP4Experts
    from nvfp4lib.kernels.hopper_varlen import kernel as varlen_kernel
    from nvfp4lib.nn import EPMoE

    varlen_kernel.EAGER_FUSED = False  # one compile per GEMM config per process (see tests/gpu/test_ep_gpu.py)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", rank=rank, world_size=W, device_id=dev, timeout=timedelta(seconds=120))
    try:
        what = f"rank {rank} {transport} {activations} {os.path.basename(path)}"
        single, single_bytes = _loaded(dev, path=path, activations=activations)
        ep, ep_bytes = _loaded(dev, path=path, activations=activations, ep_group=dist.group.WORLD, ep_capacity=CAP,
                               ep_transport=transport)
        layers = [m.moe for m in ep.modules() if isinstance(m, NVFP4Experts)]
        assert layers and all(isinstance(m, EPMoE) and m.local.experts == m.experts // W for m in layers), what
        print(f"{what}: GPU memory {ep_bytes / 2**20:.2f} MiB EP, {single_bytes / 2**20:.2f} MiB single", flush=True)
        assert ep_bytes < single_bytes, what

        g = torch.Generator().manual_seed(0)
        ids = [torch.randint(0, 512, (2, 24), generator=g) for _ in range(W)][rank].to(dev)
        with torch.no_grad():
            got, want = ep(ids).logits, single(ids).logits
        err = _rel(got, want)
        print(f"{what}: logits rel err {err:.3g}, bit-identical {torch.equal(got, want)}", flush=True)
        assert torch.isfinite(got).all() and err <= TOL[activations], (what, err)

        prompt = torch.tensor([[3, 14, 15, 92, 65]] * 4) + rank
        eager, _ = generate(ep, prompt, 16)
        graphed, stats = generate(ep, prompt, 16, cuda_graph=True)
        alone, _ = generate(single, prompt, 16, cuda_graph=True)
        print(f"{what}: graphed {stats['global_tokens_per_s']:.1f} tokens/s over {W} ranks; the single GPU's tokens: "
              f"{torch.equal(graphed, alone)}", flush=True)
        assert torch.equal(eager, graphed), what
        torch.cuda.synchronize()
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    from nvfp4lib.hf import make_checkpoint

    root = tmp_path_factory.mktemp("hf_ep_gpu")
    made = {}

    def get(arch, fmt):
        if (arch, fmt) not in made:
            made[(arch, fmt)] = make_checkpoint(root / f"{arch}-{fmt}", arch=arch, fmt=fmt, shard_bytes=1 << 20,
                                                **MEDIUM)
        return made[(arch, fmt)]

    return get


@pytest.mark.parametrize("transport,activations,arch,fmt", CASES)
def test_ep_loaded_model_two_gpus(ckpts, transport, activations, arch, fmt):
    _needs_two_hoppers()
    path = str(ckpts(arch, fmt))
    run_ranks(_worker, (free_port(), path, transport, activations), W, TIMEOUT_S)
