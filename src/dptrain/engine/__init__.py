"""A Task (what to train) and the engine that runs its steps and evaluation on the devices of one process: losses reduced exactly, balance, compile."""
