"""A graph network fed PyG-style batches, an object of one's own from a ``collate_fn`` (nodes
and edges, no common first axis; ``model(batch)`` against ``batch.y``): trains as the plain
loop on one device and on 2 processes (each collating its part; it failed on "a batch must
hold at least one tensor"), ``devices="auto"`` keeps one device and says why, and several
devices of a process are an error naming the fixes. A GRU fed PackedSequences alike."""
import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_sequence
from torch.utils.data import Dataset

import dptrain
from tests.distributed.helpers import run_workers


class GraphBatch:
    def __init__(self, x, edges, graph, y):
        self.x, self.edges, self.graph, self.y = x, edges, graph, y

    batch_size = property(lambda self: len(self.y))

    def to(self, device):
        return GraphBatch(self.x.to(device), self.edges.to(device), self.graph.to(device), self.y.to(device))


class Graphs(Dataset):
    def __len__(self):
        return 36

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        n = 3 + i % 4
        return torch.randn(n, 5, generator=g), torch.randint(0, n, (2, 2 * n), generator=g), torch.tensor(i % 2)


def collate(items):
    xs, edges, graph, ys, offset = [], [], [], [], 0
    for k, (x, e, y) in enumerate(items):
        xs.append(x)
        edges.append(e + offset)
        graph.append(torch.full((len(x),), k))
        ys.append(y)
        offset += len(x)
    return GraphBatch(torch.cat(xs), torch.cat(edges, 1), torch.cat(graph), torch.stack(ys))


class GNN(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin, self.out = nn.Linear(5, 16), nn.Linear(16, 2)

    def forward(self, data):
        h = torch.relu(self.lin(data.x))
        h = h + torch.zeros_like(h).index_add_(0, data.edges[1], h[data.edges[0]])
        return self.out(torch.zeros(data.batch_size, 16).index_add_(0, data.graph, h))


def forward(model, batch):
    return model(batch), batch.y


def train(devices=1, **kw):
    model = GNN()
    result = dptrain.fit(model, Graphs(), Graphs(), epochs=2, batch_size=8, collate_fn=collate, devices=devices,
                         optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),   # model(batch): .y
                         shuffle=False, **{"log": None, **kw})
    return model, result


def plain_loop():
    model = GNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = Graphs()
    for _ in range(2):
        for start in range(0, len(data), 8):
            batch = collate([data[i] for i in range(start, min(start + 8, len(data)))])
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(batch), batch.y).backward()
            optimizer.step()
    return model


def close(a, b):
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_it_trains_as_the_plain_loop_on_one_device_and_auto_keeps_one(capsys):
    want = plain_loop()
    model, result = train()
    close(model, want)
    model, result = train("auto", log=lambda line: None)
    close(model, want)
    assert "devices auto: cpu:0: a batch holds a GraphBatch (one object, whose tensors share no first axis), which " \
        "is not cut into parts" in \
        capsys.readouterr().err
    assert result["history"][-1]["test_loss"] == pytest.approx(dptrain.evaluate(
        want, Graphs(), collate_fn=collate, devices=1, forward=forward)["test_loss"], rel=1e-6)
    predicted = dptrain.predict(model, Graphs(), collate_fn=collate, batch_size=8)
    with torch.no_grad():
        torch.testing.assert_close(predicted, want(collate([Graphs()[i] for i in range(36)])))


def test_several_devices_of_a_process_are_an_error_naming_the_fixes():
    with pytest.raises(TypeError, match=r"a batch holding a GraphBatch \(one object, whose tensors share no first "
                                        r"axis\) cannot be cut into parts of the batch, one per device: train on one "
                                        r"device a process"):
        train(devices=2)


class Sequences(Dataset):
    """Sequences of 2-6 steps, packed by the collate_fn (torch's PackedSequence, a namedtuple)."""

    def __len__(self):
        return 36

    def __getitem__(self, i):
        x = torch.randn(2 + i % 5, 3, generator=torch.Generator().manual_seed(i))
        return x, (x.sum() > 0).long()


def pack(items):
    items = sorted(items, key=lambda item: -len(item[0]))
    return pack_sequence([x for x, _ in items]), torch.stack([y for _, y in items])


class GRU(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.rnn, self.out = nn.GRU(3, 8), nn.Linear(8, 2)

    def forward(self, packed):
        return self.out(self.rnn(packed)[1][-1])


def train_packed(devices=1):
    model = GRU()
    result = dptrain.fit(model, Sequences(), Sequences(), epochs=2, batch_size=8, collate_fn=pack, devices=devices,
                         optimizer=torch.optim.Adam(model.parameters(), lr=0.01), shuffle=False, log=None)
    return model, result


def test_packed_sequences_train_as_the_plain_loop():
    """A PackedSequence batch failed in any setting (rebuilt field by field as a namedtuple)."""
    model, _ = train_packed()
    want = GRU()
    optimizer = torch.optim.Adam(want.parameters(), lr=0.01)
    data = Sequences()
    for _ in range(2):
        for start in range(0, len(data), 8):
            x, y = pack([data[i] for i in range(start, min(start + 8, len(data)))])
            optimizer.zero_grad()
            nn.functional.cross_entropy(want(x), y).backward()
            optimizer.step()
    close(model, want)
    with pytest.raises(TypeError, match=r"a batch holding a PackedSequence \(one object"):
        train_packed(devices=2)


def graph_step(model, batch):
    return nn.functional.cross_entropy(model(batch), batch.y)


def two_processes(rank, world):
    return [([p.detach().tolist() for p in model.parameters()], result["history"][-1]["test_loss"])
            for model, result in (train(), train_packed(), train(step=graph_step))]


def test_two_processes_each_collating_its_part_train_as_one_device():
    """A step function too: its reduction check (asked where the batch is cut into parts) cannot
    cut a graph batch, and leaves it (it failed on "cannot cut")."""
    wanted = (train(), train_packed(), train(step=graph_step))
    for ranks in run_workers(two_processes):
        for (params, test_loss), (want, result) in zip(ranks, wanted):
            for p, q in zip(params, want.parameters()):
                torch.testing.assert_close(torch.tensor(p), q.detach(), rtol=1e-5, atol=1e-6)
            assert test_loss == pytest.approx(result["history"][-1]["test_loss"], rel=1e-6)
