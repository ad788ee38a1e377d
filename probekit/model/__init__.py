"""The model layer (probekit/model.py moved to probekit/model/handle.py; split next)."""

from probekit.model.handle import *  # noqa: F403
from probekit.model.handle import (  # noqa: F401
    RAW_BLOCKS_ENV,
    VOCAB_CHUNK,
    HookList,
    _blocked_linear,
    _head_class_for,
    _HFBlocks,
    all_finite,
)
