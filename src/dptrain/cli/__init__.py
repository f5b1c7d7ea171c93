"""The ``dptrain`` command: ``main.py`` runs the subcommands, ``args.py`` parses them."""
from .main import entry, main

__all__ = ["entry", "main"]
