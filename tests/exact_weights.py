"""Weights for the GPU decode tests: every E2M1 code in every 16-element block and every finite E4M3 scale in turn."""
import torch

from nvfp4lib.formats import NVFP4Tensor, pack_e2m1


def every_code_weights(n: int = 256, k: int = 256, device: str = "cuda") -> NVFP4Tensor:
    """An ``[n, k]`` NVFP4 matrix (global scale 1): each 16-element block holds the 16 codes in a seeded order, and the
    blocks' scales run through all 254 finite E4M3 bytes (signed, subnormal and zero) in turn."""
    gen = torch.Generator().manual_seed(0)
    codes = torch.stack([torch.randperm(16, generator=gen) for _ in range(n * k // 16)]).reshape(n, k)
    finite = torch.arange(256)[(torch.arange(256) & 0x7F) != 0x7F].to(torch.uint8)
    scales = finite.repeat(-(-n * k // 16 // len(finite)))[: n * k // 16].reshape(n, k // 16)
    return NVFP4Tensor(pack_e2m1(codes.to(torch.uint8)), scales.view(torch.float8_e4m3fn), 1.0).to(device)
