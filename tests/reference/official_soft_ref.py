"""The official SOFT classifier's eval forward (fudan-zvg/SOFT master,
``soft_*`` / ``soft_norm_*``) over a state dict in the OFFICIAL key layout,
independent of mmsoft; in the dtype of the state dict and input."""
import math
from collections import OrderedDict

import torch
import torch.nn.functional as F

STEM_CHANNELS = 32  # hidden width of the official stage-1 stem
NR_ITERS = 20  # the official newton_max_iter


def _linear(sd, name, x):
    return F.linear(x, sd[name + '.weight'], sd.get(name + '.bias'))


def _layer_norm(sd, name, x, eps):
    return F.layer_norm(x, x.shape[-1:], sd[name + '.weight'],
                        sd[name + '.bias'], eps)


def gelu_tanh(x):  # the official ``Approx_GeLU`` (FFN of the SOFT blocks)
    return 0.5 * x * (
        1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def gelu_erf(x):  # ``nn.GELU()`` (sampler, stage-4 MLP): x Phi(x)
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gaussian_kernel(a, b):  # exp(-||a_i - b_j||^2 / 2), expanded
    sq = (a * a).sum(-1, keepdim=True) + (b * b).sum(-1).unsqueeze(-2) \
        - 2.0 * a @ b.transpose(-1, -2)
    return torch.exp(-sq / 2.0)


def nr_pinv_soft(A, iters=NR_ITERS):
    """``soft_*``: per matrix alpha = 0.9 * 2 / (max row sum of A)^2, then
    V <- 2V - V P V on P = A + 0.01 I from V_0 = alpha P."""
    alpha = 1.8 / A.sum(-1).amax(-1)**2
    P = A + 0.01 * torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    V = alpha[..., None, None] * P
    for _ in range(iters):
        V = 2 * V - V @ P @ V
    return V


def nr_pinv_norm(A, iters=NR_ITERS):
    """``soft_norm_*``: one alpha for the stack (the official batch) = 2 /
    (largest row sum)^2, halved (<= 10 times) while the largest column abs
    sum of I - A (alpha A) exceeds 1.01; V <- 2V - V A V, V_0 = alpha A."""
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    alpha = 2.0 / A.sum(-1).max()**2
    for _ in range(10):
        if not (eye - A @ (alpha * A)).abs().sum(-2).max() > 1.01:
            break
        alpha = alpha / 2
    V = alpha * A
    for _ in range(iters):
        V = 2 * V - V @ A @ V
    return V


def patch_embed(sd, stage, x):  # conv, BN, ReLU (stage 1: three)
    for conv, stride in ((0, 2), (3, 1), (6, 2)) if stage == 1 else [(0, 2)]:
        c, bn = (f'patch_embed{stage}.proj.{i}.' for i in (conv, conv + 1))
        x = F.conv2d(x, sd[c + 'weight'], sd[c + 'bias'], stride, 1)
        x = F.relu(
            F.batch_norm(x, sd[bn + 'running_mean'], sd[bn + 'running_var'],
                         sd[bn + 'weight'], sd[bn + 'bias'], False, 0.1, 1e-5))
    return x


def resize_pos(grid_pos, H, W):  # (1, g*g, C) -> (1, H*W, C), bilinear
    n, C = grid_pos.shape[1:]
    g = int(n**0.5)
    img = grid_pos.reshape(1, g, g, C).permute(0, 3, 1, 2)
    img = F.interpolate(img, size=(H, W), mode='bilinear', align_corners=False)
    return img.flatten(2).transpose(1, 2)


def soft_attention(sd, pre, x, H, W, attn_norm, iters):
    """``{pre}.mha`` (SoftmaxFree[Norm]Attention; norm: D^-1/2 A^+ D^-1/2)."""
    B, N, C = x.shape
    dw = sd[pre + '.attn.conv.weight']  # (heads, 1, k, k)
    heads, k = dw.shape[0], dw.shape[-1]
    d = C // heads
    lm_w = sd[pre + '.attn.Qlandmark_op.weight']  # (d, d, r, r)

    def heads_first(t):  # (B, N, C) -> (B, heads, N, d)
        return t.reshape(B, N, heads, d).transpose(1, 2)

    q = heads_first(_linear(sd, pre + '.W_q', x)) / d**0.25
    v = heads_first(_linear(sd, pre + '.W_v', x))
    qmap = q.reshape(B * heads, H, W, d).permute(0, 3, 1, 2)
    lm = F.conv2d(qmap, lm_w, stride=lm_w.shape[-1])  # (B*h, d, H/r, W/r)
    lm = lm.flatten(2).transpose(1, 2).reshape(B, heads, -1, d)
    lm = gelu_erf(_layer_norm(sd, pre + '.attn.Qnorm_act.0', lm, 1e-5))
    P, A = gaussian_kernel(q, lm), gaussian_kernel(lm, lm)
    if attn_norm:
        Dm = A.sum(-1, keepdim=True).rsqrt()
        A_inv = Dm * nr_pinv_norm(A, iters) * Dm.transpose(-1, -2)
    else:
        A_inv = nr_pinv_soft(A, iters)
    out = (P @ A_inv) @ (P.transpose(-1, -2) @ v)
    # depthwise conv on V: channels = heads, batch = (B, d)
    vmap = v.reshape(B, heads, H, W, d).permute(0, 4, 1, 2, 3)
    conv = F.conv2d(
        vmap.reshape(B * d, heads, H, W), dw, padding=k // 2, groups=heads)
    out = out + conv.reshape(B, d, heads, H * W).permute(0, 2, 3, 1)
    return _linear(sd, pre + '.ff', out.transpose(1, 2).reshape(B, N, C))


def soft_block(sd, pre, x, H, W, attn_norm, iters):  # post-norm ``.att``
    p = pre + '.att'
    mha = soft_attention(sd, p + '.mha', x, H, W, attn_norm, iters)
    x = _layer_norm(sd, p + '.norm1', x + mha, 1e-5)
    hidden = gelu_tanh(_linear(sd, p + '.ff1', x))
    return _layer_norm(sd, p + '.norm2', x + _linear(sd, p + '.ff2', hidden),
                       1e-5)


def softmax_block(sd, pre, x, heads):  # ``block4.{j}``: a pre-norm ViT
    B, N, C = x.shape
    d = C // heads
    y = _layer_norm(sd, pre + '.norm1', x, 1e-6)
    q = _linear(sd, pre + '.attn.q', y).reshape(B, N, heads, d)
    kv = _linear(sd, pre + '.attn.kv', y).reshape(B, N, 2, heads, d)
    q, k_, v = (t.transpose(1, 2) for t in (q, kv[:, :, 0], kv[:, :, 1]))
    weights = torch.softmax(q @ k_.transpose(-1, -2) * d**-0.5, dim=-1)
    att = (weights @ v).transpose(1, 2).reshape(B, N, C)
    x = x + _linear(sd, pre + '.attn.proj', att)
    y = _layer_norm(sd, pre + '.norm2', x, 1e-6)
    return x + _linear(sd, pre + '.mlp.fc2',
                       gelu_erf(_linear(sd, pre + '.mlp.fc1', y)))


def depth(sd, stage):  # from the ``block{stage}.{j}`` keys
    head = f'block{stage}.'
    return 1 + max(int(k[len(head):].split('.')[0]) for k in sd
                   if k.startswith(head))  # yapf: disable


def forward(sd, img, stage4_heads, attn_norm, iters=NR_ITERS):
    """Logits of the official model ``sd`` on ``img`` (``soft_norm_*``:
    alpha spans the batch); ``stage4_heads``: not visible in the weights."""
    B, x = img.shape[0], img
    for s in (1, 2, 3):
        x = patch_embed(sd, s, x)
        H, W = x.shape[-2:]
        pos = resize_pos(sd[f'pos_embed{s}'], H, W)
        x = x.flatten(2).transpose(1, 2) + pos
        for j in range(depth(sd, s)):
            x = soft_block(sd, f'block{s}.{j}', x, H, W, attn_norm, iters)
        x = x.reshape(B, H, W, -1).permute(0, 3, 1, 2)
    x = patch_embed(sd, 4, x)
    H, W = x.shape[-2:]
    pos = sd['pos_embed4']
    pos = torch.cat([pos[:, :1], resize_pos(pos[:, 1:], H, W)], 1)
    cls = sd['cls_token'].expand(B, -1, -1)
    x = torch.cat([cls, x.flatten(2).transpose(1, 2)], 1) + pos
    for j in range(depth(sd, 4)):
        x = softmax_block(sd, f'block4.{j}', x, stage4_heads)
    return _linear(sd, 'head', _layer_norm(sd, 'norm', x, 1e-6)[:, 0])


def random_official_state_dict(embed_dims, num_heads, depths, num_classes=10,
                               pretrain_img_size=64, in_chans=3,
                               ratios=(8, 4, 2), convs=(9, 5, 3), seed=0,
                               dtype=torch.float64):  # yapf: disable
    """Random tensors of the official names and shapes (registration order),
    scaled so that every part moves the logits."""
    g = torch.Generator().manual_seed(seed)
    sd = OrderedDict()

    def rnd(*shape, scale=1.0, shift=0.0):
        return torch.randn(*shape, generator=g, dtype=dtype) * scale + shift

    def fan_in(*shape):  # weights of Linear / Conv
        return rnd(*shape, scale=1 / math.sqrt(math.prod(shape[1:])))

    def linear(name, cin, cout):
        sd[name + '.weight'] = fan_in(cout, cin)
        sd[name + '.bias'] = rnd(cout, scale=0.1)

    def norm(name, c):
        sd[name + '.weight'] = rnd(c, scale=0.2, shift=1.0)
        sd[name + '.bias'] = rnd(c, scale=0.2)

    def add(pre, *layers):  # (name, c): a norm; (name, cin, cout): linear
        for name, *shape in layers:
            (norm if len(shape) == 1 else linear)(pre + name, *shape)

    def conv_bn(pre, idx, cin, cout):
        sd[f'{pre}.{idx}.weight'] = fan_in(cout, cin, 3, 3)
        sd[f'{pre}.{idx}.bias'] = rnd(cout, scale=0.1)
        bn = f'{pre}.{idx + 1}'
        norm(bn, cout)
        sd[bn + '.running_mean'] = rnd(cout, scale=0.2)
        sd[bn + '.running_var'] = 0.5 + torch.rand(
            cout, generator=g, dtype=dtype)
        sd[bn + '.num_batches_tracked'] = torch.tensor(1, dtype=torch.long)

    C, grid = list(embed_dims), pretrain_img_size // 4
    for i in range(4):
        sd[f'pos_embed{i + 1}'] = rnd(1, (grid >> i)**2 + (i == 3), C[i])
    stem = 'patch_embed1.proj'
    conv_bn(stem, 0, in_chans, STEM_CHANNELS)
    conv_bn(stem, 3, STEM_CHANNELS, STEM_CHANNELS)
    conv_bn(stem, 6, STEM_CHANNELS, C[0])
    for i in range(1, 4):
        conv_bn(f'patch_embed{i + 1}.proj', 0, C[i - 1], C[i])
    for s in range(3):
        c, h, r, k = C[s], num_heads[s], ratios[s], convs[s]
        for j in range(depths[s]):
            p = f'block{s + 1}.{j}.att.'
            add(p, ('mha.W_q', c, c), ('mha.W_v', c, c))
            a = p + 'mha.attn.'
            sd[a + 'Qlandmark_op.weight'] = fan_in(c // h, c // h, r, r)
            norm(a + 'Qnorm_act.0', c // h)
            sd[a + 'conv.weight'] = rnd(h, 1, k, k, scale=1 / k)
            add(p, ('mha.ff', c, c), ('norm1', c), ('ff1', c, 4 * c),
                ('ff2', 4 * c, c), ('norm2', c))
    c = C[3]
    for j in range(depths[3]):
        add(f'block4.{j}.', ('norm1', c), ('attn.q', c, c),
            ('attn.kv', c, 2 * c), ('attn.proj', c, c), ('norm2', c),
            ('mlp.fc1', c, 4 * c), ('mlp.fc2', 4 * c, c))
    norm('norm', c)
    sd['cls_token'] = rnd(1, 1, c)
    linear('head', c, num_classes)
    return sd
