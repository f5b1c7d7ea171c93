"""What the learning-rate range test costs: a plain loop's (every group's rate set before each
step, the loss smoothed, the weights and optimizer put back after) against ``dptrain.lr_find`` on
one device, and Lightning's ``Tuner.lr_find`` where Lightning is installed (``--no-lightning``: not).

    python benchmarks/bench_lr_find.py --rounds 7 --out benchmarks/results/lr_find.json
    python benchmarks/bench_lr_find.py --smoke

The programs: ``everyday.py``'s tiny MLP (tensors in memory, batch 128) and text classifier (a
Dataset of token lists, a padding collate_fn, dict batches, batch 64), ``--steps`` steps (100,
Lightning's default) from 1e-6 to 1 (exponential), no early stop. A figure is one whole call's wall
seconds, set-up included; the variants take turns each round, the order rotating; ratios are paired
(the same round), medians over the rounds.
"""
from __future__ import annotations

import copy
import importlib.util
import logging
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
from dptrain.run.lr_find import rates, smoothed  # noqa: E402

MIN_LR, MAX_LR = 1e-6, 1.0


def _loss(program, model, batch):
    if isinstance(batch, dict):
        return F.cross_entropy(model(batch["input_ids"], batch["attention_mask"]), batch["labels"])
    return F.cross_entropy(model(batch[0]), batch[1])


def plain(program, data, steps):
    """The plain loop's range test."""
    start = time.perf_counter()
    torch.manual_seed(0)
    model = program.model()
    opt = program.optimizer(model.parameters(), lr=MIN_LR)
    saved, saved_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    dataset = torch.utils.data.TensorDataset(*data) if isinstance(data, tuple) else data
    loader = torch.utils.data.DataLoader(dataset, batch_size=program.batch, shuffle=True, collate_fn=program.collate)
    lrs, sums = rates(MIN_LR, MAX_LR, steps, "exponential"), []
    while len(sums) < steps:
        for batch in loader:
            for group in opt.param_groups:
                group["lr"] = lrs[len(sums)]
            loss = _loss(program, model, batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sums.append(loss.item())
            if len(sums) == steps:
                break
    smoothed(sums, [1.0] * steps)
    model.load_state_dict(saved)
    opt.load_state_dict(saved_opt)
    return time.perf_counter() - start


def found(program, data, steps):
    start = time.perf_counter()
    torch.manual_seed(0)
    model = program.model()
    dptrain.lr_find(model, data, optimizer=program.optimizer, batch_size=program.batch, collate_fn=program.collate,
                    devices=1, min_lr=MIN_LR, max_lr=MAX_LR, num_training=steps, early_stop_threshold=None)
    return time.perf_counter() - start


def lightning_found(program, data, steps):
    import lightning
    from lightning.pytorch.tuner import Tuner

    class Module(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = program.model()

        def training_step(self, batch, batch_idx):
            return _loss(program, self.net, batch)

        def configure_optimizers(self):
            return program.optimizer(self.parameters(), lr=MIN_LR)
    start = time.perf_counter()
    torch.manual_seed(0)
    trainer = lightning.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False, max_epochs=1000)
    dataset = torch.utils.data.TensorDataset(*data) if isinstance(data, tuple) else data
    loader = torch.utils.data.DataLoader(dataset, batch_size=program.batch, shuffle=True, collate_fn=program.collate)
    Tuner(trainer).lr_find(Module(), train_dataloaders=loader, min_lr=MIN_LR, max_lr=MAX_LR, num_training=steps,
                           early_stop_threshold=None, update_attr=False)
    return time.perf_counter() - start


def main() -> None:
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    parser = rounds_parser(__doc__, 0)
    parser.add_argument("--programs", default="tiny-mlp,text")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--no-lightning", action="store_true")
    args = parser.parse_args()
    rounds, steps = (1, 12) if args.smoke else (args.rounds, args.steps)
    lightning = not args.no_lightning and importlib.util.find_spec("lightning") is not None
    figures = {}
    for name in args.programs.split(","):
        program = everyday.PROGRAMS[name]
        data = program.data()
        variants = {"plain loop": lambda: plain(program, data, steps), "lr_find": lambda: found(program, data, steps)}
        if lightning:
            variants["lightning Tuner.lr_find"] = lambda: lightning_found(program, data, steps)
        for fn in variants.values():        # a warm-up call each
            fn()
        raw = in_turns(variants, rounds)
        speed = {k: [1 / s for s in v] for k, v in raw.items()}
        figures[name] = {"seconds": {k: statistics.median(v) for k, v in raw.items()},
                         "x plain loop (speed)": {k: paired(speed, k, "plain loop") for k in variants
                                                  if k != "plain loop"}, "raw": raw}
    command = "python benchmarks/bench_lr_find.py " + " ".join(sys.argv[1:])
    save_result({"rounds": rounds, "steps": steps, "programs": figures}, command, args.out)


if __name__ == "__main__":
    main()
