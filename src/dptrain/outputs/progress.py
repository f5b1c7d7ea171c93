"""A one-line progress bar for an epoch on a terminal; nothing when not a terminal."""
from __future__ import annotations

import sys
import time
from typing import Optional, TextIO


def seconds(value: float) -> str:
    """A duration as the epoch lines show it: ``7.9``, and below a second two significant
    digits (``0.043``, not ``0.0``: a small model's epoch)."""
    return f"{value:.1f}" if value >= 0.95 else f"{value:.2g}"


class ProgressBar:
    """Redraw ``epoch 3 [#####.....] 120/235  7,812 img/s  loss 0.512`` in place on stderr.

    Off (every call a no-op) unless ``enabled`` and the stream is a TTY, so logs and pipes
    keep one line per epoch. Redraws at most 10 times a second. ``unit``: ``img/s`` for
    images, ``samples/s`` for text, tables... ``total`` None (a stream read to its end, of no
    length known before): ``epoch 3  120 batches  7,812 img/s  loss 0.512``, no bar.
    """

    def __init__(self, total: Optional[int], epoch: int, enabled: bool = True, stream: Optional[TextIO] = None,
                 width: int = 24, unit: str = "samples/s"):
        self.unit = unit
        self.stream = stream or sys.stderr
        terminal = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.enabled = enabled and (total is None or total > 0) and terminal
        self.total, self.epoch, self.width = total, epoch, width
        self.start = self.last = time.perf_counter()

    def due(self, done: int) -> bool:
        """Whether ``update`` would draw now (at most every 0.1 s, and the last batch)."""
        return self.enabled and (time.perf_counter() - self.last >= 0.1 or
                                 (self.total is not None and done >= self.total))

    def update(self, done: int, images: int, loss: Optional[float] = None) -> None:
        if not self.due(done):
            return
        now = time.perf_counter()
        self.last = now
        rate = images / max(now - self.start, 1e-9)
        if self.total is None:
            text = f"\repoch {self.epoch}  {done} batches  {rate:,.0f} {self.unit}"
        else:
            filled = self.width * done // self.total
            text = f"\repoch {self.epoch} [{'#' * filled}{'.' * (self.width - filled)}] {done}/{self.total}  " \
                   f"{rate:,.0f} {self.unit}"
        if loss is not None:
            text += f"  loss {loss:.3f}"
        self.stream.write(text)
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r\033[K")      # clear the line: the epoch summary replaces it
            self.stream.flush()
