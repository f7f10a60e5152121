"""The exercises' checkers, on real processes: each reference solution passes, each exercise cell as
shipped in its notebook is "not done yet", at least two usual wrong answers per exercise each get
their own hint, and a collective called on one rank is reported within seconds, not by a hang.

The wrong answers are functions of this file: the checker sends their source to the processes,
where only torch, dist, nn, F, math, contextlib and DDP are defined."""
import importlib.util, json, re, time
import pytest
from _util import ROOT
from cifar_ddp_tut.lessons import solutions
from cifar_ddp_tut.lessons.checkers import EXERCISES, check


def verdict(capsys, n, fn):
    check(n, fn)
    return capsys.readouterr().out


def exercise_cells():
    "{n: source of the code cell after the markdown cell headed 'Exercise n'} in the course."
    found = {}
    for path in sorted((ROOT/'nbs'/'course').glob('*.ipynb')):
        if path.stem == '10_solutions': continue
        cells = json.loads(path.read_text())['cells']
        for a, b in zip(cells, cells[1:]):
            m = re.match(r'\s*#+\s*Exercise (\d+):', ''.join(a['source']))
            if m and a['cell_type'] == 'markdown': found[int(m[1])] = (path.stem, ''.join(b['source']))
    return found


def test_every_exercise_is_in_its_notebook():
    cells = exercise_cells()
    assert sorted(cells) == sorted(EXERCISES)
    for n, (stem, _) in cells.items(): assert EXERCISES[n].notebook == f'course/{stem}'


@pytest.mark.parametrize('n', sorted(EXERCISES))
def test_solution_passes_and_shipped_cell_is_not_done(n, capsys, tmp_path):
    fn = getattr(solutions, re.search(r'def (\w+)', EXERCISES[n].stub)[1])
    out = verdict(capsys, n, fn)
    assert f'Exercise {n}: passed' in out, out
    stem, cell = exercise_cells()[n]
    (tmp_path/f'cell{n}.py').write_text('import torch, torch.distributed as dist\n' + cell)
    spec = importlib.util.spec_from_file_location(f'cell{n}', tmp_path/f'cell{n}.py')
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    out = verdict(capsys, n, getattr(mod, fn.__name__))
    assert f'Exercise {n}: not done yet' in out, out


# ---- exercise 1: every rank at the meeting
def total_images_rank0_only(n_mine):
    total = torch.tensor([n_mine])
    if dist.get_rank() == 0: dist.all_reduce(total)
    return total.item()

def total_images_own(n_mine): return n_mine

def total_images_avg(n_mine):
    t = torch.tensor([float(n_mine)]); dist.all_reduce(t, op=dist.ReduceOp.AVG); return t.item()

# ---- exercise 2: the gradient hook
def average_gradient_sum(p): dist.all_reduce(p.grad)

def average_gradient_local(p): p.grad.div_(dist.get_world_size())

# ---- exercise 3: a shard without padding
def my_shard_padded(n):
    w, r = dist.get_world_size(), dist.get_rank()
    idx = list(range(n)); idx += idx[:(-n) % w]
    return idx[r::w]

def my_shard_same(n): return list(range(n))

def my_shard_drop(n):
    w, r = dist.get_world_size(), dist.get_rank()
    k = n // w
    return list(range(r * k, (r + 1) * k))

# ---- exercise 4: the order of an epoch
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

# ---- exercise 5: an exact mean
def global_mean_of_means(values):
    m = torch.tensor([values.mean().item()], dtype=torch.float64)
    dist.all_reduce(m, op=dist.ReduceOp.AVG); return m.item()

def global_mean_own(values): return values.mean().item()

def global_mean_by_world(values):
    s = torch.tensor([values.sum().item()], dtype=torch.float64)
    dist.all_reduce(s); return (s / dist.get_world_size()).item()

# ---- exercise 6: accumulate with no_sync
def accumulate_every_sync(ddp_model, micro_batches, optimizer):
    optimizer.zero_grad()
    for x, y in micro_batches: (F.cross_entropy(ddp_model(x), y) / len(micro_batches)).backward()
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

def save_no_map_location(ddp_model, path):
    if dist.get_rank() == 0: torch.save(ddp_model.module.state_dict(), path)
    dist.barrier(); return torch.load(path)

# ---- exercise 9: decide together
def skip_step_local(loss): return not bool(torch.isfinite(loss))

def skip_step_min(loss):
    bad = torch.tensor([0.0 if torch.isfinite(loss) else 1.0])
    dist.all_reduce(bad, op=dist.ReduceOp.MIN); return bool(bad.item())


WRONG = [  # (exercise, wrong answer, a piece of the hint meant for that mistake)
    (1, total_images_rank0_only, 'rank 0 waited in a collective'),
    (1, total_images_own, 'each rank returned its own count'),
    (1, total_images_avg, 'that is the mean over ranks'),
    (2, average_gradient_sum, 'divides by dist.get_world_size()'),
    (2, average_gradient_local, 'weights differ'),
    (4, my_shard_padded, 'padding the shards'),
    (4, my_shard_same, 'every rank returned the same indices'),
    (4, my_shard_drop, 'are on no rank'),
    (3, epoch_indices_no_epoch, 'seed + epoch'),
    (3, epoch_indices_by_rank, 'the same permutation'),
    (3, epoch_indices_blocks, 'indices[rank::world_size]'),
    (5, global_mean_of_means, 'mean of the per-rank means'),
    (5, global_mean_own, "each rank's own mean"),
    (5, global_mean_by_world, 'the sum divided by the world size'),
    (6, accumulate_every_sync, 'wrap every backward but the last'),
    (6, accumulate_not_divided, 'times too large'),
    (6, accumulate_step_each, 'an optimizer step after every micro-batch'),
    (7, train_uneven_local, 'decide together'),
    (7, train_uneven_own_count, 'its own number of batches'),
    (8, save_everywhere, 'one file, one writer'),
    (8, save_wrapper, "start with 'module.'"),
    (8, save_no_barrier, 'before rank 0 had written it'),
    (8, save_no_map_location, 'without map_location'),
    (9, skip_step_local, 'they disagree'),
    (9, skip_step_min, 'not the MIN'),
]


@pytest.mark.parametrize('n,fn,hint', WRONG, ids=[f.__name__ for _, f, _ in WRONG])
def test_wrong_answer_gets_its_hint(n, fn, hint, capsys):
    t0 = time.monotonic()
    out = verdict(capsys, n, fn)
    assert f'Exercise {n}: not yet right' in out and hint in out, out
    assert time.monotonic() - t0 < 60, "the checker took too long: a hang, not a verdict"


def test_hang_is_named_within_seconds(capsys):
    "A collective on rank 0 only: rank 0 waits; the checker says so after its 4 s timeout."
    check(1, total_images_rank0_only)  # warm the forkserver
    capsys.readouterr()
    t0 = time.monotonic()
    out = verdict(capsys, 1, total_images_rank0_only)
    assert 'rank 0 waited in a collective that rank(s) 1 never joined' in out, out
    assert time.monotonic() - t0 < 20


def test_special_case_for_two_ranks_fails(capsys):
    out = verdict(capsys, 4, my_shard_two_only)
    assert 'Exercise 4: not yet right' in out and 'on 3 ranks' in out, out


def my_shard_two_only(n):
    if dist.get_world_size() == 2: return list(range(dist.get_rank(), n, 2))
    return list(range(n)) if dist.get_rank() == 0 else []
