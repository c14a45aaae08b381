"""The compute rules: mixed precision on the GPU and on the CPU, compile, a larger batch,
and the model's intra-op threads against the cores. Each snippet is written in the
``dialect`` of the run's framework (``Adapter.dialect``, "torch" where none is
declared: loader.py's ``dialect_of``); compile is written in torch only."""

from __future__ import annotations

from ..cpufeatures import has_bf16
from ..metrics import Metrics
from ..records import GpuInfo, Run
from .base import MEASURE, Recommendation
from .loader import compute_cpu_per_step

#: compiling takes longer than the what-if budget (2-14 s for a small MLP on 2 CPU cores, minutes
#: for large models): measured by a trial instead
COMPILE_BASIS = ("no estimate: compiling takes seconds to minutes, beyond the replays' budget; "
                 "`loadprof tune --fixes compile` measures it, its first call's compile time counted apart")

#: the reason mixed precision on a GPU carries no figure
TENSOR_CORES = ("no estimate: tensor cores speed up the matrix work, not the rest of the step, and "
                "their share is not measured here; `loadprof tune` measures it (amp)")


def host_bound_advice(m: Metrics, dialect: str) -> list[Recommendation]:
    """A host-bound run (the GPU idles while the loop is not waiting for data): a larger
    batch, and in torch, compile."""
    out: list[Recommendation] = []
    if m.gpu_memory_peak_fraction is None or m.gpu_memory_peak_fraction < 0.6:
        out.append(Recommendation(
            "larger_batch", "Use a larger batch",
            f"The GPU is busy {m.gpu_util_median:.0f}% of the time and memory peaks at "
            f"{(m.gpu_memory_peak_fraction or 0):.0%}: larger batches amortise per-step overhead.",
            "DataLoader(..., batch_size=2 * batch_size)  # scale the learning rate accordingly",
            {"batch_size_factor": 2},
            basis="no estimate: it changes the optimisation; compare samples per second",
        ))
    if dialect == "torch":
        out.append(Recommendation(
            "compile", "Compile the model to cut Python and launch overhead",
            f"The GPU idles {100 - (m.gpu_util_median or 0):.0f}% of the time while the loop is not "
            "waiting for data: the host cannot launch kernels fast enough.",
            "model = torch.compile(model)  # or mode='reduce-overhead' for CUDA graphs",
            basis=COMPILE_BASIS,
        ))
    return out


def _best_gpu(run: Run) -> GpuInfo | None:
    known = [g for g in run.environment.gpus if g.compute_capability]
    return max(known, key=lambda g: g.compute_capability or (0, 0)) if known else None


def mixed_precision(run: Run, dialect: str) -> Recommendation | None:
    gpu = _best_gpu(run)
    if run.amp_in_use or gpu is None or not gpu.has_tensor_cores or gpu.compute_capability is None:
        return None
    cc = gpu.compute_capability
    bf16 = gpu.supports_bf16
    dtype = "bfloat16" if bf16 else "float16"
    if dialect == "tf":
        policy = "mixed_bfloat16" if bf16 else "mixed_float16"
        return Recommendation(
            "mixed_precision", f"Train in mixed precision ({policy})",
            f"The GPU (compute capability {cc[0]}.{cc[1]}) has tensor cores and the run uses float32.",
            f'keras.mixed_precision.set_global_policy("{policy}")', {"policy": policy},
            basis=TENSOR_CORES, framework="tf",
        )
    code = (
        f"with torch.autocast('cuda', dtype=torch.{dtype}):\n    loss = loss_fn(model(x), y)\nloss.backward()"
        if bf16 else
        "scaler = torch.amp.GradScaler()\nwith torch.autocast('cuda', dtype=torch.float16):\n"
        "    loss = loss_fn(model(x), y)\nscaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()"
    )
    return Recommendation(
        "mixed_precision", f"Train in mixed precision ({dtype})",
        f"The GPU (compute capability {cc[0]}.{cc[1]}) has tensor cores and no autocast was seen.",
        code, {"dtype": dtype}, basis=TENSOR_CORES,
    )


def compute_advice(run: Run, m: Metrics, dialect: str) -> list[Recommendation]:
    """A compute-bound run: faster math, fewer launches, more work per step. None of
    these has an estimate from the measurements (the gain depends on the model)."""
    out: list[Recommendation] = []
    mp = mixed_precision(run, dialect) if m.gpu_in_use else _cpu_mixed_precision(run, dialect)
    if mp is not None:
        out.append(mp)
    if dialect == "torch" and m.gpu_in_use:
        # on a CPU, torch.compile ran three compute-bound models here at 0.45-0.95x of eager
        # (docs/dev/advice-accuracy.md): only `tune --fixes compile` may say it pays there
        out.append(Recommendation(
            "compile", "Compile the model",
            "The model's own work sets the pace on the GPU: torch.compile fuses its operations and "
            "cuts per-operation overhead. The first steps compile (seconds to minutes); the gain depends "
            "on the model, so time it: `loadprof tune --fixes compile` compiles it in a trial.",
            "model = torch.compile(model)",
            basis=COMPILE_BASIS,
        ))
    peak = m.gpu_memory_peak_fraction
    if m.gpu_in_use and peak is not None and peak < 0.6 and (m.gpu_util_median or 0) < 90:
        out.append(Recommendation(
            "larger_batch", "Use a larger batch",
            f"The GPU is busy {m.gpu_util_median or 0:.0f}% of the time with memory at {peak:.0%} at its "
            "peak: a larger batch gives each kernel more work and amortises per-step overhead.",
            "DataLoader(..., batch_size=2 * batch_size)  # scale the learning rate accordingly",
            {"batch_size_factor": 2},
            basis="no estimate: it changes the optimisation; compare samples per second",
        ))
    return out


def _cpu_mixed_precision(run: Run, dialect: str) -> Recommendation | None:
    """bf16 on a CPU pays only with native bf16 instructions (AMX, AVX-512 BF16)."""
    features = run.environment.cpu_features
    if run.amp_in_use or not has_bf16(features):
        return None
    which = " and ".join(f for f in ("amx_bf16", "avx512_bf16") if f in features)
    if dialect == "tf":
        return Recommendation(
            "mixed_precision", "Train in mixed precision (mixed_bfloat16)",
            f"The model's work sets the pace on the CPU, which has bf16 instructions ({which}).",
            'keras.mixed_precision.set_global_policy("mixed_bfloat16")', {"policy": "mixed_bfloat16"},
            basis=MEASURE, framework="tf",
        )
    return Recommendation(
        "mixed_precision", "Train in mixed precision (bfloat16 on the CPU)",
        f"The model's work sets the pace on the CPU, which has bf16 instructions ({which}) and no "
        "autocast was seen. `loadprof tune` tries it (amp=auto) and checks the loss.",
        "with torch.autocast('cpu', dtype=torch.bfloat16):\n    loss = loss_fn(model(x), y)\nloss.backward()",
        {"dtype": "bfloat16", "device": "cpu"}, basis=MEASURE,
    )


def threads_advice(run: Run, m: Metrics, planned_workers: int | None) -> Recommendation | None:
    """The model's intra-op threads, the loader's busy cores and other processes' cores
    against the usable cores. More busy threads than cores make the model's threads,
    which wait for one another at each operation, wait for the slowest descheduled one."""
    threads = run.environment.intra_op_threads
    if threads is None:
        return None
    cores = m.usable_cores
    others = m.others_cpu_cores or 0.0
    free = max(1, int(cores - others + 0.5))
    # the workers advised will be busy (the loop waits for them); today's, as measured
    loader = float(planned_workers) if planned_workers is not None else (m.children_cpu_cores or 0.0)
    target = max(1, int(free - loader + 0.5))
    if threads <= target:
        return None
    busy = compute_cpu_per_step(m, m.loader) / max(m.compute_per_step, 1e-9)
    who = (f"{planned_workers} loader worker(s) as advised" if planned_workers is not None
           else f"loader workers using {loader:.1f} cores")
    held = f", other processes {others:.1f}," if others >= 0.25 else ""
    return Recommendation(
        "threads", f"Run the model on {target} intra-op thread{'s' if target > 1 else ''}",
        f"PyTorch computes on {threads} threads; with {who}{held} on {cores} usable cores, "
        f"{target} {'is' if target == 1 else 'are'} left for the model. Its threads kept {busy:.1f} cores "
        "busy while it computed; threads beyond the free cores wait for one another at every operation.",
        f"torch.set_num_threads({target})  # at the top of the script, or: OMP_NUM_THREADS={target} python ...",
        {"threads": target, "current": threads, "usable_cores": cores},
        basis=f"no estimate: compare the median step of `OMP_NUM_THREADS={target} loadprof diagnose ...` "
              "with today's",
    )
