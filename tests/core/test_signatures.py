"""``takes``: whether a function can be called with N positional arguments."""
from dptrain.core.signatures import takes


def test_takes_reads_the_signature_and_trusts_what_it_cannot_read():
    def step(batch, batch_idx, dataloader_idx=0):
        return batch

    def configure(weight_decay):
        return weight_decay
    assert takes(step, 2) and takes(step, 3) and not takes(step, 1) and not takes(step, 4)
    assert takes(configure, 1) and not takes(configure, 0)
    assert takes(lambda *args: args, 5) and takes(len, 1)          # (a builtin: not readable, trusted)
