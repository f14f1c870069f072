"""CuTe DSL kernels (Hopper sm_90a: runs here; Blackwell sm_100a: compiled, not run), one folder per family.

- :mod:`.hopper_smem`: the smem-decode Hopper kernel (both operands decoded into shared memory) and the
  ``cute-hopper`` backend, which also dispatches to the register-decode family;
- :mod:`.hopper_rs`: the register-decode swap-AB Hopper kernel (weights decoded into wgmma's register operand);
- :mod:`.hopper_varlen`: the register-decode kernel for serving (prepared weights, device-side group offsets);
- :mod:`.blackwell`: the sm_100a kernel (compiled, not run);
- :mod:`.common`: what several families share (the decode PTX, Hopper facts, packing, offline compiling).

Nothing here imports the bench, the store, the API or the notebooks (``tests/test_layout.py``).
"""
