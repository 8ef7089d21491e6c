"""Job stages (the r2v spec's "Task state"): the names the engine reports and the order of the
spec's diagram. How a run records them (hidden tags, run events) is :mod:`contracts.events`.

Pure constants: the engine, the API, the daemon and the ops all import this.
"""

from __future__ import annotations

QUEUED = "queued"
CLAIMED = "claimed"
WAITING_FOR_MEMORY = "waiting_for_memory"
RECOVERED = "recovered"
VALIDATING = "validating"
CACHE_LOOKUP = "conditioning_cache_lookup"
KEEPING_ON_GPU = "keeping_generator_on_gpu"
STAGING_ON_CPU = "staging_generator_on_cpu"
UNLOADING = "unloading_for_conditioning"
CONDITIONING = "conditioning"
LOADING_GENERATOR = "loading_generator"
INFERRING = "inferring"
DECODING = "decoding"
WRITING = "writing"
MERGING = "merging"
SUCCEEDED = "succeeded"
FAILED = "failed"
CANCELED = "canceled"

# Order of the spec's diagram (the weight-tier stages are alternatives of one another).
ORDER = (
    QUEUED,
    CLAIMED,
    WAITING_FOR_MEMORY,
    RECOVERED,
    VALIDATING,
    CACHE_LOOKUP,
    KEEPING_ON_GPU,
    STAGING_ON_CPU,
    UNLOADING,
    CONDITIONING,
    LOADING_GENERATOR,
    INFERRING,
    DECODING,
    WRITING,
    MERGING,
    SUCCEEDED,
    FAILED,
    CANCELED,
)
TERMINAL = (SUCCEEDED, FAILED, CANCELED)
