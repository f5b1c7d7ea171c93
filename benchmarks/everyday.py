"""Everyday training programs, each written as its users write it: a plain PyTorch loop, DDP
under torchrun, Accelerate, and ``dptrain.fit`` (issue 22's suite; ``bench_programs.py`` runs
them side by side).

A program is its data, its model, its loss, its optimizer and its global batch; every
framework trains the same one for the same steps. Each runner returns the seconds of every
epoch's training loop (evaluation excluded) and the call's total seconds, so a step's time
and the set-up cost (total minus the epochs) compare alike.

    python benchmarks/everyday.py --framework ddp --program text --epochs 2   # under torchrun
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from job_turns import JobGate  # noqa: E402  (this folder: on the path when run as a script or imported)

# -- the programs -----------------------------------------------------------------------------
@dataclass
class Program:
    name: str
    data: Callable[[], Any]             # a Dataset, or (X, y) tensors
    model: Callable[[], nn.Module]
    batch: int
    lr: float
    optimizer: Callable[..., torch.optim.Optimizer] = torch.optim.SGD
    collate: Optional[Callable] = None
    workers: int = 0
    step: Optional[Callable] = None       # step(model, batch) -> loss, for models computing their own
    # Several optimizers (a GAN): {submodule name: step(model, batch) -> loss}, in order; each
    # submodule's own optimizer (``optimizer`` over its parameters) updates after its step.
    updates: Optional[Dict[str, Callable]] = None
    # Several optimizers on one loss (Muon + AdamW): fn(model) -> {name: optimizer on its
    # parameters}; each steps after the one backward.
    optimizers: Optional[Callable[[nn.Module], Dict[str, torch.optim.Optimizer]]] = None

    def dataset(self) -> Dataset:
        data = self.data()
        return TensorDataset(*data) if isinstance(data, tuple) else data


def tiny_data(n: int = 25_600):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, 32, generator=g)
    y = (X @ torch.randn(32, 4, generator=g)).argmax(1)
    return X, y


def tiny_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))


class Sentences(Dataset):
    """Token sequences of 8-64 tokens; the label is the class most of their tokens point to."""

    def __init__(self, n: int = 8192, vocab: int = 2000, classes: int = 4):
        g = torch.Generator().manual_seed(1)
        lengths = torch.randint(8, 65, (n,), generator=g)
        self.tokens = [torch.randint(1, vocab, (int(k),), generator=g) for k in lengths]
        self.labels = [int(torch.bincount(t % classes, minlength=classes).argmax()) for t in self.tokens]

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, i):
        return {"input_ids": self.tokens[i], "label": self.labels[i]}


def pad_collate(items: List[Dict[str, Any]]) -> Dict[str, torch.Tensor]:
    """Pad to the longest sequence of the batch; a mask says which positions are tokens."""
    longest = max(len(it["input_ids"]) for it in items)
    ids = torch.zeros(len(items), longest, dtype=torch.long)
    mask = torch.zeros(len(items), longest, dtype=torch.bool)
    for i, it in enumerate(items):
        ids[i, :len(it["input_ids"])] = it["input_ids"]
        mask[i, :len(it["input_ids"])] = True
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([it["label"] for it in items])}


class BagClassifier(nn.Module):
    """Mean of the token embeddings under the mask, then an MLP."""

    def __init__(self, vocab: int = 2000, dim: int = 64, classes: int = 4):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.head = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, classes))

    def forward(self, input_ids, attention_mask):
        m = attention_mask.unsqueeze(-1).float()
        return self.head((self.embed(input_ids) * m).sum(1) / m.sum(1))


class TinyEncoder(nn.Module):
    """A Hugging Face-style model: keyword inputs, a dict out with ``logits`` (and ``loss``
    when the batch holds ``labels``)."""

    def __init__(self, vocab: int = 2000, dim: int = 64, classes: int = 4):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layer = nn.TransformerEncoderLayer(dim, 4, 128, dropout=0.0, batch_first=True)
        self.head = nn.Linear(dim, classes)

    def forward(self, input_ids, attention_mask, labels=None):
        h = self.layer(self.embed(input_ids), src_key_padding_mask=~attention_mask)
        m = attention_mask.unsqueeze(-1).float()
        logits = self.head((h * m).sum(1) / m.sum(1))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits, labels)
        return out


def muon_and_adamw(model: nn.Module) -> Dict[str, torch.optim.Optimizer]:
    """Muon for the hidden matrices, AdamW for the embedding, the biases and the output layer
    (Muon's own advice: not for embeddings or the last layer)."""
    named = list(model.named_parameters())
    last = named[-2][0]           # the output layer's weight
    matrices = [p for n, p in named if p.ndim == 2 and "embed" not in n and n != last]
    others = [p for p in model.parameters() if all(p is not q for q in matrices)]
    return {"muon": torch.optim.Muon(matrices, lr=0.02), "adamw": torch.optim.AdamW(others, lr=1e-3)}


def hf_step(model, batch):
    return model(**batch)


class AugmentedImages(Dataset):
    """Fashion-MNIST images, randomly shifted (pad 2, crop 28) and flipped per read."""

    def __init__(self, n: int = 12_288, data_dir: Optional[str] = None):
        images, labels = fashion(n, data_dir)
        self.images = (images * 255).round().to(torch.uint8)
        self.labels = labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        x = F.pad(self.images[i].float().div_(255), (2, 2, 2, 2))
        dx, dy = torch.randint(0, 5, (2,)).tolist()
        x = x[:, dy:dy + 28, dx:dx + 28]
        if torch.rand(()) < 0.5:
            x = x.flip(-1)
        return (x - 0.286) / 0.353, int(self.labels[i])


def fashion(n: int, data_dir: Optional[str] = None):
    """The first ``n`` Fashion-MNIST training images and labels; random ones of the same
    shapes only where the files are not found (a smoke run elsewhere), which it says."""
    from dptrain.data.datasets import load_dataset
    try:
        data = load_dataset("fashion-mnist", data_dir=data_dir or os.environ.get("BENCH_DATA"), allow_download=False)
    except FileNotFoundError as e:
        print(f"everyday: random images in place of Fashion-MNIST ({str(e).split(';')[0]})", file=sys.stderr)
        g = torch.Generator().manual_seed(2)
        return torch.rand(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)
    return data.train_X[:n], data.train_y[:n]


def fashion_tensors(n: int = 12_288):
    return fashion(n)


def small_cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(32 * 7 * 7, 10))


def lenet() -> nn.Module:
    from dptrain.models import GluonLeNet
    return GluonLeNet()


def resnet() -> nn.Module:
    from dptrain.models import resnet18
    return resnet18(10, in_channels=1)


class RingGAN(nn.Module):
    """examples/gan.py's GAN: a generator and a discriminator, MLPs of 128 units."""

    def __init__(self):
        super().__init__()
        self.generator = nn.Sequential(nn.Linear(8, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 2))
        self.discriminator = nn.Sequential(nn.Linear(2, 128), nn.LeakyReLU(0.2), nn.Linear(128, 128),
                                           nn.LeakyReLU(0.2), nn.Linear(128, 1))


def ring(n: int = 16_384) -> torch.Tensor:
    """Points on a ring of 8 Gaussians (the real data; no labels)."""
    g = torch.Generator().manual_seed(3)
    angles = torch.randint(0, 8, (n,), generator=g) * (2 * math.pi / 8)
    return 2 * torch.stack([angles.cos(), angles.sin()], 1) + 0.05 * torch.randn(n, 2, generator=g)


def _bce(logits: torch.Tensor, label: float) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(logits, torch.full_like(logits, label))


def _real(batch: Any) -> torch.Tensor:
    return batch[0] if isinstance(batch, (list, tuple)) else batch


def gan_d_step(gan: nn.Module, batch: Any) -> torch.Tensor:
    real = _real(batch)
    fake = gan.generator(torch.randn(len(real), 8, device=real.device)).detach()
    return _bce(gan.discriminator(real), 1.0) + _bce(gan.discriminator(fake), 0.0)


def gan_g_step(gan: nn.Module, batch: Any) -> torch.Tensor:
    real = _real(batch)
    return _bce(gan.discriminator(gan.generator(torch.randn(len(real), 8, device=real.device))), 1.0)


PROGRAMS: Dict[str, Program] = {
    "tiny-mlp": Program("tiny-mlp", tiny_data, tiny_mlp, 128, 0.1),
    "text": Program("text", Sentences, BagClassifier, 64, 1e-3, torch.optim.AdamW, pad_collate),
    "cnn-augment": Program("cnn-augment", AugmentedImages, small_cnn, 128, 0.05, collate=None, workers=2),
    "hf-style": Program("hf-style", lambda: Sentences(4096), TinyEncoder, 32, 1e-3, torch.optim.AdamW, pad_collate,
                        step=hf_step),
    "lenet": Program("lenet", fashion_tensors, lenet, 256, 0.9),
    "resnet18": Program("resnet18", lambda: fashion_tensors(512), resnet, 64, 0.05),
    "gan": Program("gan", ring, RingGAN, 256, 1e-3, functools.partial(torch.optim.Adam, betas=(0.5, 0.999)),
                   updates={"discriminator": gan_d_step, "generator": gan_g_step}),
    "muon": Program("muon", lambda: Sentences(4096), TinyEncoder, 32, 1e-3, collate=pad_collate, step=hf_step,
                    optimizers=muon_and_adamw),
}


def shrink(program: Program, samples: int) -> Program:
    """The program on its first ``samples`` samples (the smoke run)."""
    def data():
        d = program.data()
        if isinstance(d, tuple):
            return tuple(t[:samples] for t in d)
        if isinstance(d, torch.Tensor):
            return d[:samples]
        return torch.utils.data.Subset(d, range(min(samples, len(d))))
    return Program(program.name, data, program.model, program.batch, program.lr, program.optimizer,
                   program.collate, min(program.workers, 1), program.step, program.updates, program.optimizers)


# -- the frameworks ---------------------------------------------------------------------------
def _loss(program: Program, model: nn.Module, batch: Any) -> torch.Tensor:
    """One batch's loss as each framework's user writes it."""
    if program.step is not None:
        return program.step(model, batch)["loss"]
    if isinstance(batch, dict):
        labels = batch["labels"]
        return F.cross_entropy(model(**{k: v for k, v in batch.items() if k != "labels"}), labels)
    X, y = batch
    return F.cross_entropy(model(X), y)


def _optimizer(program: Program, model: nn.Module) -> Any:
    """The program's optimizer on the model; with several, ``{name: one on that submodule}``
    (or on its parameters: ``program.optimizers``)."""
    if program.optimizers is not None:
        return program.optimizers(model)
    if program.updates is None:
        return program.optimizer(model.parameters(), lr=program.lr)
    return {name: program.optimizer(getattr(model, name).parameters(), lr=program.lr) for name in program.updates}


def _train_batch(program: Program, model: nn.Module, opt: Any, to: Callable[[Any], Any] = lambda b: b,
                 backward: Callable[[torch.Tensor], None] = torch.Tensor.backward) -> Callable[[Any], None]:
    """One batch as the program's users write it: ``zero_grad``, backward, ``step``; with
    several optimizers each update in turn (the GAN: the discriminator's, then the generator's)."""
    if program.optimizers is not None:
        def train_all(batch: Any) -> None:
            for o in opt.values():
                o.zero_grad()
            backward(_loss(program, model, to(batch)))
            for o in opt.values():
                o.step()
        return train_all
    if program.updates is None:
        def train(batch: Any) -> None:
            opt.zero_grad()
            backward(_loss(program, model, to(batch)))
            opt.step()
        return train

    def train_each(batch: Any) -> None:
        batch = to(batch)
        for name, step in program.updates.items():
            opt[name].zero_grad()
            backward(step(model, batch))
            opt[name].step()
    return train_each


def _to(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, dict):
        return {k: v.to(device, non_blocking=True) for k, v in batch.items()}
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    return [t.to(device, non_blocking=True) for t in batch]


def _model(program: Program, device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return program.model().to(device)


def _loader(program: Program, batch: int, sampler=None, shuffle: bool = True) -> DataLoader:
    return DataLoader(program.dataset(), batch_size=batch, shuffle=shuffle if sampler is None else None,
                      sampler=sampler, collate_fn=program.collate, num_workers=program.workers,
                      persistent_workers=program.workers > 0, drop_last=True)


def _plain(program: Program, device: str):
    """The plain loop's device, model, optimizer and DataLoader."""
    dev = torch.device(device)
    model = _model(program, dev)
    return dev, model, _optimizer(program, model), _loader(program, program.batch)


def run_plain(program: Program, epochs: int, device: str = "cpu", gate: Optional[Callable[[], None]] = None
              ) -> Dict[str, Any]:
    """The plain loop: a DataLoader, ``.to(device)``, forward, backward, step. ``gate()`` is
    called before each epoch (``bench_programs``'s interleaved part: variants take turns)."""
    start = time.perf_counter()
    dev, model, opt, loader = _plain(program, device)
    return {"epochs": _epochs_of(epochs, loader, _train_batch(program, model, opt, lambda b: _to(b, dev)), dev, gate),
            "total": time.perf_counter() - start, "steps": len(loader)}


def run_plain_tensors(program: Program, epochs: int, device: str = "cpu") -> Dict[str, Any]:
    """The fastest hand loop for tensors in memory: whole batches indexed, no DataLoader."""
    start = time.perf_counter()
    dev = torch.device(device)
    X, y = (t.to(dev) for t in program.data())
    model = _model(program, dev)
    opt = program.optimizer(model.parameters(), lr=program.lr)
    n, times = len(X) // program.batch * program.batch, []
    for epoch in range(epochs):
        _sync(dev)
        t = time.perf_counter()
        perm = torch.randperm(len(X), device=dev)
        for i in range(0, n, program.batch):
            idx = perm[i:i + program.batch]
            opt.zero_grad()
            F.cross_entropy(model(X[idx]), y[idx]).backward()
            opt.step()
        _sync(dev)
        times.append(time.perf_counter() - t)
    return {"epochs": times, "total": time.perf_counter() - start, "steps": n // program.batch}


def _epochs(epochs: int, loader, loss_of: Callable, opt, dev: torch.device,
            gate: Optional[Callable[[], None]] = None) -> List[float]:
    """Each epoch's seconds of ``zero_grad``, ``loss_of(batch).backward()``, ``step``."""
    def train(batch: Any) -> None:
        opt.zero_grad()
        loss_of(batch).backward()
        opt.step()
    return _epochs_of(epochs, loader, train, dev, gate)


def _epochs_of(epochs: int, loader, train: Callable[[Any], None], dev: torch.device,
               gate: Optional[Callable[[], None]] = None) -> List[float]:
    """Each epoch's seconds of ``train(batch)`` over the loader."""
    times = []
    for epoch in range(epochs):
        if gate is not None:
            gate()
        if hasattr(loader, "sampler") and hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        _sync(dev)
        t = time.perf_counter()
        for batch in loader:
            train(batch)
        _sync(dev)
        times.append(time.perf_counter() - t)
    return times


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def fit_settings(program: Program, epochs: int, devices: Optional[str] = None,
                 callbacks: Optional[List[Any]] = None) -> Dict[str, Any]:
    """``dptrain.fit``'s keyword arguments for the program, as its README writes them."""
    kwargs: Dict[str, Any] = dict(optimizer=program.optimizer, lr=program.lr, epochs=epochs,
                                  batch_size=program.batch, num_workers=program.workers, log=None, progress=False)
    if program.updates is not None or program.optimizers is not None:     # (built on the model: with_model)
        del kwargs["optimizer"], kwargs["lr"]
    if program.updates is not None:
        kwargs["step"] = dict(program.updates)
    if program.collate is not None:
        kwargs["collate_fn"] = program.collate
    if program.step is not None:
        kwargs["step"] = program.step
    if devices:
        kwargs["devices"] = devices
    if callbacks:
        kwargs["callbacks"] = callbacks
    return kwargs


def with_model(program: Program, model: nn.Module, settings: Dict[str, Any]) -> Dict[str, Any]:
    """``settings`` with the optimizers several updates need, built on ``model``'s parts."""
    several = program.updates is not None or program.optimizers is not None
    return {**settings, "optimizer": _optimizer(program, model)} if several else settings


def run_dptrain(program: Program, epochs: int, devices: Optional[str] = None,
                gate: Optional[Callable[[], None]] = None) -> Dict[str, Any]:
    """``dptrain.fit`` as its README writes it: the Dataset (or tensors) and the settings
    (``gate``: as ``run_plain``'s, called by a callback as each epoch starts, before its clock)."""
    import dptrain
    start = time.perf_counter()
    torch.manual_seed(0)
    model = program.model()
    data = program.data()
    callbacks = None
    if gate is not None:
        class Gate(dptrain.Callback):
            def on_epoch_start(self, run, epoch):
                gate()
        callbacks = [Gate()]
    result = dptrain.fit(model, data, **with_model(program, model, fit_settings(program, epochs, devices, callbacks)))
    return {"epochs": [row["sec"] for row in result["history"]], "total": time.perf_counter() - start,
            "devices": result["devices"], "steps": None}


def run_accelerate(program: Program, epochs: int, gate: Optional[Callable[[], None]] = None) -> Dict[str, Any]:
    """Accelerate as its docs write it: ``prepare`` the model, optimizer and DataLoader,
    ``accelerator.backward``. The DataLoader's batch is per process."""
    from accelerate import Accelerator
    start = time.perf_counter()
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = program.model()
    opt = _optimizer(program, model)
    loader = _loader(program, program.batch // accelerator.num_processes)
    if program.optimizers is not None:      # the model and every optimizer prepared
        names = list(opt)
        model, *prepared, loader = accelerator.prepare(model, *opt.values(), loader)
        opt = dict(zip(names, prepared))
    elif program.updates is None:
        model, opt, loader = accelerator.prepare(model, opt, loader)
    else:       # each submodule and its optimizer prepared, as Accelerate's GAN examples do
        names = list(program.updates)
        *parts, loader = accelerator.prepare(*[getattr(model, n) for n in names], *[opt[n] for n in names], loader)
        for n, part, o in zip(names, parts[:len(names)], parts[len(names):]):
            setattr(model, n, part)
            opt[n] = o
    train = _train_batch(program, model, opt, backward=accelerator.backward)
    times = []
    for epoch in range(epochs):
        if gate is not None:
            gate()
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        t = time.perf_counter()
        for batch in loader:
            train(batch)
        accelerator.wait_for_everyone()
        times.append(time.perf_counter() - t)
    steps = len(loader)
    accelerator.end_training()
    if torch.distributed.is_initialized():      # left to exit, gloo aborted 2 short runs in 4 (SIGABRT)
        torch.distributed.destroy_process_group()
    return {"epochs": times, "total": time.perf_counter() - start, "steps": steps}


def run_ddp(program: Program, epochs: int, gate: Optional[Callable[[], None]] = None) -> Dict[str, Any]:
    """DDP under torchrun as PyTorch's tutorial writes it: a process group, a
    ``DistributedSampler``, the per-process batch, ``DistributedDataParallel``."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data.distributed import DistributedSampler
    start = time.perf_counter()
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    if program.updates is None:
        model = DDP(_model(program, torch.device("cpu")))
    else:       # each submodule wrapped (the GAN: DDP(generator), DDP(discriminator)), as DCGAN scripts do
        model = _model(program, torch.device("cpu"))
        for name in program.updates:
            setattr(model, name, DDP(getattr(model, name)))
    opt = _optimizer(program, model)
    data = program.dataset()
    sampler = DistributedSampler(data, shuffle=True, drop_last=True)
    loader = DataLoader(data, batch_size=program.batch // world, sampler=sampler, collate_fn=program.collate,
                        num_workers=program.workers, persistent_workers=program.workers > 0, drop_last=True)
    times = _epochs_of(epochs, loader, _train_batch(program, model, opt), torch.device("cpu"), gate)
    dist.barrier()
    dist.destroy_process_group()
    return {"epochs": times, "total": time.perf_counter() - start, "steps": len(loader)}


# -- evaluation -------------------------------------------------------------------------------
def held_out(program: Program) -> Any:
    """The evaluation part's set: the first quarter of the program's data (its timing is what
    counts, not what it measures)."""
    data = program.data()
    if isinstance(data, tuple):
        return tuple(t[:len(t) // 4] for t in data)
    return torch.utils.data.Subset(data, range(len(data) // 4))


def _evaluate(program: Program, model: nn.Module, loader, dev: torch.device) -> float:
    """The plain loop's evaluation: eval mode, no gradients, the loss summed over the set
    (and the correct predictions, for a classifier), read once at the end."""
    model.eval()
    loss_sum = torch.zeros((), device=dev)
    correct = torch.zeros((), device=dev, dtype=torch.long)
    with torch.no_grad():
        for batch in loader:
            batch = _to(batch, dev)
            if program.updates is not None:      # several optimizers: each step's loss
                n = len(_real(batch))
                for step in program.updates.values():
                    loss_sum += step(model, batch) * n
                continue
            if program.step is not None:
                n = len(batch["labels"])
                loss_sum += program.step(model, batch)["loss"] * n
                continue
            X, y = (batch[0], batch[1]) if not isinstance(batch, dict) else (batch, batch["labels"])
            out = model(X) if not isinstance(batch, dict) else \
                model(**{k: v for k, v in batch.items() if k != "labels"})
            loss_sum += F.cross_entropy(out, y, reduction="sum")
            correct += (out.argmax(1) == y).sum()
    model.train()
    return float(loss_sum) + float(correct)


def run_plain_eval(program: Program, epochs: int, device: str = "cpu",
                   gate: Optional[Callable[[], None]] = None) -> Dict[str, Any]:
    """The plain loop with an evaluation after every epoch; the evaluations' seconds (``gate()``
    before each evaluation's clock, to take turns: ``turns.py``)."""
    start = time.perf_counter()
    dev, model, opt, loader = _plain(program, device)
    evals = _eval_loader(program)
    times = []
    for epoch in range(epochs):
        _epochs_of(1, loader, _train_batch(program, model, opt, lambda b: _to(b, dev)), dev)
        _sync(dev)
        if gate is not None:
            gate()
        t = time.perf_counter()
        _evaluate(program, model, evals, dev)
        times.append(time.perf_counter() - t)
    return {"epochs": times, "total": time.perf_counter() - start, "steps": len(evals)}


def run_dptrain_eval(program: Program, epochs: int, devices: str = "cpu:0",
                     gate: Optional[Callable[[], None]] = None) -> Dict[str, Any]:
    """``dptrain.fit`` with the same evaluation set; each evaluation's seconds, seen by a
    callback: from its start to its figures (summed over the processes); ``gate()`` as
    ``run_plain_eval``'s."""
    import dptrain

    class EvalTime(dptrain.Callback):
        def __init__(self):
            self.began, self.times = 0.0, []

        def on_evaluate_start(self, run, epoch):
            if gate is not None:
                gate()
            self.began = time.perf_counter()

        def on_evaluate_end(self, run, epoch, metrics):
            self.times.append(time.perf_counter() - self.began)
    start = time.perf_counter()
    torch.manual_seed(0)
    timer = EvalTime()
    data = held_out(program)
    n = len(data[0]) if isinstance(data, tuple) else len(data)
    model = program.model()
    dptrain.fit(model, program.data(), data, **with_model(program, model, fit_settings(program, epochs, devices, [timer])))
    return {"epochs": timer.times, "total": time.perf_counter() - start, "steps": -(-n // program.batch)}


def _eval_loader(program: Program) -> DataLoader:
    """The plain loop's DataLoader over ``held_out``'s set."""
    data = held_out(program)
    return DataLoader(TensorDataset(*data) if isinstance(data, tuple) else data, batch_size=program.batch,
                      collate_fn=program.collate, num_workers=program.workers, persistent_workers=program.workers > 0)


def run_paired(program: Program, epochs: int, evaluation: bool = False,
               gate: Optional[Callable[[], None]] = None) -> Dict[str, Any]:
    """The plain loop and ``dptrain.fit`` on 1 device in one process, epoch by epoch (or
    evaluation by evaluation): a callback of dptrain's runs one epoch of the plain loop (its
    own model, optimizer and DataLoader, whose workers wait meanwhile, as dptrain's do during
    the plain loop's epoch) just before dptrain's epoch, then just after the next one, and so
    on, so neither always runs first. The same interpreter, memory and threads for both; the
    two only share the machine's weather of the same seconds. ``gate`` is called once, before
    the set-up (``turns.py``: a part of its own, in a fresh process)."""
    import dptrain
    if gate is not None:
        gate()
    dev, model, opt, loader = _plain(program, "cpu")
    train = _train_batch(program, model, opt, lambda b: _to(b, dev))
    evals = _eval_loader(program) if evaluation else None
    plain: List[float] = []
    first: List[str] = []           # which ran first in each pair

    def plain_once() -> None:
        if evaluation:
            t = time.perf_counter()
            _evaluate(program, model, evals, dev)
            plain.append(time.perf_counter() - t)
        else:
            plain.extend(_epochs_of(1, loader, train, dev))

    class Paired(dptrain.Callback):
        def __init__(self):
            self.mine: List[float] = []
            self.began = 0.0

        def _before(self, k: int) -> None:
            if k % 2:
                first.append("plain loop")
                plain_once()
            self.began = time.perf_counter()

        def _after(self, k: int) -> None:
            if evaluation:
                self.mine.append(time.perf_counter() - self.began)
            if not k % 2:
                first.append("dptrain")
                plain_once()

        def on_epoch_start(self, run, epoch):
            if not evaluation:
                self._before(epoch)

        def on_epoch_end(self, run, epoch, row):
            if not evaluation:
                self._after(epoch)

        def on_evaluate_start(self, run, epoch):
            if evaluation:
                self._before(epoch)

        def on_evaluate_end(self, run, epoch, metrics):
            if evaluation:
                self._after(epoch)
    paired = Paired()
    torch.manual_seed(0)
    mine_model = program.model()
    result = dptrain.fit(mine_model, program.data(), held_out(program) if evaluation else None,
                         **with_model(program, mine_model, fit_settings(program, epochs, "cpu:0", [paired])))
    mine = paired.mine if evaluation else [row["sec"] for row in result["history"]]
    return {"plain loop": {"epochs": plain, "steps": len(evals if evaluation else loader)},
            "dptrain, 1 device": {"epochs": mine}, "first": first}


def run_named(framework: str, name: str, epochs: int, samples: int = 0, *args: Any, **kwargs: Any) -> Dict[str, Any]:
    """``FRAMEWORKS[framework](program, epochs, *args, **kwargs)`` on the program called
    ``name`` (its first ``samples`` only, if given): what another process can be asked to run
    by name (``turns.py``)."""
    program = PROGRAMS[name] if not samples else shrink(PROGRAMS[name], samples)
    return FRAMEWORKS[framework](program, epochs, *args, **kwargs)


FRAMEWORKS = {"plain": run_plain, "plain-tensors": run_plain_tensors, "dptrain": run_dptrain,
              "accelerate": run_accelerate, "ddp": run_ddp, "plain-eval": run_plain_eval,
              "dptrain-eval": run_dptrain_eval, "paired": run_paired}


def main() -> None:
    """One framework on one program in this process (torchrun starts one per rank); rank 0
    writes the result as JSON to ``--out``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--framework", choices=sorted(FRAMEWORKS), required=True)
    parser.add_argument("--program", choices=sorted(PROGRAMS), required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, help="train on the first N samples only (smoke runs)")
    parser.add_argument("--out")
    args = parser.parse_args()
    program = PROGRAMS[args.program]
    if args.samples:
        program = shrink(program, args.samples)
    turns = JobGate.from_env()          # taking turns with other jobs (job_turns.py)
    if turns is not None:
        turns.gate()                    # the set-up too, in its turn
    result = FRAMEWORKS[args.framework](program, args.epochs, **({"gate": turns.gate} if turns else {}))
    if int(os.environ.get("RANK", "0")) == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump({k: v for k, v in result.items() if not isinstance(v, float) or math.isfinite(v)}, f)
    if turns is not None:
        turns.finish()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # Measured and written: leave without the interpreter's teardown, where gloo's threads
        # aborted 1 short Accelerate run in 3 here ("terminate called without an active
        # exception"), even after destroy_process_group; every framework leaves alike.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
