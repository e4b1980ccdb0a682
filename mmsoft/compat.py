"""The checkpoint side of the supported stacks."""
from mmsoft.utils.safe_load import mmengine_checkpoints_allowed  # noqa: F401
from mmsoft.utils.safe_load import native_allow_list  # noqa: F401
from mmsoft.utils.safe_load import safe_torch_load, torch_version  # noqa: F401
