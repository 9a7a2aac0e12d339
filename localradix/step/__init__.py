"""The step plan: what the scheduler hands a model runner for one step and what comes back.

Framework-neutral (numpy only) and at the bottom of the package graph: `sched/` builds it,
`runner/` and `backends/` consume it, and neither imports the other for it.
"""

from localradix.step.forward_batch import ForwardBatch
from localradix.step.sampling_batch import SampleOutput, SamplingBatch

__all__ = ["ForwardBatch", "SampleOutput", "SamplingBatch"]
