"""Processes for the tests, forked from a warm Python that imported torch and dptrain once.

A fresh ``python -m dptrain`` or a spawned worker spends about 3 s importing torch before it
does anything; the suite starts a few hundred of them. Here each one is forked from
multiprocessing's fork server, which imported torch and dptrain when it started, so it starts
in a few milliseconds and still begins fresh (a new process, nothing of another test in it).
What a spawned process would take from the test is passed on explicitly: the environment
(``monkeypatch.setenv``) and the working folder, read when the process starts.

``dptrain_cli`` runs the command line as ``subprocess.run([sys.executable, "-m", "dptrain",
...])`` would, with its output, exit code and atexit handlers; tests of start-up itself (the
``dptrain`` script, ``torchrun``, ``dptrain launch``'s workers) still start real interpreters.
"""
import atexit
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import traceback
from typing import Dict, List, Optional

CONTEXT = mp.get_context("forkserver")
CONTEXT.set_forkserver_preload(["torch", "torch.distributed", "dptrain", "dptrain.cli.main"])


def here() -> Dict[str, object]:
    """What a spawned process inherits and a forked one must be given: the environment and folder."""
    return {"env": dict(os.environ), "cwd": os.getcwd()}


def become(place: Dict[str, object]) -> None:
    """In the forked process: take the test's environment and folder, and the threads that
    ``OMP_NUM_THREADS`` asks for (OpenMP read it once, when the fork server loaded torch; a
    different count sums in another order, and runs compared bit for bit differ)."""
    os.environ.clear()
    os.environ.update(place["env"])
    os.chdir(place["cwd"])
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch
        torch.set_num_threads(int(threads))


def _cli(args: List[str], place: Dict[str, object], out_path: str, err_path: str) -> None:
    become(place)
    for fd, path in ((1, out_path), (2, err_path)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    sys.argv = ["dptrain", *args]
    code = 1
    try:
        from dptrain.cli.main import entry
        entry()
        code = 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    try:
        atexit._run_exitfuncs()     # as the interpreter would at exit
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def dptrain_cli(args: List[str], env: Optional[Dict[str, str]] = None,
                timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m dptrain *args`` in a forked warm process: its exit code, stdout and stderr (text)."""
    place = here()
    if env is not None:
        place["env"] = dict(env)
    with tempfile.TemporaryDirectory() as tmp:
        out_path, err_path = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        proc = CONTEXT.Process(target=_cli, args=(list(args), place, out_path, err_path))
        proc.start()
        proc.join(timeout)
        if proc.is_alive():
            proc.kill()
            proc.join()
            raise subprocess.TimeoutExpired(["dptrain", *args], timeout)
        with open(out_path, errors="replace") as out, open(err_path, errors="replace") as err:
            return subprocess.CompletedProcess(["dptrain", *args], proc.exitcode, out.read(), err.read())
