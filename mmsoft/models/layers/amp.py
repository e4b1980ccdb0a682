"""Autocast regions that work on every device.

SOFT's Gaussian kernel, Newton-Raphson pseudo-inverse and attention
products run in float32 under mixed precision: they leave autocast with
``torch.autocast(device_type, enabled=False)``. That constructor raises on a
device type without autocast (``'meta'``: "unsupported scalarType"), so a
model on the ``meta`` device (shape inference, deferred initialisation,
the device-agnostic checks of the test suite) could not run a forward pass.
:func:`autocast_off` is the same context where autocast exists and a no-op
where it does not (there is nothing to disable).
"""
import contextlib

import torch

__all__ = ['autocast_off']


def autocast_off(device_type: str):
    """``torch.autocast(device_type, enabled=False)``, or a no-op context on
    a device without autocast (``'meta'``)."""
    if device_type == 'meta':
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, enabled=False)
