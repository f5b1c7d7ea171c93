"""Datasets: IDX parsing, finding/downloading files, in-memory batching."""
from .batch import Samples, collate_samples
from .datasets import FASHION_LABELS, Dataset, load_dataset
from .idx import IDXError, parse_idx, read_idx
from .choose_loader import make_loader
from .dataset_loader import DatasetLoader
from .loader import ArrayLoader, EpochPlan, TensorLoader
from .sources import DataNotFoundError, locate

__all__ = ["ArrayLoader", "Dataset", "DatasetLoader", "DataNotFoundError", "EpochPlan", "Samples", "TensorLoader",
           "collate_samples", "make_loader", "FASHION_LABELS", "IDXError",
           "load_dataset", "locate", "parse_idx", "read_idx"]
