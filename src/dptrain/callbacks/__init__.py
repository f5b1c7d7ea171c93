"""Callbacks: hooks into a run (``base.py``), and dptrain's own outputs written as such (``outputs.py``)."""
from .base import BatchEnd, Callback, CallbackList
from .outputs import EpochLog, MetricsFile, ProgressBar, TensorBoard, Trace

__all__ = ["BatchEnd", "Callback", "CallbackList", "EpochLog", "MetricsFile", "ProgressBar", "TensorBoard", "Trace"]
