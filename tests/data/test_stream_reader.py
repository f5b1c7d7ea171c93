"""A stream's passes (``stream_reader.py``): reads that draw from the stream's own random
numbers, the same in every read and a resumed one, the training's left untouched; data
workers that read each sample once, in a ``DataLoader``'s order."""
import random

import numpy as np
import torch

from dptrain.data.stream_loader import StreamLoader
from tests.data.test_stream_loader import Sized


def test_the_stream_draws_its_own_random_numbers_the_same_in_every_read():
    torch.manual_seed(3), random.seed(3), np.random.seed(3)
    before = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    whole = torch.cat(list(StreamLoader(Sized(40, draws=True), 4).batches()))
    after = torch.get_rng_state(), random.getstate(), np.random.get_state()[1]
    assert torch.equal(before[0], after[0]) and before[1] == after[1] and np.array_equal(before[2], after[2])
    again = torch.cat(list(StreamLoader(Sized(40, draws=True), 4).batches()))
    part = torch.cat(list(StreamLoader(Sized(40, draws=True), 4).batches(6)))
    assert torch.equal(whole, again) and torch.equal(part, whole[24:])
    assert whole[:, 1].unique().numel() == 40
    loader = StreamLoader(Sized(40, draws=True), 4)
    loader.set_epoch(1)
    assert not torch.equal(torch.cat(list(loader))[:, 1], whole[:, 1])     # another pass, other numbers


def test_a_stream_that_draws_nothing_is_read_without_swapping_states():
    loader = StreamLoader(Sized(80), 4)
    list(loader)
    assert loader._reader._draws == set()
    drawing = StreamLoader(Sized(80, draws=True), 4)
    list(drawing)
    assert drawing._reader._draws == {"torch", "random", "numpy"}


def test_workers_read_the_stream_each_sample_once_and_alike_every_time():
    stream = Sized(50, draws=True)
    first = torch.cat(list(StreamLoader(stream, 8, num_workers=2).batches()))
    again = torch.cat(list(StreamLoader(stream, 8, num_workers=2).batches()))
    assert sorted(first[:, 0].long().tolist()) == list(range(50)) and torch.equal(first, again)
    # batch_size samples from each worker in turn, as a DataLoader over the stream gives them
    assert first[:8, 0].long().tolist() == list(range(0, 16, 2))
