"""Every cut-off the diagnosis and the advice judge by (``Thresholds``, each with where it
comes from), and ``Evidence``: one measured number and the rule it was compared with."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Thresholds:
    """Every cut-off the diagnosis uses, with where it comes from."""

    #: TensorFlow Profiler input-pipeline analyzer (xprof op_stats_to_input_pipeline_analysis):
    #: >= 20% of step time waiting on input is HIGHLY input-bound ...
    input_high: float = 0.20
    #: ... and >= 5% MODERATELY input-bound. PyTorch's tb-plugin also flags DataLoader > 5%.
    input_moderate: float = 0.05
    #: Ours: an input share this close to ``input_high``, either side, gives its verdict medium
    #: confidence: runs of one script on a busy or noisy host land on both sides of the line.
    verdict_band: float = 0.05
    #: PyTorch tb-plugin: peak memory > 90% of device memory -> memory advice.
    gpu_memory_high: float = 0.90
    #: PyTorch tb-plugin: GPU utilization < 50% -> low utilization advice.
    gpu_util_low: float = 50.0
    #: Ours: the loader's process tree uses >= 85% of the usable cores = saturated.
    #: (TraceML calls compute-bound at 0.85; we use the same share for "cores are full".)
    cpu_saturated: float = 0.85
    #: Ours: a loader worker busy >= 60% of a core is doing CPU work, not waiting on I/O.
    worker_busy: float = 0.60
    #: Ours: the training thread spent >= 60% of its wait on CPU -> in-process loading is CPU work.
    wait_cpu_bound: float = 0.60
    #: Ours: host memory pressure = swap grew by this much, or available memory under 5%.
    swap_growth_bytes: int = 256 * 2**20
    memory_available_low: float = 0.05
    #: Steps needed after warm-up to judge at all (TraceML needs 20; we judge from 5
    #: but say "low" confidence under 20).
    min_steps: int = 5
    confident_steps: int = 20
    #: Ours: the evidence line for garbage collection taken out of batch waits is shown
    #: from this share of the judged steps' time: it moved the input share by a point.
    gc_in_waits_shown: float = 0.01
    #: Ours: the host is contended when processes outside the job keep >= 25% of the
    #: usable cores busy (a quarter: half a core on the 2-core CI VM, 4 of 16) ...
    contended_others: float = 0.25
    #: ... or the training thread or the loader workers spend >= 10% of the time
    #: runnable but waiting for a CPU (Linux schedstat run-queue time): then a
    #: loader that looks idle is waiting for a core, not for I/O.
    contended_run_delay: float = 0.10
    #: Ours: ... and for at least a third of the time they were off a core: queued that much,
    #: more cores would cut their batches by a third; less, they sleep (storage, the network)
    contended_idle_share: float = 1 / 3
    #: Ours: the hypervisor took >= 5% of the VM's CPU time (Linux steal): on the 2-core CI VM
    #: a tf.data loop ran at its usual speed below 2% and 1.4-2.2x slower at 10-33%
    steal_warn: float = 0.05
    #: Ours: a step's input wait is a stall from five times the judged steps' median wait
    #: (a batch a few times the usual one is jitter; five times is out of the body) ...
    stall_over_median: float = 5.0
    #: ... and from half the median step: a shorter hiccup is not a pause anyone sees, and
    #: with no median wait at all (workers keeping up) it is the only floor there is.
    stall_of_step: float = 0.5
    #: Ours: the loop waits for its tail (warning ``input-stalls``) when the stalls are at most
    #: a quarter of the judged steps (more, and the long waits are the body, the input
    #: share's business) ...
    stall_steps_max: float = 0.25
    #: ... hold at least half of the judged steps' input wait (the mean is made of them, so
    #: a faster median would not help), and at least ``input_moderate`` of their time (the
    #: share from which input is worth fixing at all).
    stall_wait_share: float = 0.50
    #: Ours: the epoch starts' stalls say how much of them was freeing the last epoch's
    #: iterator (tf.data's ``stop_s``) from a tenth: less is the pipeline's start.
    epoch_start_freeing_shown: float = 0.10
    #: ... and of the whole input wait, at which the cause line says it
    freeing_cause_share: float = 0.5


DEFAULT_THRESHOLDS = Thresholds()


@dataclass
class Evidence:
    """One measured number that took part in the decision."""

    key: str
    label: str
    value: float | None
    display: str
    threshold: str = ""  # the rule it was compared with, when one applies
    source: str = ""  # where the rule comes from
