"""Everyday training programs as users write them: a Hugging Face-style model (dict batches,
a dict output with ``loss`` and ``logits``), a loss that needs the rest of the batch (per-sample
weights); the same training on 1, 2 and 3 devices as the plain loop on one."""
import dataclasses
from typing import Optional

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dptrain
from dptrain.data.loader import TensorLoader


class HuggingFaceStyle(nn.Module):
    """``model(input_ids, attention_mask, labels=None) -> {"loss", "logits"}``, as a
    ``transformers`` sequence classifier: the loss only when the labels are given."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(50, 16), nn.Linear(16, 3)

    def forward(self, input_ids, attention_mask, labels=None):
        mask = attention_mask.unsqueeze(-1).float()
        logits = self.head((self.embed(input_ids) * mask).sum(1) / mask.sum(1))
        return {"loss": F.cross_entropy(logits, labels) if labels is not None else None, "logits": logits}


def text(n=120, seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(n, 10, generator=g) > 0.3).long()
    mask[:, 0] = 1
    return {"input_ids": torch.randint(0, 50, (n, 10), generator=g), "attention_mask": mask,
            "labels": torch.randint(0, 3, (n,), generator=g)}


def accuracy(output, y):
    return (output.argmax(1) == y).sum(), y.numel()


def fit_text(devices, batch_size=16, model=HuggingFaceStyle, **kw):
    torch.manual_seed(0)
    model = model()
    result = dptrain.fit(model, text(), text(37, seed=1), epochs=2, batch_size=batch_size, devices=devices,
                         optimizer=torch.optim.AdamW, lr=0.01, metrics={"accuracy": accuracy}, log=None, **kw)
    return model, result


@pytest.mark.parametrize("how", [{}, {"step": lambda model, batch: model(**batch)}])
def test_a_hugging_face_style_model_trains_alike_on_one_and_two_devices_with_accumulation(how):
    """Its logits against the labels (the default), or its own loss (step returns its output):
    the same training, with metrics on the logits either way."""
    one, r1 = fit_text(1, **how)
    two, r2 = fit_text(2, accumulate_grad_batches=2, batch_size=8, **how)
    reference, r0 = fit_text(1)
    for model in (two, reference):
        for p, q in zip(one.parameters(), model.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)
    assert r1["test_accuracy"] == r2["test_accuracy"] == r0["test_accuracy"]
    assert r2["train_loss"] == pytest.approx(r1["train_loss"], rel=1e-5)


@dataclasses.dataclass
class Output:
    """A model's own output object (not a dict): its ``loss`` and ``logits`` as attributes."""
    loss: Optional[torch.Tensor]
    logits: torch.Tensor


class DataclassOutput(HuggingFaceStyle):
    def forward(self, input_ids, attention_mask, labels=None):
        return Output(**super().forward(input_ids, attention_mask, labels))


@pytest.mark.parametrize("how", [{}, {"step": lambda model, batch: model(**batch)}])
def test_an_output_object_with_loss_and_logits_trains_and_predicts_as_the_dict_output(how):
    """Its ``.logits`` against the labels, or its ``.loss`` from a step (the loss checks read
    ``.dim()`` of it and failed on an AttributeError; the step refused it)."""
    ours, r1 = fit_text(2, model=DataclassOutput, **how)
    dicts, r2 = fit_text(2, **how)
    for p, q in zip(ours.parameters(), dicts.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    assert r1["test_accuracy"] == r2["test_accuracy"] and r1["train_loss"] == r2["train_loss"]
    out = dptrain.predict(ours, text(37, seed=1), devices=2, batch_size=8)
    assert isinstance(out, Output) and out.logits.shape == (37, 3)


def test_an_output_object_without_logits_names_the_fix():
    with pytest.raises(TypeError, match=r"returned a Hidden, not a tensor.*model\(batch\[0\]\)\.FIELD, batch\[1\]"):
        dptrain.fit(nn.Sequential(nn.Linear(4, 3), Wrap()), (torch.randn(8, 4), torch.randint(0, 3, (8,))),
                    devices=1, log=None)


@dataclasses.dataclass
class Hidden:
    scores: torch.Tensor


class Wrap(nn.Module):
    def forward(self, x):
        return Hidden(x)


def rows(columns):
    """A dict of tensors as a list of samples, one dict each (a tokenized dataset's rows)."""
    return [{k: v[i] for k, v in columns.items()} for i in range(len(columns["labels"]))]


@pytest.mark.parametrize("devices", [1, 2])
def test_a_list_of_dict_samples_trains_evaluates_and_predicts_as_the_same_data_in_tensors(devices):
    """A list of samples is a Dataset, as a DataLoader takes it (it was read as tensors and failed)."""
    results = []
    for data in (text(), rows(text())):
        torch.manual_seed(0)
        model = HuggingFaceStyle()
        result = dptrain.fit(model, data, validation_split=0.25, epochs=2, batch_size=16, devices=devices,
                             forward=lambda m, b: (m(b["input_ids"], b["attention_mask"])["logits"], b["labels"]),
                             optimizer=torch.optim.AdamW, lr=0.01, log=None)
        out = dptrain.predict(model, data, devices=devices, batch_size=32,
                              forward=lambda m, b: m(b["input_ids"], b["attention_mask"])["logits"])
        results.append((model, result, out))
    (one, r1, out1), (two, r2, out2) = results
    for p, q in zip(one.parameters(), two.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert r2["test_loss"] == pytest.approx(r1["test_loss"], rel=1e-5) and r2["test_acc"] == r1["test_acc"]
    assert out2.shape == (120, 3)
    torch.testing.assert_close(out1, out2, rtol=1e-5, atol=1e-6)


def weighted_huber(output, target, batch):
    """A per-sample-weighted Huber loss, exact as (sum, count): the mean over the weights."""
    w = batch["weight"]
    return (w * F.huber_loss(output.squeeze(1), target, reduction="none")).sum(), w.sum()


def tabular(n=100, seed=3):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 4, generator=g)
    return {"x": X, "y": X @ torch.tensor([1.0, -1.0, 2.0, 0.0]), "weight": torch.rand(n, generator=g)}


def test_a_loss_that_sees_the_batch_equals_the_plain_loop_on_any_number_of_devices():
    data = tabular()
    torch.manual_seed(0)
    plain = nn.Linear(4, 1)
    opt = torch.optim.SGD(plain.parameters(), lr=0.05)
    order = TensorLoader(data, 20, shuffle=True, seed=0)         # fit's order of the samples
    for epoch in range(2):
        order.set_epoch(epoch)
        for b in order:
            s, c = weighted_huber(plain(b["x"]), b["y"], b)
            opt.zero_grad()
            (s / c).backward()
            opt.step()
    for devices in (1, 2, 3):
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        dptrain.fit(model, data, forward=lambda m, b: (m(b["x"]), b["y"]), loss=weighted_huber, epochs=2,
                    batch_size=20, devices=devices, optimizer="sgd", lr=0.05, log=None, seed=0)
        for p, q in zip(plain.parameters(), model.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_a_model_returning_another_dict_names_the_fix():
    class Dicty(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 2)

        def forward(self, x):
            return {"scores": self.lin(x)}
    with pytest.raises(TypeError, match=r"keys scores.*forward=lambda model, batch"):
        dptrain.fit(Dicty(), (torch.randn(8, 4), torch.randint(0, 2, (8,))), epochs=1, batch_size=4, log=None)


class TwoHeads(nn.Module):
    """A multi-task model: a class and a value from one trunk, as a dict or as a tuple."""

    def __init__(self, as_tuple=False):
        super().__init__()
        self.trunk, self.cls, self.reg, self.as_tuple = nn.Linear(6, 16), nn.Linear(16, 3), nn.Linear(16, 1), as_tuple

    def forward(self, x):
        h = torch.tanh(self.trunk(x))
        return (self.cls(h), self.reg(h)) if self.as_tuple else {"cls": self.cls(h), "reg": self.reg(h)}


def heads(output):
    return output if isinstance(output, tuple) else (output["cls"], output["reg"])


def multitask_loss(output, target):
    """The model's dict (or tuple) whole, against a dict of targets: a mean over samples."""
    cls, reg = heads(output)
    return F.cross_entropy(cls, target["cls"]) + 0.5 * F.mse_loss(reg.squeeze(1), target["reg"])


def value_error(output, target):
    return (heads(output)[1].squeeze(1) - target["reg"]).abs().sum(), target["reg"].numel()


def multitask(n=90, seed=4):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    return {"x": x, "t": {"cls": (x[:, 0] > 0).long() + (x[:, 1] > 1).long(), "reg": x[:, 2] - x[:, 3]}}


@pytest.mark.parametrize("as_tuple", [False, True], ids=["dict", "tuple"])
def test_a_model_with_several_outputs_trains_on_a_loss_of_its_own_as_the_plain_loop(as_tuple):
    """Keras's multi-output models, Lightning's multi-task steps: the output goes whole to the
    user's loss (and metrics), with any number of devices the plain loop's steps."""
    data, forward = multitask(), (lambda model, batch: (model(batch["x"]), batch["t"]))
    torch.manual_seed(0)
    plain = TwoHeads(as_tuple)
    opt = torch.optim.Adam(plain.parameters(), lr=0.01)
    order = TensorLoader(data, 15, shuffle=True, seed=0)
    for epoch in range(2):
        order.set_epoch(epoch)
        for b in order:
            opt.zero_grad()
            multitask_loss(plain(b["x"]), b["t"]).backward()
            opt.step()
    with torch.no_grad():
        mae = value_error(plain(data["x"]), data["t"])
    for devices in (1, 2, 3):
        torch.manual_seed(0)
        model = TwoHeads(as_tuple)
        result = dptrain.fit(model, data, data, forward=forward, loss=multitask_loss, epochs=2, batch_size=15,
                             devices=devices, optimizer=torch.optim.Adam, lr=0.01, metrics={"mae": value_error},
                             train_metrics=True, log=None, seed=0)
        for p, q in zip(plain.parameters(), model.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
        assert result["test_mae"] == pytest.approx(float(mae[0]) / mae[1], rel=1e-5)
        assert "train_mae" in result["history"][-1]
    with pytest.raises(TypeError, match=r"keys cls, reg.*a loss of your own"):
        dptrain.fit(TwoHeads(), data, forward=forward, epochs=1, batch_size=15, log=None)


def test_bf16_on_cpu_devices_trains_alike_and_sums_the_loss_in_float32():
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(256, 16, generator=g), torch.randint(0, 4, (256,), generator=g)
    losses = []
    for devices in (1, 2):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
        result = dptrain.fit(model, (X, y), (X, y), amp="bf16", epochs=2, batch_size=32, devices=devices,
                             optimizer="adam", lr=1e-2, log=None)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(X)
        # The bf16 logits' loss summed in float32, as one device computes it.
        assert result["test_loss"] == pytest.approx(F.cross_entropy(logits.float(), y).item(), rel=1e-5)
        assert model[0].weight.dtype == torch.float32
        losses.append([h["train_loss"] for h in result["history"]])
    assert losses[1] == pytest.approx(losses[0], rel=2e-3)       # bf16 rounding differs by shard


def test_a_dataclass_batch_from_a_collate_fn_is_split_over_the_devices_as_the_plain_loop_reads_it():
    """``collate_fn`` returning ``Batch(x=..., y=..., ids=[...])`` (a dataclass, as structured
    research code writes it): one device took it whole; two split nothing and failed."""
    import dataclasses
    from torch.utils.data import DataLoader

    @dataclasses.dataclass
    class Batch:
        x: torch.Tensor
        y: torch.Tensor
        ids: list

    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(50, 4, generator=g), torch.randn(50, 1, generator=g)

    def collate(items):
        return Batch(torch.stack([X[i] for i in items]), torch.stack([y[i] for i in items]), list(items))

    def forward(model, batch):
        assert len(batch.ids) == len(batch.x)           # every shard's own samples
        return model(batch.x), batch.y
    torch.manual_seed(0)
    plain = nn.Linear(4, 1)
    opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    for b in DataLoader(range(50), batch_size=16, collate_fn=collate):
        opt.zero_grad()
        F.mse_loss(*forward(plain, b)).backward()
        opt.step()
    for devices in (1, 2, 3):
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        dptrain.fit(model, DataLoader(range(50), batch_size=16, collate_fn=collate), forward=forward,
                    loss=nn.MSELoss(), epochs=1, shuffle=False, devices=devices, optimizer="sgd", lr=0.1, log=None)
        for p, q in zip(plain.parameters(), model.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("devices, said", [(1, False), (2, True)])
def test_an_embedding_renormalised_in_its_forward_is_named_on_several_devices(devices, said):
    """``nn.Embedding(max_norm=1)`` writes the rows it looks up in its forward: each copy only
    its part's rows, so the copies drift apart (as DDP's processes do); fit says so."""
    lines = []
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(20, 4, max_norm=1.0), nn.Flatten(), nn.Linear(8, 2))
    dptrain.fit(model, (torch.randint(0, 20, (16, 2)), torch.randint(0, 2, (16,))), epochs=1, batch_size=8,
                devices=devices, log=lines.append)
    assert any(line.startswith("dptrain: 0: an Embedding with max_norm") for line in lines) == said


@pytest.mark.parametrize("devices", [1, 2])
def test_an_autoencoders_step_on_batches_without_targets_gives_its_metrics_from_its_output(devices):
    """``step`` on ``(x,)`` batches returning ``{"loss", "output": {"kl", "recon"}}``, metrics
    reading the output alone: the figures of each term (a VAE's), over the set. The missing
    target once failed with "a batch of one tuple has no target ... pass step=", step given."""
    g = torch.Generator().manual_seed(0)
    X = torch.rand(40, 6, generator=g)

    def step(model, batch):
        code = model[0](batch[0])
        recon = ((model[1](code) - batch[0]) ** 2).sum(1)
        penalty = (code ** 2).sum(1)
        return {"loss": (recon + 0.1 * penalty).mean(), "output": {"recon": recon.detach(), "pen": penalty.detach()}}
    metrics = {name: (lambda o, t, name=name: (o[name].sum(), len(o[name]))) for name in ("recon", "pen")}
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 3), nn.Linear(3, 6))
    result = dptrain.fit(model, (X,), (X[:15],), step=step, metrics=metrics, train_metrics=True, epochs=2,
                         batch_size=8, devices=devices, optimizer="adam", lr=1e-2, log=None)
    row = result["history"][-1]
    with torch.no_grad():
        out = step(model, (X[:15],))["output"]
    assert row["test_recon"] == pytest.approx(out["recon"].mean().item(), rel=1e-5)
    assert row["test_pen"] == pytest.approx(out["pen"].mean().item(), rel=1e-5)
    assert row["train_loss"] == pytest.approx(row["train_recon"] + 0.1 * row["train_pen"], rel=1e-5)


class TinyDetector(nn.Module):
    """torchvision's detection interface: ``model(images, targets)`` -> a dict of losses while
    training, a list with a dict of boxes per image in eval mode; images of their own sizes."""

    def __init__(self):
        super().__init__()
        self.conv, self.head = nn.Conv2d(3, 4, 3), nn.Linear(4, 4)

    def forward(self, images, targets=None):
        boxes = [self.head(self.conv(image.unsqueeze(0)).mean((2, 3)))[0] for image in images]
        if not self.training:
            return [{"boxes": b.unsqueeze(0)} for b in boxes]
        return {"loss_box": sum(((b - t["boxes"].mean(0)) ** 2).mean() for b, t in zip(boxes, targets)) / len(boxes)}


def detection_samples(n=14):
    g = torch.Generator().manual_seed(0)
    return [(torch.rand(3, 6 + 2 * (k % 3), 6 + 2 * (k % 3), generator=g),
             {"boxes": torch.rand(k % 3 + 1, 4, generator=g)}) for k in range(n)]


def detection_step(model, batch):
    return sum(model(*batch).values())


def plain_detector(data):
    """torchvision's recipe as a plain loop: ``tuple(zip(*batch))`` batches of 4, SGD, in order."""
    from torch.utils.data import DataLoader
    torch.manual_seed(0)
    plain = TinyDetector()
    opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    for batch in DataLoader(data, batch_size=4, collate_fn=lambda b: tuple(zip(*b))):
        opt.zero_grad()
        detection_step(plain, batch).backward()
        opt.step()
    return plain


@pytest.mark.parametrize("devices", [1, 2, 3])
def test_a_detection_model_on_images_of_several_sizes_trains_as_the_plain_loop(devices):
    """torchvision's detection recipe (``collate_fn=lambda b: tuple(zip(*b))``) with
    ``dptrain.data.collate_samples``: each device takes whole images and their boxes."""
    from torch.utils.data import DataLoader
    data = detection_samples()
    plain = plain_detector(data)
    torch.manual_seed(0)
    model = TinyDetector()
    dptrain.fit(model, DataLoader(data, batch_size=4, collate_fn=dptrain.data.collate_samples), step=detection_step,
                epochs=1, shuffle=False, devices=devices, optimizer="sgd", lr=0.1, log=None)
    for p, q in zip(plain.parameters(), model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    boxes = dptrain.predict(model, DataLoader(data, batch_size=4, collate_fn=dptrain.data.collate_samples),
                            devices=devices)
    assert len(boxes) == len(data) and all(b["boxes"].shape == (1, 4) for b in boxes)
    model.eval()
    torch.testing.assert_close(boxes[5]["boxes"], model([data[5][0]])[0]["boxes"])


def batchnorm_data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(48, 4, generator=g), torch.randint(0, 2, (48,), generator=g)


def batchnorm_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))


def plain_batchnorm():
    """The plain loop on ``batchnorm_data`` in batches of 16: BatchNorm over each whole batch."""
    (X, y), plain = batchnorm_data(), batchnorm_model()
    opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    for i in range(0, 48, 16):
        opt.zero_grad()
        F.cross_entropy(plain(X[i:i + 16]), y[i:i + 16]).backward()
        opt.step()
    return plain


@pytest.mark.parametrize("devices", [1, 2])
def test_torchs_sync_batchnorm_in_the_model_is_synchronised_by_fit(devices):
    """A DDP script's ``nn.SyncBatchNorm.convert_sync_batchnorm(model)``: torch's layers sync
    nothing between the devices of one process (and refuse CPU tensors across processes), so
    fit synchronises them itself: the plain loop's BatchNorm over the whole batch."""
    (X, y), plain = batchnorm_data(), plain_batchnorm()
    lines = []
    model = nn.SyncBatchNorm.convert_sync_batchnorm(batchnorm_model())
    dptrain.fit(model, (X, y), epochs=1, batch_size=16, shuffle=False, devices=devices, optimizer="sgd", lr=0.1,
                log=lines.append)
    assert isinstance(model[1], nn.SyncBatchNorm)           # the user's layers, given back
    for p, q in zip(plain.state_dict().values(), model.state_dict().values()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert any("holds torch's SyncBatchNorm" in line for line in lines) == (devices > 1)


class TwoInputs(nn.Module):
    def __init__(self, tupled=False):
        super().__init__()
        self.tupled, self.a, self.b, self.out = tupled, nn.Linear(3, 4), nn.Linear(5, 4), nn.Linear(4, 2)

    def forward(self, x1, x2=None):
        if self.tupled:                 # forward(self, inputs): the pair as one argument
            x1, x2 = x1
        return self.out(torch.relu(self.a(x1) + self.b(x2)))


def test_two_inputs_nested_in_the_data_reach_a_model_taking_them_whole_or_name_the_fix():
    g = torch.Generator().manual_seed(0)
    X1, X2 = torch.randn(40, 3, generator=g), torch.randn(40, 5, generator=g)
    y = torch.randint(0, 2, (40,), generator=g)
    fits = {}
    for name, model, data in (("flat", TwoInputs(), (X1, X2, y)), ("nested", TwoInputs(tupled=True), ((X1, X2), y))):
        torch.manual_seed(0)
        model.load_state_dict(TwoInputs().state_dict())
        fits[name] = dptrain.fit(model, data, epochs=1, batch_size=8, devices=2, log=None)
        fits[name + " predicted"] = dptrain.predict(model, data, devices=2)
    assert fits["flat"]["train_loss"] == pytest.approx(fits["nested"]["train_loss"], rel=1e-6)
    torch.testing.assert_close(fits["flat predicted"], fits["nested predicted"])

    class Strict(TwoInputs):
        def forward(self, x1, x2):
            return super().forward(x1, x2)
    fix = r"takes its inputs one by one .*fit\(model, \(x1, x2, y\)\)"
    with pytest.raises(TypeError, match=fix) as e:
        dptrain.fit(Strict(), ((X1, X2), y), epochs=1, batch_size=8, devices=2, log=None)
    assert "required positional argument" in str(e.value.__cause__)
    with pytest.raises(TypeError, match=fix):
        dptrain.predict(Strict(), ((X1, X2), y), devices=2)


def test_a_list_of_text_label_pairs_with_a_tokenizing_collate_fn_trains_alike_on_one_and_two_devices():
    """Raw strings read by a collate_fn that tokenizes and pads (it failed: the list was taken for tensors)."""
    words = "the a movie was good bad great awful fine plot".split()
    g = torch.Generator().manual_seed(0)
    pairs = [(" ".join(words[int(j)] for j in torch.randint(0, 10, (3 + i % 5,), generator=g)), i % 2)
             for i in range(64)]

    def collate(samples):
        ids = [torch.tensor([words.index(w) + 1 for w in text.split()]) for text, _ in samples]
        return nn.utils.rnn.pad_sequence(ids, batch_first=True), torch.tensor([label for _, label in samples])

    runs = []
    for devices in (1, 2):
        torch.manual_seed(0)
        model = nn.Sequential(nn.EmbeddingBag(11, 8, padding_idx=0), nn.Linear(8, 2))
        result = dptrain.fit(model, pairs, pairs[:16], collate_fn=collate, epochs=2, batch_size=16, devices=devices,
                             optimizer="adam", lr=0.01, log=None)
        runs.append((model, result, dptrain.predict(model, pairs, collate_fn=collate, devices=devices)))
    (one, r1, p1), (two, r2, p2) = runs
    for p, q in zip(one.parameters(), two.parameters()):
        torch.testing.assert_close(p, q)
    assert r1["test_acc"] == r2["test_acc"] and p1.shape == (64, 2)
    torch.testing.assert_close(p1, p2)
