"""Running a Task: ``fit``, the session (joining processes), the epoch loop, checkpoints and resume, stopping, the config."""
