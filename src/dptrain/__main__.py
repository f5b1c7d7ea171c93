"""``python -m dptrain``: the command line (what ``--processes`` and ``torchrun -m dptrain`` run)."""
from .cli.main import entry

entry()
