"""``dptrain.fit`` trains any model on any data: the same result on 1, 2 or 3 devices, every
sample once per epoch, the weights left in the user's module, the history returned."""
import functools
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

import dptrain
from dptrain.run.fit import CONFIG_KEYWORDS, PEER_KEYWORDS, TASK_KEYWORDS

REPO = Path(__file__).resolve().parents[2]


def regression(n=150, seed=1):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 4, generator=g)
    return X, X @ torch.tensor([[1.0], [-2.0], [0.5], [0.0]]) + 0.3


def fit_mlp(devices, **kw):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    result = dptrain.fit(model, regression(), regression(41, seed=2), loss=nn.MSELoss(),
                         optimizer=functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9),
                         scheduler=functools.partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=20),
                         scheduler_interval="batch", epochs=3, batch_size=32, devices=devices, log=None, **kw)
    return model, result


def test_the_same_training_on_one_two_and_three_devices():
    (one, r1), (two, r2), (three, r3) = fit_mlp("1"), fit_mlp("2"), fit_mlp("cpu:0,cpu:1,cpu:2")
    assert r2["devices"] == ["cpu:0", "cpu:1"] and r3["devices"] == ["cpu:0", "cpu:1", "cpu:2"]
    for model in (two, three):                         # trained in place, in the user's module
        for p, q in zip(one.parameters(), model.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    for r in (r2, r3):
        for a, b in zip(r1["history"], r["history"]):
            assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-5)
            assert b["test_loss"] == pytest.approx(a["test_loss"], rel=1e-5)
    assert r1["history"][-1]["train_loss"] < r1["history"][0]["train_loss"]
    assert "test_acc" not in r1 and set(r1["history"][0]) == {"epoch", "sec", "train_loss", "test_loss", "lr"}


class Recorded(Dataset):
    """Sample i is ``{"x": [i], "id": i, "y": i % 3}``; steps record the ids they see."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": torch.tensor([float(i)]), "id": i, "y": i % 3}


def test_a_dataset_with_workers_gives_every_sample_once_per_epoch_to_the_devices():
    seen, lock = [], threading.Lock()

    def step(model, batch):
        if model.training:      # (not the calls in eval mode: the check of the step's reduction)
            with lock:
                seen.append((threading.current_thread().name, batch["id"].tolist()))
        return nn.functional.cross_entropy(model(batch["x"]), batch["y"])
    dptrain.fit(nn.Linear(1, 3), Recorded(53), step=step, epochs=2, batch_size=10, num_workers=2,
                devices=2, log=None)
    per_epoch = [sorted(i for _, ids in seen[k:k + 12] for i in ids) for k in (0, 12)]
    assert len(seen) == 24 and per_epoch == [list(range(53))] * 2
    assert {name for name, _ in seen} == {"dptrain-cpu:0", "dptrain-cpu:1"}


def test_workers_read_the_training_dataset_beside_an_evaluation_set_of_tensors():
    X, y = torch.arange(20.0).unsqueeze(1), torch.arange(20) % 3
    result = dptrain.fit(nn.Linear(1, 3), Recorded(30), (X, y), forward=lambda m, b: (m(b["x"]), b["y"])
                         if isinstance(b, dict) else (m(b[0]), b[1]), epochs=1, batch_size=10, num_workers=1,
                         devices=1, log=None)
    assert result["history"][0]["test_loss"] > 0        # (the tensors gathered without workers: not an error)
    with pytest.raises(ValueError, match="num_workers applies to a Dataset"):
        dptrain.fit(nn.Linear(1, 3), (X, y), num_workers=1, log=None)


def test_metrics_are_exact_on_an_evaluation_set_that_does_not_divide():
    X = torch.randn(37, 3)
    y = torch.randint(0, 4, (37,))
    torch.manual_seed(0)
    model = nn.Linear(3, 4)
    result = dptrain.fit(model, (X, y), (X, y), optimizer="sgd", lr=0.0, epochs=1, batch_size=8, devices=3,
                         metrics={"mean_label": lambda out, t: (t.sum(), t.numel())}, log=None)
    with torch.no_grad():
        out = model(X)
    assert result["test_acc"] == pytest.approx((out.argmax(1) == y).float().mean().item())
    assert result["test_loss"] == pytest.approx(nn.functional.cross_entropy(out, y).item(), rel=1e-6)
    assert result["test_mean_label"] == pytest.approx(y.float().mean().item())   # 5 batches, 15 shards


def test_the_example_runs(tmp_path):
    """examples/train_your_own.py, as the README shows it: it learns."""
    out = subprocess.run([sys.executable, str(REPO / "examples" / "train_your_own.py"), "--epochs", "3"],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    mae = float(out.stdout.strip().splitlines()[-1].split()[2])
    assert mae < 0.4, out.stdout                     # predicting the mean gives ~0.6


def test_the_steps_example_runs_and_resumes_with_more_steps(tmp_path):
    """examples/finetune_in_steps.py: 30 updates, then 30 more from its checkpoint: it learns,
    logs and evaluates by steps, and keeps the two best files."""
    def run(*args):
        out = subprocess.run([sys.executable, str(REPO / "examples" / "finetune_in_steps.py"), "--devices", "1",
                              "--checkpoint-dir", "run", "--log-every", "3", "--eval-every", "15", *args], capture_output=True, text=True, timeout=300,
                             cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert out.returncode == 0, out.stderr
        return out.stdout
    first = run("--max-steps", "30")
    assert "step 3 (epoch 1, batch 3), train loss" in first and "stopped after epoch 1: max_steps 30 reached" in first
    second = run("--max-steps", "60", "--resume")
    assert "resuming: epoch 1 ended after batch 30 (max_steps); it goes on from there" in second
    tested = second.strip().splitlines()[-1]                     # steps: 60, test acc by step: 15: ..., 60: ...
    assert tested.startswith("steps: 60, test acc by step: 15: ") and float(tested.split()[-1]) > 0.7, second
    kept = sorted(int(p.stem.split("-")[-1]) for p in (tmp_path / "runs").glob("steps-best-*.pt"))
    scores = {int(part.split(": ")[0]): float(part.split(": ")[1]) for part in tested.split("by step: ")[1].split(", ")}
    assert kept == sorted(sorted(scores, key=scores.get)[-2:])             # the two best evaluations, by step


def test_errors_name_the_fix():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        dptrain.fit(lambda x: x, (torch.zeros(2, 1), torch.zeros(2)), log=None)
    with pytest.raises(ValueError, match="give either loss .* or step"):
        dptrain.fit(nn.Linear(1, 1), (torch.zeros(2, 1), torch.zeros(2)), loss=nn.MSELoss(), step=lambda m, b: 0)
    with pytest.raises(ValueError, match="at least 2 classes.*For regression use loss=nn.MSELoss"):
        dptrain.fit(nn.Linear(1, 1), (torch.zeros(4, 1), torch.zeros(4, 1)), epochs=1, log=None)


def test_keywords_of_keras_lightning_and_accelerate_and_typos_are_answered_with_ours():
    X, y = torch.randn(8, 2), torch.randint(0, 2, (8,))
    for key, ours in [("validation_data", "eval_data"), ("max_epochs", "epochs"), ("verbose", "log=None"),
                      ("gradient_accumulation_steps", "accumulate_grad_batches"),
                      ("limit_val_batches", "eval_batches"),
                      ("min_epochs", "EarlyStopping(..., start_from_epoch=N)"), ("accelerator", "devices ('auto'"),
                      ("gradient_clip_algorithm", "clip_grad_norm=X or clip_grad_value=X"),
                      # Hugging Face's Trainer and TrainingArguments
                      ("compute_metrics", "metrics=dptrain.whole_set(compute_metrics)"),
                      ("per_device_train_batch_size", "batch_size (the global batch"),
                      ("learning_rate", "lr"), ("load_best_model_at_end", "restore_best_weights=True"),
                      ("warmup_steps", "scheduler=lambda optimizer: transformers.get_linear_schedule_with_warmup"),
                      ("save_steps", "checkpoint_every"),
                      ("preprocess_logits_for_metrics", "preprocess=preprocess_logits_for_metrics")]:
        with pytest.raises(TypeError, match=rf"unexpected keyword argument '{key}'; dptrain's is .*{re.escape(ours)}"):
            dptrain.fit(nn.Linear(2, 2), (X, y), log=None, **{key: 1})
    with pytest.raises(TypeError, match="'strategy'; dptrain has none: training is data-parallel; several processes "
                                        "run with dptrain launch --processes N"):
        dptrain.fit(nn.Linear(2, 2), (X, y), log=None, strategy="ddp")
    with pytest.raises(TypeError, match="'gradient_checkpointing'; dptrain has none: call "
                                        r"model.gradient_checkpointing_enable\(\)"):    # (not checkpoint_dir)
        dptrain.fit(nn.Linear(2, 2), (X, y), log=None, gradient_checkpointing=True)
    with pytest.raises(TypeError, match="'args'; dptrain has none: fit takes each of TrainingArguments' settings as "
                                        "a keyword of its own .num_train_epochs -> epochs"):
        dptrain.fit(nn.Linear(2, 2), (X, y), log=None, args=object())
    with pytest.raises(TypeError, match=r"'sampler'; dptrain has none: train_data=torch.utils.data.DataLoader\(data, "
                                        r"batch_size=N, sampler=sampler\)"):     # (it named 'amp')
        dptrain.fit(nn.Linear(2, 2), (X, y), log=None, sampler=torch.utils.data.SequentialSampler(X))
    known = set(TASK_KEYWORDS + CONFIG_KEYWORDS)
    for key, hint in PEER_KEYWORDS.items():         # every name a hint gives as ours is one of fit's
        named = re.findall(r"(?<![\w.])([a-z_]+)(?==)", hint) + [w for w in re.findall(r"^([a-z_]+)\b", hint)]
        assert all(n in known | {"none", "a", "train_data", "eval_data", "log", "weight", "start_from_epoch",
                                 "patience", "restore_best_weights", "weight_decay", "label_smoothing", "save_top_k",
                                 "preprocess", "betas", "eps"}      # (and a DataLoader's own keywords:)
                                | {"sampler", "batch_sampler", "worker_init_fn", "prefetch_factor",
                                   "multiprocessing_context"}
                   for n in named), (key, hint)
    with pytest.raises(TypeError, match="callbacks must have at least one of the hooks .*; got int"):
        dptrain.fit(nn.Linear(2, 2), (X, y), log=None, callbacks=1)
    seen = []

    class Seen(dptrain.Callback):           # one callback, not in a list (Lightning's Trainer takes it so)
        def on_epoch_end(self, run, epoch, row):
            seen.append(epoch)
    dptrain.fit(nn.Linear(2, 2), (X, y), log=None, epochs=2, devices=1, callbacks=Seen())
    assert seen == [1, 2]
    # Keras's metrics=["accuracy"]: a classification's is test_acc already (metric_names.py: the others).
    result = dptrain.fit(nn.Linear(2, 2), (X, y), (X, y), log=None, metrics=["accuracy"], devices=1, epochs=1)
    assert "test_acc" in result and "test_accuracy" not in result
    with pytest.raises(TypeError, match="'batchsize'; did you mean 'batch_size'"):
        dptrain.fit(nn.Linear(2, 2), (X, y), log=None, batchsize=4)


def test_fit_x_y_as_keras_writes_it_is_answered_with_a_pair():
    model = nn.Linear(2, 2)
    with pytest.raises(TypeError, match=r"fit\(model, \(X, y\), \.\.\.\)"):
        dptrain.fit(model, torch.randn(8, 2), torch.randint(0, 2, (8,)), log=None)
    # Inputs alone, with a step of one's own (an autoencoder): a tensor each for training and evaluation.
    X = torch.randn(8, 2)
    result = dptrain.fit(model, X, X[:4], step=lambda m, batch: ((m(batch[0]) - batch[0]) ** 2).mean(), epochs=1,
                         batch_size=4, devices=1, log=None)
    assert result["history"][-1]["test_loss"] >= 0


@pytest.mark.parametrize("devices", [1, 2])
def test_fit_called_under_no_grad_or_inference_mode_trains_as_outside(devices):
    """A notebook cell or a server's handler may hold torch.no_grad() or torch.inference_mode():
    training is the same (inference mode failed in dptrain, or trained nothing on 2 devices);
    a model made inside inference mode takes no gradient, and the error says so."""
    X, y = torch.randn(32, 3), torch.randint(0, 2, (32,))

    def trained(context):
        torch.manual_seed(0)
        model = nn.Linear(3, 2)
        with context():
            dptrain.fit(model, (X, y), epochs=1, batch_size=8, devices=devices, log=None)
        return model.weight.detach()
    outside = trained(torch.enable_grad)
    assert torch.equal(trained(torch.no_grad), outside) and torch.equal(trained(torch.inference_mode), outside)
    with torch.inference_mode():
        made_inside = nn.Linear(3, 2)
    with pytest.raises(TypeError, match="'weight' was made under torch.inference_mode.*outside that block"):
        dptrain.fit(made_inside, (X, y), epochs=1, devices=devices, log=None)


def test_load_weights_from_a_checkpoint_folder_and_a_best_file(tmp_path):
    from dptrain.callbacks import BestCheckpoint
    torch.manual_seed(0)
    X, y = torch.randn(64, 3), torch.randn(64, 1)
    model = nn.Linear(3, 1)
    dptrain.fit(model, (X, y), (X, y), loss=nn.MSELoss(), epochs=2, batch_size=16, log=None, progress=False,
                checkpoint_dir=str(tmp_path / "run"), callbacks=[BestCheckpoint(str(tmp_path / "best.pt"))])
    last = dptrain.load_weights(nn.Linear(3, 1), str(tmp_path / "run"))
    assert all(torch.equal(a, b) for a, b in zip(last.parameters(), model.parameters()))
    best = dptrain.load_weights(nn.Linear(3, 1), str(tmp_path / "best.pt"))
    saved = torch.load(tmp_path / "best.pt", weights_only=True)["model"]
    assert torch.equal(best.weight, saved["weight"])
    with pytest.raises(ValueError, match="do not fit Linear: Error"):
        dptrain.load_weights(nn.Linear(4, 1), str(tmp_path / "run"))
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ValueError, match="is not a checkpoint folder, checkpoint.pt or BestCheckpoint file"):
        dptrain.load_weights(nn.Linear(3, 1), str(tmp_path / "notes.txt"))


def test_a_dataloaders_batch_size_is_taken_and_defaults_are_said():
    from torch.utils.data import DataLoader, TensorDataset
    loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,))), batch_size=16)
    said = []
    result = dptrain.fit(nn.Linear(4, 2), loader, epochs=1, devices=1, log=said.append)
    assert result["batch_size"] == 16
    assert said[0] == "dptrain: no optimizer given: SGD at lr 0.01 (choose one: optimizer=torch.optim.AdamW, lr=1e-3)"
    said.clear()
    result = dptrain.fit(nn.Linear(4, 2), loader, epochs=1, batch_size=32, optimizer="adam", devices=1,
                         log=said.append)
    assert result["batch_size"] == 32 and said[0] == "dptrain: batch_size=32 is used, not the DataLoader's 16"
    assert not any("shuffle" in line for line in said)


def _order_read(loader, devices=1, **settings):
    """The sample ids fit trains on over 2 epochs of ``loader``, batch after batch (each sorted)."""
    seen = []

    def forward(model, batch):
        x, y, ids = batch
        if model.training and len(ids) > 1:        # (not the one-sample trial batch)
            seen.append(ids)
        return model(x), y
    dptrain.fit(nn.Linear(3, 2), loader, forward=forward, epochs=2, devices=devices, log=None, **settings)
    read = torch.cat(seen)          # (the devices' parts of a batch in the order their threads ran: sorted)
    return torch.cat([chunk.sort().values for chunk in read.split(loader.batch_size)]).tolist()


@pytest.mark.parametrize("devices", [1, 2])
def test_a_dataloaders_shuffle_is_taken_unless_shuffle_is_given(devices):
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler
    n = 40
    data = TensorDataset(torch.randn(n, 3), torch.randint(0, 2, (n,)), torch.arange(n))
    in_order = list(range(n)) * 2
    assert _order_read(DataLoader(data, batch_size=8), devices) == in_order           # shuffle=False: its order
    assert _order_read(DataLoader(data, batch_size=8, sampler=DistributedSampler(data, 1, 0, shuffle=False)),
                       devices) == in_order
    for shuffled in (_order_read(DataLoader(data, batch_size=8, shuffle=True), devices),
                     _order_read(DataLoader(data, batch_size=8, sampler=DistributedSampler(data, 1, 0)), devices),
                     _order_read(DataLoader(data, batch_size=8), devices, shuffle=True)):    # (given: it wins)
        assert sorted(shuffled) == sorted(in_order) and shuffled != in_order
        assert shuffled[:n] != shuffled[n:]              # (a new order each epoch)
    assert _order_read(DataLoader(data, batch_size=8, shuffle=True), devices, shuffle=False) == in_order


@pytest.mark.parametrize("shuffle", [False, True])
def test_shuffle_false_keeps_the_order_of_the_samples(shuffle):
    seen = []

    def forward(model, batch):
        if model.training and len(batch["id"]) > 1:        # (not the one-sample trial batch)
            seen.append(batch["id"])
        return model(batch["x"]), batch["y"]
    n = 40
    data = {"x": torch.randn(n, 3), "y": torch.randint(0, 2, (n,)), "id": torch.arange(n)}
    dptrain.fit(nn.Linear(3, 2), data, forward=forward, epochs=2, batch_size=8, devices=1, shuffle=shuffle, log=None)
    order = torch.cat(seen).tolist()
    assert sorted(order) == sorted(list(range(n)) * 2)             # every sample once an epoch
    assert (order == list(range(n)) * 2) is not shuffle


def test_an_evaluation_set_that_does_not_fit_the_model_fails_before_training(tmp_path):
    trained = []

    class Count(dptrain.Callback):
        def on_batch_end(self, run, batch):
            trained.append(batch.batch)
    with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied"):
        dptrain.fit(nn.Linear(4, 2), (torch.randn(64, 4), torch.randint(0, 2, (64,))),
                    (torch.randn(16, 5), torch.randint(0, 2, (16,))), epochs=1, batch_size=8, devices=1,
                    callbacks=[Count()], checkpoint_dir=str(tmp_path / "ck"), log=None)
    assert trained == []            # not one batch, not an epoch lost


@pytest.mark.parametrize("devices", ["cpu:0", "cpu:0,cpu:1"])
def test_fit_frees_its_run_when_it_returns_without_the_collector(devices):
    """Nothing of a run sits in a reference cycle: its model copies, optimizer and buckets (GPU
    memory, gloo objects) go when fit returns, not whenever Python's collector next runs."""
    import gc
    import weakref
    seen = {}

    class Keep(dptrain.Callback):
        def on_fit_start(self, run):
            seen["run"] = weakref.ref(run)
    # torch's first optimizer imports torch._dynamo, whose frames sit in a cycle of torch's own
    # with the frames that imported it: made here, outside the run.
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    X, y = torch.randn(64, 4), torch.randint(0, 3, (64,))
    gc.collect()
    gc.disable()
    try:
        dptrain.fit(nn.Linear(4, 3), (X, y), epochs=2, batch_size=16, devices=devices, log=None,
                    progress=False, callbacks=[Keep()])
        alive = seen["run"]() is not None
    finally:
        gc.enable()
    assert not alive


def test_with_a_scheduler_each_row_gives_the_learning_rate_its_last_batch_had():
    lines = []
    X, y = regression(64)
    schedule = functools.partial(torch.optim.lr_scheduler.StepLR, step_size=1, gamma=0.5)
    result = dptrain.fit(nn.Linear(4, 1), (X, y), loss=nn.MSELoss(), optimizer="sgd", lr=3e-4, scheduler=schedule,
                         epochs=3, batch_size=16, devices=2, log=lines.append, progress=False)
    assert [row["lr"] for row in result["history"]] == pytest.approx([3e-4, 1.5e-4, 7.5e-5])
    assert [line.split(", lr ")[1] for line in lines if line.startswith("epoch ")] == ["0.0003", "0.00015", "7.5e-05"]
    plain = dptrain.fit(nn.Linear(4, 1), (X, y), loss=nn.MSELoss(), epochs=1, batch_size=16, devices=1, log=None)
    assert "lr" not in plain["history"][0]                      # a constant rate is in the result already


def _adam_run(devices, splits, kvstore="device"):
    """An MLP trained by Adam for 4 epochs, in ``splits`` calls of ``fit`` on one optimizer object."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for epochs in splits:
        dptrain.fit(model, regression(), None, loss=nn.MSELoss(), optimizer=optimizer, epochs=epochs, batch_size=32,
                    shuffle=False, devices=devices, kvstore=kvstore, log=None)
    return model, optimizer


@pytest.mark.parametrize("devices, kvstore", [(1, "device"), (2, "device"), (3, "device"), (2, "local")])
def test_fit_again_with_the_same_optimizer_goes_on_where_it_ended(devices, kvstore):
    """As a plain loop's optimizer (and Keras's fit called twice): Adam's moments carry over,
    so 2 + 2 epochs are 4 epochs. Before, each fit started the moments again (0.06 apart)."""
    once, _ = _adam_run(devices, [4], kvstore)
    twice, optimizer = _adam_run(devices, [2, 2], kvstore)
    for p, q in zip(once.parameters(), twice.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    steps = [float(s["step"]) for s in optimizer.state_dict()["state"].values()]
    assert steps == [4 * 5.0] * 4                       # 150 samples, batch 32: 5 steps an epoch


def test_the_users_optimizer_ends_with_the_state_and_learning_rate_training_reached():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    dptrain.fit(model, regression(), None, loss=nn.MSELoss(), optimizer=optimizer, epochs=3, batch_size=32,
                scheduler=functools.partial(torch.optim.lr_scheduler.StepLR, step_size=1, gamma=0.5),
                shuffle=False, devices=2, log=None)
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    ref = torch.optim.Adam(plain.parameters(), lr=0.01)
    steps = torch.optim.lr_scheduler.StepLR(ref, step_size=1, gamma=0.5)
    X, y = regression()
    for _ in range(3):
        for i in range(0, len(X), 32):
            ref.zero_grad()
            nn.functional.mse_loss(plain(X[i:i + 32]), y[i:i + 32]).backward()
            ref.step()
        steps.step()
    assert optimizer.param_groups[0]["lr"] == ref.param_groups[0]["lr"] == 0.01 * 0.5 ** 3
    for p, q in zip(model.parameters(), plain.parameters()):
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(optimizer.state[p][key], ref.state[q][key], rtol=1e-5, atol=1e-7)


def test_a_scheduler_made_on_another_optimizer_is_refused_with_the_way_to_give_it():
    """(One made on the optimizer given to fit is taken: tests/engine/test_user_scheduler.py.)"""
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    made = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    with pytest.raises(TypeError, match=r"not a StepLR made on another.*scheduler=lambda optimizer: "
                                        r"StepLR\(optimizer, \.\.\.\), or functools.partial\(StepLR, \.\.\.\)"):
        dptrain.fit(model, regression(), None, loss=nn.MSELoss(), optimizer=torch.optim.SGD, scheduler=made,
                    epochs=1, log=None)


def test_the_optimizers_state_is_lent_to_the_run_not_held_twice():
    """During a second fit the run's optimizers hold the state and the user's object none (a
    GPU holds Adam's moments once); it comes back as the run ends."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    held = []

    class Count(dptrain.Callback):
        def on_epoch_start(self, run, epoch):
            held.append(len(optimizer.state))
    for _ in range(2):
        dptrain.fit(model, regression(), None, loss=nn.MSELoss(), optimizer=optimizer, epochs=1, batch_size=32,
                    devices=2, callbacks=[Count()], log=None)
        held.append(len(optimizer.state))
    assert held == [0, 4, 0, 4]


def test_a_model_handed_over_in_eval_mode_is_trained_in_train_mode_and_fit_says_so():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 1))
    model.eval()                                   # left from a look at it
    lines = []
    dptrain.fit(model, regression(), None, loss=nn.MSELoss(), epochs=1, batch_size=32, devices=2, log=lines.append)
    assert all(m.training for m in model.modules())
    assert model[1].running_mean.abs().sum() > 0   # BatchNorm's statistics were updated
    assert any("the model was in eval mode: fit trains it in train mode" in line for line in lines)


def _penalised_step(guarded):
    """A step with a gradient penalty (WGAN-GP's, on the inputs): gradients inside the loss."""
    def step(model, batch):
        x, t = batch
        x = x.clone().requires_grad_(True)
        out = model(x)
        loss = nn.functional.cross_entropy(out, t, reduction="sum")
        if guarded and not model.training:
            return loss, len(t)
        g, = torch.autograd.grad(out.sum(), x, create_graph=True)
        return loss + 0.1 * (g.norm(dim=1) - 1).pow(2).sum(), len(t)
    return step


@pytest.mark.parametrize("devices", [1, 2, 3])
def test_a_gradient_penalty_in_the_step_trains_as_the_plain_loop(devices):
    g = torch.Generator().manual_seed(4)
    X, y = torch.randn(60, 6, generator=g), torch.randint(0, 2, (60,), generator=g)

    def net():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))
    plain, step = net(), _penalised_step(guarded=True)
    opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    for _ in range(2):
        for i in range(0, 60, 20):
            total, count = step(plain, (X[i:i + 20], y[i:i + 20]))
            opt.zero_grad()
            (total / count).backward()
            opt.step()
    model = net()
    result = dptrain.fit(model, (X, y), (X, y), step=step, optimizer="sgd", lr=0.1, epochs=2, batch_size=20,
                         shuffle=False, devices=devices, log=None)
    for p, q in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q)
    assert "test_loss" in result["history"][-1]


def test_gradients_taken_in_an_evaluated_step_fail_with_the_fix():
    X, y = torch.randn(8, 6), torch.randint(0, 2, (8,))
    with pytest.raises(RuntimeError, match=r"does not require grad.*under `if model.training:`"):
        dptrain.fit(nn.Linear(6, 2), (X, y), (X, y), step=_penalised_step(guarded=False), epochs=1, batch_size=4,
                    devices=1, log=None)
    # Without an evaluation set, the same step trains; dptrain.evaluate then says the fix.
    model = nn.Linear(6, 2)
    dptrain.fit(model, (X, y), step=_penalised_step(guarded=False), epochs=1, batch_size=4, devices=1, log=None)
    with pytest.raises(RuntimeError, match="torch.enable_grad"):
        dptrain.evaluate(model, (X, y), step=_penalised_step(guarded=False), devices=1)


class _CountsSamples(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.register_buffer("seen", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        if self.training:
            self.seen += len(x)
        return self.lin(x)


@pytest.mark.parametrize("devices", [1, 2])
def test_a_buffer_the_forward_writes_is_device_zeros_as_in_ddp(devices):
    """As DDP's broadcast_buffers: device 0's buffers after each step (a sample counter counts its part)."""
    model = _CountsSamples()
    dptrain.fit(model, (torch.randn(96, 3), torch.randint(0, 2, (96,))), epochs=1, batch_size=16, devices=devices,
                log=None)
    assert int(model.seen) == 96 // devices


@pytest.mark.parametrize("devices", [1, 2, 3])
def test_a_dataloaders_drop_last_trains_as_the_plain_loop_on_it(devices):
    """A BatchNorm model, whose last batch of one sample would fail in training (as in the plain loop)."""
    g = torch.Generator().manual_seed(5)
    data = TensorDataset(torch.randn(49, 4, generator=g), torch.randint(0, 2, (49,), generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=16, drop_last=True)

    def net():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    plain = net()
    opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    for _ in range(2):
        for x, y in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(plain(x), y).backward()
            opt.step()
    model = net()
    result = dptrain.fit(model, loader, loader, optimizer="sgd", lr=0.1, epochs=2, shuffle=False, devices=devices,
                         sync_batchnorm=devices > 1, log=None)
    for p, q in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q)
    plain.eval()        # the evaluation reads every sample, the last one too
    with torch.no_grad():
        want = float(nn.functional.cross_entropy(plain(data.tensors[0]), data.tensors[1]))
    assert result["history"][-1]["test_loss"] == pytest.approx(want, rel=1e-5)


def test_log_takes_true_and_false_as_progress_does_and_names_the_fix_for_other_values(capsys):
    """``log=False`` (as ``progress=False``) failed at the first line with "'bool' object is not callable"."""
    X, y = torch.randn(16, 2), torch.randint(0, 2, (16,))
    for log, lines in [(False, 0), (None, 0), (True, 3)]:
        dptrain.fit(nn.Linear(2, 2), (X, y), (X, y), epochs=3, batch_size=8, devices=1, progress=False, log=log)
        assert len(re.findall(r"^epoch \d", capsys.readouterr().out, re.M)) == lines
    with pytest.raises(TypeError, match=r"log='quiet' is not a function of a line.*log=None \(or False\)"):
        dptrain.fit(nn.Linear(2, 2), (X, y), epochs=1, log="quiet")
