"""The SOFT architectures (NeurIPS 2021 Table 2, IJCV 2024 Table 2) as data.

A neutral module (it imports nothing of mmsoft): the backbone
(:attr:`mmsoft.models.SOFT.arch_zoo`, :attr:`~mmsoft.models.SOFT.arch_defaults`
refer to these dicts, the mmpretrain convention) and the checkpoint
converters (:mod:`mmsoft.models.converters`, which must not import the
backbone) read the same presets.
"""

__all__ = ['ARCH_ZOO', 'ARCH_DEFAULTS', 'NUM_STAGES']

#: levels of the pyramid
NUM_STAGES = 4


def _arch(embed_dims, num_heads, depths):
    return dict(embed_dims=embed_dims, num_heads=num_heads, depths=depths)


#: presets under their names and aliases, as Swin's ``arch_zoo`` (an alias
#: maps to the same dict); ``'small-official'`` has the depths [1, 3, 20, 4]
#: of the authors' ``soft_small`` weights
ARCH_ZOO = {
    **dict.fromkeys(['tiny', 't'],
                    _arch([64, 128, 320, 512], [2, 4, 10, 16], [1, 2, 3, 2])),
    **dict.fromkeys(['small', 's'],
                    _arch([64, 128, 320, 512], [2, 4, 10, 16], [1, 3, 7, 4])),
    **dict.fromkeys(['medium', 'm'],
                    _arch([64, 128, 288, 512], [2, 4, 9, 16], [1, 3, 29, 5])),
    **dict.fromkeys(['large', 'l'],
                    _arch([64, 128, 320, 512], [2, 4, 10, 16], [1, 3, 40, 5])),
    **dict.fromkeys(['huge', 'h'],
                    _arch([64, 128, 352, 512], [2, 4, 11, 16], [1, 5, 49, 5])),
    'small-official':
    _arch([64, 128, 320, 512], [2, 4, 10, 16], [1, 3, 20, 4]),
}

#: the optional entries of an arch dict and their defaults
ARCH_DEFAULTS = dict(
    sampling_ratios=[8, 4, 2, 1],
    mlp_ratios=[4, 4, 4, 4],
    dw_kernel_sizes=[9, 5, 3, None])
