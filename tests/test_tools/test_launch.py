"""Issue 13: 2-process CPU (gloo) runs end cleanly - exit status 0 and no
"terminate called without an active exception" (SIGABRT at interpreter
exit). The end of a distributed test runs in 2 groups at once (the failure
is intermittent); ``tools/dist_test.sh`` runs once and its metric is checked
(``launch.shutdown_dist`` alone: test_tool_helpers.py::test_shutdown_dist)."""
import os.path as osp
import pickle
import subprocess
import sys

import pytest
import torch
from conftest import (ROOT, TOOLS, child_env, cls_demo_config, free_port,
                      random_model, run)

# the end of a distributed test: DDP-wrapped model, results gathered, the
# metrics broadcast from rank 0, then mmsoft's teardown
SCRIPT = '''
import sys
sys.path[:0] = [{root!r}, {tools!r}]
import torch
import torch.distributed as dist
from mmsoft_tools import launch
dist.init_process_group('gloo')
dist_rank = dist.get_rank()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
out = [torch.empty(3) for _ in range(dist.get_world_size())]
dist.all_gather(out, torch.full((3, ), float(dist.get_rank())))
metrics = [dict(top1=1.0)] if dist.get_rank() == 0 else [None]
dist.broadcast_object_list(metrics, src=0)
assert metrics[0]['top1'] == 1.0
try:
    pass
finally:
    launch.shutdown_dist()
assert not dist.is_initialized()
print('rank', dist_rank, 'done')
'''


def assert_clean(proc):
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and 'terminate called' not in out, (
        f'exit code {proc.returncode}\n{out[-4000:]}')
    return out


def test_teardown_repeated(tmp_path):
    """Each rank of 2 groups a fresh interpreter with torchrun's env."""
    script = tmp_path / 'end_of_test.py'
    script.write_text(SCRIPT.format(root=ROOT, tools=TOOLS))
    procs = []
    for port in [str(free_port()) for _ in range(2)]:
        procs += [(rank, subprocess.Popen(
            [sys.executable, str(script)], cwd=ROOT, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=child_env(RANK=str(rank), LOCAL_RANK=str(rank),
                          WORLD_SIZE='2', LOCAL_WORLD_SIZE='2',
                          MASTER_ADDR='127.0.0.1', MASTER_PORT=port)))
                  for rank in range(2)]  # yapf: disable
    try:
        for rank, p in procs:
            outs = p.communicate(timeout=300)
            out = assert_clean(
                subprocess.CompletedProcess(p.args, p.returncode, *outs))
            assert out.count(f'rank {rank} done') == 1, out[-4000:]
    finally:
        for _, p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.skipif(torch.cuda.is_available(), reason='the CPU fall-back')
def test_dist_test_sh_exits_cleanly(tmp_path):
    pytest.importorskip('mmpretrain')
    cfg = cls_demo_config(tmp_path, test=1)
    model = random_model(cfg)
    # a constant head (zero weights, one-hot bias): every image gets the
    # class of the first val image, so top-1 follows from the labels
    with open(tmp_path / 'data' / 'imagenet' / 'meta' / 'val.txt') as f:
        labels = [int(ln.split()[1]) for ln in f if ln.strip()]
    sd = model.state_dict()
    sd['head.fc.weight'] = torch.zeros_like(sd['head.fc.weight'])
    sd['head.fc.bias'] = torch.nn.functional.one_hot(
        torch.tensor(labels[0]), 5).float() * 10
    ckpt = str(tmp_path / 'cls.pth')
    torch.save({'state_dict': sd, 'meta': {}}, ckpt)
    proc = run(['bash', osp.join(ROOT, 'tools', 'dist_test.sh'), cfg, ckpt,
                '2', '--work-dir', tmp_path / 'work', '--out',
                tmp_path / 'preds.pkl'], tmp_path, 300,
               PORT=str(free_port()))  # yapf: disable
    out = assert_clean(proc)
    top1 = 100 * labels.count(labels[0]) / len(labels)
    # all 4 images once (the 2 ranks' results gathered), printed by rank 0
    assert out.count(f'accuracy/top1: {top1:.4f}') == 1, out[-3000:]
    # ... scored by the checkpoint's head: softmax(bias) for each of them
    with open(tmp_path / 'preds.pkl', 'rb') as f:
        preds = pickle.load(f)
    assert [int(p['gt_label']) for p in preds] == labels
    for p in preds:
        torch.testing.assert_close(p['pred_score'],
                                   sd['head.fc.bias'].softmax(0))
