"""Tensor parallelism (`--tp N`): one model split across N ranks, one process per rank.

`model_api.shard` says which slice of each weight a rank holds (no torch); `model_api.tp_comm`
is the interface the model calls for its collectives (a no-op at tp=1); `dist` implements it with torch.distributed
(gloo on CPUs, NCCL on CUDA); `loader` reads a rank's slices from safetensors; `runner` is rank
0 (the engine's runner: it runs the scheduler, sends each step's plan to the workers and
samples); `worker` is every other rank (forward only). Importing this package imports no torch.
"""
