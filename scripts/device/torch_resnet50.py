#!/usr/bin/env python3
"""The PyTorch side of the device check (scripts/device/check.sh run resnet50): ResNet-50
training on synthetic data in PyTorch eager mode, channels-last, on one GPU.

  torch_resnet50.py [--batch 256] [--precision fp32|tf32|fp16|bf16]... [--warmup 10] [--iters 30]
  torch_resnet50.py --cpu-dry-run     the same code on the CPU, batch 2, one step each

Each step: forward, cross-entropy, backward, SGD with momentum 0.9 (PyTorch's recipe for
ResNet-50), on one random batch (224x224) that stays on the GPU, so no data loading is timed.
Precisions:
  fp32   float32, TF32 off for convolutions and matrix products
  tf32   float32 with TF32 tensor cores (cuDNN and cuBLAS)
  fp16   torch.autocast float16 with a GradScaler (AMP)
  bf16   torch.autocast bfloat16 (AMP; no scaler needed)
cudnn.benchmark is on (eager PyTorch's fast setting; its search runs in the warm-up steps).
Prints one JSON line per precision: img_per_s over the timed steps, peak_memory_bytes
(torch.cuda.max_memory_allocated: tensors the caching allocator handed out, not its reserve),
and the versions and GPU. Run one precision per process for peak memory that is its own.
"""
import argparse
import contextlib
import json
import time

import torch
import torchvision

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")


def set_tf32(enabled):
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


def measure(precision, batch, warmup, iters, device):
    torch.manual_seed(0)
    on_gpu = device.type == "cuda"
    if on_gpu:
        set_tf32(precision == "tf32")
        torch.backends.cudnn.benchmark = True
    model = torchvision.models.resnet50(num_classes=1000).to(device)
    model = model.to(memory_format=torch.channels_last)
    model.train()
    x = torch.randn(batch, 3, 224, 224, device=device).to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device=device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    # The CPU's autocast in old PyTorch (the dry run's 1.13) takes bf16 only.
    use_amp = amp_dtype is not None and (on_gpu or amp_dtype == torch.bfloat16)
    scaler_enabled = precision == "fp16" and on_gpu
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        scaler = torch.amp.GradScaler(device.type, enabled=scaler_enabled)
    else:
        scaler = torch.cuda.amp.GradScaler(enabled=scaler_enabled)

    def step():
        autocast = (torch.autocast(device.type, dtype=amp_dtype) if use_amp
                    else contextlib.nullcontext())
        with autocast:
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    def sync():
        if on_gpu:
            torch.cuda.synchronize(device)

    if on_gpu:
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(warmup):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        loss = step()
    sync()
    seconds = time.perf_counter() - start
    result = {
        "framework": "pytorch",
        "model": "resnet50",
        "batch": batch,
        "precision": precision,
        "memory_format": "channels_last",
        "amp": use_amp,
        "img_per_s": round(iters * batch / seconds, 2),
        "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if on_gpu else None,
        "warmup": warmup,
        "iters": iters,
        "loss": float(loss),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version() if on_gpu else None,
        "device": torch.cuda.get_device_name(device) if on_gpu else "cpu",
    }
    if not on_gpu:
        result["dry_run"] = True
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--precision", action="append", choices=PRECISIONS,
                    help="repeat for several (default: all four)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--cpu-dry-run", action="store_true",
                    help="run on the CPU with batch 2, one warm-up and one timed step (checks "
                         "the script where there is no GPU)")
    args = ap.parse_args()
    precisions = args.precision or list(PRECISIONS)
    if args.cpu_dry_run:
        device, args.batch, args.warmup, args.iters = torch.device("cpu"), 2, 1, 1
    else:
        if not torch.cuda.is_available():
            raise SystemExit("torch_resnet50.py: no CUDA device (use --cpu-dry-run to check the "
                             "script on the CPU)")
        device = torch.device("cuda", 0)
    for precision in precisions:
        print(json.dumps(measure(precision, args.batch, args.warmup, args.iters, device)),
              flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
