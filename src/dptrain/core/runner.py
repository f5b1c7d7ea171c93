"""Run one piece of work per device, all devices at once.

Each device gets its own long-lived worker thread. PyTorch releases the GIL inside its
kernels, so shards really compute concurrently. On the CPU the intra-op threads are divided
among the virtual devices (2 cores, 2 devices: 1 thread each): measured on a 2-core EPYC,
LeNet forward+backward on two half-batches in two 1-thread workers ran at 7,300 img/s
against 4,200 img/s for one full batch with 2 intra-op threads, because small convolutions
parallelise poorly inside one op. On a GPU the worker makes its device current, so
kernels for different GPUs are queued in parallel.
"""
from __future__ import annotations

import queue
import threading
from contextlib import contextmanager
from concurrent.futures import Future
from typing import Callable, ContextManager, Dict, Iterator, List, Optional, Sequence, Tuple, TypeVar

import torch

from .devices import check_devices

T = TypeVar("T")


def caller_grad_mode() -> Callable[[], ContextManager]:
    """The caller's autograd mode, to enter on a worker thread.

    Grad mode and inference mode are thread-local in PyTorch: without this, ``torch.no_grad()``
    around a multi-device forward would not reach the device threads (they would record
    graphs), and under ``torch.inference_mode()`` they would fail to use the caller's
    inference tensors in a graph.
    """
    if torch.is_inference_mode_enabled():
        return lambda: torch.inference_mode(True)
    enabled = torch.is_grad_enabled()
    return lambda: torch.set_grad_enabled(enabled)


class _Worker(threading.Thread):
    """A daemon thread bound to one device: runs the calls queued for that device, in order."""

    def __init__(self, device: torch.device, cpu_threads: int):
        super().__init__(name=f"dptrain-{device.type}:{device.index or 0}", daemon=True)
        self.device, self.cpu_threads = device, cpu_threads
        self.calls: "queue.SimpleQueue" = queue.SimpleQueue()
        self.ready = threading.Event()

    def run(self) -> None:
        # Per thread under OpenMP/MKL: this worker computes with its own share of cores.
        # get_num_threads() first: it runs PyTorch's lazy per-thread init, which would
        # otherwise later overwrite our setting with the process-wide default.
        torch.get_num_threads()
        torch.set_num_threads(self.cpu_threads)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.ready.set()
        while True:
            call = self.calls.get()
            if call is None:
                return
            fn, args, done, mode = call
            try:
                with mode():
                    done.set_result(fn(*args))
            except BaseException as e:  # handed to the caller, who re-raises it
                done.set_exception(e)


class DeviceRunner:
    """Run ``fn(i, *args_i)`` for every device index ``i`` concurrently, one thread per device.

    The work runs in the caller's autograd mode (``torch.no_grad()``, ``torch.inference_mode()``).

    >>> runner = DeviceRunner([cpu(0), cpu(1)])
    >>> runner.map(lambda i, x: x * i, [torch.ones(1), torch.ones(1)])  # on cpu:0, on cpu:1
    [tensor([0.]), tensor([1.])]

    With one device the work runs inline in the calling thread, which keeps all its cores.
    """

    def __init__(self, devices: Sequence[torch.device], threads_per_cpu_device: Optional[int] = None):
        self.devices = check_devices(devices)
        n_cpu = sum(d.type == "cpu" for d in self.devices)
        # The threads this process was given (OMP_NUM_THREADS, e.g. a share of the cores when
        # several processes run on one machine), divided among its CPU devices.
        self.cpu_threads = threads_per_cpu_device or max(1, torch.get_num_threads() // max(1, n_cpu))
        self._workers: List[_Worker] = []
        if len(self.devices) > 1:
            caller_threads = torch.get_num_threads()
            self._workers = [_Worker(d, self.cpu_threads) for d in self.devices]
            for w in self._workers:
                w.start()
            for w in self._workers:
                w.ready.wait()
            # set_num_threads also sets the default of threads started later: keep the caller's.
            torch.set_num_threads(caller_threads)

    def map(self, fn: Callable[..., T], *per_device_args: Sequence) -> List[T]:
        """Call ``fn(i, a[i], b[i], ...)`` on device ``i``'s thread for every ``i``; return the results in order."""
        n = len(self.devices)
        for a in per_device_args:
            if len(a) != n:
                raise ValueError(f"DeviceRunner.map needs one argument per device ({n}), got {len(a)}")
        if not self._workers:
            return [fn(0, *(a[0] for a in per_device_args))]
        futures, mode = [], caller_grad_mode()
        for i, w in enumerate(self._workers):
            done: Future = Future()
            w.calls.put((fn, (i,) + tuple(a[i] for a in per_device_args), done, mode))
            futures.append(done)
        return [f.result() for f in futures]

    def run(self, i: int, fn: Callable[..., T], *args) -> T:
        """Call ``fn(*args)`` on device ``i``'s thread and return its result.

        Work between the per-device phases (e.g. an allreduce) belongs on a device thread,
        not the caller's: the caller's OpenMP team keeps spinning for a while after each of
        its parallel ops and steals a core from the devices (measured: 2-device LeNet steps
        ran 18% slower with the gradient allreduce done on the calling thread).
        """
        if not self._workers:
            return fn(*args)
        done: Future = Future()
        self._workers[i].calls.put((fn, args, done, caller_grad_mode()))
        return done.result()

    @contextmanager
    def coordinating(self) -> Iterator[None]:
        """Within this block the calling thread computes with one intra-op thread.

        With several CPU devices the caller only coordinates (gathers batches, splits them);
        if it kept its own OpenMP team, that team would spin after each op and slow the
        devices (measured: 6,500 against 7,700 img/s for 2-device LeNet steps when the
        caller gathered the batches with 2 threads). A no-op with one device.
        """
        if not self._workers or not any(d.type == "cpu" for d in self.devices):
            yield
            return
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    def close(self) -> None:
        """Stop the worker threads (they are daemons, so this is optional at exit)."""
        for w in self._workers:
            w.calls.put(None)
        for w in self._workers:
            w.join(timeout=10)
        self._workers = []


_runners: Dict[Tuple[torch.device, ...], DeviceRunner] = {}
_lock = threading.Lock()


def get_runner(devices: Sequence[torch.device]) -> DeviceRunner:
    """Return the shared runner for this device list (created on first use)."""
    key = tuple(check_devices(devices))
    with _lock:
        runner = _runners.get(key)
        if runner is None:
            runner = _runners[key] = DeviceRunner(key)
        return runner
