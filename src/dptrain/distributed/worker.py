"""The worker side of a launched job: die with the launcher, leave a one-line error for it.

``launcher.py`` is the other side (it starts the workers through torchrun's agent and reads
what they leave); the two share only the environment variables and the error file's format.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any, Dict, Optional

from ..core.atomic import atomic_file
from ..core.errors import INTERRUPTED, Interrupted

#: How ``dptrain train --processes`` starts its workers: ``python -c BOOTSTRAP train ...``, as
#: ``python -m dptrain train ...`` would, except that a Ctrl-C that lands while torch is still
#: importing (a second or more) ends the worker quietly with code 130 (``INTERRUPTED``) rather
#: than with an import traceback under the launcher's one line; once imported, Ctrl-C is the
#: run's to handle (saved at a batch boundary, or one line naming the stage it stopped).
BOOTSTRAP = ("import os, signal, sys; sys.argv[0] = 'dptrain'; "
             f"signal.signal(signal.SIGINT, lambda *_: os._exit({INTERRUPTED})); "
             "from dptrain.cli.main import entry; signal.signal(signal.SIGINT, signal.default_int_handler); entry()")


def die_with_launcher() -> None:
    """In a worker the launcher started: be killed (SIGKILL) when the launcher dies, so no
    worker outlives a killed launcher."""
    if not os.environ.get("DPTRAIN_LAUNCHED") or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)     # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:               # the launcher died before the call above
        os._exit(1)


def end_interrupted_quietly() -> None:
    """In a worker of a job whose script calls ``fit``: an ``Interrupted`` the script does not
    catch (Ctrl-C or SIGTERM, the checkpoint saved) ends the process as the CLI's workers end,
    with its one line and exit code 130, not a traceback that the launcher then reports as a
    failure. Any other exception goes to the hook that was there."""
    previous = sys.excepthook
    if getattr(previous, "dptrain_interrupts", False):
        return

    def hook(kind, value, tb) -> None:
        if isinstance(value, Interrupted):
            print(f"dptrain: {value}", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(INTERRUPTED)       # as the CLI's workers leave: no gloo teardown at exit
        previous(kind, value, tb)
    hook.dptrain_interrupts = True      # type: ignore[attr-defined]
    sys.excepthook = hook


def record_error(line: str, blames: Optional[int] = None) -> None:
    """Leave this worker's one-line error where the agent reads a failure's cause; ``blames``:
    the rank it names as the one that failed first."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    record: Dict[str, Any] = {"message": line, "timestamp": int(time.time())}
    if blames is not None:
        record["blames"], record["rank"] = blames, int(os.environ.get("RANK", "0"))
    try:
        with atomic_file(path) as f:    # whole or absent: the agent reads it while stopping us (SIGTERM)
            f.write(json.dumps(record).encode())
    except OSError:
        pass
