"""A run's files and records: checkpoints, metrics, sinks, TensorBoard events, storage, progress, faults."""
