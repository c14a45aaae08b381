"""What the host CPU offers the model: the instruction sets behind fast bf16 math.

Mixed precision on a CPU pays only where the cores have bf16 instructions (AVX-512
BF16, AMX); elsewhere bf16 is emulated and slower than float32, so the advice and
``tune`` both ask here before offering it.
"""

from __future__ import annotations

from pathlib import Path

#: /proc/cpuinfo flags for native reduced-precision matrix math (Linux's names).
BF16_FLAGS = ("amx_bf16", "avx512_bf16")
KNOWN_FLAGS = ("amx_bf16", "amx_fp16", "amx_tile", "avx512_bf16", "avx512_fp16", "avx512f")


def parse_flags(cpuinfo: str) -> list[str]:
    """The known flags of the first processor listed in /proc/cpuinfo text."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            present = set(value.split())
            return [f for f in KNOWN_FLAGS if f in present]
    return []


def cpu_features(path: str = "/proc/cpuinfo") -> list[str]:
    """The known flags of this host's CPU; empty where /proc/cpuinfo cannot be read."""
    try:
        return parse_flags(Path(path).read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return []


def has_bf16(features: list[str]) -> bool:
    return any(f in features for f in BF16_FLAGS)
