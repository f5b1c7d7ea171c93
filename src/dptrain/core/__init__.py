"""The bottom layer, used by every other: devices, the per-device thread runner, cutting samples into parts, errors and exit codes, atomic files, tracing, imports by name."""
