"""What Keras's ``class_weight`` and ``sample_weight`` cost a step: the plain loop weighing each
sample's loss (``(F.cross_entropy(out, y, reduction="none") * w[y]).mean()``, or ``* w`` by the
batch's own weights) against ``dptrain.fit(..., class_weight=...)``, ``fit(...,
sample_weight=w)`` and ``fit`` unweighted, on one device and on ``--devices`` (default 2 virtual).

    python benchmarks/bench_weights.py --rounds 7 --out benchmarks/results/weights.json
    python benchmarks/bench_weights.py --smoke

The programs: ``everyday.py``'s tiny MLP (tensors in memory, batch 128, 4 classes) and text
classifier (token lists, a padding collate_fn, dict batches, batch 64), 4 classes weighted 1, 2, 4,
8; a sample's own weight drawn in [0, 2) (the plain loop's text batches get theirs from a collate
function of (sample, weight) pairs, as ``fit`` makes them). A figure is an epoch's seconds (the
second of a 2-epoch call: set-up left out, as an epoch of a long run); the variants take turns each
round, the order rotating; ratios are paired (the same round), medians over the rounds, each
against the plain loop weighing alike. "loss op" times the loss alone, forward and backward on one
thread (a 128 x 4 batch, microseconds a call): the plain loop's expression against
``ClassWeights.weighted_sum`` (what ``fit`` calls) and the unweighted ``cross_entropy``.
"evaluation": a whole ``dptrain.evaluate(..., sample_weight=w)`` call (set-up included) against
the plain loop's weighted evaluation (its ``DataLoader`` made, ``no_grad``) and ``evaluate``
unweighted, on the training set. "fit's evaluation": the second epoch's evaluation inside ``fit``
(timed by a callback, from ``on_evaluate_start`` to ``on_evaluate_end``) of ``validation_split=0.2``'s
held-out part, weighed by its ``sample_weight`` (Keras's ``val_loss``) or not, against the plain
loop's weighted evaluation of that part.
"""
from __future__ import annotations

import functools
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dptrain  # noqa: E402
import everyday  # noqa: E402
from common import in_turns, paired, rounds_parser, save_result  # noqa: E402
from dptrain.data.holdout import data_length, hold_out  # noqa: E402
from dptrain.engine.class_weights import ClassWeights  # noqa: E402

WEIGHTS = {0: 1.0, 1: 2.0, 2: 4.0, 3: 8.0}


def _inputs_and_labels(batch):
    if isinstance(batch, dict):
        return (batch["input_ids"], batch["attention_mask"]), batch["labels"]
    return (batch[0],), batch[1]


class Paired(torch.utils.data.Dataset):
    """The plain loop's ``(sample, weight)`` pairs (a text sample's own weight)."""

    def __init__(self, data, weights):
        self.data, self.weights = data, weights

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i], self.weights[i]


def pairs_collate(collate, pairs):
    """The plain loop's batch of ``(sample, weight)`` pairs: ``(collate(samples), weights)``."""
    return collate([s for s, _ in pairs]), torch.stack([v for _, v in pairs])


def plain_loader(program, data, sample_weights, shuffle):
    """The plain loop's ``DataLoader`` (over the samples and their weights, with them) and a
    reader of its batches: ``batch -> (inputs, y, weights or None)``."""
    collate = program.collate
    if sample_weights is None:
        dataset = torch.utils.data.TensorDataset(*data) if isinstance(data, tuple) else data
    elif isinstance(data, tuple):
        dataset = torch.utils.data.TensorDataset(*data, sample_weights)
    else:
        dataset, collate = Paired(data, sample_weights), functools.partial(pairs_collate, program.collate)

    def read(batch):
        if sample_weights is None:
            return (*_inputs_and_labels(batch), None)
        if isinstance(data, tuple):
            return (*_inputs_and_labels(batch[:2]), batch[2])
        return (*_inputs_and_labels(batch[0]), batch[1])
    return torch.utils.data.DataLoader(dataset, batch_size=program.batch, shuffle=shuffle, collate_fn=collate), read


def plain(program, data, sample_weights=None, epochs=2):
    """The plain loop's weighted epochs (by class, or by ``sample_weights``); the last one's seconds."""
    torch.manual_seed(0)
    model = program.model()
    opt = program.optimizer(model.parameters(), lr=program.lr)
    w = torch.tensor([WEIGHTS[c] for c in range(4)])
    loader, read = plain_loader(program, data, sample_weights, shuffle=True)
    for _ in range(epochs):
        start = time.perf_counter()
        total = torch.zeros(())
        for batch in loader:
            inputs, y, weight = read(batch)
            loss = (F.cross_entropy(model(*inputs), y, reduction="none") * (w[y] if weight is None else weight)).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.detach()
        float(total)
        seconds = time.perf_counter() - start
    return seconds


def plain_evaluation(program, model, data, sample_weights):
    """Seconds of the plain loop's weighted evaluation loss over ``data`` (its loader made too)."""
    start = time.perf_counter()
    loader, read = plain_loader(program, data, sample_weights, shuffle=False)
    total, n = torch.zeros((), dtype=torch.float64), 0
    model.eval()
    with torch.no_grad():
        for batch in loader:
            inputs, y, weight = read(batch)
            total += (F.cross_entropy(model(*inputs), y, reduction="none") * weight).sum()
            n += len(y)
    float(total / n)
    return time.perf_counter() - start


def evaluated(model, program, data, **weights):
    """Seconds of a ``dptrain.evaluate`` call on one device, set-up included."""
    start = time.perf_counter()
    dptrain.evaluate(model, data, batch_size=program.batch, collate_fn=program.collate, devices=1, **weights)
    return time.perf_counter() - start


def fitted(program, data, devices, **weights):
    torch.manual_seed(0)
    result = dptrain.fit(program.model(), data, optimizer=program.optimizer, lr=program.lr,
                         batch_size=program.batch, collate_fn=program.collate, epochs=2, devices=devices,
                         log=None, progress=False, **weights)
    return result["history"][-1]["sec"]


class EvaluationTime(dptrain.Callback):
    """The seconds of each evaluation inside ``fit``."""

    def __init__(self):
        self.began, self.seconds = 0.0, []

    def on_evaluate_start(self, run, epoch):
        self.began = time.perf_counter()

    def on_evaluate_end(self, run, epoch, metrics):
        self.seconds.append(time.perf_counter() - self.began)


def fit_evaluation(program, data, **weights):
    """The second epoch's evaluation seconds of ``fit(..., validation_split=0.2)``."""
    timer = EvaluationTime()
    torch.manual_seed(0)
    dptrain.fit(program.model(), data, optimizer=program.optimizer, lr=program.lr, batch_size=program.batch,
                collate_fn=program.collate, epochs=2, devices=1, validation_split=0.2, log=None, progress=False,
                callbacks=[timer], **weights)
    return timer.seconds[-1]


def loss_op(calls):
    """Microseconds a forward and backward of each weighting of a 128 x 4 batch's loss."""
    torch.manual_seed(0)
    logits, y = torch.randn(128, 4), torch.randint(0, 4, (128,))
    w = torch.tensor([WEIGHTS[c] for c in range(4)])
    ce = torch.nn.CrossEntropyLoss()
    weights = ClassWeights(WEIGHTS, ce)
    ops = {"plain loop's per-sample * w[y]": lambda o: (F.cross_entropy(o, y, reduction="none") * w[y]).mean(),
           "ClassWeights.weighted_sum": lambda o: weights.weighted_sum(ce, o, y) / len(y),
           "unweighted cross_entropy": lambda o: F.cross_entropy(o, y)}

    def timed(op):
        start = time.perf_counter()
        for _ in range(calls):
            op(logits.detach().requires_grad_()).backward()
        return (time.perf_counter() - start) / calls * 1e6
    return {name: (lambda op=op: timed(op)) for name, op in ops.items()}


def main() -> None:
    parser = rounds_parser(__doc__, 0)
    parser.add_argument("--programs", default="tiny-mlp,text")
    parser.add_argument("--devices", default="2")
    args = parser.parse_args()
    rounds = 1 if args.smoke else args.rounds
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    ops = loss_op(100 if args.smoke else 3000)
    for fn in ops.values():
        fn()
    op_raw = in_turns(ops, rounds)
    torch.set_num_threads(threads)
    op = {"us a call": {k: statistics.median(v) for k, v in op_raw.items()}, "raw": op_raw}
    figures = {}
    for name in args.programs.split(","):
        program = everyday.PROGRAMS[name]
        data = program.data()
        if args.smoke:
            data = (data[0][:1024], data[1][:1024]) if isinstance(data, tuple) else \
                torch.utils.data.Subset(data, range(256))
        n = len(data[1]) if isinstance(data, tuple) else len(data)
        sw = torch.rand(n, generator=torch.Generator().manual_seed(0)) * 2
        d = args.devices
        variants = {"plain loop, class-weighted": lambda: plain(program, data),
                    "fit class_weight, 1 device": lambda: fitted(program, data, 1, class_weight=WEIGHTS),
                    "fit unweighted, 1 device": lambda: fitted(program, data, 1),
                    f"fit class_weight, {d} devices": lambda: fitted(program, data, d, class_weight=WEIGHTS),
                    "plain loop, sample-weighted": lambda: plain(program, data, sw),
                    "fit sample_weight, 1 device": lambda: fitted(program, data, 1, sample_weight=sw),
                    f"fit sample_weight, {d} devices": lambda: fitted(program, data, d, sample_weight=sw)}
        for fn in variants.values():        # a warm-up call each
            fn()
        raw = in_turns(variants, rounds)
        speed = {k: [1 / s for s in v] for k, v in raw.items()}
        against = {k: "plain loop, sample-weighted" if "sample" in k else "plain loop, class-weighted"
                   for k in variants if not k.startswith("plain")}
        figures[name] = {"epoch seconds": {k: statistics.median(v) for k, v in raw.items()},
                         "x plain loop (speed)": {k: paired(speed, k, b) for k, b in against.items()}, "raw": raw}
        model = program.model()
        checks = {"plain evaluation, sample-weighted": lambda: plain_evaluation(program, model, data, sw),
                  "evaluate sample_weight, 1 device": lambda: evaluated(model, program, data, sample_weight=sw),
                  "evaluate unweighted, 1 device": lambda: evaluated(model, program, data)}
        for fn in checks.values():
            fn()
        raw = in_turns(checks, rounds)
        speed = {k: [1 / s for s in v] for k, v in raw.items()}
        figures[name]["evaluation"] = {
            "call seconds": {k: statistics.median(v) for k, v in raw.items()},
            "x plain evaluation (speed)": {k: paired(speed, k, "plain evaluation, sample-weighted")
                                           for k in checks if not k.startswith("plain")}, "raw": raw}
        held = hold_out(data, 0.2)[1]
        held_weights = sw[-data_length(held):]
        checks = {"plain evaluation of the held-out part, sample-weighted":
                  lambda: plain_evaluation(program, model, held, held_weights),
                  "fit validation_split, held-out part weighed": lambda: fit_evaluation(program, data, sample_weight=sw),
                  "fit validation_split, unweighted": lambda: fit_evaluation(program, data)}
        for fn in checks.values():
            fn()
        raw = in_turns(checks, rounds)
        speed = {k: [1 / s for s in v] for k, v in raw.items()}
        first = next(iter(checks))
        figures[name]["fit's evaluation"] = {
            "evaluation seconds": {k: statistics.median(v) for k, v in raw.items()},
            "x plain evaluation (speed)": {k: paired(speed, k, first) for k in checks if k != first}, "raw": raw}
    command = "python benchmarks/bench_weights.py " + " ".join(sys.argv[1:])
    save_result({"rounds": rounds, "weights": WEIGHTS, "loss op": op, "programs": figures}, command, args.out)


if __name__ == "__main__":
    main()
