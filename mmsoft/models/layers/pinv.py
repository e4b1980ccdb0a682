"""Moore-Penrose inverse of the bottleneck matrix A by Newton-Raphson.

Implements Algorithm 2 of SOFT (NeurIPS 2021) / Eq. (10) of the IJCV 2024
paper::

    A_0 = alpha * A,        A_{k+1} = 2 A_k - A_k A A_k

together with the initialisations used by the official checkpoints. The
normalized (IJCV) models search alpha by the official rule; the three
``'soft_norm_per_*'`` modes differ only in which matrices share one alpha:

* ``'soft_norm_per_sample'`` (the default with ``attn_norm=True``; old name
  ``'soft_norm_sample'``): the heads of one sample (all leading dims but the
  first) share alpha = 2 beta^n / max ||A||_1^2, beta = 0.5, n the smallest
  integer in [0, 10] for which ||I - alpha A A||_1 <= 1.01 holds for every
  head (n = 10 if none passes). This is the official code's rule applied to
  each sample alone: batch-independent, and identical to the official model
  at batch size 1 (the usual detection / segmentation setting).
* ``'soft_norm_per_matrix'`` (old name ``'soft_norm'``, the default before):
  the same search for each matrix on its own. Batch-independent too, but a
  different function from the official one wherever the 20 iterations have
  not converged (large bottlenecks, e.g. m ~ 950 at 800 x 1216).
* ``'soft_norm_per_batch'`` (old name ``'soft_norm_global'``; opt-in, for
  bit-level comparison with the official code only): one alpha for the whole
  (batch, heads) stack, as the official normalized kernel does. A sample's
  result then depends on the other samples of its batch.
* ``'soft'`` (NeurIPS): the iteration runs on A + 0.01 I with
  alpha = 0.9 * 2 / ||A||_1^2 (||A||_1 of A before the shift), per matrix.

All candidates alpha_n are scored at once (no Python loop, no host
synchronisation).

The iterations run without autograd. Two backward passes (``backward``):

* ``'eq16'`` (default, as the papers): the closed form of Eq. (16),
  grad_A = -Y^T (grad_Y) Y^T with Y the computed inverse. It is the gradient
  of the true pseudo-inverse, i.e. of the forward only once the T iterations
  have converged on every eigenvalue of A that matters.
* ``'exact'``: the gradient of the function the T iterations compute, with
  alpha held fixed (the forward computes it without autograd). With the
  spectral method A_T = U diag(f(l)) U^T, f(l) = v_T(l) the scalar
  recurrence below, and by the Daleckii-Krein theorem
  dA_T = U (F o (U^T dA U)) U^T with F_ij = (f(l_i) - f(l_j)) / (l_i - l_j)
  (f'(l_i) for l_i = l_j). F is formed directly for well-separated
  eigenvalues and by differentiating the recurrence itself (divided
  differences obey a Leibniz rule, so no cancellation) for close or equal
  ones. Costs two m x m x m products more than Eq. (16). With the iterative
  method the backward runs through the iterations (autograd).

Everything runs in float32 (or float64 if given), autocast disabled.

Two ways to evaluate the same T iterations (``method``):

* ``'iterative'``: 2T batched m x m products (Alg. 2 as written);
* ``'spectral'``: A is symmetric, and every iterate is a polynomial in A, so
  with one eigendecomposition A = U diag(l) U^T the iteration becomes the
  scalar recurrence v_{k+1} = 2 v_k - v_k^2 l on the eigenvalues, and
  A_T = U diag(v_T) U^T. Same function (up to rounding), much less work for
  large m (detection / segmentation resolutions).
* ``'auto'`` (default): spectral when m >= ``SPECTRAL_MIN_M`` on the CPU,
  iterative otherwise (on GPUs the batched products are fast and eigh is
  not).
"""
import dataclasses
import warnings
from typing import Dict, Mapping, Optional, Tuple, Union

import torch

from mmsoft.compat import unravel_index
from . import export_ops
from .amp import autocast_off
from .checks import check_int

__all__ = [
    'newton_inverse', 'newton_inverse_apply', 'nr_init_alpha',
    'pinv_convergence', 'NewtonInverse', 'NewtonInverseApply', 'NRConfig',
    'INIT_MODES', 'INIT_ALIASES', 'NR_METHODS', 'NR_BACKWARDS', 'NR_FIELDS',
    'SPECTRAL_MIN_M', 'canonical_init', 'default_init', 'nr_residual',
    'nr_iteration_matrix'
]

INIT_MODES = ('soft_norm_per_sample', 'soft_norm_per_matrix',
              'soft_norm_per_batch', 'soft')
#: old names, still accepted (configs and saved configs may use them)
INIT_ALIASES = {
    'soft_norm_sample': 'soft_norm_per_sample',
    'soft_norm_global': 'soft_norm_per_batch',
    'soft_norm': 'soft_norm_per_matrix'
}
NR_METHODS = ('auto', 'iterative', 'spectral')
NR_BACKWARDS = ('eq16', 'exact')
#: the fields of :class:`NRConfig` (the ``attn_cfg`` keys ``nr_<field>``)
NR_FIELDS = ('iters', 'init', 'method', 'backward')
#: smallest m for which ``method='auto'`` uses the spectral form on the CPU.
#: Measured crossover of ``newton_inverse_apply`` (16 matrices, d = 32,
#: 2-core CPU): spectral / iterative time 0.93 (1 thread) and 1.56
#: (2 threads) at m = 49, 0.52 / 0.93 at m = 81, 0.25 / 0.37 at m = 128.
SPECTRAL_MIN_M = 80

_NORM_BETA = 0.5
_NORM_MAX_HALVINGS = 10
_NORM_TOL = 1.01
_SOFT_SHIFT = 0.01
_SOFT_SCALE = 0.9
#: eigenvalue pairs with |l_i - l_j| <= _DD_RTOL max(|l_i|, |l_j|) get their
#: divided difference from the differentiated recurrence (no cancellation);
#: the direct quotient loses about T eps / _DD_RTOL relative elsewhere.
_DD_RTOL = 0.05


def default_init(attn_norm: bool) -> str:
    """The alpha rule of each official variant: the official normalized rule
    per sample with ``attn_norm`` (IJCV), else ``'soft'`` (NeurIPS)."""
    return 'soft_norm_per_sample' if attn_norm else 'soft'


def canonical_init(init: str) -> str:
    """``init`` with an old name (:data:`INIT_ALIASES`) replaced by the new.

    ``'soft_norm'`` keeps its old meaning (alpha per matrix) so that saved
    configs reproduce; it warns, because the default is now per sample.
    """
    if init in INIT_MODES:
        return init
    if init in INIT_ALIASES:
        new = INIT_ALIASES[init]
        if init == 'soft_norm':
            warnings.warn(
                "nr_init='soft_norm' is the old name of "
                "'soft_norm_per_matrix' (alpha per matrix); the default "
                "with attn_norm=True is now 'soft_norm_per_sample' (the "
                "official rule per sample). Set nr_init to one of the new "
                "names to silence this warning.",
                FutureWarning,
                stacklevel=3)
        return new
    raise ValueError(
        f'unknown Newton-Raphson init (nr_init) {init!r}; choose one of '
        f'{INIT_MODES} (old names: {sorted(INIT_ALIASES)})')


@dataclasses.dataclass(frozen=True)
class NRConfig:
    """The Newton-Raphson settings of one attention, validated once.

    Args:
        iters (int): T, the iterations (>= 1). Default: 20.
        init (str): the alpha rule, one of :data:`INIT_MODES` (an old name
            of :data:`INIT_ALIASES` is replaced by its new one). Default:
            'soft_norm_per_sample'.
        method (str): ``'auto'``, ``'iterative'`` or ``'spectral'`` (see
            the module docstring). Default: 'auto'.
        backward (str): ``'eq16'`` or ``'exact'``. Default: 'eq16'.

    Frozen: a SOFT attention's settings are chosen by building it with them
    (``SOFTAttention(..., nr=...)``, or the ``attn_cfg`` keys ``nr_iters``,
    ``nr_init``, ``nr_method``, ``nr_backward``, see
    :func:`~mmsoft.models.layers.attention_zoo.build_attention`). Every
    spelling ends here: :meth:`__post_init__` is the one check of the
    settings. :meth:`of` reads the ``nr`` argument of
    :class:`~mmsoft.models.layers.SOFTAttention`; :meth:`inverse` and
    :meth:`apply` evaluate A_T and A_T W with it.
    """
    iters: int = 20
    init: str = 'soft_norm_per_sample'
    method: str = 'auto'
    backward: str = 'eq16'

    def __post_init__(self):
        # errors name the attn_cfg key too (nr_<field>), the usual spelling
        iters = check_int('Newton-Raphson iters (nr_iters)', self.iters)
        object.__setattr__(self, 'iters', iters)
        object.__setattr__(self, 'init', canonical_init(self.init))
        if self.method not in NR_METHODS:
            raise ValueError(f'unknown pseudo-inverse method (nr_method) '
                             f'{self.method!r}; choose one of {NR_METHODS}')
        if self.backward not in NR_BACKWARDS:
            raise ValueError(f'unknown Newton-Raphson backward (nr_backward) '
                             f'{self.backward!r}; choose one of '
                             f'{NR_BACKWARDS}')

    @classmethod
    def of(cls, nr: Union['NRConfig', Mapping, None],
           attn_norm: bool) -> 'NRConfig':
        """The settings of a SOFT attention from its ``nr`` argument: an
        NRConfig as it is; a dict of the fields (``iters``, ``init``,
        ``method``, ``backward``) or None: the defaults for the fields it
        leaves out, where ``init`` missing or None is the official rule of
        the variant (:func:`default_init` of ``attn_norm``)."""
        if isinstance(nr, NRConfig):
            return nr
        if nr is not None and not isinstance(nr, Mapping):
            raise TypeError(f'nr must be an NRConfig, a dict of its fields '
                            f'{NR_FIELDS} or None, got {nr!r}')
        nr = dict(nr or {})
        unknown = sorted(set(nr) - set(NR_FIELDS))
        if unknown:
            raise TypeError(f'nr: unknown Newton-Raphson settings {unknown}; '
                            f'the settings are {NR_FIELDS}')
        if nr.get('init') is None:
            nr['init'] = default_init(attn_norm)
        return cls(**nr)

    def replace(self, **changes) -> 'NRConfig':
        """A copy with some settings changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def inverse(self,
                A: torch.Tensor,
                stats: Optional[Dict] = None) -> torch.Tensor:
        """A_T for (..., m, m) matrices A (see :func:`newton_inverse`)."""
        return _solve(_check_square(A), None, self, stats)

    def apply(self,
              A: torch.Tensor,
              W: torch.Tensor,
              stats: Optional[Dict] = None) -> torch.Tensor:
        """A_T W without forming A_T (see :func:`newton_inverse_apply`)."""
        return _solve(_check_square(A), W, self, stats)


def _shared_max(t: torch.Tensor, init: str, trailing: int = 0):
    """Max of per-matrix values over the matrices that share one alpha.

    ``t`` has the batch dims of A first, then ``trailing`` own dims.
    """
    if init not in ('soft_norm_per_batch', 'soft_norm_per_sample'):
        return t
    lead = t.dim() - trailing
    if lead == 0:
        return t
    tail = t.shape[lead:]
    if init == 'soft_norm_per_batch':
        return t.reshape(-1, *tail).amax(0).expand_as(t)
    shared = t.reshape(t.shape[0], -1, *tail).amax(1)  # per sample
    return shared.view(t.shape[0], *([1] * (lead - 1)), *tail).expand_as(t)


def nr_init_alpha(A: torch.Tensor,
                  init: str = 'soft_norm_per_sample') -> torch.Tensor:
    """Per-matrix alpha of A_0 = alpha A. Returns shape ``A.shape[:-2]``.

    For the ``'soft_norm_per_*'`` rules the residual test of the official
    code, ``max_j sum_i |I - alpha A A|_ij <= 1.01``, is evaluated for all
    candidates alpha_n = 2 * 0.5^n / ||A||_1^2, n = 0..10, in one batched
    expression; the first passing n is used (10 when none passes). ||A||_1
    and the test are shared by the matrices of a sample / the batch
    (``'soft_norm_per_sample'`` / ``'soft_norm_per_batch'``): the official
    kernel uses the max ||A||_1 of its stack and halves until every matrix
    passes.
    """
    init = canonical_init(init)
    norm1 = A.sum(-1).amax(-1)  # A is non-negative: row sums = abs row sums
    norm1 = _shared_max(norm1, init)
    alpha0 = 2.0 / norm1.clamp_min(torch.finfo(A.dtype).tiny).square()
    if init == 'soft':
        return _SOFT_SCALE * alpha0
    n = torch.arange(_NORM_MAX_HALVINGS + 1, device=A.device, dtype=A.dtype)
    alphas = alpha0[..., None] * _NORM_BETA**n  # (..., K)
    # ||I - alpha_k A A||_1 (max column abs sum, as the official test) for
    # every candidate k, in O(m^2) per matrix instead of forming A A:
    # A is symmetric and non-negative, so A A is non-negative and column j
    # of I - alpha A A has abs sum |1 - alpha (AA)_jj| + alpha sum_{i!=j}
    # (AA)_ij, with (AA)_jj = sum_i A_ij^2 and sum_i (AA)_ij = (A (A 1))_j.
    colsum = torch.matmul(A, A.sum(-1, keepdim=True)).squeeze(-1)  # (..., m)
    diag = A.square().sum(-2)  # (..., m)
    off = (colsum - diag).clamp_min(0)
    a = alphas[..., :, None]  # (..., K, 1)
    res = ((1 - a * diag[..., None, :]).abs() +
           a * off[..., None, :]).amax(-1)  # (..., K)
    res = _shared_max(res, init, trailing=1)
    passed = res <= _NORM_TOL
    passed[..., -1] = True  # after 10 halvings the search stops regardless
    first = passed.to(torch.uint8).argmax(-1)  # first True
    return alphas.gather(-1, first[..., None]).squeeze(-1)


def _newton_iterate(A: torch.Tensor, V: torch.Tensor,
                    iters: int) -> torch.Tensor:
    """A_{k+1} = 2 A_k - A_k A A_k, ``iters`` times (Eq. 10)."""
    shape = V.shape
    m = shape[-1]
    A3 = A.reshape(-1, m, m)
    V = V.reshape(-1, m, m)
    for _ in range(iters):
        # 2 V - (V A) V, the axpy fused into the second product
        V = torch.baddbmm(V, torch.bmm(V, A3), V, beta=2.0, alpha=-1.0)
    return V.reshape(shape)


def _scalar_iterate_impl(lam: torch.Tensor, alpha: torch.Tensor,
                         iters: int) -> torch.Tensor:
    """f(l) = v_T: v_0 = alpha l, v_{k+1} = 2 v_k - v_k^2 l (Eq. 10 on the
    eigenvalues l; ``alpha`` of shape ``lam.shape[:-1]``)."""
    v = alpha[..., None] * lam
    for _ in range(iters):
        v = 2 * v - v * v * lam
    return v


def _register_scalar_iterate():
    """:func:`_scalar_iterate_impl` as the custom op
    ``torch.ops.mmsoft.nr_scalar_iterate`` (torch >= 2.4), the same code.

    Why: inductor (``torch.compile``) fuses the T pointwise steps into one
    expression in which v_k appears three times per step, and analyses it
    with v inlined: its compile time grows ~3^T (measured on this CPU: 2.6 s
    at T = 4, 41 s at T = 8; the spectral path's T = 20 did not finish in
    35 minutes). As an opaque op it runs eagerly inside the compiled graph
    (still one graph; it is O(m) work next to the O(m^3) ``eigh``), with
    results identical to eager.
    """
    custom_op = getattr(torch.library, 'custom_op', None)
    if custom_op is None:  # torch < 2.4: plain function
        return _scalar_iterate_impl

    @custom_op('mmsoft::nr_scalar_iterate', mutates_args=())
    def nr_scalar_iterate(lam: torch.Tensor, alpha: torch.Tensor,
                          iters: int) -> torch.Tensor:
        return _scalar_iterate_impl(lam, alpha, iters)

    @nr_scalar_iterate.register_fake
    def _(lam, alpha, iters):
        shape = torch.broadcast_shapes(alpha.shape + (1, ), lam.shape)
        return lam.new_empty(shape, dtype=torch.result_type(alpha, lam))

    return nr_scalar_iterate


_scalar_iterate = _register_scalar_iterate()


def _spectral_factors(A: torch.Tensor, alpha: torch.Tensor, iters: int
                      ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The NR iterations on the eigenvalues of the symmetric A.

    Returns (U, v, l) with A = U diag(l) U^T and A_T = U diag(v) U^T: every
    iterate is the same polynomial of A, so A_0 = alpha A becomes
    v_0 = alpha l and Eq. (10) becomes v_{k+1} = 2 v_k - v_k^2 l.
    """
    lam, U = torch.linalg.eigh(A)
    return U, _scalar_iterate(lam, alpha, iters), lam


def _pair_divided_differences(a: torch.Tensor, b: torch.Tensor,
                              alpha: torch.Tensor, iters: int) -> torch.Tensor:
    """[a, b] f for f = v_T, elementwise, without cancellation.

    Divided differences obey the Leibniz rule
    [a, b](g h) = mean(g) [a, b] h + [a, b] g mean(h) (mean of the values at
    a and b), so D_k = [a, b] v_k follows the recurrence
    D_0 = alpha,
    D_{k+1} = D_k (2 - (v_a + v_b)(a + b) / 2) - (v_a^2 + v_b^2) / 2,
    which for a = b is f'(a) (the derivative of the scalar recurrence).
    """
    va, vb = alpha * a, alpha * b
    D = alpha.clone()
    for _ in range(iters):
        D = D * (2 - 0.5 * (va + vb) * (a + b)) - 0.5 * (va * va + vb * vb)
        va = 2 * va - va * va * a
        vb = 2 * vb - vb * vb * b
    return D


def _close_pairs(lam: torch.Tensor) -> Tuple[torch.Tensor, ...]:
    """Indices (batch..., i, j) of the eigenvalue pairs with
    |l_i - l_j| <= _DD_RTOL max(|l_i|, |l_j|) (the diagonal included).

    ``eigh`` returns l sorted ascending, so the close partners of l_i form
    one run [lo_i, hi_i) found by binary search: no m x m mask. Pairs of
    opposite signs are never close; l_i = 0 is close to exact zeros only.
    """
    m = lam.shape[-1]
    flat = lam.reshape(-1, m).contiguous()
    keep = 1.0 - _DD_RTOL
    pos = flat >= 0
    lower = torch.where(pos, flat * keep, flat / keep)
    upper = torch.where(pos, flat / keep, flat * keep)
    lo = torch.searchsorted(flat, lower.contiguous(), side='left')
    hi = torch.searchsorted(flat, upper.contiguous(), side='right')
    counts = (hi - lo).flatten()  # >= 1: l_i itself
    rows = torch.arange(counts.numel(), device=lam.device)
    row = torch.repeat_interleave(rows, counts)  # flat (batch, i) index
    start = torch.cumsum(counts, 0) - counts
    j = torch.arange(row.numel(), device=lam.device) - start[row] + \
        lo.flatten()[row]
    b, i = row // m, row % m
    batch = unravel_index(b, lam.shape[:-1]) if lam.dim() > 1 else ()
    return tuple(batch) + (i, j)


def _divided_differences(lam: torch.Tensor, v: torch.Tensor,
                         alpha: torch.Tensor, iters: int) -> torch.Tensor:
    """F_ij = (f(l_i) - f(l_j)) / (l_i - l_j), f'(l_i) where l_i = l_j.

    The Daleckii-Krein kernel of f = v_T (see the module docstring):
    the quotient for well-separated eigenvalues, the differentiated
    recurrence (:func:`_pair_divided_differences`) for the close pairs
    (:func:`_close_pairs`), which overwrite the quotient there.
    """
    F = v.unsqueeze(-1) - v.unsqueeze(-2)
    F.div_(lam.unsqueeze(-1) - lam.unsqueeze(-2))  # inf / nan where close
    idx = _close_pairs(lam)
    batch = idx[:-2]
    F[idx] = _pair_divided_differences(lam[batch + (idx[-2], )],
                                       lam[batch + (idx[-1], )], alpha[batch],
                                       iters)
    return F


def resolve_method(method: str, A: torch.Tensor) -> str:
    if method not in NR_METHODS:
        raise ValueError(f'unknown pseudo-inverse method {method!r}; choose '
                         f'one of {NR_METHODS}')
    if method != 'auto':
        return method
    if A.device.type == 'cpu' and A.shape[-1] >= SPECTRAL_MIN_M:
        return 'spectral'
    return 'iterative'


def nr_iteration_matrix(A: torch.Tensor, init: str) -> torch.Tensor:
    """The matrix the Newton iterations run on: A itself, or A + 0.01 I for
    the non-normalised ``'soft'`` rule (the official ``soft_*`` models)."""
    if init == 'soft':
        m = A.shape[-1]
        A = A + _SOFT_SHIFT * torch.eye(m, device=A.device, dtype=A.dtype)
    return A


def _init(A: torch.Tensor, init: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """(matrix the iterations run on, per-matrix alpha), alpha without
    autograd (it is held fixed by both backward passes)."""
    with torch.no_grad():
        alpha = nr_init_alpha(A, init)
    return nr_iteration_matrix(A, init), alpha


def _first_iterate(A: torch.Tensor,
                   init: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """(matrix the iterations run on, A_0 = alpha * that matrix)."""
    Aw, alpha = _init(A, init)
    return Aw, alpha[..., None, None] * Aw


def _newton_forward(A: torch.Tensor, iters: int, init: str) -> torch.Tensor:
    """A_T by the iterations (autograd through them if A requires grad)."""
    Aw, V = _first_iterate(A, init)
    return _newton_iterate(Aw, V, iters)


def _record_residual(stats: Optional[Dict], lam: torch.Tensor,
                     v: torch.Tensor) -> None:
    """Fill ``stats`` with the NR convergence of the last forward.

    From the eigenvalues l of the matrix iterated on and v = f(l):

    * ``'residual'``: ||A A_T A - A||_2 / ||A||_2 = max |l (l v - 1)| /
      max |l| per matrix (the paper's metric, Fig. 4);
    * ``'unconverged'``: the fraction of the numerical rank of A (the
      eigenvalues above m eps max |l|, as ``torch.linalg.matrix_rank``) on
      which the iterations are far from the pseudo-inverse,
      |1 - l v| > 0.5 (A_T scales those directions by v instead of 1 / l),
      per matrix.
    """
    if stats is None:
        return
    lam, v = lam.detach(), v.detach()
    absl = lam.abs()
    lmax = absl.amax(-1, keepdim=True)
    stats['residual'] = (lam * (lam * v - 1)).abs().amax(-1) / \
        lmax.squeeze(-1).clamp_min(torch.finfo(lam.dtype).tiny)
    rank = absl > lmax * (lam.shape[-1] * torch.finfo(lam.dtype).eps)
    far = ((1 - lam * v).abs() > 0.5) & rank
    stats['unconverged'] = far.sum(-1).to(lam.dtype) / \
        rank.sum(-1).clamp_min(1).to(lam.dtype)


def _iterative_stats(stats: Optional[Dict], A: torch.Tensor, init: str,
                     iters: int) -> None:
    """The same statistics for the iterative method (one ``eigvalsh``)."""
    if stats is None:
        return
    with torch.no_grad():
        Aw, alpha = _init(A, init)
        lam = torch.linalg.eigvalsh(Aw)
        _record_residual(stats, lam, _scalar_iterate(lam, alpha, iters))


class _NewtonFunction(torch.autograd.Function):
    """The forward of :class:`NewtonInverse` (``W`` None) and
    :class:`NewtonInverseApply`: ``apply(A, W, nr, stats)``."""

    @staticmethod
    def forward(ctx,
                A: torch.Tensor,
                W: Optional[torch.Tensor],
                nr: NRConfig,
                stats: Optional[Dict] = None) -> torch.Tensor:
        """Without autograd: Y = A_T (``W`` None) or Z = A_T W, with
        ``nr.method`` resolved ('iterative' or 'spectral'); saves what the
        backward of each subclass needs."""
        ctx.exact = nr.backward == 'exact'
        ctx.iters = nr.iters
        ctx.method = nr.method
        with torch.no_grad():
            if nr.method == 'spectral':
                Aw, alpha = _init(A, nr.init)
                U, v, lam = _spectral_factors(Aw, alpha, nr.iters)
                if W is None:
                    out = (U * v.unsqueeze(-2)) @ U.transpose(-1, -2)
                    saved = (U, v, lam, alpha) if ctx.exact else (out, )
                else:
                    UtW = U.transpose(-1, -2) @ W
                    out = U @ (v.unsqueeze(-1) * UtW)
                    exact = (U, v, lam, alpha, UtW)
                    saved = exact if ctx.exact else (U, v, out)
                _record_residual(stats, lam, v)
            else:
                assert not ctx.exact, 'exact iterative backward uses autograd'
                Y = _newton_forward(A, nr.iters, nr.init)
                out = Y if W is None else Y @ W
                saved = (Y, ) if W is None else (Y, out)
                _iterative_stats(stats, A, nr.init, nr.iters)
        ctx.save_for_backward(*saved)
        return out


class NewtonInverse(_NewtonFunction):
    """Y = NR-pseudo-inverse(A) with a closed-form backward: Eq. (16), or
    with ``backward='exact'`` (spectral method only) the Daleckii-Krein
    derivative of the T-iteration function, alpha held fixed.
    ``NewtonInverse.apply(A, None, nr, stats)``."""

    @staticmethod
    def backward(ctx, grad_Y: torch.Tensor):
        if ctx.exact:
            U, v, lam, alpha = ctx.saved_tensors
            F = _divided_differences(lam, v, alpha, ctx.iters)
            Ut = U.transpose(-1, -2)
            grad_A = U @ (F * (Ut @ grad_Y @ U)) @ Ut
            return grad_A, None, None, None
        (Y, ) = ctx.saved_tensors
        Yt = Y.transpose(-1, -2)
        grad_A = -(Yt @ grad_Y @ Yt)
        return grad_A, None, None, None


class NewtonInverseApply(_NewtonFunction):
    """Z = A_T W, A_T the T-th NR iterate (A_T -> A^+), Eq. (16) backward.

    Never forms A_T with ``'spectral'``: Z = U (v * (U^T W)), O(m^2 d)
    after the eigendecomposition. The backward is Eq. (16) applied to
    Y = A_T with grad_Y = grad_Z W^T, associated so that no m x m product
    is needed either: grad_A = -(Y^T grad_Z) Z^T, grad_W = Y^T grad_Z.
    With ``backward='exact'`` (spectral only) grad_A is the Daleckii-Krein
    derivative U (F o ((U^T grad_Z) (U^T W)^T)) U^T (two m x m x m products).
    ``NewtonInverseApply.apply(A, W, nr, stats)``.
    """

    @staticmethod
    def backward(ctx, grad_Z: torch.Tensor):
        grad_A = None
        if ctx.exact:
            U, v, lam, alpha, UtW = ctx.saved_tensors
            Ut = U.transpose(-1, -2)
            UtG = Ut @ grad_Z
            G = U @ (v.unsqueeze(-1) * UtG)
            if ctx.needs_input_grad[0]:
                F = _divided_differences(lam, v, alpha, ctx.iters)
                M = F.mul_(UtG @ UtW.transpose(-1, -2))
                grad_A = (U @ M) @ Ut
            return grad_A, G, None, None
        if ctx.method == 'spectral':
            U, v, Z = ctx.saved_tensors  # Y = U diag(v) U^T is symmetric
            G = U @ (v.unsqueeze(-1) * (U.transpose(-1, -2) @ grad_Z))
        else:
            Y, Z = ctx.saved_tensors
            G = Y.transpose(-1, -2) @ grad_Z
        if ctx.needs_input_grad[0]:
            grad_A = -(G @ Z.transpose(-1, -2))
        return grad_A, G, None, None


def _check_square(A: torch.Tensor) -> torch.Tensor:
    if A.dim() < 2 or A.shape[-1] != A.shape[-2]:
        raise ValueError(f'newton_inverse expects (..., m, m) matrices, '
                         f'got shape {tuple(A.shape)}')
    return A


def _solve(A: torch.Tensor, W: Optional[torch.Tensor], nr: NRConfig,
           stats: Optional[Dict]) -> torch.Tensor:
    """A_T (``W`` None) or A_T W: the export path, the autograd path of
    ``backward='exact'`` with the iterative method, or the Functions."""
    if W is not None and W.shape[:-1] != A.shape[:-1]:
        raise ValueError(f'newton_inverse_apply: W of shape '
                         f'{tuple(W.shape)} does not match A of shape '
                         f'{tuple(A.shape)}; expected (..., m, d) with the '
                         f'batch dims and m of A')
    if export_ops.is_exporting():  # ONNX: plain ops, iterative, no eigh
        export_ops.check_method(nr.method)
        Y = export_ops.newton_iterate(*_init(export_ops.fp32(A), nr.init),
                                      nr.iters)
        return Y if W is None else torch.matmul(Y, export_ops.fp32(W))
    method = resolve_method(nr.method, A)
    if method != nr.method:
        nr = nr.replace(method=method)
    dtype = torch.float64 if A.dtype == torch.float64 else torch.float32
    A = A.to(dtype)
    W = None if W is None else W.to(dtype)
    with autocast_off(A.device.type):
        if nr.backward == 'exact' and method == 'iterative':
            # the gradient of the T iterations: autograd through them
            _iterative_stats(stats, A, nr.init, nr.iters)
            Y = _newton_forward(A, nr.iters, nr.init)
            return Y if W is None else Y @ W
        if W is None:
            return NewtonInverse.apply(A, None, nr, stats)
        return NewtonInverseApply.apply(A, W, nr, stats)


def newton_inverse(A: torch.Tensor,
                   iters: int = 20,
                   init: str = 'soft_norm_per_sample',
                   method: str = 'auto',
                   backward: str = 'eq16',
                   stats: Optional[Dict] = None) -> torch.Tensor:
    """Moore-Penrose inverse of a batch of symmetric non-negative matrices.

    Args:
        A: (..., m, m) bottleneck matrices (Gaussian-kernel Gram matrices).
        iters: Newton-Raphson iterations (the papers use 20).
        init: alpha rule, one of :data:`INIT_MODES` (or an old name of
            :data:`INIT_ALIASES`); see the module docstring.
        method: ``'auto'``, ``'iterative'`` or ``'spectral'`` (see module
            docstring); all compute the same T iterations.
        backward: ``'eq16'`` (the papers' closed form) or ``'exact'`` (the
            gradient of the T iterations, alpha held fixed).
        stats: optional dict, filled with the convergence of this call
            (``'residual'``, ``'unconverged'``, per matrix; see
            :func:`nr_residual`).

    Returns:
        (..., m, m) tensor in float32 (float64 if A is float64), independent
        of autocast. The same as ``NRConfig(iters, init, method,
        backward).inverse(A, stats)``.
    """
    _check_square(A)
    return NRConfig(iters, init, method, backward).inverse(A, stats)


def newton_inverse_apply(A: torch.Tensor,
                         W: torch.Tensor,
                         iters: int = 20,
                         init: str = 'soft_norm_per_sample',
                         method: str = 'auto',
                         backward: str = 'eq16',
                         stats: Optional[Dict] = None) -> torch.Tensor:
    """A^+ W with A^+ from :func:`newton_inverse`, without forming A^+.

    The same function as ``newton_inverse(A, iters, init, method) @ W``
    (up to rounding) at a fraction of the cost for large m: with the
    spectral method the m x m inverse is never built, and the Eq. (16)
    backward needs only (m x m) x (m x d) products.

    Args:
        A: (..., m, m) symmetric non-negative matrices.
        W: (..., m, d) right-hand sides (broadcast batch dims not supported:
            A and W share theirs).
        iters, init, method, backward, stats: as :func:`newton_inverse`.

    Returns:
        (..., m, d) in float32 (float64 if A is float64), autocast disabled.
        The same as ``NRConfig(iters, init, method, backward).apply(A, W,
        stats)``.
    """
    _check_square(A)
    return NRConfig(iters, init, method, backward).apply(A, W, stats)


@torch.no_grad()
def nr_residual(A: torch.Tensor,
                iters: int = 20,
                init: str = 'soft_norm_per_sample') -> Dict[str, torch.Tensor]:
    """Convergence of the T iterations on A, from its eigenvalues.

    Returns ``{'residual': ||A A_T A - A||_2 / ||A||_2,
    'unconverged': fraction of the numerical rank with |1 - l v_T(l)| >
    0.5}``,
    each of shape ``A.shape[:-2]`` (what ``stats`` of
    :func:`newton_inverse` receives).
    """
    init = NRConfig(iters, init).init
    _check_square(A)
    stats: Dict[str, torch.Tensor] = {}
    _iterative_stats(stats, A, init, iters)
    return stats


@torch.no_grad()
def pinv_convergence(A: torch.Tensor,
                     iters: int = 20,
                     init: str = 'soft_norm_per_sample'
                     ) -> Tuple[torch.Tensor, ...]:
    """The paper's convergence metric ||A A_k A - A||_2 / ||A||_2 per step.

    Returns a tuple of ``iters + 1`` tensors of shape ``A.shape[:-2]``
    (k = 0..iters), as plotted in Fig. 4.
    """
    init = canonical_init(init)
    A = A.double()
    Aw, V = _first_iterate(A, init)

    def norm2(M):  # symmetric: the spectral norm is the largest |eigenvalue|
        return torch.linalg.eigvalsh(0.5 * (M + M.mT)).abs().amax(-1)

    normA = norm2(A)
    out = []
    for k in range(iters + 1):
        out.append(norm2(A @ V @ A - A) / normA)
        if k < iters:
            V = _newton_iterate(Aw, V, 1)
    return tuple(out)
