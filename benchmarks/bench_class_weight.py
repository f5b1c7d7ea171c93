"""What Keras's ``class_weight`` costs a step: the plain loop weighing each sample's loss by its
class (``(F.cross_entropy(out, y, reduction="none") * w[y]).mean()``) against ``dptrain.fit(...,
class_weight=...)`` and ``fit`` unweighted, on one device and on ``--devices`` (default 2 virtual).

    python benchmarks/bench_class_weight.py --rounds 7 --out benchmarks/results/class_weight.json
    python benchmarks/bench_class_weight.py --smoke

The programs: ``everyday.py``'s tiny MLP (tensors in memory, batch 128, 4 classes) and text
classifier (token lists, a padding collate_fn, dict batches, batch 64), 4 classes weighted 1, 2, 4,
8. A figure is an epoch's seconds (the second of a 2-epoch call: set-up left out, as an epoch of
a long run); the variants take turns each round, the order rotating; ratios are paired (the same
round), medians over the rounds. "loss op" times the loss alone, forward and backward on one
thread (a 128 x 4 batch, microseconds a call): the plain loop's expression against
``ClassWeights.weighted_sum`` (what ``fit`` calls) and the unweighted ``cross_entropy``.
"""
from __future__ import annotations

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
from dptrain.engine.class_weights import ClassWeights  # noqa: E402

WEIGHTS = {0: 1.0, 1: 2.0, 2: 4.0, 3: 8.0}


def _inputs_and_labels(batch):
    if isinstance(batch, dict):
        return (batch["input_ids"], batch["attention_mask"]), batch["labels"]
    return (batch[0],), batch[1]


def plain(program, data, epochs=2):
    """The plain loop's weighted epochs; the last one's seconds."""
    torch.manual_seed(0)
    model = program.model()
    opt = program.optimizer(model.parameters(), lr=program.lr)
    w = torch.tensor([WEIGHTS[c] for c in range(4)])
    dataset = torch.utils.data.TensorDataset(*data) if isinstance(data, tuple) else data
    loader = torch.utils.data.DataLoader(dataset, batch_size=program.batch, shuffle=True, collate_fn=program.collate)
    for _ in range(epochs):
        start = time.perf_counter()
        total = torch.zeros(())
        for batch in loader:
            inputs, y = _inputs_and_labels(batch)
            loss = (F.cross_entropy(model(*inputs), y, reduction="none") * w[y]).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.detach()
        float(total)
        seconds = time.perf_counter() - start
    return seconds


def fitted(program, data, devices, class_weight):
    torch.manual_seed(0)
    result = dptrain.fit(program.model(), data, optimizer=program.optimizer, lr=program.lr,
                         batch_size=program.batch, collate_fn=program.collate, epochs=2, devices=devices,
                         class_weight=class_weight, log=None, progress=False)
    return result["history"][-1]["sec"]


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
        variants = {"plain loop, weighted": lambda: plain(program, data),
                    "fit class_weight, 1 device": lambda: fitted(program, data, 1, WEIGHTS),
                    "fit unweighted, 1 device": lambda: fitted(program, data, 1, None),
                    f"fit class_weight, {args.devices} devices": lambda: fitted(program, data, args.devices, WEIGHTS)}
        for fn in variants.values():        # a warm-up call each
            fn()
        raw = in_turns(variants, rounds)
        speed = {k: [1 / s for s in v] for k, v in raw.items()}
        figures[name] = {"epoch seconds": {k: statistics.median(v) for k, v in raw.items()},
                         "x plain loop (speed)": {k: paired(speed, k, "plain loop, weighted") for k in variants
                                                  if k != "plain loop, weighted"}, "raw": raw}
    command = "python benchmarks/bench_class_weight.py " + " ".join(sys.argv[1:])
    save_result({"rounds": rounds, "weights": WEIGHTS, "loss op": op, "programs": figures}, command, args.out)


if __name__ == "__main__":
    main()
