"""What model code is written against, below `models/` and `runner/` so neither imports the
other back: the attention backend interface and its registry, the KV layout, the tensor-parallel
communicator and a rank's shard of the weights, and (hybrids) the recurrent state of each row.

Runners and backends implement or hold these; models call them; loaders slice by them.
"""
