"""Every error dptrain reports as one line, and the exit code each gives (in one place).

The CLI prints ``dptrain: error: <message>`` and exits with ``exit_code(e)``; it never
asks for an exception's class. Bad input (``ValueError``, ``TypeError``, argparse) is
``USAGE``; a run that could not go on (data, checkpoint, a NaN loss, peers that did not
meet) is ``FAILED``; Ctrl-C or SIGTERM is ``INTERRUPTED``, as shells count it (128 + 2).
"""
from __future__ import annotations

from typing import Optional

FAILED = 1
USAGE = 2
INTERRUPTED = 130


class DptrainError(Exception):
    """A run that could not go on; ``exit_code`` says how the CLI exits."""
    exit_code = FAILED


class DataNotFoundError(DptrainError, FileNotFoundError):
    """The dataset is on none of the places looked and could not be downloaded."""


class IDXError(DptrainError, ValueError):
    """An IDX file is corrupt, truncated or not the kind expected."""


class CheckpointError(DptrainError, ValueError):
    """A checkpoint is missing, corrupt, or of another run."""


class NonFiniteLoss(DptrainError, ValueError):
    """The loss became NaN or infinite (``--on-nan stop``)."""


class DataStalled(DptrainError, RuntimeError):
    """The data workers gave no batch within ``--worker-timeout``: one is stuck in the Dataset."""


class PeerFailed(DptrainError, RuntimeError):
    """Another process failed at work this one waited for (rank 0 reading a dispatched stream)."""


class RendezvousError(DptrainError, RuntimeError):
    """The processes of a job did not all meet in time."""


class Interrupted(DptrainError):
    """SIGINT or SIGTERM arrived; the state was saved (if a checkpoint directory was given)."""
    exit_code = INTERRUPTED


def exit_code(e: BaseException) -> Optional[int]:
    """The CLI's exit code for ``e``; None for an error that is not a one-line error (a bug,
    or the user's own code failing: its traceback is what helps)."""
    if isinstance(e, DptrainError):
        return e.exit_code
    if isinstance(e, KeyboardInterrupt):
        return INTERRUPTED
    if isinstance(e, (ValueError, TypeError)):
        return USAGE
    return None
