"""Which weights a model holds right now, cheaply: what samplers compare to know their state is stale."""

from __future__ import annotations

import itertools

from torch import nn

__all__ = ["Fingerprint", "weights_fingerprint"]

Fingerprint = tuple[tuple[int, int], ...]


def weights_fingerprint(model: nn.Module) -> Fingerprint:
    """Identity and autograd version counter of every parameter and buffer.

    Changes on any in-place write (an optimizer step, ``load_state_dict``, a weight sync) or replaced tensor;
    costs one pass over the tensor list, no data read.
    """
    return tuple((id(t), t._version) for t in itertools.chain(model.parameters(), model.buffers()))
