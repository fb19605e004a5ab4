"""ringattn: exact sequence-parallel ("ring") flash attention over libringattn's C API.

    import ringattn                  # numpy-level plans and communicators (ringattn.core)
    import ringattn.torch            # differentiable torch ops, torch.compile-able
    import ringattn.hf               # the Hugging Face AttentionInterface "ringattn"

Errors of the C library are raised as ringattn.RingattnError subclasses carrying the status and
ringattn_last_error()'s message.
"""
from ._capi import (CommError, CudaError, InvalidArgumentError, OutOfMemory, RingattnError,
                    UnsupportedError, UsageError, library_path)
from ._capi import lib as _lib
from .core import Comm, Plan
from .log import log_to

__version__ = _lib().ringattn_version_string().decode()


def cpu_kernels():
    """The instruction set the CPU backend's element-wise loops run on, in words: the wheel
    picks it when the library loads (x86-64-v4, v3 or baseline)."""
    return _lib().ringattn_cpu_kernels().decode()


__all__ = ["Comm", "Plan", "RingattnError", "InvalidArgumentError", "UsageError",
           "UnsupportedError", "CommError", "CudaError", "OutOfMemory", "library_path",
           "cpu_kernels", "log_to", "__version__"]
