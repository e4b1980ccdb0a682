"""Sphinx configuration of the mmsoft documentation (``make docs``).

Built with ``-W --keep-going`` (every warning is an error) and nitpicky
cross-references: a reference that does not resolve fails the build. Names
of other packages (torch, mmengine, ...) are not documented here and are
listed in ``nitpick_ignore_regex``.
"""
import os.path as osp
import sys

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
sys.path.insert(0, ROOT)  # document this checkout, not an installed mmsoft

from mmsoft.version import __version__  # noqa: E402

project = 'mmsoft'
copyright = '2026, the mmsoft authors'
author = 'the mmsoft authors'
version = release = __version__

extensions = [
    'myst_parser',
    'sphinx.ext.autodoc',
    'sphinx.ext.napoleon',
    'sphinx.ext.viewcode',
    'sphinx_copybutton',
]
source_suffix = {'.md': 'markdown', '.rst': 'restructuredtext'}
root_doc = 'index'
# compat/ holds what `make compat` writes (a markdown and a CSV table);
# advanced_guides/support_matrix.md shows the CSV, whatever the markdown's form
exclude_patterns = ['_build', 'compat']

# formulas are written in Unicode (readable offline and on GitHub; no
# MathJax download)
myst_enable_extensions = ['colon_fence', 'deflist']
myst_heading_anchors = 3  # [text](page.md#a-heading) links

# autodoc: the public API as documented in the docstrings
autodoc_default_options = {'members': True, 'show-inheritance': True}
autodoc_member_order = 'bysource'
# the docstrings give the types (napoleon); no second 'Return type'
autodoc_typehints = 'none'
add_module_names = False
autodoc_class_signature = 'separated'
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

nitpicky = True
nitpick_ignore_regex = [
    # other packages' names (no intersphinx: the build needs no network)
    (r'py:.*', r'(torch|mmengine|mmcv|mmdet|mmseg|mmpretrain|numpy|np)'
     r'(\..*)?'),
    (r'py:.*', r'(nn|Tensor|optional|callable|Module|Optimizer|Runner)'),
    (r'py:.*', r'(Path|PathLike|os\.PathLike|IO|Generator|ModuleType)'),
    (r'py:.*', r'(typing|collections|argparse|pathlib|contextlib)\..*'),
    (r'py:class', r'(dict tuple|Dropout|BatchNorm|nn\.Module)'),
    (r'py:.*', r'(mmsoft\.models\.backbones\.soft\.)?(PyramidStage|SOFTBlock|'
     r'SoftmaxBlock|ZooAttention|bottleneck_inverse)'),
    # internals the public docstrings name but the API page leaves out
    (r'py:.*', r'(mmsoft\.)?(models\.layers\.)?(pinv\.)?'
     r'(INIT_MODES|INIT_ALIASES|STAGE_TYPES|default_init|'
     r'iterative_pinv|stage_cfgs|landmark_grid)'),
    (r'py:mod', r'mmsoft\..*'),
    (r'py:data', r'mmsoft\.registry\.ATTENTIONS'),
    (r'py:func', r'mmsoft\.compat\.applied'),
    (r'py:class', r'mmsoft\.utils\.strict_load\.CheckpointMismatchError'),
    # internals of the loading module, the NR settings and the attention
    # zoo that docstrings name (issue 29's split) but the API page leaves out
    (r'py:.*', r'(~?mmsoft\.models\.)?(converters\.|'
     r'loading\.|layers\.attention_zoo\.|layers\.zoo\.common\.|'
     r'utils\.strict_load\.)?(pretrained_init_cfg|'
     r'ReducedGridAttention|check_state_dict|check_attn_norm|'
     r'__post_init__)'),
]

html_theme = 'furo'
html_title = f'mmsoft {release}'
html_static_path = ['_static']
html_css_files = ['custom.css']
html_theme_options = {
    'navigation_with_keys': True,
}
copybutton_prompt_text = r'\$ '
copybutton_prompt_is_regexp = True
copybutton_exclude = '.linenos, .gp, .go'
