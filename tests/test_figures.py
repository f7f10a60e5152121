"The course's figures label what their inputs hold, not what today's callers happen to pass."
import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
from cifar_ddp_tut.lessons import figures


def _shown(monkeypatch):
    shown = []
    monkeypatch.setattr(plt, 'show', lambda: shown.append(plt.gcf()))
    return shown


def test_plot_ring_any_world_size(monkeypatch):
    "3 ranks: 2(n-1) steps + the start, a 2 x 3 grid whose last panel is the text, '3 tensors'."
    shown, n = _shown(monkeypatch), 3
    states = [(f"step {i}", [[1.0] * n] * n, [[{r} for _ in range(n)] for r in range(n)], set())
              for i in range(2 * (n - 1) + 1)]
    figures.plot_ring(states)
    fig = shown[-1]
    assert 'of 3 tensors' in fig._suptitle.get_text() and len(fig.axes) == 2 * n
    plt.close('all')


def test_plot_lr_runs_labels_from_results(monkeypatch):
    "Batches come from the runs' global_batch, learning rates from `lrs`."
    shown = _shown(monkeypatch)
    run = lambda gb: dict(loss=[1.0, 0.5], acc=[0.1, 0.2], global_batch=gb)
    res = {n: {'a: global 64': run(128), 'b: same lr': run(8 * n), 'b: lr x N, warmup': run(8 * n)}
           for n in (1, 2)}
    figures.plot_lr_runs(res, 'title', lrs=(0.1, 0.01))
    titles = [ax.get_title() for ax in shown[-1].axes]
    assert titles[0] == '(a) fixed global batch 128, lr 0.1' and titles[1].startswith('(b) 8 a rank')
    legend = [t.get_text() for t in shown[-1].axes[1].get_legend().get_texts()]
    assert legend == ['N=1, global 8, lr 0.01', 'N=2, global 16, lr 0.01', 'N=2, global 16, lr 0.02']
    plt.close('all')
