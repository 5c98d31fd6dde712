"""A simulated accelerator for tests: a device that is not the CPU as far as PyTorch is concerned.

Registered from Python through the PrivateUse1 mechanism (the one TorchNeuron uses for `neuron`),
under the device type `simdev`. A tensor on it is a wrapper subclass holding a host tensor; each
operator runs on the host data and its results are wrapped again, so numerics are the CPU's bit for
bit. What makes it catch device bugs is what it refuses and keeps apart, as a real accelerator does:
- an operator mixing a simdev tensor with a CPU tensor of one element or more, or writing into a
  CPU tensor of any size, raises, as CUDA does (a batch left on the host, a loss reduced on a
  host tensor);
- it has its own random generator, seeded by `torch.manual_seed` like any device, which every
  random operator on it draws from (randn_like and dropout too), and its own memory statistics:
  RNG state or memory read from the CPU is wrong here;
- `.numpy()` and `.tolist()` need an explicit copy to the host;
- autocast takes `device_type="simdev"` and applies the CPU's cast lists (so `mixed` matches).
A torch.distributed backend, `simgloo`, covers both devices: collectives reach it with host data
(the operator wrapper unwraps them) and gloo moves it.

Only the test suite registers it (`register()`); nothing in hlat names it. Registered, the device
is absent (as on a machine without one) until a test makes it present with `present()`: other
tests in the same process keep resolving `train.device = auto` to the CPU.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import return_and_correct_aliasing
from torch.utils._pytree import tree_map

from device.simulated_autocast import register_autocast

TYPE = "simdev"
BACKEND = "simgloo"
# One device per process, as a launch that hands each rank one visible device does: torch's device
# guard for a Python backend reports one device, so autograd's engine takes none but index 0 (a
# backward on simdev:1 fails an internal assert). Ranks each use their own simdev:0.
DEVICE_COUNT = 1
TOTAL_MEMORY = 16 * 1024**3

# Operators the CPU has no kernel for that a device profile (tests/device/profiles.py) provides, by
# operator name: run on the host data in place of the operator. "sdpa": the profile's choice of
# kernel for scaled_dot_product_attention (on the device's tensors, above autograd), else the CPU's.
HOST_KERNELS: dict[str, Callable[..., Any]] = {}

# Operators that move data between the host and the device by design.
_TRANSFERS = {"copy_", "_to_copy", "_copy_from", "_copy_from_and_resize", "lift_fresh", "set_"}
# Advanced indexing takes host index tensors on CUDA too (they are copied over).
_HOST_INDICES = {"index", "index_put", "index_put_", "_index_put_impl_"}
_FLASH = 1  # torch.nn.attention.SDPBackend.FLASH_ATTENTION


class _Memory:
    """Bytes of the distinct host storages live simdev tensors hold (FSDP2 resizes them in place,
    so sizes are read when asked), and the peak since a reset. A wrapper's finalizer runs whenever
    the garbage collector does, possibly while this thread holds the lock (an allocation inside
    `allocated` can trigger it): it only queues its storage's release, which the next caller applies
    under the lock, so no finalizer ever waits on the lock its own thread holds."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.storages: dict[int, tuple[int, torch.UntypedStorage]] = {}  # StorageImpl -> (wrappers, it)
        self.released: collections.deque[int] = collections.deque()  # appended by finalizers, lock-free
        self._peak = 0

    def track(self, wrapper: torch.Tensor, host: torch.Tensor) -> None:
        storage = host.untyped_storage()
        key = storage._cdata
        with self.lock:
            self._apply_releases()
            count, _ = self.storages.get(key, (0, storage))
            self.storages[key] = (count + 1, storage)
        weakref.finalize(wrapper, self.released.append, key)
        self.peak()

    def _apply_releases(self) -> None:
        while self.released:
            key = self.released.popleft()
            count, storage = self.storages[key]
            if count == 1:
                del self.storages[key]
            else:
                self.storages[key] = (count - 1, storage)

    def allocated(self) -> int:
        with self.lock:
            self._apply_releases()
            return sum(storage.nbytes() for _, storage in self.storages.values())

    def peak(self) -> int:
        self._peak = max(self._peak, self.allocated())
        return self._peak

    def reset_peak(self) -> None:
        self._peak = self.allocated()


_memory = _Memory()
_generator = torch.Generator()
_current = threading.local()
_presence = {"present": False}


@contextlib.contextmanager
def present() -> Iterator[None]:
    """The device is visible (torch.accelerator finds it) inside this block."""
    before = _presence["present"]
    _presence["present"] = True
    try:
        yield
    finally:
        _presence["present"] = before


def current_device() -> int:
    return getattr(_current, "index", 0)


class SimTensor(torch.Tensor):
    """A simdev tensor: the wrapper autograd and the dispatcher see, and the host tensor it holds."""

    host: torch.Tensor

    @staticmethod
    def __new__(cls, host: torch.Tensor, index: int = 0) -> SimTensor:
        wrapper = torch.Tensor._make_wrapper_subclass(
            cls,
            host.size(),
            strides=host.stride(),
            storage_offset=host.storage_offset(),
            dtype=host.dtype,
            layout=host.layout,
            device=torch.device(TYPE, index),
            requires_grad=host.requires_grad,
        )
        wrapper.host = host
        _memory.track(wrapper, host)
        return wrapper

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        return f"SimTensor({self.host!r}, device='{self.device}')"

    def numpy(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() first.")

    def untyped_storage(self) -> torch.UntypedStorage:
        # The host storage: FSDP2 frees and re-grows unsharded parameters by resizing storages,
        # which a wrapper's own (data-less) storage cannot do; the host's can, in place.
        return self.host.untyped_storage()

    def tolist(self) -> Any:
        return self.host.tolist()  # like CUDA: a synchronizing copy, allowed

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func.namespace == "hlat":  # hlat's own operators run their Python body on the device's tensors
            return _opdef(func)._init_fn(*args, **kwargs)
        name = func._schema.name.split("::")[-1]
        index = _device_index(args, kwargs)
        if name not in _TRANSFERS | _HOST_INDICES and func.namespace not in ("c10d", "_c10d_functional"):
            _check_same_device(func, args, kwargs)
        host_args, host_kwargs = tree_map(_unwrap, args), tree_map(_unwrap, kwargs)
        if _takes_generator(func) and host_kwargs.get("generator") is None:
            host_kwargs["generator"] = _generator
        with _device_generator() if _seeded_without_generator(func) else contextlib.nullcontext():
            out = HOST_KERNELS.get(name, func)(*host_args, **host_kwargs)
        if name == "record_stream":
            return None  # one synchronous queue: nothing to keep alive for another stream
        if func.namespace == "c10d":  # in-place collectives: the caller's tensors hold the result
            return _rewrap_collective(out, args)
        target = kwargs.get("device")
        if name == "_to_copy" and target is not None and torch.device(target).type != TYPE:
            return out  # to another device: a host tensor
        wrapped = tree_map(lambda t: SimTensor(t, index) if _plain(t) else t, out)
        return return_and_correct_aliasing(func, args, kwargs, wrapped)


def _opdef(func: Any) -> Any:
    """The custom operator's definition (torch.library.custom_op), whose Python body runs here as a
    device's kernel would: the body's own operators then reach the device one by one."""
    from torch._library.custom_ops import _maybe_get_opdef

    opdef = _maybe_get_opdef(func)
    assert opdef is not None, f"{func} is not a torch.library.custom_op"
    return opdef


def _plain(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and not isinstance(value, SimTensor)


def _unwrap(value: Any) -> Any:
    if isinstance(value, SimTensor):
        return value.host
    if isinstance(value, torch.device) and value.type == TYPE:
        return torch.device("cpu")
    return value


def _device_index(args: tuple, kwargs: dict) -> int:
    for value in (*args, *kwargs.values()):
        if isinstance(value, SimTensor):
            return value.device.index or 0
        if isinstance(value, torch.device) and value.type == TYPE:
            return value.index or 0
    return getattr(_current, "index", 0)


def _check_same_device(func: Any, args: tuple, kwargs: dict) -> None:
    """CUDA's rule: device tensors may meet CPU tensors only as 0-dim scalars that are read; one
    that is written (a host accumulator `total += device_loss`) is refused like any other."""
    found: set[str] = set()
    written = _written(func)

    def visit(value: Any, write: bool = False) -> Any:
        if isinstance(value, SimTensor):
            found.add(str(value.device))
        elif isinstance(value, torch.Tensor) and (value.dim() > 0 or write):
            found.add(str(value.device))
        return value

    arguments = func._schema.arguments
    for i, value in enumerate(args):
        tree_map(functools.partial(visit, write=i < len(arguments) and arguments[i].name in written), value)
    for key, value in kwargs.items():
        tree_map(functools.partial(visit, write=key in written), value)
    if len(found) > 1:
        first, second = sorted(found)[:2]
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices, {first} and "
            f"{second}! (when checking arguments of {func})"
        )


@functools.cache
def _takes_generator(func: Any) -> bool:
    return any(argument.name == "generator" for argument in func._schema.arguments)


@functools.cache
def _written(func: Any) -> frozenset[str]:
    """The arguments `func` writes (self of an in-place op, out=)."""
    return frozenset(a.name for a in func._schema.arguments if a.alias_info is not None and a.alias_info.is_write)


@functools.cache
def _seeded_without_generator(func: Any) -> bool:
    """A random operator that takes no generator (randn_like, native_dropout): on the host data it
    would draw from the CPU's default generator."""
    return torch.Tag.nondeterministic_seeded in func.tags and not _takes_generator(func)


@contextlib.contextmanager
def _device_generator() -> Iterator[None]:
    """The CPU's default generator holds the device generator's state for one operator's call."""
    host = torch.get_rng_state()
    torch.set_rng_state(_generator.get_state())
    try:
        yield
    finally:
        _generator.set_state(torch.get_rng_state())
        torch.set_rng_state(host)


def _rewrap_collective(out: Any, args: tuple) -> Any:
    """c10d's in-place ops return (their tensor arguments, work): hand back the caller's wrappers."""
    if isinstance(out, tuple) and out and isinstance(out[0], list) and args and isinstance(args[0], list):
        return (list(args[0]), *out[1:])
    if isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor) and isinstance(args[0], SimTensor):
        return (args[0], *out[1:])
    return out


def _empty_memory_format(
    size: list[int],
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
    memory_format: torch.memory_format | None = None,
) -> SimTensor:
    host = torch.empty(size, dtype=dtype, memory_format=memory_format or torch.contiguous_format)
    return SimTensor(host, _index_of(device))


def _empty_strided(
    size: list[int],
    stride: list[int],
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
) -> SimTensor:
    return SimTensor(torch.empty_strided(size, stride, dtype=dtype), _index_of(device))


def _factories() -> list[Any]:
    """Operators that make a tensor from nothing but sizes and a device, with a composite kernel
    (arange, zeros, randn, ...). Composite, they would build an empty simdev tensor and resize it in
    an out= call, which a wrapper's fixed sizes cannot follow; registered, they build on the host."""
    found = []
    for full in torch._C._dispatch_get_all_op_names():
        name, _, overload = full.removeprefix("aten::").partition(".")
        if not full.startswith("aten::") or "sparse" in name:
            continue
        op = getattr(getattr(torch.ops.aten, name, None), overload or "default", None)
        arguments = op._schema.arguments if op is not None else []
        if (
            any(a.name == "device" for a in arguments)
            and not any("Tensor" in str(a.type) for a in arguments)
            and torch._C._dispatch_has_kernel_for_dispatch_key(full, "CompositeExplicitAutograd")
        ):
            found.append(op)
    return found


def _factory(op: Any) -> Callable[..., Any]:
    seeded = _with_generator(op)

    def kernel(*args: Any, **kwargs: Any) -> SimTensor:
        index = _index_of(kwargs.get("device"))
        kwargs = {**kwargs, "device": torch.device("cpu")}
        if seeded is not op:
            return SimTensor(seeded(*args, generator=_generator, **kwargs), index)
        if _takes_generator(op) and kwargs.get("generator") is None:
            kwargs["generator"] = _generator
        return SimTensor(op(*args, **kwargs), index)

    return kernel


def _with_generator(op: Any) -> Any:
    """randn -> randn.generator, randint.low -> randint.low_generator: the overload that takes the
    simulated device's generator, for a random factory without one (else `op`)."""
    if _takes_generator(op):
        return op
    packet = getattr(torch.ops.aten, op._schema.name.split("::")[-1])
    name = "generator" if op._overloadname == "default" else f"{op._overloadname}_generator"
    return getattr(packet, name) if name in packet.overloads() else op


def _copy_from(source: torch.Tensor, destination: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """Reached without the Python key (torch.tensor(..., device=...) builds that way)."""
    target = destination.host if isinstance(destination, SimTensor) else destination
    target.copy_(source.host if isinstance(source, SimTensor) else source)
    return destination


def _attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """SDPA as the CPU runs it (torch picks its math path for an unknown device): the CPU's choice of
    kernel on the host data, then that kernel, whose own backward autograd records; or a profile's."""
    if (profile_sdpa := HOST_KERNELS.get("sdpa")) is not None:
        return profile_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    hosts = [t.host if isinstance(t, SimTensor) else t for t in (query, key, value, attn_mask)]
    choice = torch._fused_sdp_choice(*hosts, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        zero = torch.zeros((), dtype=query.dtype, device=query.device)
        attn_mask = torch.where(attn_mask.logical_not(), float("-inf"), zero)
    if choice == _FLASH:
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        return flash(query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]
    math = torch.ops.aten._scaled_dot_product_attention_math
    return math(query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa)[0]


def _cpu_kernels_with_decompositions() -> list[str]:
    """Operators with a CPU kernel and a CompositeImplicitAutograd one (silu_backward, ...): on a
    device without its own kernel torch decomposes them above the Python key, and the numbers drift
    from the CPU's. A PrivateUse1 registration turns the decomposition off; the operator then reaches
    SimTensor.__torch_dispatch__ (the Python key comes first), which runs the CPU kernel."""
    return [
        name.removeprefix("aten::")
        for name in torch._C._dispatch_get_all_op_names()
        if name.startswith("aten::")
        and torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU")
        and torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeImplicitAutograd")
    ]


def _unreachable(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the Python key handles simdev tensors before their backend key")


def _index_of(device: torch.device | None) -> int:
    return device.index if device is not None and device.index is not None else current_device()


class Event:
    """Every operator has finished when it returns: an event is always complete."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.time = 0.0

    def record(self, stream: Stream | None = None) -> None:
        self.time = time.perf_counter()

    def wait(self, stream: Stream | None = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: Event) -> float:
        return (end.time - self.time) * 1000.0


class Stream:
    """A synchronous queue (what FSDP2 and the trainer's overlap ask for, ordering already given)."""

    def __init__(self, device: Any = None, priority: int = 0) -> None:
        self.device = torch.device(TYPE, current_device())

    def wait_stream(self, stream: Stream) -> None:
        pass

    def wait_event(self, event: Event) -> None:
        pass

    def record_event(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


@functools.cache
def _default_stream() -> Stream:
    return Stream()


class _Properties:
    def __init__(self, index: int) -> None:
        self.name = f"Simulated accelerator {index}"
        self.total_memory = TOTAL_MEMORY


class DeviceModule:
    """What `torch.get_device_module("simdev")` returns: the functions a device module offers."""

    @staticmethod
    def is_available() -> bool:
        return _presence["present"]

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def _lazy_init() -> None:
        pass

    @staticmethod
    def device_count() -> int:
        return DEVICE_COUNT

    @staticmethod
    def current_device() -> int:
        return current_device()

    @staticmethod
    def set_device(device: int | str | torch.device) -> None:
        _current.index = (
            torch.device(TYPE, device).index if isinstance(device, int) else torch.device(device).index or 0
        )

    Stream = Stream
    Event = Event

    @staticmethod
    def synchronize(device: Any = None) -> None:
        pass  # every operator has finished when it returns

    @staticmethod
    def current_stream(device: Any = None) -> Stream:
        return _default_stream()

    @staticmethod
    def default_stream(device: Any = None) -> Stream:
        return _default_stream()

    @staticmethod
    def stream(stream: Stream | None) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext(stream)

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return _generator.get_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        _generator.set_state(state)

    @staticmethod
    def manual_seed(seed: int) -> None:
        _generator.manual_seed(seed)

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        _generator.manual_seed(seed)

    @staticmethod
    def seed() -> None:
        _generator.seed()

    @staticmethod
    def initial_seed() -> int:
        return _generator.initial_seed()

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        return _memory.allocated()

    @staticmethod
    def max_memory_allocated(device: Any = None) -> int:
        return _memory.peak()

    memory_reserved = memory_allocated  # no caching allocator: what is held is what is reserved
    max_memory_reserved = max_memory_allocated

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        _memory.reset_peak()

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        return TOTAL_MEMORY - _memory.allocated(), TOTAL_MEMORY

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return _Properties(0).name

    @staticmethod
    def get_device_properties(device: Any = None) -> _Properties:
        return _Properties(0)

    @staticmethod
    def get_amp_supported_dtype() -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16]

    @staticmethod
    def is_bf16_supported() -> bool:
        return True


_libraries: list[torch.library.Library] = []


def _gloo(store: Any, rank: int, size: int, timeout: Any) -> Any:
    return dist.ProcessGroupGloo(store, rank, size, timeout)


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return _presence["present"]

    def has_primary_context(self, device_index: int) -> bool:
        return True

    def is_built(self) -> bool:
        return True


def register() -> None:
    """Register `simdev` and the `simgloo` backend in this process (idempotent)."""
    if _libraries:
        return
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    _setup_privateuseone_for_python_backend(TYPE, backend_module=DeviceModule(), hook=_Hooks())
    factories = torch.library.Library("aten", "IMPL")
    factories.impl("empty.memory_format", _empty_memory_format, "PrivateUse1")
    factories.impl("empty_strided", _empty_strided, "PrivateUse1")
    factories.impl("_copy_from", _copy_from, "PrivateUse1")
    factories.impl("scaled_dot_product_attention", _attention, "AutogradPrivateUse1")
    for op in _factories():
        factories.impl(op, _factory(op), "PrivateUse1")
    for name in _cpu_kernels_with_decompositions():
        factories.impl(name, _unreachable, "PrivateUse1")
    _libraries.extend((factories, *register_autocast(TYPE)))
    if dist.is_available():
        dist.Backend.register_backend(BACKEND, _gloo, devices=[TYPE])
