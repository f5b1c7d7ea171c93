"""What reading a stream (an ``IterableDataset``) costs: the plain loop over a ``DataLoader``
of the stream against ``dptrain.fit`` on the same stream (1 device, and 2 virtual devices),
and against ``fit`` on the same samples as a map-style ``Dataset``, and on the stream without
``__len__`` (read to its end each epoch); and a ``DataLoader`` with
a ``WeightedRandomSampler``, a stream that yields whole batches (``DataLoader(stream,
batch_size=None)``), and (text) a batch sampler grouping sequences by length, the plain
loop's against ``fit``'s; in turns, median epoch
times past the first, paired ratios; with ``--processes``, ``fit`` as 2 processes against DDP
as 2 processes on the same stream sharded by rank (each reading its half), under torchrun,
``fit`` with ``dispatch_batches`` (rank 0 reads, the other gets its parts), and ``fit`` with
``sharded_stream`` on DDP's stream sharded by rank (each reads its share); with
``--evaluation``, 2 processes evaluating the stream: DDP's script on its shares, ``evaluate``
reading it whole, ``evaluate`` with ``sharded_stream``. ``--read-us``:
each sample's read waits that long (a stream read over a network).

The stream yields the samples of ``everyday.py``'s programs (the tiny MLP's rows, the text
classifier's token sequences, padded by its ``collate_fn``) in order, with ``__len__``.

    python benchmarks/bench_stream.py --rounds 5 --epochs 3 --processes   # --processes: also 2 vs DDP
    python benchmarks/bench_stream.py --rounds 5 --epochs 3 --processes --read-us 100 --programs text
    python benchmarks/bench_stream.py --rounds 3 --epochs 4 --evaluation --read-us 200 --programs text
    python benchmarks/bench_stream.py --smoke        # CI: one short round
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Tuple

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler, TensorDataset, WeightedRandomSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import everyday  # noqa: E402
import dptrain  # noqa: E402
from common import rounds_parser, save_result  # noqa: E402


#: ``--read-us``: what reading a sample waits (a stream read over a network), in seconds.
READ_WAIT = [0.0]


class Streamed(IterableDataset):
    """A map-style dataset's samples, in order, as a stream (each read waiting ``READ_WAIT``)."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __iter__(self):
        return (self._read(i) for i in range(len(self.dataset)))

    def _read(self, i: int) -> Any:
        if READ_WAIT[0]:
            time.sleep(READ_WAIT[0])
        return self.dataset[i]


class Unsized(IterableDataset):
    """The same stream without ``__len__``: an epoch read to its end, its batches counted as
    they come (Keras's and Lightning's epoch of such a stream)."""

    def __init__(self, dataset: Dataset):
        self.stream = Streamed(dataset)

    def __iter__(self):
        return iter(self.stream)


class Batched(IterableDataset):
    """The stream's samples collated ``batch`` at a time: a stream that yields whole batches
    (WebDataset's ``.batched(n)``), read through ``DataLoader(stream, batch_size=None)``."""

    def __init__(self, dataset: Dataset, batch: int, collate: Any):
        self.stream, self.batch = Streamed(dataset), batch
        self.collate = collate or torch.utils.data.default_collate

    def __iter__(self):
        samples = []
        for sample in self.stream:
            samples.append(sample)
            if len(samples) == self.batch:
                yield self.collate(samples)
                samples = []
        if samples:
            yield self.collate(samples)


def of_batches(program: everyday.Program, data: Dataset) -> DataLoader:
    return DataLoader(Batched(data, program.batch, program.collate), batch_size=None)


def plain_batches(program: everyday.Program, data: Dataset, epochs: int) -> List[float]:
    """The plain loop over a DataLoader of a stream of whole batches (1 device)."""
    dev = torch.device("cpu")
    model = everyday._model(program, dev)
    opt = program.optimizer(model.parameters(), lr=program.lr)
    return everyday._epochs(epochs, of_batches(program, data), lambda b: everyday._loss(program, model, b), opt, dev)


def dataset(program: everyday.Program, samples: int) -> Dataset:
    data = program.data()
    if isinstance(data, tuple):
        return TensorDataset(*(t[:samples] for t in data))
    return torch.utils.data.Subset(data, range(min(samples, len(data))))


def plain(program: everyday.Program, data: Dataset, epochs: int) -> List[float]:
    """The plain loop over a ``DataLoader`` of the stream (1 device)."""
    dev = torch.device("cpu")
    model = everyday._model(program, dev)
    opt = program.optimizer(model.parameters(), lr=program.lr)
    loader = DataLoader(Streamed(data), batch_size=program.batch, collate_fn=program.collate)
    return everyday._epochs(epochs, loader, lambda b: everyday._loss(program, model, b), opt, dev)


def weighted(program: everyday.Program, data: Dataset) -> DataLoader:
    """A DataLoader drawing ``len(data)`` samples a pass by weights (every 4th sample 4 times as likely)."""
    weights = [4.0 if i % 4 == 0 else 1.0 for i in range(len(data))]
    return DataLoader(data, batch_size=program.batch, collate_fn=program.collate,
                      sampler=WeightedRandomSampler(weights, len(data)))


def plain_weighted(program: everyday.Program, data: Dataset, epochs: int) -> List[float]:
    """The plain loop over a DataLoader with a ``WeightedRandomSampler`` (1 device)."""
    dev = torch.device("cpu")
    model = everyday._model(program, dev)
    opt = program.optimizer(model.parameters(), lr=program.lr)
    return everyday._epochs(epochs, weighted(program, data), lambda b: everyday._loss(program, model, b), opt, dev)


class LengthBuckets(Sampler):
    """Batches of sequences of alike lengths (Hugging Face's ``group_by_length``): a shuffle cut
    into chunks of 50 batches, each sorted by length and cut into batches, the batches shuffled."""

    def __init__(self, lengths: List[int], batch: int):
        self.lengths, self.batch, self.generator = lengths, batch, None

    def __len__(self) -> int:
        return -(-len(self.lengths) // self.batch)

    def __iter__(self):
        order = torch.randperm(len(self.lengths), generator=self.generator).tolist()
        chunk = 50 * self.batch
        batches = []
        for c in range(0, len(order), chunk):
            part = sorted(order[c:c + chunk], key=lambda i: -self.lengths[i])
            batches += [part[k:k + self.batch] for k in range(0, len(part), self.batch)]
        return iter([batches[i] for i in torch.randperm(len(batches), generator=self.generator).tolist()])


def bucketed(program: everyday.Program, data: Dataset) -> DataLoader:
    lengths = [len(data[i]["input_ids"]) for i in range(len(data))]
    return DataLoader(data, batch_sampler=LengthBuckets(lengths, program.batch), collate_fn=program.collate)


def plain_bucketed(program: everyday.Program, data: Dataset, epochs: int) -> List[float]:
    """The plain loop over a DataLoader whose batch sampler groups sequences by length (1 device)."""
    dev = torch.device("cpu")
    model = everyday._model(program, dev)
    opt = program.optimizer(model.parameters(), lr=program.lr)
    return everyday._epochs(epochs, bucketed(program, data), lambda b: everyday._loss(program, model, b), opt, dev)


def fitted(program: everyday.Program, data: Any, epochs: int, devices: int, **kw: Any) -> List[float]:
    torch.manual_seed(0)
    settings = everyday.fit_settings(program, epochs, str(devices))
    if isinstance(data, DataLoader) and isinstance(data.dataset, Batched):     # (collated: the stream's batches)
        settings.pop("collate_fn", None)
        settings.pop("batch_size")
    result = dptrain.fit(program.model(), data, shuffle=False, **settings, **kw)
    return [row["sec"] for row in result["history"]]


class RankShare(Streamed):
    """A stream sharded by rank, as a DDP user writes one: every world_size-th sample."""

    def __init__(self, dataset: Dataset, rank: int, world: int):
        super().__init__(dataset)
        self.rank, self.world = rank, world

    def __len__(self) -> int:
        return len(range(self.rank, len(self.dataset), self.world))

    def __iter__(self):
        return (self._read(i) for i in range(self.rank, len(self.dataset), self.world))


def ddp(program: everyday.Program, data: Dataset, epochs: int) -> List[float]:
    """DDP under torchrun on a stream each process reads its share of (the per-process batch)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = DDP(everyday._model(program, torch.device("cpu")))
    opt = program.optimizer(model.parameters(), lr=program.lr)
    loader = DataLoader(RankShare(data, rank, world), batch_size=program.batch // world, collate_fn=program.collate)
    times = everyday._epochs(epochs, loader, lambda b: everyday._loss(program, model, b), opt, torch.device("cpu"))
    dist.barrier()
    dist.destroy_process_group()
    return times


def ddp_evaluation(program: everyday.Program, data: Dataset, repeats: int) -> List[float]:
    """A DDP script's evaluation of a stream sharded by rank: each process its share, the loss
    sum and count summed over the processes (one ``all_reduce``); seconds per evaluation."""
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = everyday._model(program, torch.device("cpu")).eval()
    loader = DataLoader(RankShare(data, rank, world), batch_size=program.batch // world, collate_fn=program.collate)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        totals = torch.zeros(2, dtype=torch.float64)
        with torch.no_grad():
            for batch in loader:
                n = len(batch["labels"]) if isinstance(batch, dict) else len(batch[1])
                totals += torch.tensor([float(everyday._loss(program, model, batch)) * n, n], dtype=torch.float64)
        dist.all_reduce(totals)
        times.append(time.perf_counter() - t)
    dist.barrier()
    dist.destroy_process_group()
    return times


def evaluated(program: everyday.Program, data: Any, repeats: int, **kw: Any) -> List[float]:
    """``dptrain.evaluate`` ``repeats`` times on 1 device a process; seconds each."""
    model, times = everyday._model(program, torch.device("cpu")), []
    for _ in range(repeats):
        t = time.perf_counter()
        dptrain.evaluate(model, data, batch_size=program.batch, devices=1, collate_fn=program.collate, **kw)
        times.append(time.perf_counter() - t)
    return times


WORKERS: Dict[str, Callable[[everyday.Program, Dataset, int], List[float]]] = {
    "ddp": ddp, "dptrain": lambda program, data, epochs: fitted(program, Streamed(data), epochs, 1),
    "dptrain-dispatch": lambda program, data, epochs: fitted(program, Streamed(data), epochs, 1,
                                                             dispatch_batches=True),
    "dptrain-sharded": lambda program, data, epochs: fitted(program, RankShare(data, *_rank_world()), epochs, 1,
                                                            sharded_stream=True),
    # --evaluation: the stream evaluated (epochs: how many times), as DDP's script does, read whole
    # on every process, and each process reading its share to the end.
    "eval-ddp": ddp_evaluation,
    "eval-dptrain": lambda program, data, repeats: evaluated(program, Streamed(data), repeats),
    "eval-dptrain-sharded": lambda program, data, repeats: evaluated(program, RankShare(data, *_rank_world()),
                                                                     repeats, sharded_stream=True)}
TRAINING = ("ddp", "dptrain", "dptrain-dispatch", "dptrain-sharded")
EVALUATION = ("eval-ddp", "eval-dptrain", "eval-dptrain-sharded")


def _rank_world() -> Tuple[int, int]:
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def processes(program: str, samples: int, epochs: int, rounds: int, read_us: float = 0.0,
              workers: Tuple[str, ...] = TRAINING) -> Dict[str, List[float]]:
    """``workers`` as 2 processes under torchrun (1 thread each), in turns: each run's median
    epoch (or evaluation) past the first, per round."""
    import subprocess
    import tempfile
    times: Dict[str, List[float]] = {w: [] for w in workers}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for worker in (list(workers) if r % 2 == 0 else list(reversed(workers))):
                out = os.path.join(tmp, f"{worker}.json")
                subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                                "--master-port", str(29700 + r), os.path.abspath(__file__), "--worker", worker,
                                "--programs", program, "--samples", str(samples), "--epochs", str(epochs),
                                "--read-us", str(read_us), "--out", out], check=True, env=env, capture_output=True,
                               timeout=600)
                with open(out) as f:
                    times[worker].append(statistics.median(json.load(f)[1:]))
    return times


def paired(times: Dict[str, List[float]], a: str, b: str) -> float:
    """b's speed over a's: a's time over b's, the median of the rounds' ratios."""
    return statistics.median(x / y for x, y in zip(times[a], times[b]))


def versus_ddp(times: Dict[str, List[float]]) -> Dict[str, Any]:
    speed = functools.partial(paired, times)
    return {"epoch_sec": {w: statistics.median(t) for w, t in times.items()},
            "dptrain / DDP (speed)": speed("ddp", "dptrain"),
            "dptrain dispatch_batches / DDP (speed)": speed("ddp", "dptrain-dispatch"),
            "dispatch_batches / every process reading (speed)": speed("dptrain", "dptrain-dispatch"),
            "dptrain sharded_stream / DDP (speed)": speed("ddp", "dptrain-sharded")}


def main(argv: Any = None) -> None:
    parser = rounds_parser(__doc__, samples=8192)
    parser.add_argument("--programs", default="tiny-mlp,text")
    parser.add_argument("--processes", action="store_true", help="also 2 processes: dptrain against DDP")
    parser.add_argument("--evaluation", action="store_true",
                        help="also 2 processes evaluating the stream (--epochs times): DDP's script, dptrain reading "
                             "it whole, dptrain with sharded_stream")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)   # a torchrun child
    parser.add_argument("--read-us", type=float, default=0.0,
                        help="each sample's read waits this long (microseconds: a stream read over a network)")
    args = parser.parse_args(argv)
    READ_WAIT[0] = args.read_us / 1e6
    if args.worker:
        times = WORKERS[args.worker](everyday.PROGRAMS[args.programs], dataset(everyday.PROGRAMS[args.programs],
                                                                                args.samples), args.epochs)
        if int(os.environ.get("RANK", "0")) == 0:
            with open(args.out, "w") as f:
                json.dump(times, f)
        return
    if args.smoke:
        args.rounds, args.epochs, args.samples = 1, 2, 512
    command = " ".join(["python benchmarks/bench_stream.py"] + (argv if argv is not None else sys.argv[1:]))
    out: Dict[str, Any] = {"programs": {}}
    for name in args.programs.split(","):
        program = everyday.PROGRAMS[name]
        data = dataset(program, args.samples)
        variants: Dict[str, Callable[[], List[float]]] = {
            "plain loop, DataLoader of the stream": lambda: plain(program, data, args.epochs),
            "dptrain, the stream, 1 device": lambda: fitted(program, Streamed(data), args.epochs, 1),
            "dptrain, the Dataset, 1 device": lambda: fitted(program, data, args.epochs, 1),
            "dptrain, the stream, 2 devices": lambda: fitted(program, Streamed(data), args.epochs, 2),
            "plain loop, a weighted sampler": lambda: plain_weighted(program, data, args.epochs),
            "dptrain, a weighted sampler, 1 device": lambda: fitted(program, weighted(program, data), args.epochs, 1),
        }
        variants["dptrain, the stream without __len__, 1 device"] = lambda: fitted(program, Unsized(data),
                                                                                   args.epochs, 1)
        variants["plain loop, a stream of batches"] = lambda: plain_batches(program, data, args.epochs)
        variants["dptrain, a stream of batches, 1 device"] = lambda: fitted(program, of_batches(program, data),
                                                                            args.epochs, 1)
        if program.collate is not None:     # sequences: a batch sampler grouping them by length
            variants["plain loop, batches by length"] = lambda: plain_bucketed(program, data, args.epochs)
            variants["dptrain, batches by length, 1 device"] = lambda: fitted(program, bucketed(program, data),
                                                                               args.epochs, 1)
        times: Dict[str, List[float]] = {v: [] for v in variants}
        start = time.perf_counter()
        for r in range(args.rounds):
            for v in (list(variants) if r % 2 == 0 else list(reversed(variants))):
                times[v].append(statistics.median(variants[v]()[1:]))

        speed = functools.partial(paired, times)
        names = list(variants)
        out["programs"][name] = {"epoch_sec": {v: statistics.median(t) for v, t in times.items()},
                                 "stream 1 device / plain loop": speed(names[0], names[1]),
                                 "stream / Dataset (1 device)": speed(names[2], names[1]),
                                 "stream 2 devices / plain loop": speed(names[0], names[3]),
                                 "weighted sampler: dptrain / plain loop": speed(names[4], names[5]),
                                 "stream without __len__ / plain loop": speed(names[0], names[6]),
                                 "stream without __len__ / with it (dptrain)": speed(names[1], names[6]),
                                 "a stream of batches: dptrain / plain loop": speed(names[7], names[8]),
                                 **({"batches by length: dptrain / plain loop": speed(names[9], names[10]),
                                     "batches by length / shuffled (dptrain)": speed(names[2], names[10])}
                                    if len(names) > 9 else {}),
                                 "bench_sec": time.perf_counter() - start}
        if args.processes:
            out["programs"][name]["2 processes"] = versus_ddp(processes(name, args.samples, args.epochs, args.rounds,
                                                                        args.read_us))
        if args.evaluation:
            times = processes(name, args.samples, args.epochs, args.rounds, args.read_us, EVALUATION)
            out["programs"][name]["2 processes, evaluation"] = {
                "sec": {w: statistics.median(t) for w, t in times.items()},
                "dptrain, stream read whole / DDP (speed)": paired(times, "eval-ddp", "eval-dptrain"),
                "dptrain sharded_stream / DDP (speed)": paired(times, "eval-ddp", "eval-dptrain-sharded"),
                "sharded_stream / read whole (speed)": paired(times, "eval-dptrain", "eval-dptrain-sharded")}
        print(name, json.dumps(out["programs"][name], indent=1), flush=True)
    save_result(out, command, args.out)        # with the machine and the date, whole or not at all


if __name__ == "__main__":
    main()
