"""What optimizers of other shapes than torch.optim's cost in ``fit``: the plain loop against
``fit`` on 1 device and on 2 virtual CPU devices, on the same batches.

    python benchmarks/bench_optimizers.py --rounds 5 --out benchmarks/results/optimizers.json
    python benchmarks/bench_optimizers.py --smoke

Optimizers needing a closure (``engine/closure_step.py``): a physics-informed-style regression
MLP (2-64-64-1, tanh, 8192 points, batch 2048, ``torch.optim.LBFGS`` with ``max_iter=10`` and a
``strong_wolfe`` line search, the usual way LBFGS is used), a logistic regression (784 -> 10 on
random 28x28 "images", 8192 samples, batch 4096, ``max_iter=20``), and SAM over SGD (momentum
0.9; the plain loop: a backward, then ``step(closure)``). Then the shapes of
``tests/parallel/optimizer_shapes.py`` and a step hook: timm's Lookahead over AdamW (``k=5``:
its counter taken back from the groups each step), an SGD with one step size over the whole
group (Prodigy's shape: every device updates every parameter), Adam with a max-norm constraint
as a step post-hook (the first replica's weights copied to the others after it), and AdamW
alone to compare with (torch.optim's: none of these paths). These five on
the tiny MLP of the everyday programs (32-64-4, 8192 samples, batch 128: many short steps, where
per-step host work shows). Variants take turns each round; a figure is the median epoch time of
a run (3 epochs after one warm-up) in samples/s; ratios are paired (fit / plain in the same round).
"""
from __future__ import annotations

import functools
import os
import statistics
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dptrain  # noqa: E402
from common import paired, rounds_parser, save_result  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, ROOT)
from sharpness_aware import SAM  # noqa: E402  (as its users copy it)
from tests.parallel.optimizer_shapes import GroupStepSize, TimmShape  # noqa: E402


def max_norm(optimizer, args, kwargs):
    """Keras's max-norm constraint on each weight's rows, after every step."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.dim() == 2:
                p.data.copy_(torch.renorm(p.data, 2, 0, 2.0))


def hooked_adam(params):
    optimizer = torch.optim.Adam(params, lr=1e-3)
    optimizer.register_step_post_hook(max_norm)
    return optimizer


def programs(samples):
    g = torch.Generator().manual_seed(0)
    X = torch.rand(samples, 2, generator=g) * 2 - 1
    images = torch.randn(samples, 784, generator=g)
    return {
        "pinn-mlp": (lambda: nn.Sequential(nn.Linear(2, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                                           nn.Linear(64, 1)),
                     (X, torch.sin(3 * X[:, :1]) * X[:, 1:]), 2048, nn.functional.mse_loss,
                     functools.partial(torch.optim.LBFGS, lr=1, max_iter=10, line_search_fn="strong_wolfe")),
        "logistic": (lambda: nn.Linear(784, 10), (images, torch.randint(0, 10, (samples,), generator=g)), 4096,
                     nn.functional.cross_entropy, functools.partial(torch.optim.LBFGS, lr=1, max_iter=20)),
        **{f"{name}-tiny-mlp": (lambda: nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)),
                                (images[:, :32], torch.randint(0, 4, (samples,), generator=g)), 128,
                                nn.functional.cross_entropy, optimizer) for name, optimizer in (
            ("sam", functools.partial(SAM, lr=0.05, momentum=0.9)),
            ("lookahead", lambda params: TimmShape(torch.optim.AdamW(params, lr=1e-3), k=5)),
            ("group-step", GroupStepSize), ("hooked", hooked_adam),
            ("adamw", functools.partial(torch.optim.AdamW, lr=1e-3)))},
    }


def plain(make, data, batch, loss_fn, optimizer, epochs):
    torch.manual_seed(0)
    model, (X, Y) = make(), data
    opt = optimizer(model.parameters())
    closing = isinstance(opt, (SAM, torch.optim.LBFGS))
    times = []
    for _ in range(epochs + 1):
        start = time.perf_counter()
        for i in range(0, len(X), batch):
            if not closing:         # (the everyday loop)
                opt.zero_grad()
                loss_fn(model(X[i:i + batch]), Y[i:i + batch]).backward()
                opt.step()
                continue

            def closure():
                opt.zero_grad()
                loss = loss_fn(model(X[i:i + batch]), Y[i:i + batch])
                loss.backward()
                return loss
            if isinstance(opt, SAM):        # (its loop: a backward, then step(closure))
                closure()
            opt.step(closure)
        times.append(time.perf_counter() - start)
    return len(X) / statistics.median(times[1:])


def fitted(make, data, batch, loss_fn, optimizer, epochs, devices):
    torch.manual_seed(0)
    result = dptrain.fit(make(), data, loss=loss_fn, optimizer=optimizer, epochs=epochs + 1, batch_size=batch,
                         devices=devices, shuffle=False, log=None, progress=False)
    return len(data[0]) / statistics.median(h["sec"] for h in result["history"][1:])


def main() -> None:
    args = rounds_parser(__doc__, 8192).parse_args()
    rounds, epochs = (1, 1) if args.smoke else (args.rounds, args.epochs)
    figures = {}
    for name, (make, data, batch, loss_fn, optimizer) in programs(args.samples).items():
        raw = {"plain": [], "fit-1": [], "fit-2": []}
        for r in range(rounds):
            order = list(raw)[r % 3:] + list(raw)[:r % 3]
            for variant in order:
                raw[variant].append(plain(make, data, batch, loss_fn, optimizer, epochs) if variant == "plain" else
                                    fitted(make, data, batch, loss_fn, optimizer, epochs, int(variant[-1])))
        figures[name] = {"samples_per_s": {k: statistics.median(v) for k, v in raw.items()},
                         "fit-1 / plain": paired(raw, "fit-1", "plain"),
                         "fit-2 / plain": paired(raw, "fit-2", "plain"), "raw": raw}
    command = "python benchmarks/bench_optimizers.py " + " ".join(sys.argv[1:])
    save_result({"rounds": rounds, "epochs": epochs, "programs": figures}, command, args.out)


if __name__ == "__main__":
    main()
