"""Peers: what a user would otherwise pick (cuBLAS through torch, torch._grouped_mm, torch.compile, Triton)."""
