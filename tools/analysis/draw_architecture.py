"""Draw the SOFT architecture figure of the README and the docs.

    python tools/analysis/draw_architecture.py [--out PATH] [--arch small]

Top: the four-stage pyramid (strides 4 / 8 / 16 / 32, the channels and
heads of ``--arch`` and the depths of every preset, from
``mmsoft/models/arch_zoo.py``). Bottom: one SOFT layer (NeurIPS 2021
Alg. 1-2, IJCV 2024 Eq. 25): Q = K, the bottleneck sampling f_s to m
landmarks, the Gaussian kernel exp(-||q - k||^2 / (2 sqrt d)), the
Newton-Raphson Moore-Penrose inverse, the symmetric normalisation, and
the product computed right to left (O(n m d), the n x n matrix is never
formed).

matplotlib only (no torch, no model is built): seconds. Writes PATH
(default ``tools/analysis/figures/architecture.png``, from the
checkout's root) atomically.
"""
import argparse
import importlib.util
import os
import os.path as osp
import sys
import tempfile

DEFAULT_OUT = 'tools/analysis/figures/architecture.png'
#: one figure pixel per CSS pixel at the docs' content width (~ 800 px)
WIDTH_IN, DPI = 8.0, 120
STRIDES = (4, 8, 16, 32)
PRESETS = ('tiny', 'small', 'medium', 'large', 'huge')


def arch_zoo():
    """``ARCH_ZOO`` / ``ARCH_DEFAULTS`` of mmsoft: its module imports
    nothing, so it is loaded by path (found without importing mmsoft, whose
    package imports torch)."""
    spec = importlib.util.find_spec('mmsoft')
    if spec is None:
        sys.exit('error: mmsoft is not importable: pip install -e . (or '
                 'PYTHONPATH=<checkout>)')
    path = osp.join(spec.submodule_search_locations[0], 'models',
                    'arch_zoo.py')
    spec = importlib.util.spec_from_file_location('_arch_zoo', path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.ARCH_ZOO, mod.ARCH_DEFAULTS


def _box(ax, x, y, w, h, text, color, size=9.5, weight='normal'):
    from matplotlib.patches import FancyBboxPatch
    ax.add_patch(
        FancyBboxPatch((x, y),
                       w,
                       h,
                       boxstyle='round,pad=0.4,rounding_size=1.2',
                       fc=color,
                       ec='#333333',
                       lw=1))
    ax.text(
        x + w / 2,
        y + h / 2,
        text,
        ha='center',
        va='center',
        fontsize=size,
        weight=weight,
        linespacing=1.35)


def _arrow(ax, start, end, text=None, size=8.5):
    ax.annotate(
        '',
        xy=end,
        xytext=start,
        arrowprops=dict(arrowstyle='-|>', color='#333333', lw=1.2))
    if text:
        ax.text(
            (start[0] + end[0]) / 2, (start[1] + end[1]) / 2 + 1.6,
            text,
            ha='center',
            va='bottom',
            fontsize=size,
            color='#444444')


def draw_pyramid(ax, arch):
    zoo, defaults = arch_zoo()
    cfg = dict(defaults, **zoo[arch])
    ax.set_xlim(0, 100)
    ax.set_ylim(0, 54)
    ax.axis('off')
    ax.set_title(
        f'SOFT backbone: a 4-stage pyramid (channels and heads of '
        f'SOFT-{arch.capitalize()})',
        fontsize=11.5,
        weight='bold',
        loc='left')
    _box(ax, 0.5, 24, 9.5, 12, 'image\nH × W × 3', '#eeeeee')
    heights = (36, 33, 30, 30)  # the pyramid, as far as the text allows
    colors = ('#dbe9f6', '#c6dbef', '#9ecae1', '#f2d7a6')
    x = 17
    for i in range(4):
        h = heights[i]
        attn = ('SOFT attn\nr = {}'.format(cfg['sampling_ratios'][i])
                if i < 3 else 'softmax attn\n+ cls token')
        text = (f'Stage {i + 1}\nstride {STRIDES[i]}\n'
                f'C = {cfg["embed_dims"][i]}\n'
                f'{cfg["num_heads"][i]} heads\n{attn}')
        _box(ax, x, 30 - h / 2, 15, h, text, colors[i], size=9.5)
        left = (11.2, 30) if i == 0 else (x - 5.8, 30)
        _arrow(
            ax,
            left, (x - 0.6, 30),
            text='stem\n3 convs' if i == 0 else 'conv\ns2',
            size=8)
        # the output of the stage, to the neck
        _arrow(ax, (x + 7.5, 30 - h / 2 - 0.6), (x + 7.5, 7.5))
        ax.text(
            x + 7.5,
            5.8,
            f'C{i + 2}: {cfg["embed_dims"][i]} ch, H/{STRIDES[i]}',
            ha='center',
            va='top',
            fontsize=9)
        x += 21
    ax.text(
        50,
        0.2, 'to the neck (FPN / UperNet; out_indices) or, stage 4 cls token, '
        'the classifier',
        ha='center',
        va='bottom',
        fontsize=9,
        style='italic')
    depths = '   '.join(f'{p} ' + '-'.join(map(str, zoo[p]['depths']))
                        for p in PRESETS)
    ax.text(
        50,
        51,
        f'layers per stage: {depths}',
        ha='center',
        va='center',
        fontsize=9)


def draw_block(ax):
    ax.set_xlim(0, 100)
    ax.set_ylim(0, 64)
    ax.axis('off')
    ax.set_title(
        'One SOFT layer (stages 1-3): softmax-free attention, linear in n',
        fontsize=11.5,
        weight='bold',
        loc='left')
    blue, green, orange, grey = '#dbe9f6', '#dcefd9', '#f7e0c4', '#eeeeee'
    # row 1: tokens, projections, bottleneck sampling
    _box(ax, 1, 50, 17, 9, 'tokens X\nn × C  (n = HW/s²)', grey)
    _box(ax, 27, 50, 22, 9, 'Q = K = X W_q  (shared)\nV = X W_v,  per head d',
         blue)
    _box(
        ax, 58, 50, 40, 9, 'sampling f_s: r×r conv, stride r, LN, GELU\n'
        r'→ $\tilde{Q}$: m = n / r² landmarks (bottleneck)', blue)
    _arrow(ax, (18.6, 54.5), (26.4, 54.5))
    _arrow(ax, (49.6, 54.5), (57.4, 54.5))
    # row 2: the Gaussian kernel, NR inverse, normalisation
    kernel = r'$k(q, k) = \exp(-\|q-k\|^2\,/\,(2\sqrt{d}))$'
    _box(
        ax, 1, 26, 31, 17, 'Gaussian kernel\n' + kernel + '\n'
        r'P = k($\tilde{Q}$, K):  m × n' + '\n' +
        r'A = k($\tilde{Q}$, $\tilde{Q}$):  m × m', green)
    _box(
        ax, 37, 27, 30, 15, 'Newton–Raphson, T steps\n'
        r'$A_0 = \alpha A,\ \ A_k = 2A_{k-1} - A_{k-1} A A_{k-1}$' + '\n'
        r'→ $A^{+}$ (Moore–Penrose inverse)', green)
    _box(
        ax, 73, 27, 25, 15, 'IJCV normalisation\n'
        r'$D = \mathrm{diag}(A\,\mathbf{1})$' + '\n'
        r'$D^{-1/2} A^{+} D^{-1/2}$', orange)
    _arrow(ax, (78, 49.4), (16, 42.6))
    _arrow(ax, (32.6, 34.5), (36.4, 34.5))
    _arrow(ax, (67.6, 34.5), (72.4, 34.5))
    # row 3: the product, right to left, and the layer
    _box(
        ax, 1, 3, 53, 14, r'$Y = P^{\top}\,(D^{-1/2} A^{+} D^{-1/2})\,(P\,V)$'
        ' + DWConv(V), then W_o\n'
        'computed right to left: O(n m d) time and memory,\n'
        'the n × n attention matrix is never formed', orange)
    _box(ax, 62, 3, 36, 14, 'post-norm layer\n'
         'x = LN(x + Attn(x))\nx = LN(x + FFN(x))', grey)
    _arrow(ax, (85, 26.4), (40, 17.6))
    _arrow(ax, (54.6, 10), (61.4, 10))


def figure(arch='small'):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, (top, bottom) = plt.subplots(
        2,
        1,
        figsize=(WIDTH_IN, 8.9),
        gridspec_kw=dict(height_ratios=(54, 64)))
    draw_pyramid(top, arch)
    draw_block(bottom)
    fig.subplots_adjust(
        left=0.01, right=0.99, top=0.95, bottom=0.01, hspace=0.12)
    return fig


def save(fig, path):
    """Write the PNG atomically (a temporary file in the same folder, then
    renamed)."""
    folder = osp.dirname(osp.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix='.png', dir=folder)
    os.close(fd)
    os.chmod(tmp, 0o644)  # mkstemp's 0600: a figure is for everyone
    try:
        fig.savefig(tmp, dpi=DPI)
        os.replace(tmp, path)
    finally:
        if osp.exists(tmp):
            os.remove(tmp)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--out', default=DEFAULT_OUT, help='the PNG to write')
    p.add_argument(
        '--arch',
        default='small',
        choices=PRESETS,
        help='the preset whose channels and heads the pyramid shows')
    args = p.parse_args(argv)
    save(figure(args.arch), args.out)
    print(f'wrote {args.out}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
