"""The sm_100a (B200) kernel, compiled for sm_100a and not run: :mod:`.plan` (limits, :class:`BlackwellConfig`, the
named configs, storage arithmetic, validation, host tables), :mod:`.kernel` (the kernel class, study form),
:mod:`.warp_specialized` (its warp-specialized form), :mod:`.runner` (compiling without a GPU, reports, the
``cute-blackwell`` backend). Importing this package imports cutlass.
"""
from .runner import *  # noqa: F401, F403
from .runner import __all__  # noqa: F401
