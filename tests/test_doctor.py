"The doctor command end to end on CPU: 2 gloo processes, every check, its JSON, its table and its exit codes."
import json, os, subprocess, sys, time
import pytest
from _util import ROOT, run_module

CHECKS = ['environment', 'all-reduce: correct sums', 'run: stopped after the first snapshot', 'run: resume is continuous',
          'run: logged val = eval of snapshot.pt', 'run: logged val = eval of best.pt', 'benchmark: original and fast recipes']


def doctor(*args, timeout=300):
    "Run `python -m cifar_ddp_tut.doctor *args`; (CompletedProcess, seconds)."
    return run_module('cifar_ddp_tut.doctor', *args, timeout=timeout)


@pytest.mark.slow
def test_doctor_cpu(tmp_path):
    "Every check passes on 2 gloo processes, within a few minutes; the JSON holds every figure the table shows."
    out = tmp_path/'doctor.json'
    p, secs = doctor('--nprocs', 2, '--out', out, '--workdir', tmp_path/'work')
    rep = json.loads(out.read_text())
    assert [c['name'] for c in rep['checks']] == CHECKS, rep['checks']
    failed = [c for c in rep['checks'] if not c['ok']]
    assert p.returncode == 0 and rep['ok'] and not failed, (failed, p.stderr[-3000:])
    env = rep['environment']
    assert rep['nprocs'] == 2 and env['device'] == 'cpu' and env['backend'] == 'gloo' and env['torch']
    # all-reduce: nccl-tests' formulas, with the real process group that torchrun set up
    ar = rep['allreduce']
    assert ar['world_size'] == 2 and ar['backend'] == 'gloo' and ar['torchrun_vars']['WORLD_SIZE'] == '2'
    assert [r['bytes'] for r in ar['rows']] == [2**k for k in range(12, 25, 2)]
    for r in ar['rows']:
        algbw = r['bytes'] / (r['time_us'] / 1e6) / 1e9
        assert r['correct'] and abs(r['algbw_gbs'] - algbw) < 1e-6 * algbw and abs(r['busbw_gbs'] - algbw * 2 * 1 / 2) < 1e-6 * algbw
    # the run: resumed once, every epoch logged once, and the logged validation is the saved models' evaluation
    run = rep['run']
    assert [h['epoch'] for h in run['history']] == [0, 1, 2]
    for name, row in (('snapshot.pt', run['history'][-1]), ('best.pt', run['history'][run['best_epoch']])):
        ev = run[name]
        assert ev['count'] == row['val_count'] == 101 and ev['world_size'] == 2
        assert abs(ev['loss'] - row['val_loss']) <= 1e-5 and abs(ev['acc'] - row['val_acc']) <= 1e-5, (name, ev, row)
    # the benchmark, through the bench module
    assert sorted(r['recipe'] for r in rep['bench']['results']) == ['fast', 'original'] and not rep['bench']['failures']
    for table in ('| size | iters | time us | algbw GB/s | busbw GB/s |', '| recipe | processes |', '| check | result |'):
        assert table in p.stdout, table
    assert 'all checks passed' in p.stdout and f'wrote {out}' in p.stdout
    print(f"doctor: {secs:.0f} s\n{p.stdout}")
    assert secs < 240


def test_doctor_failures_are_named(tmp_path):
    "A failed check exits 1 and names the check and the reason; a wrong argument exits 2 before anything runs."
    out = tmp_path/'doctor.json'
    p, secs = doctor('--skip', 'run,bench', '--timeout_s', 1, '--out', out, timeout=60)
    assert p.returncode == 1, (p.returncode, p.stderr[-2000:])
    assert "cifar_ddp_doctor: check 'allreduce' failed: LaunchError: did not finish within 1 s" in p.stderr, p.stderr
    rep = json.loads(out.read_text())
    assert not rep['ok'] and rep['failed'] == ['allreduce'] and 'FAILED: allreduce' in p.stdout
    p, _ = doctor('--skip', 'bandwidth', timeout=60)
    assert p.returncode == 2 and '--skip bandwidth: parts are allreduce,run,bench' in p.stderr, p.stderr
