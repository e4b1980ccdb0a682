"""The converters' helpers: :mod:`model_converters.checkpoint_files`."""
