"""``python -m dptrain.cli``: the command line (as ``python -m dptrain``)."""
from .main import entry

entry()
