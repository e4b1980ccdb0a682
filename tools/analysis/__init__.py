"""The analysis scripts' shared helpers: :mod:`analysis.common`."""
