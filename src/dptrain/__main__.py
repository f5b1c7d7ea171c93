"""``python -m dptrain``: the command line (what ``--processes`` and ``torchrun -m dptrain`` run)."""
import sys

from .cli import main

sys.exit(main())
