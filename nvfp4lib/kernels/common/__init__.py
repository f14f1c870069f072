"""What several kernel families share: :mod:`.decode_ptx` (the E2M1 × E4M3 → fp16 decode as inline PTX, and its
CPU emulation), :mod:`.sm90` (Hopper's shared-memory limit, the decode's post-scale, the device check and the
torch → CuTe view), :mod:`.packing` (stacked weights, tile tables, activation packing) and :mod:`.compiling`
(compiling without a GPU, PTX and ptxas facts). Import the module you need; this package loads nothing itself."""
