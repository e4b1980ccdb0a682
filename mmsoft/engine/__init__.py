"""Training-engine parts of mmsoft (hooks)."""
from .hooks import *  # noqa: F401,F403
from .hooks import __all__  # noqa: F401
