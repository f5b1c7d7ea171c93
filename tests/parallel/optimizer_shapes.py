"""Optimizers of the shapes users bring from other libraries, for the tests and the benchmark
(``benchmarks/bench_optimizers.py``): a Lookahead built on an optimizer instance as timm writes
it (its step counter in the groups, its slow weights in the wrapped optimizer's state) and as
alphadl's does (a counter attribute, its own state), and an SGD with one step size over the
whole group, kept in the group and changed by each step (Prodigy's and D-Adaptation's shape);
and one with no learning rate (Adafactor's relative step: ``lr=None``)."""
import collections
import math

import torch


class GroupStepSize(torch.optim.Optimizer):
    """SGD with one step size ``d`` for the whole group, grown from the group's gradient norm."""

    def __init__(self, params, lr=1.0, d0=1e-3):
        super().__init__(params, {"lr": lr, "d": d0, "k": 0})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in group["params"] if p.grad is not None))
            group["d"] = max(group["d"], float(norm) * 1e-2 / (group["k"] + 1))
            group["k"] += 1
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"] * group["d"])


class Hooked(torch.optim.Optimizer):
    """A wrapper that does not call ``Optimizer.__init__`` (as Lookahead codes do), with the
    hooks torch's step wrapper reads."""

    def _hooks(self):
        self._optimizer_step_pre_hooks = collections.OrderedDict()
        self._optimizer_step_post_hooks = collections.OrderedDict()


class TimmShape(Hooked):
    def __init__(self, base_optimizer, alpha=0.5, k=6):
        defaults = {"lookahead_alpha": alpha, "lookahead_k": k, "lookahead_step": 0}
        self._base_optimizer = base_optimizer
        self.param_groups = base_optimizer.param_groups
        self.defaults = {**base_optimizer.defaults, **defaults}
        self.state = collections.defaultdict(dict)
        self._hooks()
        for group in self.param_groups:
            for name, default in defaults.items():
                group.setdefault(name, default)

    @torch.no_grad()
    def step(self, closure=None):
        loss = self._base_optimizer.step(closure)
        for group in self.param_groups:
            group["lookahead_step"] += 1
            if group["lookahead_step"] % group["lookahead_k"] == 0:
                for p in group["params"]:
                    slow = self._base_optimizer.state[p].setdefault("lookahead_slow_buff", p.clone())
                    slow.add_(p - slow, alpha=group["lookahead_alpha"])
                    p.copy_(slow)
        return loss

    def state_dict(self):
        return self._base_optimizer.state_dict()

    def load_state_dict(self, state_dict):
        self._base_optimizer.load_state_dict(state_dict)
        self.param_groups = self._base_optimizer.param_groups


class AlphadlShape(Hooked):
    def __init__(self, optimizer, alpha=0.5, k=6):
        self.optimizer, self.alpha, self.k, self.step_counter = optimizer, alpha, k, 0
        self.param_groups, self.defaults = optimizer.param_groups, optimizer.defaults
        self.state = collections.defaultdict(dict)
        self._hooks()
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["cached_params"] = p.detach().clone()

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none)

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict):
        self.optimizer.load_state_dict(state_dict)

    @torch.no_grad()
    def step(self, closure=None):
        loss = self.optimizer.step(closure)
        self.step_counter += 1
        if self.step_counter >= self.k:
            self.step_counter = 0
            for group in self.param_groups:
                for p in group["params"]:
                    cached = self.state[p]["cached_params"]
                    p.mul_(self.alpha).add_(cached, alpha=1 - self.alpha)
                    cached.copy_(p)
        return loss


class RelativeStep(torch.optim.Optimizer):
    """Adafactor's relative step: no learning rate (``lr=None``), a step size from its own count."""

    def __init__(self, params, lr=None, relative_step=True):
        if lr is not None and relative_step:
            raise ValueError("Cannot combine manual lr and relative_step=True options")
        super().__init__(params, {"lr": lr, "relative_step": relative_step})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    state = self.state[p]
                    state["step"] = state.get("step", 0) + 1
                    size = min(1e-1, 1 / math.sqrt(state["step"])) if group["relative_step"] else group["lr"]
                    p.add_(p.grad, alpha=-size)
