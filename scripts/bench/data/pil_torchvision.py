#!/usr/bin/env python3
"""The PIL + torchvision side of scripts/bench/data.sh, and its helpers.

  make    --src DIR --out DIR       ImageNet-sized JPEG photos: every *.jpg in DIR, as RGB,
                                    resized to 500x375 (375x500 when portrait), quality 90
  bench   --images DIR --procs N --seconds S [--val]
                                    decode + augment images/s with PIL and torchvision.transforms,
                                    N single-threaded processes (one per core), as a PyTorch
                                    DataLoader with N workers would run them
  report  --cortado FILE --torch FILE [--cortado-val FILE --torch-val FILE]
                                    the side-by-side table and the per-core ratio

Run with Debian's /usr/bin/python3 (python3-pil, python3-torch, python3-torchvision).
"""
import glob
import json
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import benchlib  # noqa: E402

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def make(args):
    from PIL import Image
    os.makedirs(args.out, exist_ok=True)
    sources = benchlib.source_photos(args.src)
    for path in sources:
        im = Image.open(path).convert("RGB")
        size = (500, 375) if im.width >= im.height else (375, 500)
        im = im.resize(size, Image.BICUBIC)
        name = os.path.splitext(os.path.basename(path))[0] + ".JPEG"
        im.save(os.path.join(args.out, name), quality=90)
    print("wrote %d JPEGs to %s" % (len(sources), args.out))


def transform(val):
    import torchvision.transforms as T
    if val:
        return T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN, STD)])
    return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                      T.Normalize(MEAN, STD)])


def worker(files, seconds, val, start, results):
    import torch
    from PIL import Image
    torch.set_num_threads(1)
    tf = transform(val)

    def load(path):  # torchvision.datasets.folder.pil_loader
        with open(path, "rb") as f:
            return Image.open(f).convert("RGB")

    for path in files:  # warm up: imports, page cache
        tf(load(path))
    start.wait()
    count, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for path in files:
            tf(load(path))
            count += 1
    results.put((count, time.perf_counter() - t0))


def bench(args):
    files = sorted(glob.glob(os.path.join(args.images, "*.JPEG")))
    if not files:
        sys.exit("no *.JPEG in %s" % args.images)
    ctx = mp.get_context("fork")
    start, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(files, args.seconds, args.val, start, results))
             for _ in range(args.procs)]
    for p in procs:
        p.start()
    time.sleep(1.0)  # let every process finish its warm-up
    start.set()
    counts = [results.get() for _ in procs]
    for p in procs:
        p.join()
    rate = sum(c / t for c, t in counts)
    import PIL
    import torch
    import torchvision
    print(json.dumps({
        "transform": "val" if args.val else "train", "procs": args.procs,
        "images": sum(c for c, _ in counts), "images_per_s": round(rate, 1),
        "images_per_s_per_proc": round(rate / args.procs, 1),
        "versions": {"PIL": PIL.__version__, "torch": torch.__version__,
                     "torchvision": torchvision.__version__}}))


def report(args):
    def load(path):
        with open(path) as f:
            return json.loads(f.read().strip().splitlines()[-1])

    rows = [("train", load(args.cortado), load(args.torch))]
    if args.cortado_val and args.torch_val:
        rows.append(("val", load(args.cortado_val), load(args.torch_val)))
    ours0, theirs0 = rows[0][1], rows[0][2]
    print("decode + augment to float32 CHW, ImageNet transforms, %d JPEGs ~500x375 q90" %
          args.images)
    print("  train: RandomResizedCrop(224) + flip + normalize; val: Resize(256) + CenterCrop(224)"
          " + normalize")
    print("  Cortado: libjpeg-turbo (region + DCT-scaled decode) + OpenCV, %d loader threads" %
          ours0["threads"])
    print("  PyTorch: PIL %s + torchvision %s, %d processes x 1 thread" % (
        theirs0["versions"]["PIL"], theirs0["versions"]["torchvision"], theirs0["procs"]))
    def spread(d):
        if "min_images_per_s" not in d:
            return "%.1f" % d["images_per_s"]
        return "%.1f [%.1f, %.1f]" % (d["images_per_s"], d["min_images_per_s"],
                                      d["max_images_per_s"])

    rounds = ours0.get("rounds", 1)
    print("median of %d round(s) [min, max]" % rounds)
    print("| transform | Cortado img/s | PIL+torchvision img/s | Cortado img/s/core | "
          "PIL+torchvision img/s/core | per-core ratio |")
    print("|---|---|---|---|---|---|")
    summary = {}
    for name, ours, theirs in rows:
        per_ours = ours["images_per_s"] / ours["threads"]
        per_theirs = theirs["images_per_s"] / theirs["procs"]
        ratio = per_ours / per_theirs
        summary[name] = round(ratio, 2)
        print("| %s | %s | %s | %.1f | %.1f | %.2fx |" % (
            name, spread(ours), spread(theirs), per_ours, per_theirs, ratio))
    print("per-core ratio (train): %.2fx (goal: >= 1.5x)" % summary["train"])
    print(json.dumps({"per_core_ratio": summary}))


def main():
    ap, sub, _ = benchlib.photo_commands(__doc__, "cmd")
    b = sub.add_parser("bench")
    b.add_argument("--images", required=True)
    b.add_argument("--procs", type=int, default=os.cpu_count())
    b.add_argument("--seconds", type=float, default=10)
    b.add_argument("--val", action="store_true")
    r = sub.add_parser("report")
    r.add_argument("--cortado", required=True)
    r.add_argument("--torch", required=True)
    r.add_argument("--cortado-val")
    r.add_argument("--torch-val")
    r.add_argument("--images", type=int, default=0)
    args = ap.parse_args()
    {"make": make, "bench": bench, "report": report}[args.cmd](args)


if __name__ == "__main__":
    main()
