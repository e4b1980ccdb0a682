"""The host codebases' own tools on mmsoft's configs (issue 50): what the
configs name (hooks, the backbone's init) makes the installed
``<package>/.mim/tools`` train / test and ``mim test`` stop on bad weights as
mmsoft's tools do. :data:`CASES`, the fault table: a host tool on a demo
config in a child process; its exit status and last line (a traceback's:
mmsoft's message). mmpretrain 1.2.0 has no ``train.py``: mmdet's trains."""
import glob
import importlib.util
import os.path as osp

import pytest
import torch
from conftest import (CONFIGS, child_env, cls_demo_config, load_tool,
                      random_model, tiny_demo_data)

for _codebase in ('mmpretrain', 'mmdet', 'mmseg'):
    pytest.importorskip(_codebase)

MISMATCH = 'mmsoft.utils.strict_load.CheckpointMismatchError: '
#: the authors' file: the converter command closes the line
CONVERT = ('is an official SOFT checkpoint (fudan-zvg/SOFT key layout, '
           "e.g. 'pos_embed1'); convert it first: python "
           'tools/model_converters/soft2mmsoft.py')


def host_tool(codebase, name):
    """``<codebase>/.mim/tools/<name>.py`` of the installed package."""
    spec = importlib.util.find_spec(codebase)
    path = osp.join(osp.dirname(spec.origin), '.mim', 'tools', name + '.py')
    if not osp.isfile(path):
        pytest.skip(f'{codebase} ships no tools/{name}.py')
    return path


@pytest.fixture(scope='module')
def files(tmp_path_factory, script_server):
    """The demo configs on tiny data and checkpoints: ``good``, another
    arch's, the authors' layout and ``trained`` (mmdet's tools/train.py)."""
    tmp = tmp_path_factory.mktemp('host_tools')
    cfg = cls_demo_config(tmp, val=4, test=4)
    import demo_synthetic
    demo_synthetic.make_demo_data(
        str(tmp / 'data' / 'demo'),
        tasks=('det', 'seg'),
        workers=1,
        overrides=tiny_demo_data(num_train=1),
        log=None)
    sd = random_model(cfg).state_dict()
    out = dict(cfg=cfg, cwd=str(tmp))
    official = load_tool('model_converters/mmsoft2soft.py'
                         ).convert_mmpretrain_to_official(sd)[0]
    other = {k: v for k, v in sd.items() if '.stages.2.blocks.1.' not in k}
    for name, key, state_dict in (('good', 'state_dict',
                                   sd), ('other_arch', 'state_dict', other),
                                  ('official', 'model', official)):
        out[name] = str(tmp / f'{name}.pth')
        torch.save({key: state_dict}, out[name])
    missing = tmp / 'missing.py'
    missing.write_text(
        f'_base_ = {cfg!r}\n'
        "model = dict(backbone=dict(init_cfg=dict(_delete_=True, "
        "type='Pretrained', prefix='backbone.', "
        "checkpoint='checkpoints/soft_norm_tiny.pth')))\n")
    out['missing_cfg'] = str(missing)
    out['det_cfg'] = osp.join(CONFIGS, 'demo', 'retinanet_soft_demo.py')
    out['seg_cfg'] = osp.join(CONFIGS, 'demo', 'upernet_soft_demo.py')
    argv = [
        cfg, '--work-dir', tmp / 'trained', '--cfg-options',
        'train_cfg.max_epochs=1'
    ]
    proc = script_server(host_tool('mmdet', 'train'), argv, tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out['trained'] = str(tmp / 'trained' / 'epoch_1.pth')
    assert osp.isfile(out['trained'])
    return out


#: (id, codebase, tool, arguments (split), exit 0?, start of the last line);
#: the placeholders are :func:`files`' names; each row its own work dir
CASES = [
    # faults: one line naming the problem and the fix, non-zero exit
    ('other-arch', 'mmpretrain', 'test', '{cfg} {other_arch}', False,
     MISMATCH + 'checkpoint {other_arch} does not match the model '
     '(ImageClassifier): '),
    ('weights-to-resume', 'mmdet', 'train', '{cfg} --resume {good}', False,
     MISMATCH + '--resume {good}: not a training checkpoint (it has '
     'no meta, message_hub)'),
    ('other-optimizer-resume', 'mmdet', 'train',
     '{cfg} --resume {trained} --cfg-options '
     'optim_wrapper.optimizer.type=SGD train_cfg.max_epochs=2', False,
     MISMATCH + '--resume {trained}: the checkpoint was trained '
     "with another optimizer than the config's optim_wrapper.optimizer "
     '(SGD): '),
    ('new-lr-resume', 'mmdet', 'train',
     '{cfg} --resume {trained} --cfg-options '
     'optim_wrapper.optimizer.lr=0.01 train_cfg.max_epochs=2', False,
     MISMATCH + "--resume {trained}: the config's "
     'optim_wrapper.optimizer.lr is 0.01, the checkpoint was trained with '
     '0.001: '),
    ('missing-imagenet-file', 'mmdet', 'train', '{missing_cfg}', False,
     'FileNotFoundError: checkpoints/soft_norm_tiny.pth '
     "(model.backbone.init_cfg.checkpoint) does not exist: download the "
     "authors' soft_norm_tiny ImageNet file"),
    ('nonfinite-test-outputs', 'mmpretrain', 'test',
     '{cfg} {trained} --cfg-options '
     'model.data_preprocessor.std=[0,0,0]', False,
     'mmsoft.engine.hooks.nonfinite_hook.NonFiniteLossError: '
     'NonFiniteLossHook: the test outputs of batch 1 hold nan / inf '
     '(pred_score; first image '),
    # the case (was: 0 tensors loaded, exit 0, top-1 at chance;
    # ``mim test mmpretrain`` runs this tool)
    ('cls-authors-file', 'mmpretrain', 'test', '{cfg} {official}', False,
     MISMATCH + 'checkpoint {official} does not match the model '
     '(ImageClassifier): 0 of its 1 tensors would load'),
    ('det-authors-file', 'mmdet', 'test', '{det_cfg} {official}', False,
     MISMATCH + 'checkpoint {official} does not match the model '
     '(RetinaNet): 0 of its 1 tensors would load'),
    ('seg-authors-file', 'mmseg', 'test', '{seg_cfg} {official}', False,
     MISMATCH + 'checkpoint {official} does not match the model '
     '(EncoderDecoder): 0 of its 1 tensors would load'),
    # the right files run: a training checkpoint tested (mmengine's objects
    # allowed for the Runner's load only) and resumed, without the ImageNet
    # file (a resume replaces every weight)
    ('trained-test', 'mmpretrain', 'test', '{cfg} {trained}', True, None),
    ('resume-missing-imagenet-file', 'mmdet', 'train',
     '{missing_cfg} --resume {trained} --cfg-options '
     'train_cfg.max_epochs=2', True, None),
]


@pytest.mark.parametrize(
    'name, codebase, tool, args, ok, line', CASES, ids=[c[0] for c in CASES])
def test_host_tool(files, script_server, tmp_path, name, codebase, tool, args,
                   ok, line):
    argv = [a.format(**files) for a in args.split()]
    work = tmp_path / 'work'
    proc = script_server(
        host_tool(codebase, tool), argv + ['--work-dir', work], files['cwd'],
        child_env())
    err = proc.stderr
    if ok:
        assert proc.returncode == 0, err[-3000:]
        assert 'do not match exactly' not in proc.stdout + err  # mmengine's
        if tool == 'test':
            assert 'accuracy/top1: ' in proc.stdout + err
        else:
            assert 'resumed epoch: 1, iter: 1' in proc.stdout + err
            assert osp.isfile(work / 'epoch_2.pth')
        return
    last = [ln for ln in err.splitlines() if ln.strip()][-1]
    assert proc.returncode != 0, err[-3000:]
    assert last.startswith(line.format(**files)), last
    if name.endswith('authors-file'):
        assert CONVERT in last
        assert 'accuracy/top1' not in proc.stdout
    # stopped before anything was trained or saved
    assert not glob.glob(str(work / '*.pth'))
