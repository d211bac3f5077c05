"""mok: Mixture-of-Kittens MoE layers for NVLink domains, from Python.

    import mok
    layer = mok.MoE("glm-5.2", max_tokens=4096)        # PyTorch module (needs torch)
    out = layer(x, topk_idx, topk_w)                   # autograd: every gradient

The C API through ctypes (mok.Config, mok.Comm, mok.Layer, mok.MokError) needs only
libmok.so; mok.MoE, mok.moe, mok.comm_from_process_group and mok.reference_moe need PyTorch.
See python/README.md.
"""

from .capi import (IMPLS, Comm, Config, Contexts, Layer, MokError, get_unique_id, library_path, memory_estimate,
                   models, version)

_TORCH_NAMES = ("MoE", "moe", "comm_from_process_group", "reference_moe")

try:
    from ._torch import MoE, comm_from_process_group, moe, reference_moe  # noqa: F401
except ImportError as _e:  # no torch: the C API still works
    _torch_error = _e

    def __getattr__(name):
        if name in _TORCH_NAMES:
            raise ImportError("mok.%s needs PyTorch: %s" % (name, _torch_error))
        raise AttributeError("module 'mok' has no attribute %r" % name)

__all__ = ["IMPLS", "Comm", "Config", "Contexts", "Layer", "MokError", "get_unique_id", "library_path",
           "memory_estimate", "models", "version", *_TORCH_NAMES]
