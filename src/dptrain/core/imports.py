"""Find the user's code by name: ``pkg.module:attr`` or ``path/to/file.py:attr``.

What the CLI's ``--recipe``, ``--model``, ``--data``, ``--loss`` and ``--optimizer`` take, as
uvicorn and gunicorn take an app. The current folder is searched first, so
``dptrain train --recipe my_tasks:make`` finds ``./my_tasks.py`` (workers started by
``--processes`` run in the same folder).
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any


def load_object(spec: str, what: str = "object") -> Any:
    """Return the object ``spec`` names; a wrong name is a one-line ``ValueError``.

    >>> load_object("torch.optim:AdamW")
    <class 'torch.optim.adamw.AdamW'>
    >>> load_object("examples/train_your_own.py:make_task")
    """
    if not isinstance(spec, str) or ":" not in spec:
        raise ValueError(f"{what} {spec!r} must name its code as pkg.module:name or path/file.py:name")
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise ValueError(f"{what} {spec!r} must name its code as pkg.module:name or path/file.py:name")
    if where.endswith(".py") or os.sep in where:
        path = Path(where)
        if not path.is_file():
            raise ValueError(f"{what} {spec!r}: no file {path}")
        module_name = f"_dptrain_user_{path.stem}"
        module = sys.modules.get(module_name)
        if module is None or getattr(module, "__file__", None) != str(path.resolve()):
            loader = importlib.util.spec_from_file_location(module_name, path.resolve())
            module = importlib.util.module_from_spec(loader)
            sys.modules[module_name] = module       # dataclasses and pickling look modules up
            try:
                loader.loader.exec_module(module)
            except BaseException:
                del sys.modules[module_name]
                raise
    else:
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(where)
        except ModuleNotFoundError as e:
            if e.name and where.startswith(e.name):
                raise ValueError(f"{what} {spec!r}: no module named {e.name!r} (looked in {os.getcwd()} and the "
                                 f"installed packages)") from None
            raise
    target: Any = module
    for part in name.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ValueError(f"{what} {spec!r}: {where} has no {name!r}") from None
    return target
