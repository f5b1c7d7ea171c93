"""Several processes, on one machine or many, through torch.distributed (gloo on CPU, NCCL on GPU)."""
from .collective import Collective, get_collective
from .env import DistEnv
from .join import init_distributed, shutdown_distributed

__all__ = ["Collective", "DistEnv", "get_collective", "init_distributed", "shutdown_distributed"]
