"The doctor command end to end on CPU: 2 gloo processes, every check, its JSON, its table and its exit codes."
import json, os, subprocess, sys, time
from _util import ROOT, run_module

CHECKS = ['environment', 'all-reduce: correct sums', 'run: stopped after the first snapshot', 'run: resume is continuous',
          'run: logged val = eval of snapshot.pt', 'run: logged val = eval of best.pt', 'benchmark: original and fast recipes']


def doctor(*args, timeout=300):
    "Run `python -m cifar_ddp_tut.doctor *args`; (CompletedProcess, seconds)."
    return run_module('cifar_ddp_tut.doctor', *args, timeout=timeout)


def test_doctor_command_line(tmp_path):
    """The console entry point on 2 gloo processes: exit 0, its tables on stdout, its JSON. Every part
    (the run and the benchmark too) runs and is checked in nbs/program/11_doctor.ipynb; here the two
    quick ones, through the command line."""
    out = tmp_path/'doctor.json'
    p, secs = doctor('--nprocs', 2, '--skip', 'run,bench', '--out', out, '--workdir', tmp_path/'work')
    assert p.returncode == 0, p.stderr[-3000:]
    rep = json.loads(out.read_text())
    assert [c['name'] for c in rep['checks']] == CHECKS[:2] and rep['ok'] and rep['failed'] == [], rep['checks']
    assert rep['nprocs'] == 2 and rep['environment']['backend'] == 'gloo' and 'run' not in rep
    ar = rep['allreduce']
    assert ar['world_size'] == 2 and ar['torchrun_vars']['WORLD_SIZE'] == '2' and all(r['correct'] for r in ar['rows'])
    for table in ('| size | iters | time us | algbw GB/s | busbw GB/s |', '| check | result |'):
        assert table in p.stdout, table
    assert 'all checks passed' in p.stdout and f'wrote {out}' in p.stdout
    print(f"doctor --skip run,bench: {secs:.0f} s\n{p.stdout}")


def test_doctor_failures_are_named(tmp_path):
    "A failed check exits 1 and names the check and the reason; a wrong argument exits 2 before anything runs."
    out = tmp_path/'doctor.json'
    p, secs = doctor('--skip', 'run,bench', '--job_timeout_s', 1, '--out', out, timeout=60)
    assert p.returncode == 1, (p.returncode, p.stderr[-2000:])
    assert "cifar_ddp_doctor: check 'allreduce' failed: LaunchError: did not finish within 1 s" in p.stderr, p.stderr
    rep = json.loads(out.read_text())
    assert not rep['ok'] and rep['failed'] == ['allreduce'] and 'FAILED: allreduce' in p.stdout
    p, _ = doctor('--skip', 'bandwidth', timeout=60)
    assert p.returncode == 2 and '--skip bandwidth: parts are allreduce,run,bench' in p.stderr, p.stderr


def _bench_configs_only(recipes, nprocs, size, warmup=None, steps=None, eval_batches=None, cfg=None,
                        overrides=None, out=None, job_timeout_s=900, verbose=True, repeats=None,
                        per_process_batch=None):
    "run_bench up to its checked configs, no launch: a config mistake raises ConfigError as there."
    import tempfile
    from cifar_ddp_tut.bench import bench_settings, bench_configs
    size, overrides = {'auto': 'small'}.get(size, size), dict(overrides or {})
    st = bench_settings(size, overrides, nprocs, per_process_batch, warmup=warmup, steps=steps,
                        eval_batches=eval_batches, repeats=repeats)
    with tempfile.TemporaryDirectory() as tmp:
        configs = bench_configs(recipes, size, st, cfg, overrides, tmp)
    return dict(failures=[], results=[dict(recipe=r, images_per_s=1.0, batch=c.batch_size)
                                      for (r, n, b), c in configs.items()])


def test_doctor_bench_any_process_count(tmp_path, monkeypatch):
    """check_bench times a batch a process, as the doctor's run does: 3 processes (or 5, 6, 7 GPUs)
    do not divide a fixed global batch, and a healthy machine must not fail for it."""
    import cifar_ddp_tut.bench as bench
    from cifar_ddp_tut.doctor import check_bench
    monkeypatch.setattr(bench, 'run_bench', _bench_configs_only)
    for n in (3, 1, 2):
        (row,), report = check_bench(n, tmp_path)
        assert row['ok'] and [r['batch'] for r in report['results']] == [8 * n, 8 * n], (n, report)


def test_allreduce_correct_on_every_rank():
    "A size is correct only if every rank's sum was: a wrong sum on rank 1 is not hidden by rank 0's."
    from cifar_ddp_tut.doctor import all_ranks_correct
    rank = lambda *ok: dict(world='w', rows=[dict(bytes=4096 * (i + 1), correct=c) for i, c in enumerate(ok)])
    got = all_ranks_correct([rank(True, True), rank(True, False)])
    assert [r['correct'] for r in got['rows']] == [True, False] and got['world'] == 'w'
    assert [r['bytes'] for r in got['rows']] == [4096, 8192]
