"""Train ResNet-18 on CIFAR-10: one of the three steps of nbs/course/01_first_ddp.ipynb."""
import argparse, os, time
import torch, torch.nn as nn, torchvision
import torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
from torchvision import transforms as T
from cifar_ddp_tut.data import open_cifar10  # torchvision's CIFAR10, or generated files like it


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument('--data', default='data', help='the folder that holds cifar-10-batches-py')
    p.add_argument('--epochs', type=int, default=2)
    p.add_argument('--steps', type=int, default=None, help='at most this many steps an epoch')
    p.add_argument('--batch_size', type=int, default=32, help='images per optimizer step')
    p.add_argument('--lr', type=float, default=0.005)
    p.add_argument('--norm', default='batch', choices=['batch', 'group'])
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--out', default='model.pt')
    p.add_argument('--world_size', type=int, default=2, help='processes to start')
    p.add_argument('--port', type=int, default=29500, help='a free TCP port for rank 0')
    return p.parse_args()


def main(rank, world_size, args):
    os.environ['MASTER_ADDR'], os.environ['MASTER_PORT'] = '127.0.0.1', str(args.port)
    backend = 'nccl' if torch.cuda.is_available() else 'gloo'
    device = torch.device(f'cuda:{rank}' if torch.cuda.is_available() else 'cpu')
    if device.type == 'cuda': torch.cuda.set_device(device)  # this process's GPU, before NCCL
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    tfm = T.Compose([T.ToTensor(), T.Normalize((0.49, 0.48, 0.45), (0.25, 0.24, 0.26))])
    train_ds = open_cifar10(args.data, train=True, transform=tfm)
    sampler = DistributedSampler(train_ds, num_replicas=world_size, rank=rank, seed=args.seed)
    loader = DataLoader(train_ds, batch_size=args.batch_size // world_size,
                        sampler=sampler, drop_last=True)
    torch.manual_seed(args.seed)  # the same initial weights in every run
    norm = nn.BatchNorm2d if args.norm == 'batch' else (lambda c: nn.GroupNorm(32, c))
    model = torchvision.models.resnet18(num_classes=10, norm_layer=norm).to(device)
    model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # a new order each epoch, the same in every run
        t0, losses = time.time(), []
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = loss_fn(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if len(losses) == args.steps: break
        line = (f'epoch {epoch}: loss {sum(losses) / len(losses):.6f} '
                f'({len(losses)} steps of {x.shape[0]} images, {time.time() - t0:.1f} s)')
        if rank == 0: print(line)
    psum = sum(p.detach().double().sum() for p in model.parameters())
    sums = [torch.zeros_like(psum) for _ in range(world_size)]
    dist.all_gather(sums, psum)
    if rank == 0:
        print(f'param_sum {psum.item():.10f} on every rank: {[s.item() for s in sums]}')
        torch.save(model.module.state_dict(), args.out)
    dist.destroy_process_group()


if __name__ == '__main__':
    args = parse_args()
    mp.spawn(main, args=(args.world_size, args), nprocs=args.world_size)
