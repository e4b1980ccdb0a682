"""Training-loop components (mmengine hooks) registered by mmsoft."""
from .hooks import *  # noqa: F401,F403
