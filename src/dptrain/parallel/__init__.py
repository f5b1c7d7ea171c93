"""Model replicas on the devices of a process, the Trainer and its optimizers, and the gradient-sync strategies (``sync/``) that sum gradients over devices and processes."""
