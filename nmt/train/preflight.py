"""What the host must run for a training config, checked before any long preparation.

Preparing WMT-sized data takes tens of minutes; a setting the host cannot run (a CUDA device on a
laptop, fp16 on a CPU, flash attention without CUDA) must be one error line before that work,
not after it. The same checks run again where training uses them (`nmt.train.loop`): this module
only runs them early. Nothing here is stored: what depends on the host is checked on the host
that trains.
"""

from __future__ import annotations

import torch

from nmt.config import Config
from nmt.hw.device import check_precision, resolve_device
from nmt.model.attention import resolve_backend


def check_host(config: Config) -> torch.device:
    """Raise NmtError/ConfigError (one line) for a train.device, train.precision or
    model.attention this host cannot run; return the device training will use. `auto` backends
    are not resolved here (that times kernels): only an explicit backend is checked."""
    device = resolve_device(config.train.device)
    check_precision(device, config.train.precision)
    m = config.model
    if m.attention != "auto":
        resolve_backend(m.attention, device, torch.float32, dropout=m.attention_dropout, head_dim=m.d_model // m.heads)
    return device
