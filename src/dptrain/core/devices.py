"""Device discovery and parsing: GPUs when there are some, virtual CPU devices otherwise.

A device is a plain ``torch.device``. ``cpu:0``, ``cpu:1``... are *virtual* CPU devices:
distinct replicas on the host whose work runs concurrently, one thread each (see
``dptrain.parallel``). Discovery never returns an empty list.
"""
from __future__ import annotations

import os
import sys
from typing import Iterable, List, Sequence, Union

import torch

DeviceLike = Union[str, int, torch.device]

#: Virtual CPU devices used when no GPU is found and none were asked for.
DEFAULT_CPU_DEVICES = 2

_said: set = set()


def _notice(message: str) -> None:
    """Print a one-line notice to stderr, once per process."""
    if message not in _said:
        _said.add(message)
        print(f"dptrain: {message}", file=sys.stderr)


def num_gpus() -> int:
    """Return the number of CUDA GPUs visible to this process (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def cpu(i: int = 0) -> torch.device:
    """Return virtual CPU device ``i`` (``cpu:i``); any ``i >= 0`` is valid."""
    if not isinstance(i, int) or isinstance(i, bool) or i < 0:
        raise ValueError(f"cpu(i) needs an integer i >= 0, got {i!r}")
    return torch.device("cpu", i)


def gpu(i: int = 0) -> torch.device:
    """Return GPU ``i`` (``cuda:i``); an error lists the devices that exist if it does not.

    >>> dptrain.gpu(0)      # on a machine with one GPU
    device(type='cuda', index=0)
    """
    if not isinstance(i, int) or isinstance(i, bool) or i < 0:
        raise ValueError(f"gpu(i) needs an integer i >= 0, got {i!r}")
    n = num_gpus()
    if i >= n:
        raise ValueError(
            f"cuda:{i} does not exist: this machine has {_describe_available(n)}; "
            f"use --devices auto, or dptrain.try_gpu({i}) to fall back to the CPU")
    return torch.device("cuda", i)


def _describe_available(n: int) -> str:
    if n == 0:
        return "no GPU (available: virtual CPU devices cpu:0, cpu:1, ...)"
    return f"{n} GPU{'s' if n > 1 else ''} (available: " + ", ".join(
        f"cuda:{j}" for j in range(n)) + ")"


def try_gpu(i: int = 0) -> torch.device:
    """Return ``cuda:i`` if it exists, else ``cpu:0`` with a one-line notice."""
    if not isinstance(i, int) or isinstance(i, bool) or i < 0:
        raise ValueError(f"try_gpu(i) needs an integer i >= 0, got {i!r}")
    if i < num_gpus():
        return torch.device("cuda", i)
    _notice(f"cuda:{i} not found, using cpu:0")
    return cpu(0)


def try_all_gpus() -> List[torch.device]:
    """Return every GPU, or ``[cpu:0]`` with a one-line notice; never an empty list."""
    n = num_gpus()
    if n:
        return [torch.device("cuda", j) for j in range(n)]
    _notice("no GPU found, using cpu:0")
    return [cpu(0)]


def as_device(spec: DeviceLike) -> torch.device:
    """Turn ``'cpu:1'``, ``'cuda:0'``, ``'gpu:0'``, ``'cpu'`` or a ``torch.device`` into a device.

    A CPU device without an index is ``cpu:0``; a GPU that does not exist is a ``ValueError``.
    A number ``i`` (Lightning's ``devices=[0, 1]``) is GPU ``i``, or virtual CPU device ``i``
    on a machine without one (as a count is).
    """
    if isinstance(spec, int) and not isinstance(spec, bool):
        if spec < 0:
            raise ValueError(f"a device index must be at least 0, got {spec}")
        return gpu(spec) if num_gpus() else cpu(spec)
    if isinstance(spec, torch.device):
        dev = spec
    elif isinstance(spec, str):
        text = spec.strip().lower().replace("gpu", "cuda", 1)
        try:
            dev = torch.device(text)
        except RuntimeError:
            raise ValueError(
                f"unknown device {spec!r}: expected cpu:N or cuda:N (e.g. 'cpu:0,cpu:1')"
            ) from None
    else:
        raise TypeError(f"a device must be a str, a torch.device or a GPU's index, got {type(spec).__name__}")
    if dev.type == "cpu":
        return cpu(dev.index or 0)
    if dev.type == "cuda":
        return gpu(dev.index or 0)
    raise ValueError(f"unsupported device type {dev.type!r} in {spec!r}: use cpu:N or cuda:N")


def parse_devices(spec: Union[None, str, int, Iterable[DeviceLike]] = "auto") -> List[torch.device]:
    """Parse a device list: ``'auto'``, a count ``N``, or ``'cpu:0,cpu:1'`` / ``'cuda:0,cuda:1'``.

    ``auto`` is every GPU, or ``cpu:0, cpu:1`` (virtual devices) without one. A count ``N`` is
    the first N GPUs, or N virtual CPU devices without a GPU.

    >>> parse_devices("3")          # on a CPU-only machine
    [device(type='cpu', index=0), device(type='cpu', index=1), device(type='cpu', index=2)]
    """
    if spec is None or (isinstance(spec, str) and spec.strip().lower() in ("", "auto")):
        n = num_gpus()
        if n:
            return [torch.device("cuda", j) for j in range(n)]
        _notice(f"no GPU found: {DEFAULT_CPU_DEVICES} virtual CPU devices")
        return [cpu(j) for j in range(DEFAULT_CPU_DEVICES)]
    if isinstance(spec, str) and spec.strip().isdigit():
        spec = int(spec.strip())
    if isinstance(spec, int) and not isinstance(spec, bool):
        if spec < 1:
            raise ValueError(f"a device count must be at least 1, got {spec}")
        n = num_gpus()
        if n == 0:
            return [cpu(j) for j in range(spec)]
        if spec > n:
            raise ValueError(f"asked for {spec} GPUs but this machine has {_describe_available(n)}")
        return [torch.device("cuda", j) for j in range(spec)]
    if isinstance(spec, torch.device):
        return check_devices([spec])
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    devices = [as_device(s) for s in items if not (isinstance(s, str) and not s.strip())]
    return check_devices(devices)


def check_devices(devices: Sequence[DeviceLike]) -> List[torch.device]:
    """Validate a device list (not empty, each device real); return it as ``torch.device``s.

    A device may appear more than once: ``[cuda:0, cuda:0]`` is two replicas on one GPU, as
    the Gluon tutorial's ``[mx.gpu(), mx.gpu()]`` on a machine with one GPU (each has its
    own worker thread; they share the GPU's default stream)."""
    if isinstance(devices, (str, torch.device)):
        devices = [devices]
    if devices is None or isinstance(devices, (int, float)):
        raise TypeError(f"expected a list of devices, got {devices!r}: e.g. dptrain.try_all_gpus(), "
                        f"dptrain.parse_devices({devices!r}) or [dptrain.cpu(0), dptrain.cpu(1)]")
    devices = [as_device(d) for d in devices]
    if not devices:
        raise ValueError("the device list is empty: pass at least one device, e.g. [dptrain.cpu(0)]")
    return devices


def format_device(d: torch.device) -> str:
    return f"{d.type}:{d.index or 0}"


def format_devices(devices: Sequence[torch.device]) -> str:
    """Format a device list as the reference prints it: ``[cpu:0, cpu:1]``."""
    return "[" + ", ".join(format_device(d) for d in devices) + "]"


def host_cores() -> int:
    """Return the number of CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or "CPU"


def _host_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def device_info(devices: Sequence[torch.device]) -> List[dict]:
    """Describe each device: kind, name, memory in bytes and the CPU cores it computes with.

    Virtual CPU devices share the host: each gets an equal share of its cores (at least one).
    """
    n_cpu = sum(d.type == "cpu" for d in devices)
    cores = host_cores()
    rows = []
    for d in devices:
        if d.type == "cuda":
            props = torch.cuda.get_device_properties(d)
            rows.append({"device": format_device(d), "kind": "gpu", "name": props.name,
                         "memory_bytes": props.total_memory,
                         "cores": props.multi_processor_count})
        else:
            rows.append({"device": format_device(d), "kind": "virtual cpu", "name": _cpu_name(),
                         "memory_bytes": _host_memory_bytes(),
                         "cores": max(1, cores // max(1, n_cpu))})
    return rows
