"""The plain PyTorch loop the parallel tests compare ``fit`` with: cross-entropy, in order."""
import torch
import torch.nn.functional as F


def plain_steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer, X: torch.Tensor, y: torch.Tensor,
                batch_size: int = 16, epochs: int = 1) -> torch.nn.Module:
    """``epochs`` passes over ``(X, y)`` in order, one optimizer step a batch; returns ``model``."""
    for _ in range(epochs):
        for i in range(0, len(X), batch_size):
            optimizer.zero_grad()
            F.cross_entropy(model(X[i:i + batch_size]), y[i:i + batch_size]).backward()
            optimizer.step()
    return model
