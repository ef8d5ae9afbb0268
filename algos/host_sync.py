"""The host reads of device values that ColoRL's loops make, each listed once with why it is there.

On a GPU, reading a tensor's value on the host (``.item()``, ``bool(t)``, ``.tolist()``, ``int(t)``) waits for
every kernel queued before it: inside a per-token or per-micro-batch loop that stalls the device once per
iteration. ColoRL's device code keeps its values on the device; where a host decision needs one (a shape, a branch,
a user error), it reads it through :func:`host_read`, which names its entry of ``HOST_SYNCS``. The ``fake_cuda``
tests run every phase on ``meta`` tensors, which hold no data and raise on any other read, and check that every
name read is listed here.

A ``meta`` tensor read here gives the caller's ``meta_value`` (a value the test shapes are built for), so the
device arithmetic around the read still runs on ``meta``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from torch import Tensor

# name -> where it is read, how often, and why it cannot stay on the device
HOST_SYNCS: dict[str, str] = {
    "rollout.live_rows": (
        "decode loop, once every decode_loop.EOS_CHECK_INTERVAL tokens: how many rows are still decoding, to stop "
        "when none is and to drop ended rows from the batch (a new batch shape is a host decision); in a partial "
        "rollout's piece, with how many groups have ended, to stop at its quota"
    ),
    "turn_sampler.ended_turns": (
        "multi-turn decode loop, once per position: which rows sampled a stop token, since their tool turn runs on "
        "the host and is fed from the very next position (lockstep decoding, no rewind)"
    ),
    "turn_sampler.turn_ids": "multi-turn: the ids of a turn that ended, for the tool-call parser (once per turn)",
    "update.grad_norm_finite": (
        "once per optimizer step: a mini-batch whose clipped gradient norm is not finite skips its step"
    ),
    "rollout_correction.any_valid": (
        "bypass mode, once per micro-batch (and per diagnostic): a micro-batch without a valid token is a ValueError"
    ),
    "rollout_correction.valid_sequences": (
        "bypass mode's rejection diagnostics (rollout_rs), once per option and micro-batch: the statistics of the "
        "sequences with a valid token, selected by a boolean mask (a data-dependent shape; metrics only)"
    ),
    "stats.masked_var_count": "once per whitening: fewer than 2 masked elements is a ValueError",
    "policy_losses.clip_cov_count": (
        "clip_cov, once per micro-batch: how many tokens to detach, max(ratio·valid tokens, 1), and the candidates "
        "(a data-dependent shape)"
    ),
    "policy_losses.kl_cov_count": (
        "kl_cov, once per micro-batch: the valid tokens' count sizes the top-k, computed on the CPU so that ties "
        "pick the same tokens on every device"
    ),
}
READS: Counter[str] = Counter()  # reads per name since the process started (tests count a loop's reads)


def host_read(name: str, value: Tensor, meta_value: Any) -> Any:
    """``value.tolist()`` (a Python number for a 0-d tensor), read for the reason ``HOST_SYNCS[name]``; a ``meta``
    tensor reads as ``meta_value``."""
    if name not in HOST_SYNCS:
        raise KeyError(f"host read {name!r} is not listed in algos.host_sync.HOST_SYNCS")
    READS[name] += 1
    return meta_value if value.device.type == "meta" else value.tolist()
