"""Freed host memory kept for reuse: glibc's thresholds set once, unless the user chose, and
no page faults for temporaries that change size from batch to batch."""
import os
import subprocess
import sys

import pytest

from dptrain.core import host_memory


class FakeLibc:
    def __init__(self):
        self.calls = []

    def mallopt(self, param, value):
        self.calls.append((param, value))
        return 1


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(host_memory, "_applied", None)


def test_both_thresholds_are_set_once_mmap_first(fresh):
    libc = FakeLibc()
    assert host_memory.keep_freed_host_memory({}, libc) is True
    assert libc.calls == [(host_memory.M_MMAP_THRESHOLD, 32 << 20), (host_memory.M_TRIM_THRESHOLD, 256 << 20)]
    assert host_memory.keep_freed_host_memory({}, libc) is True and len(libc.calls) == 2


@pytest.mark.parametrize("environ, why", [
    ({"DPTRAIN_HOST_MALLOC": "default"}, "DPTRAIN_HOST_MALLOC=default"),
    ({"MALLOC_ARENA_MAX": "2", "MALLOC_TRIM_THRESHOLD_": "0"}, "MALLOC_TRIM_THRESHOLD_ is set"),
    ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}, "GLIBC_TUNABLES sets glibc.malloc"),
    ({"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}, "jemalloc is preloaded"),
])
def test_the_users_own_choice_is_left_alone(fresh, environ, why):
    libc = FakeLibc()
    assert host_memory.user_chose(environ) == why
    assert host_memory.keep_freed_host_memory(environ, libc) is False and libc.calls == []


def test_a_refused_setting_says_so(fresh):
    class Refusing(FakeLibc):
        def mallopt(self, param, value):
            super().mallopt(param, value)
            return 0
    assert host_memory.keep_freed_host_memory({}, Refusing()) is False


_TEXT_EVALUATIONS = """
import resource, sys, torch
torch.set_num_threads(2)        # the faults come with a second thread's allocations (with one: none)
from dptrain.core.host_memory import keep_freed_host_memory
print("set", keep_freed_host_memory())
g = torch.Generator().manual_seed(0)
embed = torch.nn.Embedding(2000, 64)
batches = [(torch.randint(1, 2000, (64, int(n)), generator=g), torch.rand(64, int(n), 1, generator=g) > 0.2)
           for n in torch.randint(8, 65, (32,), generator=g)]
faults = []
with torch.no_grad():
    for evaluation in range(6):      # a padded text batch's temporaries: 1 MB of another size each batch
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        kept = []
        for ids, mask in batches:
            m = mask.float()
            kept.append(((embed(ids) * m).sum(1) / m.sum(1)).sum())
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print("faults", min(faults[2:]))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_temporaries_of_changing_sizes_fault_no_pages_in_once_kept():
    runs = {}
    for name, extra in (("default", {"DPTRAIN_HOST_MALLOC": "default"}), ("kept", {})):
        env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "OMP_NUM_THREADS"}
        done = subprocess.run([sys.executable, "-c", _TEXT_EVALUATIONS], capture_output=True, text=True, timeout=120,
                              env={**env, **extra})
        assert done.returncode == 0, done.stderr[-2000:]
        runs[name] = int(done.stdout.split("faults")[-1])
        assert ("set True" in done.stdout) == (name == "kept"), done.stdout
    if runs["default"] < 200:
        pytest.skip(f"this machine's allocator faulted only {runs['default']} pages an evaluation by default")
    assert runs["kept"] * 20 < runs["default"], runs
