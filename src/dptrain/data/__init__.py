"""Datasets: IDX parsing, finding/downloading files, in-memory batching."""
from .datasets import FASHION_LABELS, Dataset, load_dataset
from .idx import IDXError, parse_idx, read_idx
from .loader import ArrayLoader
from .sources import DataNotFoundError, locate

__all__ = ["ArrayLoader", "Dataset", "DataNotFoundError", "FASHION_LABELS", "IDXError",
           "load_dataset", "locate", "parse_idx", "read_idx"]
