"""mok's C API through ctypes: no PyTorch needed here.

Loads libmok.so (``$MOK_LIBRARY``, else ``build/libmok.so`` of the checkout this file is in,
else the system's ``libmok.so``) and wraps the calls the PyTorch binding uses. Every failing
call raises :class:`MokError` with the status and the library's message.
"""

import ctypes
import ctypes.util
import os

__all__ = ["MokError", "Config", "Comm", "Layer", "Contexts", "IMPLS", "models", "version", "get_unique_id",
           "library_path"]

# mokImpl_t
IMPLS = {"auto": 0, "baseline": 1, "nccl": 2, "mega": 3}
# mokDtype_t
DTYPES = {"bf16": 0, "fp32": 1}

_STATUS = ["mokSuccess", "mokInvalidArgument", "mokInvalidUsage", "mokOutOfMemory", "mokCudaError",
           "mokNcclError", "mokNotSupported", "mokTimeout", "mokDeviceError", "mokInternalError"]


class MokError(RuntimeError):
    """A mok call failed. ``status`` is the mokResult_t value, ``name`` its name."""

    def __init__(self, status, message):
        self.status = int(status)
        self.name = _STATUS[self.status] if 0 <= self.status < len(_STATUS) else "mokUnknownResult"
        super().__init__("%s: %s" % (self.name, message))


class _Config(ctypes.Structure):  # mokConfig_t
    _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint32), ("version", ctypes.c_uint32),
                ("num_experts", ctypes.c_int), ("hidden", ctypes.c_int), ("inter", ctypes.c_int),
                ("topk", ctypes.c_int), ("shared_inter", ctypes.c_int), ("num_ranks", ctypes.c_int),
                ("max_tokens", ctypes.c_int), ("grad_dtype", ctypes.c_int), ("swiglu_limit", ctypes.c_float),
                ("row_pad", ctypes.c_int)]


class _CommConfig(ctypes.Structure):  # mokCommConfig_t
    _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint32), ("version", ctypes.c_uint32),
                ("timeout_ms", ctypes.c_int), ("workspace_bytes", ctypes.c_size_t)]


class _UniqueId(ctypes.Structure):  # mokUniqueId_t
    _fields_ = [("internal", ctypes.c_char * 128)]


class _RankInput(ctypes.Structure):  # mokRankInput_t
    _fields_ = [("num_tokens", ctypes.c_int), ("x", ctypes.c_void_p), ("topk_idx", ctypes.c_void_p),
                ("topk_w", ctypes.c_void_p)]


class _RankWeights(ctypes.Structure):  # mokRankWeights_t
    _fields_ = [(n, ctypes.c_void_p) for n in ("w_gate", "w_up", "w_down", "s_gate", "s_up", "s_down")]


class _RankGrads(ctypes.Structure):  # mokRankGrads_t
    _fields_ = [(n, ctypes.c_void_p) for n in ("d_x", "d_topk_w", "d_w_gate", "d_w_up", "d_w_down", "d_s_gate",
                                               "d_s_up", "d_s_down")] + [("accumulate", ctypes.c_int)]


_lib = None
_path = None


def _candidates():
    env = os.environ.get("MOK_LIBRARY")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    out = [os.path.join(here, "..", "..", "build", "libmok.so")]
    found = ctypes.util.find_library("mok")
    if found:
        out.append(found)
    return out


def _load():
    global _lib, _path
    if _lib is not None:
        return _lib
    errors = []
    for p in _candidates():
        try:
            lib = ctypes.CDLL(p)
        except OSError as e:
            errors.append("%s: %s" % (p, e))
            continue
        _path = os.path.abspath(p) if os.path.exists(p) else p
        _declare(lib)
        _lib = lib
        return lib
    raise ImportError("mok: cannot load libmok.so (build it with `make`, or set MOK_LIBRARY): " + "; ".join(errors))


def _declare(lib):
    P, I, V = ctypes.POINTER, ctypes.c_int, ctypes.c_void_p
    sig = {
        "mokGetErrorName": ([I], ctypes.c_char_p),
        "mokGetLastError": ([], ctypes.c_char_p),
        "mokGetVersion": ([P(I)], I),
        "mokConfigInit": ([P(_Config)], I),
        "mokConfigSetModel": ([P(_Config), ctypes.c_char_p], I),
        "mokModelName": ([I, P(ctypes.c_char_p), P(I)], I),
        "mokLayerCreate": ([P(V), P(_Config)], I),
        "mokLayerCreateOnComm": ([P(V), P(_Config), V], I),
        "mokLayerDestroy": ([V], I),
        "mokLayerGetConfig": ([V, P(_Config)], I),
        "mokLayerGetLastError": ([V], ctypes.c_char_p),
        "mokLayerForward": ([V, I, P(_RankInput), P(_RankWeights), V, V], I),
        "mokLayerBackward": ([V, I, P(_RankInput), P(_RankWeights), V, P(_RankGrads), V], I),
        "mokLayerReserve": ([V, I, V], I),
        "mokLayerSetRecvCapacity": ([V, ctypes.c_int64], I),
        "mokLayerGetAsyncError": ([V, P(I)], I),
        "mokLayerMemoryInfo": ([V, P(ctypes.c_size_t), P(ctypes.c_size_t)], I),
        "mokLayerTrim": ([V, ctypes.c_uint, V], I),
        "mokLayerMemoryEstimate": ([P(_Config), I, I, I, P(ctypes.c_size_t), P(ctypes.c_size_t)], I),
        "mokCommConfigInit": ([P(_CommConfig)], I),
        "mokGetUniqueId": ([P(_UniqueId)], I),
        "mokCommInitRank": ([P(V), I, P(_UniqueId), I, I, P(_CommConfig)], I),
        "mokCommDestroy": ([V], I),
        "mokCommRankInfo": ([V, P(I), P(I), P(I)], I),
        "mokCommGetLastError": ([V], ctypes.c_char_p),
        "mokCommGetAsyncError": ([V, P(I)], I),
        "mokReferenceForward": ([V, P(_RankInput), P(_RankWeights), P(V), V], I),
        "mokReferenceBackward": ([V, P(_RankInput), P(_RankWeights), P(V), P(_RankGrads)], I),
    }
    for name, (args, res) in sig.items():
        f = getattr(lib, name)
        f.argtypes = args
        f.restype = res


def library_path():
    """The path of the libmok.so this module loaded."""
    _load()
    return _path


def _text(b):
    return b.decode("utf-8", "replace") if b else ""


def _check(status, message=None):
    if status != 0:
        raise MokError(status, message if message is not None else _text(_load().mokGetLastError()))


def version():
    """MOK_VERSION_CODE of the loaded library (major * 10000 + minor * 100 + patch)."""
    v = ctypes.c_int(0)
    _check(_load().mokGetVersion(ctypes.byref(v)))
    return v.value


def models():
    """The model names mokConfigSetModel knows."""
    lib = _load()
    count = ctypes.c_int(0)
    name = ctypes.c_char_p()
    _check(lib.mokModelName(0, ctypes.byref(name), ctypes.byref(count)))
    out = []
    for i in range(count.value):
        _check(lib.mokModelName(i, ctypes.byref(name), None))
        out.append(_text(name.value))
    return out


class Config:
    """A mokConfig_t. ``Config("glm-5.2", max_tokens=4096)`` or every field by keyword:
    num_experts, hidden, inter, topk, shared_inter, num_ranks, max_tokens, grad_dtype
    ("bf16" or "fp32"), swiglu_limit, row_pad. Checked by the library when a layer is made."""

    FIELDS = ("num_experts", "hidden", "inter", "topk", "shared_inter", "num_ranks", "max_tokens", "grad_dtype",
              "swiglu_limit", "row_pad")

    def __init__(self, model=None, **fields):
        lib = _load()
        self._c = _Config()
        _check(lib.mokConfigInit(ctypes.byref(self._c)))
        if self._c.size != ctypes.sizeof(_Config):
            raise MokError(9, "mokConfig_t is %d bytes in libmok.so and %d in mok/capi.py: they must agree"
                           % (self._c.size, ctypes.sizeof(_Config)))
        if model is not None:
            _check(lib.mokConfigSetModel(ctypes.byref(self._c), model.encode()))
        for k, v in fields.items():
            setattr(self, k, v)

    def __setattr__(self, k, v):
        if k == "_c":
            object.__setattr__(self, k, v)
        elif k not in Config.FIELDS:
            raise AttributeError("mok.Config has no field %r (fields: %s)" % (k, ", ".join(Config.FIELDS)))
        elif k == "grad_dtype":
            if v not in DTYPES:
                raise ValueError("grad_dtype %r: must be one of %s" % (v, sorted(DTYPES)))
            self._c.grad_dtype = DTYPES[v]
        else:
            setattr(self._c, k, v)

    def __getattr__(self, k):
        if k == "grad_dtype":
            return "fp32" if self._c.grad_dtype == DTYPES["fp32"] else "bf16"
        if k in Config.FIELDS:
            return getattr(self._c, k)
        raise AttributeError(k)

    def __repr__(self):
        return "mok.Config(%s)" % ", ".join("%s=%r" % (k, getattr(self, k)) for k in Config.FIELDS)

    def validated(self):
        """The config as the library fills it in (defaults set); raises MokError naming a bad field."""
        lib = _load()
        h = ctypes.c_void_p()
        _check(lib.mokLayerCreate(ctypes.byref(h), ctypes.byref(self._c)))
        out = Config()
        try:
            _check(lib.mokLayerGetConfig(h, ctypes.byref(out._c)))
        finally:
            lib.mokLayerDestroy(h)
        return out


def memory_estimate(config, num_tokens=None, impl="auto", worst=False, contexts=1):
    """(layer_bytes, comm_scratch_bytes): the device memory one GPU needs for a layer of `config`
    (a Config; num_ranks = the EP size) after passes of num_tokens tokens a rank (default
    max_tokens), with routes spread evenly over the experts or under the worst routing
    (mokLayerMemoryEstimate: computed on the host, no GPU); layer_bytes for `contexts` forwards
    in flight (mok.MoE's contexts: a layer's own each). A model of L layers on one comm needs
    about L * layer_bytes + comm_scratch_bytes."""
    if isinstance(contexts, bool) or not isinstance(contexts, int) or not 1 <= contexts <= 64:
        raise ValueError("mok.memory_estimate: contexts %r: an int from 1 to 64" % (contexts,))
    lib = _load()
    T = config.max_tokens if num_tokens is None else int(num_tokens)
    own, scratch = ctypes.c_size_t(), ctypes.c_size_t()
    _check(lib.mokLayerMemoryEstimate(ctypes.byref(config._c), Layer._impl(impl), T, int(bool(worst)),
                                      ctypes.byref(own), ctypes.byref(scratch)))
    return own.value * contexts, scratch.value


def get_unique_id():
    """128 fresh bytes for Comm(..., unique_id=...) (ncclGetUniqueId)."""
    u = _UniqueId()
    _check(_load().mokGetUniqueId(ctypes.byref(u)))
    return ctypes.string_at(ctypes.byref(u), 128)


class Comm:
    """A mok communicator: one rank on one GPU. ``Comm(device)`` for one GPU alone; for a
    process per GPU every rank calls ``Comm(device, num_ranks=N, rank=r, unique_id=id)`` with
    the same 128-byte id from ``get_unique_id()`` on one rank (``mok.comm_from_process_group``
    does this over torch.distributed). Collective: every rank creates and closes it together."""

    def __init__(self, device=0, num_ranks=1, rank=0, unique_id=None, timeout_ms=0, workspace_bytes=0):
        lib = _load()
        if unique_id is None:
            if num_ranks != 1:
                raise ValueError("mok.Comm: num_ranks=%d needs the unique_id of rank 0 (mok.get_unique_id)" % num_ranks)
            unique_id = get_unique_id()
        if not isinstance(unique_id, (bytes, bytearray)) or len(unique_id) != 128:
            raise ValueError("mok.Comm: unique_id must be the 128 bytes of mok.get_unique_id()")
        u = _UniqueId()
        ctypes.memmove(ctypes.byref(u), bytes(unique_id), 128)
        cc = _CommConfig()
        _check(lib.mokCommConfigInit(ctypes.byref(cc)))
        cc.timeout_ms = timeout_ms
        cc.workspace_bytes = workspace_bytes
        self._h = ctypes.c_void_p()
        _check(lib.mokCommInitRank(ctypes.byref(self._h), num_ranks, ctypes.byref(u), rank, device, ctypes.byref(cc)))
        r, n, d = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        _check(lib.mokCommRankInfo(self._h, ctypes.byref(r), ctypes.byref(n), ctypes.byref(d)))
        self.rank, self.num_ranks, self.device = r.value, n.value, d.value
        self._layers = 0

    @property
    def handle(self):
        if not self._h:
            raise MokError(2, "mok.Comm: used after close()")
        return self._h

    def async_error(self):
        """None, or the MokError a kernel recorded on the device (a timeout, a bad expert id).
        Sticky: after one, close the comm and make a new one."""
        st = ctypes.c_int(0)
        _check(_load().mokCommGetAsyncError(self.handle, ctypes.byref(st)))
        return None if st.value == 0 else MokError(st.value, _text(_load().mokCommGetLastError(self.handle)))

    def close(self):
        """Collective. Frees the comm (and its NCCL communicator); close its layers first."""
        if getattr(self, "_h", None):
            if self._layers:
                raise MokError(2, "mok.Comm.close: %d layer(s) made on this comm are still open" % self._layers)
            h, self._h = self._h, ctypes.c_void_p()
            _check(_load().mokCommDestroy(h))

    def __del__(self):
        try:
            if getattr(self, "_h", None) and not self._layers:
                self.close()
        except Exception:
            pass


def reference(config, num_tokens, x, topk_idx, topk_w, weights, out, d_out=None, grads=None):
    """mok's float64 CPU reference of one rank holding every expert (num_ranks 1), on HOST
    pointers (ints): the forward into out [T, H] bf16 and, with d_out, the backward into grads
    (d_x, d_topk_w, d_w_gate, d_w_up, d_w_down, d_s_gate, d_s_up, d_s_down; weight gradients
    in config.grad_dtype). weights: (w_gate, w_up, w_down, s_gate, s_up, s_down)."""
    lib = _load()
    if config.num_ranks != 1:
        raise ValueError("mok.capi.reference: num_ranks must be 1 here (the C API takes every rank's inputs)")
    h = ctypes.c_void_p()
    _check(lib.mokLayerCreate(ctypes.byref(h), ctypes.byref(config._c)))
    try:
        inp = _RankInput(num_tokens, x, topk_idx, topk_w)
        w = _RankWeights(*weights)
        _check(lib.mokReferenceForward(h, ctypes.byref(inp), ctypes.byref(w), (ctypes.c_void_p * 1)(out), None))
        if d_out is not None:
            g = _RankGrads(*grads)
            _check(lib.mokReferenceBackward(h, ctypes.byref(inp), ctypes.byref(w), (ctypes.c_void_p * 1)(d_out),
                                            ctypes.byref(g)))
    finally:
        lib.mokLayerDestroy(h)


class Layer:
    """A mok layer on a comm (mokLayerCreateOnComm; collective; num_ranks is the comm's,
    whatever the config says). Its forward and backward take
    raw device pointers (ints); the PyTorch binding (mok.MoE, mok.moe) builds on it."""

    def __init__(self, config, comm):
        lib = _load()
        c = _Config()
        ctypes.memmove(ctypes.byref(c), ctypes.byref(config._c), ctypes.sizeof(_Config))
        c.num_ranks = comm.num_ranks  # the comm says how many ranks there are
        self.comm = comm
        self._h = ctypes.c_void_p()
        _check(lib.mokLayerCreateOnComm(ctypes.byref(self._h), ctypes.byref(c), comm.handle))
        comm._layers += 1
        self.config = Config()
        _check(lib.mokLayerGetConfig(self._h, ctypes.byref(self.config._c)))
        self.local_experts = self.config.num_experts // self.config.num_ranks
        self.generation = 0  # forwards run so far: the backward checks it ran the last one

    @property
    def handle(self):
        if not self._h:
            raise MokError(2, "mok.Layer: used after close()")
        return self._h

    def _err(self, status):
        if status != 0:
            msg = _text(_load().mokLayerGetLastError(self._h)) or _text(_load().mokGetLastError())
            raise MokError(status, msg)

    @staticmethod
    def _impl(impl):
        if isinstance(impl, int):
            return impl
        if impl not in IMPLS:
            raise ValueError("impl %r: must be one of %s" % (impl, ", ".join(IMPLS)))
        return IMPLS[impl]

    def forward_raw(self, impl, num_tokens, x, topk_idx, topk_w, weights, out, stream):
        """mokLayerForward on device pointers. weights: (w_gate, w_up, w_down, s_gate, s_up, s_down)."""
        inp = _RankInput(num_tokens, x, topk_idx, topk_w)
        w = _RankWeights(*weights)
        self._err(_load().mokLayerForward(self.handle, self._impl(impl), ctypes.byref(inp), ctypes.byref(w),
                                          out, stream))
        self.generation += 1

    def backward_raw(self, impl, num_tokens, x, topk_idx, topk_w, weights, d_out, grads, stream, accumulate=False):
        """mokLayerBackward on device pointers. grads: (d_x, d_topk_w, d_w_gate, d_w_up, d_w_down,
        d_s_gate, d_s_up, d_s_down). accumulate: add the weight gradients to what their buffers
        hold (fp32 grad_dtype) instead of overwriting them."""
        inp = _RankInput(num_tokens, x, topk_idx, topk_w)
        w = _RankWeights(*weights)
        g = _RankGrads(*grads, int(bool(accumulate)))
        self._err(_load().mokLayerBackward(self.handle, self._impl(impl), ctypes.byref(inp), ctypes.byref(w), d_out,
                                           ctypes.byref(g), stream))
        if impl == "mega":  # its backward consumed the forward's saved rows: another needs it again
            self.generation += 1

    def memory_info(self):
        """(layer_bytes, comm_scratch_bytes): device memory the layer holds now (its saved rows,
        sized by its passes' rows, and index arrays), and the scratch its comm's layers share."""
        own, scratch = ctypes.c_size_t(), ctypes.c_size_t()
        self._err(_load().mokLayerMemoryInfo(self.handle, ctypes.byref(own), ctypes.byref(scratch)))
        return own.value, scratch.value

    def trim(self, saved=True, scratch=True, stream=None):
        """Frees the layer's saved rows (saved: its last forward's context is dropped, a backward
        then runs the forward again) and its comm's scratch (scratch), in stream order after
        their last passes (mokLayerTrim); the next pass allocates them again."""
        self._err(_load().mokLayerTrim(self.handle, (1 if saved else 0) | (2 if scratch else 0), stream))
        if saved:
            self.generation += 1

    def reserve(self, num_tokens, stream=None):
        """Grows the layer's and its comm's blocks now to what a pass of num_tokens tokens needs under
        the worst routing (mokLayerReserve): later passes of that size allocate nothing (CUDA graph
        capture). Drops the last forward's context if the layer's block grows."""
        self._err(_load().mokLayerReserve(self.handle, int(num_tokens), stream))
        self.generation += 1

    def set_recv_capacity(self, routes):
        """Collective, the same value on every rank (mokLayerSetRecvCapacity). impl "mega" at N > 1:
        the most routes this rank receives in a forward; then no pass waits on the host (CUDA graphs),
        and a pass that cannot run everywhere writes nothing and records a device error. 0: each
        forward reads the rows received on the host (the default)."""
        self._err(_load().mokLayerSetRecvCapacity(self.handle, int(routes)))

    def async_error(self):
        """None, or the text of a pass refused on the device since the last call (mokLayerGetAsyncError;
        with a receive capacity no host sees it). Reading clears it."""
        st = ctypes.c_int()
        self._err(_load().mokLayerGetAsyncError(self.handle, ctypes.byref(st)))
        return None if st.value == 0 else _load().mokLayerGetLastError(self.handle).decode()

    def close(self):
        """Collective. Frees the layer's device memory (waits for its device)."""
        if getattr(self, "_h", None):
            h, self._h = self._h, ctypes.c_void_p()
            self.comm._layers -= 1
            _check(_load().mokLayerDestroy(h))

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class Contexts:
    """Layers of one config on one comm, each holding the saved state of one forward, so that
    several forwards can wait for their backwards (pipeline schedules such as 1F1B keep up to
    their depth of micro-batches in flight): a forward takes a layer, its backward gives it back.

    Which layer a forward takes depends only on the order of the calls, never on timing or on
    garbage collection, so every rank of a comm takes the same one (the passes are collective,
    and so is a forward run again). A forward whose backward will come (`keep`) takes the first
    free layer and holds it; when every layer is held it takes the one held longest, whose
    holder then finds its state gone and runs its forward again (as with a single layer). A
    forward without a backward (no gradient wanted) uses the first free layer without holding
    it, or the one held longest. A forward whose backward never runs holds its layer until a
    forward takes it as the one held longest.
    """

    def __init__(self, layers):
        self.layers = list(layers)
        if not self.layers:
            raise ValueError("mok.Contexts: no layers")
        self._stamp = [0] * len(self.layers)  # 0: free, else the order in which it was taken
        self._next = 1

    def __len__(self):
        return len(self.layers)

    def acquire(self, keep=True):
        """(layer, stamp) for a forward; stamp 0 where it holds nothing (keep false)."""
        free = [i for i, s in enumerate(self._stamp) if s == 0]
        i = free[0] if free else min(range(len(self.layers)), key=lambda j: self._stamp[j])
        if not keep:
            return self.layers[i], 0
        self._stamp[i], self._next = self._next, self._next + 1
        return self.layers[i], self._stamp[i]

    def release(self, layer, stamp):
        """After the backward of the forward that took (layer, stamp): the layer is free again,
        unless a later forward took it since."""
        for i, l in enumerate(self.layers):
            if l is layer and stamp and self._stamp[i] == stamp:
                self._stamp[i] = 0

    def for_backward(self, layer, stamp, generation):
        """(layer, stamp, rerun) for the backward of the forward that took (layer, stamp) when
        the layer's generation was `generation`. rerun: the layer ran another forward since
        (more forwards in flight than layers, activation checkpointing, a second backward after
        one that consumed the state): the caller runs the forward again on the returned layer
        first. Give it back with release(layer, stamp) after the backward."""
        if layer.generation == generation:
            return layer, stamp, False
        self.release(layer, stamp)  # (still held where a forward without a backward ran on it)
        layer, stamp = self.acquire(True)
        return layer, stamp, True

    def free(self):
        """The layers that hold no forward's state for a backward to come."""
        return [l for l, s in zip(self.layers, self._stamp) if not s]

    def held(self):
        """How many layers hold a forward's state for a backward to come."""
        return sum(1 for s in self._stamp if s)
