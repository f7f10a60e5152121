"""The exercises' checkers, on real processes. For every exercise: the reference solution passes,
the exercise cell as shipped in its notebook is "not done yet", at least four usual wrong answers
each get their own hint (over several seeds where the inputs are random), a crash on one rank is a
verdict that names the rank (never a traceback), and an answer that reads the checker's frames is
refused. An answer right on gloo whose collective's tensor was made without a device "passed here,
not on NCCL"; processes that end before the learner's function runs are told so, and a script
without `if __name__ == '__main__':` is told to add it.

The answers are functions of this file, written as a learner would write them in a cell: the
checker sends their source to the processes, where only torch, dist, nn, F, math, os, random,
contextlib and DDP are defined."""
import importlib.util, json, os, re, subprocess, sys, time
import pytest
from _util import ROOT
from cifar_ddp_tut.lessons import solutions
from cifar_ddp_tut.lessons.checkers import EXERCISES, check


def verdict(capsys, n, fn, **kw):
    check(n, fn, **kw)
    return capsys.readouterr().out


def exercise_cells():
    "{n: source of the code cell after the markdown cell headed 'Exercise n'} in the course."
    found = {}
    for path in sorted((ROOT/'nbs'/'course').glob('*.ipynb')):
        if path.stem == '10_solutions': continue
        cells = json.loads(path.read_text())['cells']
        for a, b in zip(cells, cells[1:]):
            m = re.match(r'\s*#+\s*Exercise (\d+):', ''.join(a['source']))
            if m and a['cell_type'] == 'markdown':
                found[int(m[1])] = (path.stem, ''.join(b['source']))
    return found


def from_source(tmp_path, source, name):
    "The function `name` of `source`, as a cell defines it (inspect.getsource finds its text)."
    f = tmp_path/f'{name}_{abs(hash(source))}.py'
    f.write_text('import torch, torch.distributed as dist, torch.nn.functional as F\n' + source)
    spec = importlib.util.spec_from_file_location(f.stem, f)
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    return getattr(mod, name)


def test_every_exercise_is_in_its_notebook():
    cells = exercise_cells()
    assert sorted(cells) == sorted(EXERCISES)
    for n, (stem, _) in cells.items(): assert EXERCISES[n].notebook == f'course/{stem}'


@pytest.mark.parametrize('n', sorted(EXERCISES))
def test_solution_passes_and_shipped_cell_is_not_done(n, capsys, tmp_path):
    fn = getattr(solutions, re.search(r'def (\w+)', EXERCISES[n].stub)[1])
    out = verdict(capsys, n, fn)
    assert f'Exercise {n}: passed\n' in out, out  # not "passed here, not on NCCL"
    stem, cell = exercise_cells()[n]
    out = verdict(capsys, n, from_source(tmp_path, cell, fn.__name__))
    assert f'Exercise {n}: not done yet' in out, out
    if n in (1, 7):  # shipped code that hangs: the checker runs it and shows the wait
        assert 'waited in' in out and 'short timeout' in out, out


# ---- exercise 1: every rank at the meeting
def total_images_rank0_only(n_mine):
    total = torch.tensor([n_mine])
    if dist.get_rank() == 0: dist.all_reduce(total)
    return total.item()

def total_images_own(n_mine): return n_mine

def total_images_avg(n_mine):
    t = torch.tensor([float(n_mine)]); dist.all_reduce(t, op=dist.ReduceOp.AVG); return t.item()

def total_images_broadcast(n_mine):
    t = torch.tensor([n_mine]); dist.broadcast(t, src=0); return int(t)

def total_images_async(n_mine):
    t = torch.tensor([n_mine]); dist.all_reduce(t, async_op=True); return int(t)

def total_images_no_return(n_mine):
    t = torch.tensor([n_mine]); dist.all_reduce(t)

# ---- exercise 2: the gradient hook
def average_gradient_sum(p): dist.all_reduce(p.grad)

def average_gradient_local(p): p.grad.div_(dist.get_world_size())

def average_gradient_twice(p):
    p.grad.div_(dist.get_world_size()); dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)

def average_gradient_copy(p):
    g = p.grad.clone(); dist.all_reduce(g); g /= dist.get_world_size()

def average_gradient_async(p):
    p.grad.div_(dist.get_world_size()); dist.all_reduce(p.grad, async_op=True)

# ---- exercise 3: the order of an epoch
def _order(n, seed):
    g = torch.Generator(); g.manual_seed(seed)
    return torch.randperm(n, generator=g).tolist()

def epoch_indices_no_epoch(n, epoch, seed=0):
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator(); g.manual_seed(seed)
    order = torch.randperm(n, generator=g).tolist()
    total = math.ceil(n / world) * world
    order += order[:total - n]
    return order[rank:total:world]

def epoch_indices_by_rank(n, epoch, seed=0):
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator(); g.manual_seed(seed + epoch + 1000 * rank)
    order = torch.randperm(n, generator=g).tolist()
    total = math.ceil(n / world) * world
    order += order[:total - n]
    return order[rank:total:world]

def epoch_indices_blocks(n, epoch, seed=0):
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator(); g.manual_seed(seed + epoch)
    order = torch.randperm(n, generator=g).tolist()
    total = math.ceil(n / world) * world
    order += order[:total - n]
    k = total // world
    return order[rank * k:(rank + 1) * k]

def epoch_indices_range_pad(n, epoch, seed=0):
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator(); g.manual_seed(seed + epoch)
    order = torch.randperm(n, generator=g).tolist()
    pad = -n % world
    order += list(range(pad))
    return order[rank::world]

def epoch_indices_no_pad(n, epoch, seed=0):
    g = torch.Generator(); g.manual_seed(seed + epoch)
    order = torch.randperm(n, generator=g).tolist()
    return order[dist.get_rank()::dist.get_world_size()]

def epoch_indices_pad_once(n, epoch, seed=0):  # right unless n is below the padding (1 on 3)
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator(); g.manual_seed(seed + epoch)
    order = torch.randperm(n, generator=g).tolist()
    total = math.ceil(n / world) * world
    order += order[:total - n]
    return order[rank:total:world]

# ---- exercise 4: a shard without padding
def my_shard_padded(n):
    w, r = dist.get_world_size(), dist.get_rank()
    idx = list(range(n)); idx += idx[:(-n) % w]
    return idx[r::w]

def my_shard_same(n): return list(range(n))

def my_shard_drop(n):
    w, r = dist.get_world_size(), dist.get_rank()
    k = n // w
    return list(range(r * k, (r + 1) * k))

def my_shard_last_takes_rest(n):
    w, r = dist.get_world_size(), dist.get_rank()
    k = n // w
    return list(range(r * k, n if r == w - 1 else (r + 1) * k))

def my_shard_ceil_blocks(n):
    w, r = dist.get_world_size(), dist.get_rank()
    k = math.ceil(n / w)
    return list(range(r * k, min(n, (r + 1) * k)))

def my_shard_two_only(n):
    if dist.get_world_size() == 2: return list(range(dist.get_rank(), n, 2))
    return list(range(n)) if dist.get_rank() == 0 else []

# ---- exercise 5: an exact mean
def global_mean_of_means(values):
    m = torch.tensor([values.mean().item()], dtype=torch.float64)
    dist.all_reduce(m, op=dist.ReduceOp.AVG); return m.item()

def global_mean_own(values): return values.mean().item()

def global_mean_by_world(values):
    s = torch.tensor([values.sum().item()], dtype=torch.float64)
    dist.all_reduce(s); return (s / dist.get_world_size()).item()

def global_mean_own_count(values):
    s = values.sum().clone(); dist.all_reduce(s); return (s / len(values)).item()

def global_mean_no_return(values):
    s = torch.tensor([values.sum().item(), len(values)], dtype=torch.float64)
    dist.all_reduce(s); mean = s[0] / s[1]

def global_mean_mean_times_count(values):  # right unless a rank holds no values (nan there)
    s = torch.tensor([values.mean().item() * len(values), len(values)], dtype=torch.float64)
    dist.all_reduce(s); return (s[0] / s[1]).item()

# ---- exercise 6: accumulate with no_sync
def accumulate_every_sync(ddp_model, micro_batches, optimizer):
    optimizer.zero_grad()
    for x, y in micro_batches:
        (F.cross_entropy(ddp_model(x), y) / len(micro_batches)).backward()
    optimizer.step()

def accumulate_not_divided(ddp_model, micro_batches, optimizer):
    optimizer.zero_grad()
    for i, (x, y) in enumerate(micro_batches):
        ctx = contextlib.nullcontext() if i == len(micro_batches) - 1 else ddp_model.no_sync()
        with ctx: F.cross_entropy(ddp_model(x), y).backward()
    optimizer.step()

def accumulate_step_each(ddp_model, micro_batches, optimizer):
    for x, y in micro_batches:
        optimizer.zero_grad(); F.cross_entropy(ddp_model(x), y).backward(); optimizer.step()

def accumulate_by_world_too(ddp_model, micro_batches, optimizer):
    k, w = len(micro_batches), dist.get_world_size()
    optimizer.zero_grad()
    for i, (x, y) in enumerate(micro_batches):
        with (contextlib.nullcontext() if i == k - 1 else ddp_model.no_sync()):
            (F.cross_entropy(ddp_model(x), y) / k / w).backward()
    optimizer.step()

def accumulate_zero_grad_inside(ddp_model, micro_batches, optimizer):
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        optimizer.zero_grad()
        with (contextlib.nullcontext() if i == k - 1 else ddp_model.no_sync()):
            (F.cross_entropy(ddp_model(x), y) / k).backward()
    optimizer.step()

def accumulate_concatenated(ddp_model, micro_batches, optimizer):
    x = torch.cat([x for x, _ in micro_batches]); y = torch.cat([y for _, y in micro_batches])
    optimizer.zero_grad(); F.cross_entropy(ddp_model(x), y).backward(); optimizer.step()

def accumulate_by_hand(ddp_model, micro_batches, optimizer):
    optimizer.zero_grad()
    with ddp_model.no_sync():
        for x, y in micro_batches:
            (F.cross_entropy(ddp_model(x), y) / len(micro_batches)).backward()
    for p in ddp_model.parameters():
        dist.all_reduce(p.grad); p.grad /= dist.get_world_size()
    optimizer.step()

def accumulate_forward_outside(ddp_model, micro_batches, optimizer):
    "Only the backward inside no_sync(): each backward still all-reduces (its forward decided)."
    k = len(micro_batches)
    optimizer.zero_grad()
    for i, (x, y) in enumerate(micro_batches):
        loss = F.cross_entropy(ddp_model(x), y) / k
        with (contextlib.nullcontext() if i == k - 1 else ddp_model.no_sync()): loss.backward()
    optimizer.step()

def accumulate_last_forward_inside(ddp_model, micro_batches, optimizer):
    "Every forward inside no_sync(), the last backward outside: no all-reduce at all."
    k, losses = len(micro_batches), []
    optimizer.zero_grad()
    with ddp_model.no_sync():
        for x, y in micro_batches[:-1]:
            (F.cross_entropy(ddp_model(x), y) / k).backward()
        x, y = micro_batches[-1]
        last = F.cross_entropy(ddp_model(x), y) / k
    last.backward()
    optimizer.step()

# ---- exercise 7: stop together
def train_uneven_local(ddp_model, batches, optimizer):
    steps = 0
    while steps < len(batches):
        x, y = batches[steps]
        optimizer.zero_grad(); F.cross_entropy(ddp_model(x), y).backward(); optimizer.step()
        steps += 1
    return steps

def train_uneven_own_count(ddp_model, batches, optimizer):
    n = torch.tensor([len(batches)]); dist.all_reduce(n, op=dist.ReduceOp.MIN)
    for x, y in batches[:int(n)]:
        optimizer.zero_grad(); F.cross_entropy(ddp_model(x), y).backward(); optimizer.step()
    return len(batches)

def train_uneven_max(ddp_model, batches, optimizer):
    steps = 0
    while True:
        have = torch.tensor([1 if steps < len(batches) else 0])
        dist.all_reduce(have, op=dist.ReduceOp.MAX)
        if not have.item(): return steps
        x, y = batches[steps]
        optimizer.zero_grad(); F.cross_entropy(ddp_model(x), y).backward(); optimizer.step()
        steps += 1

def train_uneven_rank0_count(ddp_model, batches, optimizer):
    n = torch.tensor([len(batches)]); dist.broadcast(n, src=0)
    for x, y in batches[:int(n)]:
        optimizer.zero_grad(); F.cross_entropy(ddp_model(x), y).backward(); optimizer.step()
    return int(n)

def train_uneven_no_return(ddp_model, batches, optimizer):
    n = torch.tensor([len(batches)]); dist.all_reduce(n, op=dist.ReduceOp.MIN)
    for x, y in batches[:int(n)]:
        optimizer.zero_grad(); F.cross_entropy(ddp_model(x), y).backward(); optimizer.step()

# ---- exercise 8: save once, load anywhere
def save_everywhere(ddp_model, path):
    torch.save(ddp_model.module.state_dict(), path); dist.barrier()
    return torch.load(path, map_location='cpu')

def save_wrapper(ddp_model, path):
    if dist.get_rank() == 0: torch.save(ddp_model.state_dict(), path)
    dist.barrier(); return torch.load(path, map_location='cpu')

def save_no_barrier(ddp_model, path):
    if dist.get_rank() == 0: torch.save(ddp_model.module.state_dict(), path)
    return torch.load(path, map_location='cpu')

def save_wait_for_file(ddp_model, path):
    import time
    if dist.get_rank() == 0: torch.save(ddp_model.module.state_dict(), path)
    while not os.path.exists(path): time.sleep(0.01)
    return torch.load(path, map_location='cpu')

def save_no_map_location(ddp_model, path):
    if dist.get_rank() == 0: torch.save(ddp_model.module.state_dict(), path)
    dist.barrier(); return torch.load(path)

def save_no_load(ddp_model, path):
    if dist.get_rank() == 0: torch.save(ddp_model.module.state_dict(), path)
    dist.barrier(); return ddp_model.module.state_dict()

# ---- exercise 9: decide together
def skip_step_local(loss): return not bool(torch.isfinite(loss))

def skip_step_min(loss):
    bad = torch.tensor([0.0 if torch.isfinite(loss) else 1.0])
    dist.all_reduce(bad, op=dist.ReduceOp.MIN); return bool(bad.item())

def skip_step_rank0(loss):
    bad = torch.tensor([0.0 if torch.isfinite(loss) else 1.0])
    dist.broadcast(bad, src=0); return bool(bad.item())

def skip_step_nan_only(loss):
    bad = torch.tensor([1.0 if torch.isnan(loss) else 0.0])
    dist.all_reduce(bad, op=dist.ReduceOp.MAX); return bool(bad.item())

def skip_step_no_return(loss):
    bad = torch.tensor([0.0 if torch.isfinite(loss) else 1.0])
    dist.all_reduce(bad, op=dist.ReduceOp.MAX); skip = bool(bad.item())


NO_RETURN = 'returns None'
WRONG = [  # (exercise, wrong answer, a piece of the hint meant for that mistake)
    (1, total_images_rank0_only, 'a collective is a meeting'),
    (1, total_images_own, 'no collective was called'),
    (1, total_images_avg, 'that is the mean over ranks'),
    (1, total_images_broadcast, "dist.broadcast copies rank 0's tensor"),
    (1, total_images_async, 'call .wait() on the handle'),
    (1, total_images_no_return, NO_RETURN),
    (2, average_gradient_sum, 'the mean divides by dist.get_world_size()'),
    (2, average_gradient_local, 'no collective was called'),
    (2, average_gradient_twice, 'divided by the world size twice'),
    (2, average_gradient_copy, 'your hook left p.grad as it was'),
    (2, average_gradient_async, 'call .wait() on the handle'),
    (3, epoch_indices_no_epoch, 'seed + epoch'),
    (3, epoch_indices_by_rank, 'the same permutation'),
    (3, epoch_indices_blocks, 'order[rank::world_size]'),
    (3, epoch_indices_range_pad, 'not range(pad)'),
    (3, epoch_indices_no_pad, 'pads the permutation'),
    (3, epoch_indices_pad_once, 'as many times as the padding needs'),
    (4, my_shard_padded, 'padding the shards'),
    (4, my_shard_same, 'every rank returned the same indices'),
    (4, my_shard_drop, 'are on no rank'),
    (4, my_shard_last_takes_rest, 'not all to the last one'),
    (4, my_shard_ceil_blocks, 'blocks of ceil(n / world_size)'),
    (4, my_shard_two_only, 'on 3 ranks'),
    (5, global_mean_of_means, 'mean of the per-rank means'),
    (5, global_mean_own, 'no collective was called'),
    (5, global_mean_by_world, 'the sum divided by the world size'),
    (5, global_mean_own_count, 'all-reduce the count as well'),
    (5, global_mean_no_return, NO_RETURN),
    (5, global_mean_mean_times_count, 'a rank with no values'),
    (6, accumulate_every_sync, 'every micro-batch but the last, forward and backward'),
    (6, accumulate_forward_outside, 'DDP decides in the forward whether the next backward'),
    (6, accumulate_last_forward_inside, "the last micro-batch's forward ran inside no_sync()"),
    (6, accumulate_not_divided, 'divide it by the number of micro-batches'),
    (6, accumulate_step_each, 'step once, after the last backward'),
    (6, accumulate_by_world_too, 'not by the world size too'),
    (6, accumulate_zero_grad_inside, 'zero_grad inside the loop'),
    (6, accumulate_concatenated, 'one big batch'),
    (6, accumulate_by_hand, 'no collective of your own'),
    (7, train_uneven_local, 'decide together'),
    (7, train_uneven_own_count, 'its own number of batches'),
    (7, train_uneven_max, 'Use op=dist.ReduceOp.MIN: it stops as soon as one rank has run out'),
    (7, train_uneven_rank0_count, "a broadcast gives every rank rank 0's answer"),
    (7, train_uneven_no_return, NO_RETURN),
    (8, save_everywhere, 'one file, one writer'),
    (8, save_wrapper, "start with 'module.'"),
    (8, save_no_barrier, 'a file that exists is not yet complete'),
    (8, save_wait_for_file, 'a file that exists is not yet complete'),
    (8, save_no_map_location, 'without map_location'),
    (8, save_no_load, 'without loading the file'),
    (9, skip_step_local, 'every rank decides on the same number'),
    (9, skip_step_min, 'not the MIN'),
    (9, skip_step_rank0, "rank 0's verdict was given to every rank"),
    (9, skip_step_nan_only, 'not only torch.isnan'),
    (9, skip_step_no_return, NO_RETURN),
]


@pytest.mark.parametrize('n,fn,hint', WRONG, ids=[f.__name__ for _, f, _ in WRONG])
def test_wrong_answer_gets_its_hint(n, fn, hint, capsys):
    for seed in (0, 1):  # every exercise draws its inputs: the same hint for two draws
        t0 = time.monotonic()
        out = verdict(capsys, n, fn, seed=seed)
        assert f'Exercise {n}: not yet right' in out and hint in out, out
        assert 'Traceback' not in out and time.monotonic() - t0 < 30, out


def test_wrong_answers_cover_every_exercise():
    for n in EXERCISES: assert sum(m == n for m, _, _ in WRONG) >= 4, n


# ---- crashes: one rank raises, aborts or hangs; the verdict names it and what it was doing
def total_images_sizes(n_mine):   # gloo raises, times out or aborts on a size it did not expect
    t = torch.ones(1 + dist.get_rank()); dist.all_reduce(t); return int(t[0]) * n_mine

def average_gradient_raises(p):
    if dist.get_rank() == 1: raise ValueError("no gradient here")
    dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)

def epoch_indices_divides(n, epoch, seed=0): return list(range(n // (dist.get_rank() - 1)))

def my_shard_aborts(n):
    if dist.get_rank() == 1: os.abort()
    return list(range(dist.get_rank(), n, dist.get_world_size()))

def global_mean_gathered(values):
    every = [torch.zeros_like(values) for _ in range(dist.get_world_size())]
    dist.all_gather(every, values)
    return torch.cat(every).mean().item()

def accumulate_raises(ddp_model, micro_batches, optimizer):
    for x, y in micro_batches: F.cross_entropy(ddp_model(x), y[:1]).backward()

def save_and_load_rank1_fails(ddp_model, path):
    if dist.get_rank() == 1: raise OSError("disk full")
    torch.save(ddp_model.module.state_dict(), path); dist.barrier()
    return torch.load(path, map_location='cpu')

def skip_step_loops(loss):
    while dist.get_rank() == 1: pass
    return False

CRASH = [(1, total_images_sizes, 'with tensors of different shapes'),
         (2, average_gradient_raises, 'rank 1 raised ValueError: no gradient here at step 0'),
         (3, epoch_indices_divides, 'rank 1 raised ZeroDivisionError'),
         (4, my_shard_aborts, 'rank 1 was ended by SIGABRT'),
         (5, global_mean_gathered, 'all_gather needs a tensor of the same shape'),
         (6, accumulate_raises, 'raised ValueError: Expected input batch_size'),
         (7, train_uneven_max, 'raised IndexError: list index out of range at step'),
         (8, save_and_load_rank1_fails, 'rank 1 raised OSError: disk full'),
         (9, skip_step_loops, 'rank 1 had not returned after 8 s at step 0')]


@pytest.mark.parametrize('n,fn,says', CRASH, ids=[f.__name__ for _, f, _ in CRASH])
def test_a_crash_is_a_verdict(n, fn, says, capsys):
    out = verdict(capsys, n, fn, seed=0, job_timeout_s=8)
    assert f'Exercise {n}: not yet right' in out and says in out and 'Hint: ' in out, out
    assert 'Traceback' not in out, out


# ---- reading the answer instead of computing it
CHEATS = {n: f'''
{re.search(r'def .*', ex.stub)[0]}
    import sys
    frame = sys._getframe(1)
    return frame.f_back.f_locals.get('case')
''' for n, ex in EXERCISES.items()}


@pytest.mark.parametrize('n', sorted(EXERCISES))
def test_reading_the_callers_frame_is_refused(n, capsys, tmp_path):
    name = re.search(r'def (\w+)', EXERCISES[n].stub)[1]
    out = verdict(capsys, n, from_source(tmp_path, CHEATS[n], name))
    assert f'Exercise {n}: refused' in out and "'_getframe'" in out, out


def test_the_sampler_and_the_solutions_are_refused(capsys, tmp_path):
    uses_sampler = from_source(tmp_path, '''
def epoch_indices(n, epoch, seed=0):
    "As DistributedSampler(shuffle=True) gives them."
    from torch.utils.data import DistributedSampler
    s = DistributedSampler(range(n), shuffle=True, seed=seed); s.set_epoch(epoch)
    return list(s)
''', 'epoch_indices')
    assert "refused\n  your function uses 'DistributedSampler'" in verdict(capsys, 3, uses_sampler)
    imports_solution = from_source(tmp_path, '''
def skip_step(loss):
    from cifar_ddp_tut.lessons.solutions import skip_step as answer
    return answer(loss)
''', 'skip_step')
    out = verdict(capsys, 9, imports_solution)
    assert 'Exercise 9: refused' in out and "'solutions'" in out, out


def test_modules_imported_above_the_function_are_there(capsys, tmp_path):
    "A learner imports at the top of the cell; the processes import the same modules."
    waits_for_file = from_source(tmp_path, '''
import os, time
def save_and_load(ddp_model, path):
    if dist.get_rank() == 0: torch.save(ddp_model.module.state_dict(), path)
    while not os.path.exists(path): time.sleep(0.01)
    return torch.load(path, map_location='cpu')
''', 'save_and_load')
    out = verdict(capsys, 8, waits_for_file)
    assert 'not yet right' in out and 'a file that exists is not yet complete' in out, out
    via_module = from_source(tmp_path, '''
from cifar_ddp_tut.lessons import solutions as s
def skip_step(loss): return s.skip_step(loss)
''', 'skip_step')
    out = verdict(capsys, 9, via_module)
    assert 'Exercise 9: refused' in out and "'solutions'" in out, out


def test_hang_is_named_within_seconds(capsys):
    "A collective on rank 0 only: rank 0 waits; the checker says so after its 4 s timeout."
    check(1, total_images_rank0_only)  # warm the forkserver
    capsys.readouterr()
    t0 = time.monotonic()
    out = verdict(capsys, 1, total_images_rank0_only)
    assert 'rank 0 waited in dist.all_reduce' in out and 'rank 1 returned' in out, out
    assert time.monotonic() - t0 < 20


# ---- right on gloo, refused by NCCL: a collective's tensor made without a device
def total_images_no_device(n_mine):
    total = torch.tensor([n_mine]); dist.all_reduce(total); return int(total)

def global_mean_no_device(values):
    s = torch.tensor([values.sum().item(), values.numel()], dtype=torch.float64)
    dist.all_reduce(s); return (s[0] / s[1]).item()

def train_uneven_no_device(ddp_model, batches, optimizer):
    steps = 0
    while True:
        have = torch.tensor([1 if steps < len(batches) else 0]).double()  # derived: still CPU
        dist.all_reduce(have, op=dist.ReduceOp.MIN)
        if not have.item(): return steps
        x, y = batches[steps]
        optimizer.zero_grad(); F.cross_entropy(ddp_model(x), y).backward(); optimizer.step()
        steps += 1

def skip_step_no_device(loss):
    bad = torch.tensor([0.0 if torch.isfinite(loss) else 1.0])
    dist.all_reduce(bad, op=dist.ReduceOp.MAX); return bool(bad.item())

NO_DEVICE = [(1, total_images_no_device), (5, global_mean_no_device), (7, train_uneven_no_device),
             (9, skip_step_no_device)]


@pytest.mark.parametrize('n,fn', NO_DEVICE, ids=[f.__name__ for _, f in NO_DEVICE])
def test_a_tensor_without_a_device_passes_here_not_on_nccl(n, fn, capsys):
    out = verdict(capsys, n, fn, seed=0)
    assert f'Exercise {n}: passed here, not on NCCL' in out, out
    assert 'dist.all_reduce (its call' in out and 'NCCL takes CUDA tensors only' in out, out


def skip_step_moved(loss):
    bad = torch.tensor([0.0 if torch.isfinite(loss) else 1.0]).to(loss.device)
    dist.all_reduce(bad, op=dist.ReduceOp.MAX); return bool(bad.item())


def test_a_tensor_moved_to_the_inputs_device_passes(capsys):
    "`.to(loss.device)` after making it: the same as device= (on the CPU, the same tensor)."
    out = verdict(capsys, 9, skip_step_moved, seed=0)
    assert 'Exercise 9: passed\n' in out, out


# ---- processes that end before the learner's function runs (a script run with python)
SCRIPT = """{head}
import torch, torch.distributed as dist
from cifar_ddp_tut.lessons.checkers import check
def total_images(n_mine):
    total = torch.tensor([n_mine]); dist.all_reduce(total); return int(total)
{call}
"""

def run_script(tmp_path, head, call):
    path = tmp_path / 'answer.py'
    path.write_text(SCRIPT.format(head=head, call=call))
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get('PYTHONPATH', ''))
    p = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, env=env)
    return p.stdout


def test_a_script_without_the_main_guard_is_told_to_add_it(tmp_path):
    out = run_script(tmp_path, '', 'check(1, total_images)')
    assert 'Exercise 1: not yet right' in out and 'before your function ran' in out, out
    assert "outside `if __name__ == '__main__':`" in out and 'sys.exit' not in out, out


def test_a_process_that_ends_while_starting_is_told_apart(tmp_path):
    "The script's top level ends every new process (exit code 3) before the harness starts."
    out = run_script(tmp_path, "import os\nif __name__ != '__main__': os._exit(3)",
                     "if __name__ == '__main__': check(1, total_images)")
    assert 'rank 0 exited with code 3 before your function ran' in out, out
    assert 'each process imports your script (answer.py)' in out and 'sys.exit' not in out, out


def total_images_to_cpu(n_mine):
    total = torch.tensor([n_mine]).to('cpu'); dist.all_reduce(total); return int(total)


def test_to_cpu_does_not_hide_a_tensor_without_a_device(capsys):
    "`.to('cpu')` names the CPU, which NCCL refuses: still 'passed here, not on NCCL'."
    out = verdict(capsys, 1, total_images_to_cpu, seed=0)
    assert 'Exercise 1: passed here, not on NCCL' in out, out


def test_forbidden_names_are_whole_names():
    from cifar_ddp_tut.lessons.harness import forbidden_names
    assert forbidden_names('print("inspecting x")') == []
    assert forbidden_names('getattr(sys, "_getframe")(1)') == ['_getframe']
