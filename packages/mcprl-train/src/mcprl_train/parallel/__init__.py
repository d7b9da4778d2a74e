"""Data parallelism: collectives, the torchrun launch, the DeepSpeed backend."""
