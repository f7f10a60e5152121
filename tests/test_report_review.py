"""Review fix (issue 40): each row's MFU is against its own peak; the footnote names every peak."""
from cifar_ddp_tut.report import bench_table, project


def test_footnote_names_each_rows_peak():
    base = dict(nprocs=1, per_rank_batch=16, eval_images_per_s=2000.0, startup_s=20.0,
                warmup_extra_s=5.0, eval_extra_s=1.0, checkpoint_s=0.5, gflop_per_image=24.0,
                steps=40, peak_mem_gb=1.5, model='resnet50', image_size=224, global_batch=16,
                device='cuda', launches=1, spread_pct=0.0, device_name='H100')
    rows = project([dict(base, recipe='original', images_per_s=250.0, ms_per_step=64.0,
                         peak_tflops=495.0, peak_dtype='tf32'),
                    dict(base, recipe='fast', images_per_s=500.0, ms_per_step=32.0,
                         peak_tflops=989.0, peak_dtype='bf16')])
    text = bench_table(dict(hardware=dict(label='H100'), warmup=2, min_steps_per_queued=20,
                            results=rows))
    assert '495 TFLOP/s (tf32)' in text and '989 TFLOP/s (bf16)' in text, text[-600:]
