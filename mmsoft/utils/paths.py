"""Deprecated in 0.4 (removed in 0.5): use :mod:`mmsoft.configs`."""
import os.path as osp
import warnings


def __getattr__(name):
    if name in ('configs_root', 'get_config_path', 'list_configs',
                'package_root'):
        new = 'os.path.dirname(mmsoft.__file__)' if name == 'package_root' \
            else f'mmsoft.configs.{name}'
        warnings.warn(
            f'mmsoft.utils.paths.{name} is deprecated; use {new}',
            DeprecationWarning,
            stacklevel=2)
        from mmsoft import configs
        return getattr(configs, name, lambda: osp.dirname(configs.__file__))
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
