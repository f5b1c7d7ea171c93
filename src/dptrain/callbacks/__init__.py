"""Callbacks: hooks into a run (``base.py``), dptrain's own outputs written as such
(``outputs.py``), and early stopping, the best weights and an EMA (``training.py``)."""
from .base import BatchEnd, Callback, CallbackList
from .outputs import EpochLog, MetricsFile, ProgressBar, TensorBoard, Trace
from .training import EMA, BestCheckpoint, EarlyStopping, Monitor

__all__ = ["BatchEnd", "BestCheckpoint", "Callback", "CallbackList", "EMA", "EarlyStopping", "EpochLog",
           "MetricsFile", "Monitor", "ProgressBar", "TensorBoard", "Trace"]
