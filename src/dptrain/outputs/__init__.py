"""Files a run writes or reads: checkpoints, the metrics file, TensorBoard, the trace, plots, the progress bar."""
