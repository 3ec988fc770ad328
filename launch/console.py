"""The console of a run (and of `algo-train eval`): which other programs' output is kept off it.

Other programs' console output that says nothing about the run (logging.verbose=false): Python
warnings of libraries (FutureWarning, DeprecationWarning, torch's note on read-only NumPy arrays),
transformers' warnings (e.g. "Token indices sequence length is longer than ...") and HF / tqdm
progress bars (weight loading, in every process). Set in the launching process's environment before
anything starts, so every process of the run inherits them: the supervised child, Ray's workers (a
local Ray is started by the child), vLLM's engine processes. A variable the user set is left as it is.
"""

from __future__ import annotations

from configs.schema import RunConfig

QUIET_ENV = {
    "PYTHONWARNINGS": "ignore::FutureWarning,ignore::DeprecationWarning,ignore:The given NumPy array is not writable",
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TQDM_DISABLE": "1",
    "VLLM_LOGGING_LEVEL": "ERROR",
    "TORCH_CPP_LOG_LEVEL": "ERROR",
}


def quiet_env(cfg: RunConfig, starts_local_ray: bool, environ: dict[str, str]) -> dict[str, str]:
    """The variables to add to `environ` for the run's console (QUIET_ENV; {} with logging.verbose).
    A local Ray gets RAY_AUTH_MODE=token: what Ray 2.60 does for a new local cluster anyway, minus its
    warning that it did so (a cluster joined keeps the user's setting, docs/running.md)."""
    if cfg.logging.verbose:
        return {}
    add = dict(QUIET_ENV)
    if starts_local_ray:
        add["RAY_AUTH_MODE"] = "token"
    return {k: v for k, v in add.items() if k not in environ}
