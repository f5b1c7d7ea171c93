"""Callbacks: hooks into a run (``base.py``), dptrain's own outputs written as such
(``outputs.py``), early stopping and an EMA (``training.py``), the best epochs' weights
(``best_checkpoint.py``), what watches a figure for them (``monitor.py``), stochastic weight
averaging and BatchNorm's statistics for an average (``swa.py``), Lightning's EMA rules
(``weight_averaging.py``)."""
from .base import BatchEnd, Callback, CallbackList
from .outputs import EpochLog, MetricsFile, ProgressBar, TensorBoard, Trace
from .best_checkpoint import BestCheckpoint
from .monitor import Monitor
from .swa import SWA, update_bn
from .training import EMA, EarlyStopping
from .weight_averaging import LightningEMA

__all__ = ["BatchEnd", "BestCheckpoint", "Callback", "CallbackList", "EMA", "EarlyStopping", "EpochLog",
           "LightningEMA", "MetricsFile", "Monitor", "ProgressBar", "SWA", "TensorBoard", "Trace", "update_bn"]
