"""The checkpoint side of the supported stacks; ``import mmsoft`` leaves
torch's weights-only allow-list alone (docs/en/advanced_guides/
compatibility.md)."""
from mmsoft.utils.safe_load import mmengine_checkpoints_allowed  # noqa: F401
from mmsoft.utils.safe_load import native_allow_list  # noqa: F401
from mmsoft.utils.safe_load import safe_torch_load, torch_version  # noqa: F401
