"""The environment variables mate reads, with their defaults and meaning."""

from __future__ import annotations

import os

__all__ = ["ENV_VARS", "env_in_effect", "unknown_mate_vars", "config_overrides"]

ENV_VARS: dict[str, tuple[str, str]] = {
    "MATE_BACKEND": ("auto", "auto | triton | reference: Triton kernels on CUDA, reference on CPU; "
                     "triton on CPU needs TRITON_INTERPRET=1"),
    "MATE_CHECK_INPUTS": ("0", "1: run the expensive input checks that need a host read (index ranges, layouts)"),
    "MATE_LOGLEVEL": ("0", "API logging: 0 off, 1 names, 3 arguments and results, 5 tensor statistics, 10 dumps"),
    "MATE_LOGDEST": ("stderr", "stdout, stderr or a file path (%i becomes the process id)"),
    "MATE_DUMP_DIR": ("mate_dumps", "root folder of the dumps written at MATE_LOGLEVEL=10"),
    "MATE_DUMP_MAX_SIZE_GB": ("20", "stop dumping once this many GB were written by the process"),
    "MATE_DUMP_MAX_COUNT": ("1000", "stop dumping after this many calls"),
    "MATE_DUMP_INCLUDE": ("", "comma-separated fnmatch patterns: dump only matching function names"),
    "MATE_DUMP_EXCLUDE": ("", "comma-separated fnmatch patterns: never dump matching function names"),
    "MATE_MSA_TOPK_METHOD": ("lanes", "threshold step of MSA top-k selection: lanes (default: survivors of "
                             "a lane-max bound, one key per lane; interval beyond 256 tiles), interval (a "
                             "bisection over key values), radix or bitonic; read at import"),
    "MATE_GEMM_SPLITK_REDUCE": ("fused", "fused | launch: how split-K groupwise FP8 GEMMs sum their partials; fused "
                                "counts arrivals in one counter buffer per device and stream (a captured graph "
                                "shares one stream's buffer and must not replay concurrently with that "
                                "stream's split-K calls or another graph holding it); launch (a second "
                                "kernel) has no shared state; "
                                "read per call"),
    "MATE_MSA_DECODE_VARIANT": ("", "key=value,... overrides of the MSA decode kernel config "
                                "(mate.ops.msa.sparse_decode.DECODE_VARIANT keys, e.g. fp8_stages=2,"
                                "fp8_maxnreg=none) for benchmarks; read at import"),
    "MATE_FAST_LAUNCH": ("1", "0: launch the Triton kernels through JITFunction every time (mate._core.launch; "
                         "the default launches a cached specialization's compiled kernel directly); read at import"),
    "MATE_LAUNCH_RECIPES": ("1", "0: run every eager call the ordinary way (mate._core.recipe; by default repeated "
                            "msa() (sparse, max-score), sparse_topk_select, flash_attn_varlen_func, "
                            "flash_attn_with_kvcache, sparse_mla_fp8_decode, mla_rope_quantize_fp8 and "
                            "the groupwise and MoE GEMMs (Triton / Gluon paths) calls of one signature replay their "
                            "recorded launches, and sparse_mla_fp8_decode calls without metadata keep a plan "
                            "per shape and stream); read at import"),
    "MATE_MHA_PREFILL_TMA": ("", "key=value,... overrides of the TMA prefill attention settings "
                             "(mate.ops.mha.prefill_tma.PREFILL_TMA keys, e.g. enabled=0 or stages=2) for "
                             "benchmarks; read at import"),
    # read by the scripts in benchmarks/, not by the library
    "MATE_BENCH_BUDGET_S": ("150", "benchmarks: time budget of bench_gemm.py in seconds (later shapes get a note)"),
    "MATE_BENCH_FLEX": ("", "benchmarks: 1 adds the compiled FlexAttention peer to bench_msa_attention.py"),
    "MATE_SPARSE_MLA_BARS": ("", "benchmarks: 1 makes bench_sparse_mla.py time only the bar shapes, with "
                             "candidate launch plans"),
}


def unknown_mate_vars() -> list[str]:
    """MATE_* variables set in the environment that mate does not read (likely typos)."""
    return sorted(n for n in os.environ if n.startswith("MATE_") and n not in ENV_VARS)


def env_in_effect() -> dict[str, str]:
    """Every MATE_* variable: its value if set, else its default."""
    return {name: os.environ.get(name, default) for name, (default, _) in ENV_VARS.items()}


def config_overrides(var: str, text: str, defaults: dict, *, allow_none: bool = False) -> dict:
    """``key=value,...`` (the value of environment variable ``var``) -> updates of the kernel
    settings ``defaults``, each value read as its setting's type: bool settings as 0 / 1 ints,
    names as given, the rest as ints, and ``none`` as None where ``allow_none``. An unknown key
    raises ``ValueError`` naming ``var`` and the known keys."""
    out = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, _, val = item.partition("=")
        key, val = key.strip(), val.strip()
        if key not in defaults:
            raise ValueError(f"{var}: unknown key {key!r} (known: {sorted(defaults)})")
        if allow_none and val.lower() == "none":
            out[key] = None
        elif isinstance(defaults[key], bool):
            out[key] = bool(int(val))
        elif isinstance(defaults[key], str):
            out[key] = val
        else:
            out[key] = int(val)
    return out
