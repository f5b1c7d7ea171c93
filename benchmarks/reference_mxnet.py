"""The reference system, for side-by-side runs: the from-scratch LeNet recipe on MXNet 1.9.1.

Runs only in a separate environment with MXNet (it needs numpy < 1.24, so not dptrain's):

    python3 -m venv /tmp/mxvenv && /tmp/mxvenv/bin/pip install numpy==1.23.5 mxnet==1.9.1
    /tmp/mxvenv/bin/python benchmarks/reference_mxnet.py --data-dir ../shared/datasets --contexts 2

It follows the recipe of the reference chapter (``../shared/reference/001_*``) and the helpers
it relies on: N(0, 0.01) weights and zero biases, sum of per-sample cross-entropy per context,
naive allreduce of every gradient, SGD with the step divided by the full batch size, data from
the official IDX files (as ``gluon.data.vision.FashionMNIST`` holds them) through ``ToTensor`` and a shuffling ``DataLoader`` with 4
worker processes, epoch time measured around the training loop only (``npx.waitall`` after
every batch) and test accuracy on the first context after every epoch. Prints one JSON
object with the same keys as ``dptrain train --json``.
"""
import argparse
import gzip
import json
import os
import time

import mxnet as mx
import numpy as onp
from mxnet import autograd, gluon, np, npx

npx.set_np()


def read_idx(root, split):
    """What ``gluon.data.vision.FashionMNIST`` holds (28x28x1 uint8 images, int32 labels).

    Read directly: MXNet checks the SHA-1 of its own re-compressed copies of the files, which
    differ from the official ``.gz`` files, and would try to download them."""
    with gzip.open(os.path.join(root, f"{split}-labels-idx1-ubyte.gz")) as f:
        labels = onp.frombuffer(f.read()[8:], dtype=onp.uint8).astype(onp.int32)
    with gzip.open(os.path.join(root, f"{split}-images-idx3-ubyte.gz")) as f:
        images = onp.frombuffer(f.read()[16:], dtype=onp.uint8).reshape(len(labels), 28, 28, 1)
    return gluon.data.ArrayDataset(np.array(images, dtype=onp.uint8), np.array(labels, dtype=onp.int32))


def init_params(scale=0.01):
    shapes = [(20, 1, 3, 3), (20,), (50, 20, 5, 5), (50,), (800, 128), (128,), (128, 10), (10,)]
    return [np.random.normal(scale=scale, size=s) if len(s) > 1 else np.zeros(s) for s in shapes]


def forward(X, p):
    h = npx.pooling(npx.relu(npx.convolution(X, p[0], p[1], kernel=(3, 3), num_filter=20)),
                    pool_type="avg", kernel=(2, 2), stride=(2, 2))
    h = npx.pooling(npx.relu(npx.convolution(h, p[2], p[3], kernel=(5, 5), num_filter=50)),
                    pool_type="avg", kernel=(2, 2), stride=(2, 2))
    h = npx.relu(np.dot(h.reshape((h.shape[0], -1)), p[4]) + p[5])
    return np.dot(h, p[6]) + p[7]


def replicate(params, ctx):
    copies = [p.copyto(ctx) for p in params]
    for c in copies:
        c.attach_grad()
    return copies


def sum_to_all(grads):
    for g in grads[1:]:
        grads[0][:] += g.copyto(grads[0].ctx)
    for g in grads[1:]:
        grads[0].copyto(g)


def train_batch(X, y, replicas, ctxs, lr, loss_fn):
    Xs = gluon.utils.split_and_load(X, ctxs)
    ys = gluon.utils.split_and_load(y, ctxs)
    with autograd.record():
        losses = [loss_fn(forward(Xi, Wi), yi) for Xi, yi, Wi in zip(Xs, ys, replicas)]
    for loss in losses:
        loss.backward()
    for i in range(len(replicas[0])):
        sum_to_all([r[i].grad for r in replicas])
    for r in replicas:
        for p in r:
            p[:] = p - lr * p.grad / X.shape[0]
    return float(sum(loss.sum().item() for loss in losses))


def accuracy(params, loader, ctx):
    correct = total = 0
    for X, y in loader:
        X, y = X.as_in_ctx(ctx), y.as_in_ctx(ctx)
        correct += int((forward(X, params).argmax(axis=1).astype(y.dtype) == y).sum().item())
        total += y.size
    return correct / total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True, help="folder holding fashion-mnist/*.gz")
    ap.add_argument("--contexts", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=4, help="DataLoader worker processes")
    args = ap.parse_args()
    mx.random.seed(args.seed)
    root = os.path.join(args.data_dir, "fashion-mnist")
    to_tensor = gluon.data.vision.transforms.ToTensor()
    train_set = read_idx(root, "train").transform_first(to_tensor)
    test_set = read_idx(root, "t10k").transform_first(to_tensor)
    train_iter = gluon.data.DataLoader(train_set, args.batch_size, shuffle=True, num_workers=args.workers)
    test_iter = gluon.data.DataLoader(test_set, args.batch_size, shuffle=False, num_workers=args.workers)
    ctxs = [mx.cpu(i) for i in range(args.contexts)]
    params = init_params()
    replicas = [replicate(params, c) for c in ctxs]
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    history = []
    for epoch in range(1, args.epochs + 1):
        start, loss_sum, seen = time.perf_counter(), 0.0, 0
        for X, y in train_iter:
            loss_sum += train_batch(X, y, replicas, ctxs, args.lr, loss_fn)
            seen += X.shape[0]
            npx.waitall()
        sec = time.perf_counter() - start
        acc = accuracy(replicas[0], test_iter, ctxs[0])
        history.append({"epoch": epoch, "sec": sec, "train_loss": loss_sum / seen, "test_acc": acc})
    sec_per_epoch = sum(h["sec"] for h in history) / len(history)
    print(json.dumps({"system": f"mxnet {mx.__version__}", "devices": [str(c) for c in ctxs],
                      "epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr,
                      "seed": args.seed, "test_acc": history[-1]["test_acc"],
                      "sec_per_epoch": sec_per_epoch, "images_per_sec": len(train_set) / sec_per_epoch,
                      "history": history}))


if __name__ == "__main__":
    main()
