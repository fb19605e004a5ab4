"""ringattn: exact sequence-parallel ("ring") flash attention over libringattn's C API.

    import ringattn                  # numpy-level plans and communicators (ringattn.core)
    import ringattn.torch            # differentiable torch ops, torch.compile-able
    import ringattn.hf               # the Hugging Face AttentionInterface "ringattn"
    ringattn.flash_attn_func, ...    # flash-attn 2's functions (ringattn.flash_attn), with group=
    import ringattn.ring_flash_attn  # ring-flash-attn's entry points under their own names

Errors of the C library are raised as ringattn.RingattnError subclasses carrying the status and
ringattn_last_error()'s message.
"""
from ._capi import (CommError, CudaError, InvalidArgumentError, OutOfMemory, RingattnError,
                    UnsupportedError, UsageError, library_path)
from ._capi import lib as _lib
from .core import Comm, Grid, Plan
from .log import log_to

__version__ = _lib().ringattn_version_string().decode()


def cpu_kernels():
    """The instruction set the CPU backend's element-wise loops run on, in words: the wheel
    picks it when the library loads (x86-64-v4, v3 or baseline)."""
    return _lib().ringattn_cpu_kernels().decode()


__all__ = ["Comm", "Grid", "Plan", "RingattnError", "InvalidArgumentError", "UsageError",
           "UnsupportedError", "CommError", "CudaError", "OutOfMemory", "library_path",
           "cpu_kernels", "log_to", "__version__"]


# flash-attn's spellings need torch: they load on first use (PEP 562), so that `import ringattn`
# stays numpy-only for those who never touch them
_FLASH_ATTN_NAMES = ("flash_attn_func", "flash_attn_varlen_func", "flash_attn_qkvpacked_func",
                     "flash_attn_kvpacked_func", "flash_attn_varlen_qkvpacked_func",
                     "flash_attn_varlen_kvpacked_func")


def __getattr__(name):
    if name in _FLASH_ATTN_NAMES:
        from . import flash_attn
        value = globals()[name] = getattr(flash_attn, name)
        return value
    if name == "ring_flash_attn":
        import importlib
        return importlib.import_module(".ring_flash_attn", __name__)
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def __dir__():
    return sorted(set(globals()) | set(_FLASH_ATTN_NAMES) | {"ring_flash_attn"})
