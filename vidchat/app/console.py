"""What reaches the console: vidchat's own lines (which model, which
device, ready, where to open the page, any fallback and why) and, from the
libraries under it (vLLM, transformers, torch, tqdm), only errors, unless
the user asks for everything (--log-level debug, replay --verbose).

Set through the environment as well, so vLLM's engine-core child process,
which inherits it, is as quiet as the server.
"""

from __future__ import annotations

import logging
import os
import warnings

NOISY_LOGGERS = ("httpx", "huggingface_hub", "urllib3", "torch", "transformers", "vllm")


def quiet_libraries() -> None:
    """Keep the libraries' warnings a user can do nothing about (a missing
    libtcmalloc, Triton on a CPU, a random test model's out-of-vocabulary
    special tokens, deprecations inside vLLM) off the console."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    # torch sets its own loggers' levels from TORCH_LOGS when it is imported,
    # over the one set below ("Triton not available" on every CPU start).
    os.environ.setdefault("TORCH_LOGS", "-torch")
    os.environ.setdefault("TQDM_DISABLE", "1")  # the weight-loading progress bar
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    warnings.simplefilter("ignore")
    for noisy in NOISY_LOGGERS:
        logging.getLogger(noisy).setLevel(logging.ERROR)
    # aioice says every ICE candidate pair of every connection at INFO; its warnings stay.
    logging.getLogger("aioice").setLevel(logging.WARNING)
