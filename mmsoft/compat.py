"""Compatibility fixes for torch 2.14 + mmengine 0.10.7 (filled in by issue 2)."""


def apply():
    return []
