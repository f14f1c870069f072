"""CuTe DSL kernels (Hopper sm_90a: runs here; Blackwell sm_100a: compiled, not run) and their configs."""
