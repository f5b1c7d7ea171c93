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

Activation checkpointing (``torch.utils.checkpoint``, Hugging Face's
``gradient_checkpointing_enable()``) draws a block's masks again in the backward pass: it saves
the CPU generator's state as the block starts (``torch.get_rng_state()``) and sets it back to
replay (``torch.set_rng_state()``). Its random layers drew from their device's stream, not from
that generator, so the replay drew other masks than the forward's, and the gradients were not
those of the forward (2 and 3 devices 0.02 off one device's weights after 8 steps). While streams
are in use those two functions, called on a device's thread, save and set its stream (on any
other thread, the generator, as torch's). A replay of draws made outside the random layers
(``F.dropout`` in a checkpointed block: they came from the shared generator, in turn, and the
backward passes run at once) cannot be made exact: an error says so, with the fix.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
from torch import nn

#: Layers that draw random numbers in training mode.
RANDOM_LAYERS = (nn.modules.dropout._DropoutNd, nn.RReLU)

class ReplayError(ValueError):
    """Draws outside the random layers replayed by activation checkpointing (module docstring)."""


REPLAY_ERROR = ("the model draws random numbers outside nn.Dropout layers (F.dropout, torch.rand...) inside a block "
                "whose backward draws them again (activation checkpointing: torch.utils.checkpoint, "
                "gradient_checkpointing_enable()): on several CPU devices of one process those draws come from "
                "one shared generator and cannot be replayed exactly. Use nn.Dropout modules in checkpointed "
                "blocks, or train on one CPU device (devices=1), on GPUs, or without checkpointing")


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
        self.rank, self.devices = rank, list(devices)
        self._states: List[torch.Tensor] = []

    def decide(self, drew: bool) -> None:
        self.draws = drew
        if self.streams is not None:
            self.streams.outside = drew
            if drew and self.streams.replays:
                raise ReplayError(REPLAY_ERROR)

    def generator_state(self) -> torch.Tensor:
        """The shared generator's state, read while no random layer has its device's stream in it
        (a checkpointed block's replay in one device's backward may, during another's forward)."""
        if self.streams is None:
            return torch.default_generator.get_state()
        with self.streams.lock:
            return torch.default_generator.get_state()

    def start(self, replicas: Sequence[nn.Module]) -> None:
        """At the first step (when ``wanted``): the streams, from a checkpoint's states if any."""
        self.wanted = False
        self.streams = DeviceStreams(list(replicas), torch.initial_seed(), self.rank, self.devices)
        self.streams.outside = self.draws
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

    def __init__(self, replicas: Sequence[nn.Module], seed: int, rank: int, devices: Sequence[torch.device] = ()):
        self.lock = threading.Lock()
        #: Device ``i``'s thread by its device's name; whether the forwards draw outside the random
        #: layers (``RandomDraws.draws``), and whether a backward replayed draws (``replays``).
        self.index = {str(d): i for i, d in enumerate(devices)}
        self.outside: Optional[bool] = None
        self.replays = False
        self.states: List[torch.Tensor] = [torch.Generator().manual_seed(stream_seed(seed, rank, i)).get_state()
                                           for i in range(len(replicas))]
        self.wrapped: List[nn.Module] = []
        for i, net in enumerate(replicas):
            for layer in net.modules():
                if isinstance(layer, RANDOM_LAYERS) and "forward" not in vars(layer):
                    layer.forward = self._drawing(i, layer.forward)      # the instance's, not the class's
                    self.wrapped.append(layer)
        _OPEN.append(self)
        torch.get_rng_state, torch.set_rng_state = _get_rng_state, _set_rng_state

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

    def replayed(self) -> None:
        """A block's draws set back to replay them (``torch.set_rng_state`` on a device thread):
        in a backward pass, checkpointing's replay."""
        if _current_graph_task_id() != -1:
            self.replays = True
            if self.outside:
                raise ReplayError(REPLAY_ERROR)

    def close(self) -> None:
        for layer in self.wrapped:
            del layer.forward
        self.wrapped = []
        if self in _OPEN:
            _OPEN.remove(self)
        if not _OPEN:
            torch.get_rng_state, torch.set_rng_state = _TORCH_GET, _TORCH_SET


# -- torch.get_rng_state / set_rng_state on a device's thread: its stream -------------------
_OPEN: List[DeviceStreams] = []         # the streams in use (their engines' runs)
_TORCH_GET, _TORCH_SET = torch.get_rng_state, torch.set_rng_state
_current_graph_task_id = getattr(torch._C, "_current_graph_task_id", lambda: -1)


def _owner() -> Optional[Tuple[DeviceStreams, int]]:
    """The streams and the device whose thread this is, if one of theirs."""
    device = getattr(threading.current_thread(), "device", None)
    if device is not None:
        for streams in reversed(_OPEN):
            i = streams.index.get(str(device))
            if i is not None:
                return streams, i
    return None


def _get_rng_state() -> torch.Tensor:
    owner = _owner()
    if owner is None:
        return _TORCH_GET()
    streams, i = owner
    return streams.states[i].clone()


def _set_rng_state(new_state: torch.Tensor) -> None:
    owner = _owner()
    if owner is None:
        return _TORCH_SET(new_state)
    streams, i = owner
    streams.replayed()
    streams.states[i] = new_state.clone()
    return None
