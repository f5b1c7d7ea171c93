"""``python -m dptrain``: the command line (what ``--processes`` and ``torchrun -m dptrain`` run)."""
from .cli import entry

entry()
