"""A launched script whose fit is stopped by Ctrl-C on rank 0 after update 2 (the user's script
does not catch it): the job must end with one line and exit code 130, no traceback."""
import signal

import torch
from torch import nn

import dptrain


class CtrlC(dptrain.Callback):
    def on_batch_end(self, run, end):
        if run.rank == 0 and end.epoch == 1 and end.batch == 2:
            signal.raise_signal(signal.SIGINT)


if __name__ == "__main__":
    torch.manual_seed(0)
    X, y = torch.randn(512, 4), torch.randint(0, 2, (512,))
    dptrain.fit(nn.Linear(4, 2), (X, y), epochs=2, batch_size=16, devices=1, callbacks=[CtrlC()])
    print("not reached")
