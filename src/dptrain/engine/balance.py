"""``--balance``: who computes which samples of a global batch, in proportion to speed.

Every device of every process is a *slot*, in rank order (rank 0's devices first). A global
batch of B samples is cut into one consecutive part per slot, sized in proportion to the
slots' weights (largest remainders get the spare samples); a process reads the parts of its
slots, and gives each device its own. The order of the samples, the global batch and the
mathematics stay as they are (the gradient is the sum over the global batch, divided once):
only who computes which samples changes.

- ``even``: equal weights (today's split);
- ``3,1`` (one weight per slot): fixed weights;
- ``auto``: after the third step (a first guess, from steps 2 and 3: the first warms up)
  and then every ``every`` steps the processes share how long each slot took per sample
  (one small all_gather), and the weights follow the throughput, smoothed; the new sizes
  take effect ``lag`` steps later, in every process at the same step, so batches a loader
  prepared ahead were cut with the sizes in force for them. (The early guess matters when
  devices differ a lot, a GPU beside a CPU: each step with even parts waits for the CPU.)

The sizes in force, and the weights to come, are saved in checkpoints: a resumed run cuts
every batch as the unbroken run did.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ..core.parts import weighted_parts

MODES = ("even", "auto")
#: auto's first guess is shared after this step (counted from 0; step 0 warms up, unmeasured).
FIRST_GUESS = 2


def parse_balance(spec: Union[str, Sequence[float], None]) -> Union[str, List[float]]:
    """``"even"``, ``"auto"``, or weights (``"3,1"`` or ``[3, 1]``), validated."""
    if spec is None:
        return "even"
    if isinstance(spec, str) and spec.strip().lower() in MODES:
        return spec.strip().lower()
    try:
        weights = [float(w) for w in (spec.split(",") if isinstance(spec, str) else spec)]
    except (TypeError, ValueError):
        raise ValueError(f"--balance {spec!r}: give even, auto, or one weight per device (e.g. 3,1)") from None
    if not weights or any(not w >= 0 or w == float("inf") for w in weights) or not sum(weights) > 0:
        raise ValueError(f"--balance {spec!r}: weights must be finite numbers >= 0, not all 0")
    return weights


class Balancer:
    """The sizes of every slot's part, step by step; see the module docstring.

    ``slots_per_rank``: how many devices each process has (every process knows all).
    """

    def __init__(self, spec: Union[str, Sequence[float]], slots_per_rank: Sequence[int], rank: int = 0,
                 every: int = 10, lag: int = 2, smoothing: float = 0.5, gpu: bool = False):
        spec = parse_balance(spec)
        self.slots_per_rank, self.rank = list(slots_per_rank), rank
        self.n_slots = sum(self.slots_per_rank)
        self.first = sum(self.slots_per_rank[:rank])          # this process's first slot
        self.mode = spec if isinstance(spec, str) else "fixed"
        if isinstance(spec, list) and len(spec) != self.n_slots:
            over = f" ({' + '.join(map(str, self.slots_per_rank))} over the processes)" \
                if len(self.slots_per_rank) > 1 else ""
            raise ValueError(f"--balance gives {len(spec)} weights for {self.n_slots} devices{over}: "
                             f"give one per device")
        weights = list(spec) if isinstance(spec, list) else [1.0] * self.n_slots
        self.schedule: List[Tuple[int, List[float]]] = [(0, weights)]    # (from step, weights)
        self.every, self.lag, self.smoothing, self.gpu = every, lag, smoothing, gpu
        self._seconds = [0.0] * self.slots_per_rank[rank]
        self._samples = [0] * self.slots_per_rank[rank]
        self.speed: Optional[List[float]] = None                  # samples/s per slot, smoothed
        self.least_part = 1         # the fewest samples of a part, or none (``sizes``)

    @property
    def local(self) -> int:
        return self.slots_per_rank[self.rank]

    def weights(self, step: int) -> List[float]:
        return next(w for start, w in reversed(self.schedule) if start <= step)

    def sizes(self, step: int, n: int) -> List[int]:
        """Every slot's part of a global batch of ``n`` samples at ``step``. With ``least_part``
        2 (BatchNorm, ``ModelEngine.least_part``) a part of one sample goes to the largest."""
        sizes = weighted_parts(n, self.weights(step), least=1 if self.mode == "auto" else 0)
        if self.least_part > 1 and n > 1:
            for i, size in enumerate(sizes):
                if size == 1:
                    sizes[i] = 0
                    sizes[max(range(len(sizes)), key=sizes.__getitem__)] += 1
        return sizes

    def process_part(self, step: int, n: int, rank: int) -> Tuple[int, int]:
        """``(start, size)`` of process ``rank``'s consecutive part of the global batch."""
        sizes = self.sizes(step, n)
        first = sum(self.slots_per_rank[:rank])
        return sum(sizes[:first]), sum(sizes[first:first + self.slots_per_rank[rank]])

    def local_sizes(self, step: int, n: Union[int, Sequence[int]]) -> Union[List[int], List[List[int]]]:
        """This process's devices' parts of a batch of ``n`` (they add up to its part); of each
        batch of a group, by the same update's weights, for a list (accumulated micro-batches)."""
        if not isinstance(n, int):
            return [self.local_sizes(step, m) for m in n]
        return self.sizes(step, n)[self.first:self.first + self.local]

    # -- auto --------------------------------------------------------------------------
    def measuring(self, step: int) -> bool:
        """Whether ``step`` is timed: every step but the first (it warms up) on CPUs; on GPUs
        (where timing a step waits for the device) those before the first guess and the last 3
        of every ``every``."""
        last = (step + 1) % self.every
        return self.mode == "auto" and step > 0 and (
            not self.gpu or step <= FIRST_GUESS or last == 0 or last > self.every - 3)

    def sharing(self, step: int) -> bool:
        """Whether the measurements are shared (and new weights scheduled) after ``step``."""
        return self.mode == "auto" and (step == FIRST_GUESS or (step + 1) % self.every == 0)

    def observe(self, seconds: Sequence[float], samples: Sequence[int]) -> None:
        """What this process's devices took for a step: compute seconds and samples each."""
        for i, (t, n) in enumerate(zip(seconds, samples)):
            self._seconds[i] += t
            self._samples[i] += n

    def after_step(self, step: int, collective) -> bool:
        """After the first guess's steps and every ``every`` steps (auto): share the measurements
        and schedule new weights for ``step + 1 + lag``; every process calls it at every step.
        Returns whether it rebalanced."""
        if not self.sharing(step):
            return False
        local = torch.tensor(self._seconds + [float(n) for n in self._samples], dtype=torch.float64)
        self._seconds, self._samples = [0.0] * self.local, [0] * self.local
        parts = collective.all_gather(local)
        speed: List[float] = []
        for r, part in enumerate(parts):
            k = self.slots_per_rank[r]
            for t, n in zip(part[:k].tolist(), part[k:2 * k].tolist()):
                speed.append(n / t if t > 0 and n > 0 else 0.0)
        known = [v for v in speed if v > 0]
        if not known:
            return False
        fill = sum(known) / len(known)        # a slot that computed nothing: assume the average
        speed = [v if v > 0 else fill for v in speed]
        if self.speed is not None:
            speed = [self.smoothing * old + (1 - self.smoothing) * new for old, new in zip(self.speed, speed)]
        self.speed = speed
        self.schedule.append((step + 1 + self.lag, list(speed)))
        self.schedule = self.schedule[-(self.lag + 2):]         # what can still be in force
        return True

    def state_dict(self) -> Dict[str, Any]:
        return {"mode": self.mode, "slots": self.slots_per_rank, "schedule": self.schedule, "speed": self.speed}

    def load_state_dict(self, state: Dict[str, Any]) -> Optional[str]:
        """Take the saved sizes and weights; returns a notice if they cannot apply here."""
        if state.get("slots") != self.slots_per_rank:
            return (f"the checkpoint's run had {sum(state.get('slots') or [])} devices, this one {self.n_slots}: "
                    f"the batches are cut evenly again from here")
        if state.get("mode") != self.mode:
            return f"--balance {self.mode} (the checkpoint's run: {state.get('mode')}) from here"
        self.schedule = [(int(s), list(w)) for s, w in state["schedule"]]
        self.speed = state.get("speed")
        return None
