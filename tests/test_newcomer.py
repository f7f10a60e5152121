"""What a newcomer meets (issues 40 and 43): the quickstart says where it wrote what and, with nothing left to train,
how to train further or start over; epochs count from 1 on the console, in metrics.jsonl, best.pt and the figure;
peak memory in each platform's units; one line naming WSL on Windows; the step scripts read a real-format CIFAR-10
folder that has no synthetic manifest; the fast config's documented commands pass the config/launch check;
`deterministic: true` is accepted, sets torch's flags and makes a run match itself."""
import json, os, re, shlex, subprocess, sys, types
import pytest
import torch
from _util import ROOT, read_metrics, run_module, small_args
from cifar_ddp_tut import train
from cifar_ddp_tut.config import ConfigError, load_config, parse_cli
from cifar_ddp_tut.data import write_synthetic_cifar10
from cifar_ddp_tut.dist import DeviceError, pick_device
from cifar_ddp_tut.launch import run_process


def _tiny(save_dir, data_dir, *extra, epochs=1):
    "The small quickstart in one plain process, 128 training images: seconds."
    return small_args(save_dir, data_dir, '--synthetic_train_size', '128', '--synthetic_test_size', '32', *extra,
                      epochs=epochs)


@pytest.mark.slow
def test_first_and_second_run_say_what_they_did(tmp_path):
    run, data = tmp_path/'run', tmp_path/'data'
    p, _ = run_module('cifar_ddp_tut.train', *_tiny(run, data, '--plot', 'true', epochs=2))
    assert p.returncode == 0, p.stderr[-3000:]
    last = p.stdout.strip().splitlines()[-1]
    assert last.startswith(f"wrote into {run}: metrics.jsonl (a line an epoch), curves.png (the figure), "
                           "best.pt (the best epoch's weights), snapshot.pt"), last
    # one numbering: the console's "epoch k/2", metrics.jsonl's epoch, best.pt's epoch, the figure's x axis
    console = [int(k) for k in re.findall(r'^epoch (\d+)/2: train loss', p.stdout, re.M)]
    hist = read_metrics(run)
    assert console == [h['epoch'] for h in hist] == [1, 2], (console, hist)
    assert torch.load(run/'best.pt', weights_only=True)['epoch'] in (1, 2)
    fig = train.plot_history(hist, [0.1, 0.1])
    assert list(fig.axes[0].get_xticks()) == [1, 2] and fig.axes[0].get_yscale() == 'log'
    # nothing left to do: say how to go on
    p2, _ = run_module('cifar_ddp_tut.train', *_tiny(run, data, epochs=2))
    assert p2.returncode == 0, p2.stderr[-3000:]
    assert 'resuming from' in p2.stdout and 'nothing left to train: to train further, give more epochs (--epoch 4); ' \
        'to start over, --resume false' in p2.stdout, p2.stdout
    # and going on works: one more epoch, numbered 3
    p3, _ = run_module('cifar_ddp_tut.train', *_tiny(run, data, epochs=3))
    assert p3.returncode == 0 and [h['epoch'] for h in read_metrics(run)] == [1, 2, 3], p3.stderr[-3000:]


@pytest.mark.parametrize('platform,maxrss', [('linux', 2_000_000_000 / 1024), ('darwin', 2_000_000_000)])
def test_peak_memory_in_each_platforms_units(monkeypatch, platform, maxrss):
    "getrusage(2): ru_maxrss is in kilobytes on Linux, in bytes on macOS."
    monkeypatch.setattr(sys, 'platform', platform)
    monkeypatch.setattr(train.resource, 'getrusage', lambda who: types.SimpleNamespace(ru_maxrss=maxrss))
    assert train.peak_memory_gb('cpu') == pytest.approx(2.0)


def test_windows_stops_with_one_line_naming_wsl():
    code = "import sys, torch; sys.platform = 'win32'; import cifar_ddp_tut.train"
    p = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 1 and 'WSL' in lines[0] and 'Traceback' not in p.stderr, p.stderr


@pytest.mark.slow
def test_step_script_reads_real_format_cifar10_without_manifest(tmp_path):
    """A folder in the real format with no synthetic_manifest.json is read by torchvision's own CIFAR10 class. The
    files are generated, so the published MD5 sums are swapped for theirs, as SyntheticCIFAR10 does: the script's own
    code path for a real download runs."""
    folder = write_synthetic_cifar10(tmp_path/'data', n_train=64, n_test=16, seed=0)
    manifest = json.loads((folder/'synthetic_manifest.json').read_text())
    (folder/'synthetic_manifest.json').unlink()
    swap = (f"import runpy, sys, torchvision; C = torchvision.datasets.CIFAR10; "
            f"C.train_list, C.test_list = {manifest['train_list']!r}, {manifest['test_list']!r}; "
            f"C.meta = dict(C.meta, md5={manifest['meta']!r}); sys.argv = sys.argv[1:]; "
            f"runpy.run_path(sys.argv[0], run_name='__main__')")
    p = run_process([sys.executable, '-c', swap, str(ROOT/'steps'/'s1_one_process.py'), '--data', 'data',
                     '--epochs', '1', '--steps', '2', '--out', 's1.pt'], 240, cwd=tmp_path)
    assert p.returncode == 0 and re.search(r'^epoch 0: loss', p.stdout, re.M), p.stderr[-3000:]
    # without the swap, the same folder is not real CIFAR-10: one clear error, not a missing manifest
    p2 = run_process([sys.executable, str(ROOT/'steps'/'s1_one_process.py'), '--data', 'data', '--epochs', '1',
                      '--steps', '1'], 240, cwd=tmp_path)
    assert p2.returncode != 0 and 'its MD5 check failed' in p2.stderr and 'FileNotFoundError' not in p2.stderr


def _documented_commands():
    "The torchrun commands in the fast config's header and in program/09's GPU section."
    text = (ROOT/'config'/'classifier_cifar10_fast.yaml').read_text()
    cmds = [l.lstrip('# ').strip() for l in text.splitlines() if l.startswith('#') and 'torchrun' in l]
    nb = json.loads((ROOT/'nbs'/'program'/'09_benchmark.ipynb').read_text())
    for c in nb['cells']:
        src = ''.join(c['source'])
        for block in re.findall(r'```bash\n(.*?)```', src, re.S):
            cmds += [l for l in block.replace('\\\n', ' ').splitlines() if 'classifier_cifar10_fast' in l]
    return cmds


def test_fast_config_documented_commands_pass_the_launch_check():
    "Each documented command parses, and its device list agrees with its --nproc_per_node (checked without a GPU)."
    cmds = _documented_commands()
    assert len(cmds) == 3, cmds
    for cmd in cmds:
        words = shlex.split(cmd.removeprefix('time '))
        nproc = int(next(w for w in words if w.startswith('--nproc_per_node=')).split('=')[1])
        args = [w.replace('config/', str(ROOT/'config') + '/') for w in words[words.index('cifar_ddp_tut.train') + 1:]]
        cfg = parse_cli(args)
        try: pick_device(0, cfg.backend, cfg.device, local_world_size=nproc)
        except DeviceError as e:  # here, without a GPU, a GPU list is refused; the count must not be why
            assert 'process(es)' not in str(e) and not torch.cuda.is_available(), (cmd, e)
    # the command the header used to give is what the check refuses
    cfg = parse_cli(['--cfg', str(ROOT/'config'/'classifier_cifar10_fast.yaml')])
    with pytest.raises(DeviceError, match=r'lists 4 GPU\(s\) but 1 process\(es\)'):
        pick_device(0, cfg.backend, cfg.device, local_world_size=1)


def test_deterministic_key_sets_the_flags(monkeypatch):
    monkeypatch.delenv('CUBLAS_WORKSPACE_CONFIG', raising=False)  # restored after the test
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # too late to set: set it as a user would
        monkeypatch.setenv('CUBLAS_WORKSPACE_CONFIG', ':4096:8')
    with pytest.raises(ConfigError, match='deterministic=true cannot be combined with num_workers=4'):
        load_config(None, {'deterministic': 'true'})
    cfg = load_config(None, {'deterministic': 'true', 'num_workers': '0'})
    try:
        train.set_kernel_flags(cfg, torch.device('cuda', 0))  # no autotuning even where it is on by default
        assert torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.benchmark
        assert torch.backends.cudnn.deterministic and os.environ['CUBLAS_WORKSPACE_CONFIG'] == ':4096:8'
    finally: train.set_kernel_flags(load_config(None), torch.device('cpu'))
    assert not torch.are_deterministic_algorithms_enabled()


@pytest.mark.slow
def test_deterministic_run_matches_itself(tmp_path):
    "Two runs with deterministic: true (one process, CPU) write the same history and the same weights."
    runs = []
    for name in ('a', 'b'):
        p, _ = run_module('cifar_ddp_tut.train', *_tiny(tmp_path/name, tmp_path/'data', '--deterministic', 'true'))
        assert p.returncode == 0, p.stderr[-3000:]
        hist = [{k: v for k, v in h.items() if k not in ('seconds', 'images_per_s', 'peak_mem_gb')}
                for h in read_metrics(tmp_path/name)]
        runs.append((hist, torch.load(tmp_path/name/'snapshot.pt', weights_only=True)['model']))
    (ha, ma), (hb, mb) = runs
    assert ha == hb and all(torch.equal(ma[k], mb[k]) for k in ma)
