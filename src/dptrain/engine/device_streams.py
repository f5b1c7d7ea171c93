"""A random stream per virtual CPU device, for the random layers of its replica (dropout).

PyTorch has one CPU generator per process, and no generator per thread: on several CPU
devices (threads) of one process, the replicas' dropout layers would take its numbers in
whatever order the threads reach them, and a run could be neither repeated nor resumed
exactly. Here each device's random layers (``nn.Dropout`` and its kin, ``nn.RReLU``) draw
from a stream of their own: the layer's call swaps the device's state into the generator
and back, under a lock held only for that call (the layer's own work; the generator is
locked for it anyway), so the rest of the forward passes run at once. The streams start
from ``(seed, rank, device)`` and ride in checkpoints with the process's other random
states. Draws elsewhere in a forward (``F.dropout``, ``torch.rand``) are not covered: the
engine finds them on the first step and then runs the forwards in turn
(``step_plan.Turns``).
"""
from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional, Sequence

import torch
from torch import nn

#: Layers that draw random numbers in training mode.
RANDOM_LAYERS = (nn.modules.dropout._DropoutNd, nn.RReLU)


class RandomDraws:
    """An engine's random draws on several CPU devices of one process: ``draws``, whether its
    forward draws outside the random layers (None until the first step finds out, see
    ``step_plan.Turns``; False on one device, or with ``--sync-bn``, whose forwards wait for
    each other), and the devices' ``streams`` for the random layers, made at the first step
    (``start``: only a run that steps, and then closes, wraps the user's layers); a
    checkpoint's states (``load_state``) wait for them."""

    def __init__(self, devices: Sequence[torch.device], training: bool, sync_batchnorm: bool, rank: int):
        cpus = sum(d.type == "cpu" for d in devices)
        self.draws: Optional[bool] = None if cpus > 1 and not sync_batchnorm else False
        self.streams: Optional[DeviceStreams] = None
        self.wanted = cpus > 1 and training          # streams still to make
        self.rank = rank
        self._states: List[torch.Tensor] = []

    def decide(self, drew: bool) -> None:
        self.draws = drew

    def start(self, replicas: Sequence[nn.Module]) -> None:
        """At the first step (when ``wanted``): the streams, from a checkpoint's states if any."""
        self.wanted = False
        self.streams = DeviceStreams(list(replicas), torch.initial_seed(), self.rank)
        self.streams.load_state(self._states)

    def state(self) -> List[torch.Tensor]:
        """The devices' streams' states (none on one device)."""
        return self.streams.state() if self.streams is not None else list(self._states)

    def load_state(self, states: Sequence[torch.Tensor]) -> None:
        self._states = list(states)
        if self.streams is not None:
            self.streams.load_state(states)

    def close(self) -> None:
        if self.streams is not None:
            self.streams.close()


def stream_seed(seed: int, rank: int, device: int) -> int:
    """The seed of device ``device``'s stream in process ``rank``: distinct for each."""
    return ((seed * 1_000_003 + rank * 7_919) * 31 + device + 1) * 2_654_435_761 % 2**63


class DeviceStreams:
    """Each replica's random layers draw from their device's stream (see the module
    docstring); ``close()`` gives the layers back as they were."""

    def __init__(self, replicas: Sequence[nn.Module], seed: int, rank: int):
        self.lock = threading.Lock()
        self.states: List[torch.Tensor] = [torch.Generator().manual_seed(stream_seed(seed, rank, i)).get_state()
                                           for i in range(len(replicas))]
        self.wrapped: List[nn.Module] = []
        for i, net in enumerate(replicas):
            for layer in net.modules():
                if isinstance(layer, RANDOM_LAYERS) and "forward" not in vars(layer):
                    layer.forward = self._drawing(i, layer.forward)      # the instance's, not the class's
                    self.wrapped.append(layer)

    def __bool__(self) -> bool:
        return bool(self.wrapped)

    def _drawing(self, i: int, forward: Callable[..., Any]) -> Callable[..., Any]:
        generator = torch.default_generator

        def with_own_stream(*args: Any, **kwargs: Any) -> Any:
            with self.lock:
                shared = generator.get_state()
                generator.set_state(self.states[i])
                try:
                    return forward(*args, **kwargs)
                finally:
                    self.states[i] = generator.get_state()
                    generator.set_state(shared)
        return with_own_stream

    def state(self) -> List[torch.Tensor]:
        return [s.clone() for s in self.states]

    def load_state(self, states: Sequence[torch.Tensor]) -> None:
        if len(states) != len(self.states):
            return          # none saved, or another number of devices: the streams start afresh
        self.states = [s.clone() for s in states]

    def close(self) -> None:
        for layer in self.wrapped:
            del layer.forward
        self.wrapped = []
