#!/usr/bin/python3
"""Writes tests/testdata/layers_golden.bin: PyTorch reference values for Cortado's CPU layers.

The detection layers' references are torchvision's own SSD code (DefaultBoxGenerator,
SSDMatcher, SSD.compute_loss, SSD.postprocess_detections) run in float64, and, for Caffe SSD's
prior convention, a transcription of its prior_box_layer.cpp.

Run with Debian's python3 (the one that sees python3-torch):
    /usr/bin/python3 tests/make_golden.py
The C++ tests (tests/layers/golden_test.cpp) read the file without torch. Regenerate it only
when a case is added or changed; the file records the torch version that wrote it.

Every case is computed in float64 by torch from inputs that are exactly representable in
float32, so the C++ side can run the same case in f64 (tight tolerance) and in f32 (per-op
tolerance) from the same file.

File format (all integers little-endian):
    magic      8 bytes   b"CRTGOLD\\0"
    version    u32       1
    torch      str       torch.__version__
    note       str       free text (generator, date-independent)
    num_cases  u32
    case * num_cases:
        name        str
        type        str       the layer's registry name, e.g. "Convolution"
        phase       u8        0 = train, 1 = test
        num_settings u32
        setting * num_settings:
            key     str
            is_list u8        0 = scalar, 1 = list
            count   u32       number of items (1 for a scalar)
            item    str * count   values as text, as a YAML scalar would read
        num_tensors u32
        tensor * num_tensors:
            name    str       see below
            dtype   u8        0 = f32, 1 = f64, 4 = i32 (Cortado's DType codes)
            ndim    u32
            dims    i64 * ndim
            data    numel * sizeof(dtype) bytes, row-major
    str = u32 byte length + UTF-8 bytes (no terminator)

Tensor names: "bottom.<i>" (inputs), "param.<suffix>" and "buffer.<suffix>" (values to load
before the step, e.g. param.weight, buffer.running_mean), "top.<j>" (forward outputs),
"top_grad.<j>" (the upstream gradient fed to backward), "bottom_grad.<i>" (expected input
gradients; absent for inputs without a gradient), "param_grad.<suffix>" (expected parameter
gradients), "buffer_after.<suffix>" (buffers after the forward pass, e.g. BN running stats).
"""
import struct
import sys

import torch
import torch.nn.functional as F

MAGIC = b"CRTGOLD\0"
VERSION = 1
DTYPE_CODE = {torch.float32: 0, torch.float64: 1, torch.int32: 4}


def wstr(out, s):
    b = s.encode("utf-8")
    out.append(struct.pack("<I", len(b)))
    out.append(b)


def wtensor(out, name, t):
    t = t.detach().contiguous()
    wstr(out, name)
    out.append(struct.pack("<B", DTYPE_CODE[t.dtype]))
    out.append(struct.pack("<I", t.dim()))
    for d in t.shape:
        out.append(struct.pack("<q", d))
    out.append(t.numpy().astype(t.numpy().dtype.newbyteorder("<")).tobytes())


def f32_exact(t):
    """Rounds to float32 and back, so both f32 and f64 runs see identical inputs."""
    return t.float().double()


class Gen:
    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)

    def randn(self, *shape, scale=1.0):
        return f32_exact(torch.randn(*shape, generator=self.g, dtype=torch.float64) * scale)

    def uniform(self, lo, hi, *shape):
        return f32_exact(torch.rand(*shape, generator=self.g, dtype=torch.float64) * (hi - lo) + lo)

    def away_from_zero(self, *shape, margin=0.05):
        """Values with |x| >= margin, so kinks (ReLU at 0) are not straddled."""
        x = self.randn(*shape)
        return f32_exact(torch.where(x >= 0, x + margin, x - margin))

    def distinct(self, *shape):
        """A random permutation of well-separated values: no ties within a pooling window."""
        n = 1
        for d in shape:
            n *= d
        perm = torch.randperm(n, generator=self.g).double()
        return f32_exact((perm / n * 4.0 - 2.0).reshape(*shape))

    def labels(self, n, classes):
        return torch.randint(0, classes, (n,), generator=self.g, dtype=torch.int64).int()


CASES = []


def case(name, ltype, settings, bottoms, fn, params=None, buffers=None, phase=0, grad_inputs=None,
         seed=0, backward=True):
    """fn(bottoms, params, buffers) -> list of tops (float64, requires_grad graph)."""
    g = Gen(1000 + seed)
    params = params or {}
    buffers = buffers or {}
    leaves = []
    for i, b in enumerate(bottoms):
        if b.dtype == torch.float64 and (grad_inputs is None or i in grad_inputs):
            b.requires_grad_(True)
            leaves.append(("bottom_grad.%d" % i, b))
    for k, p in params.items():
        p.requires_grad_(True)
        leaves.append(("param_grad." + k, p))
    buffers_before = {k: v.clone() for k, v in buffers.items()}
    params_before = {k: v.detach().clone() for k, v in params.items()}
    bottoms_before = [b.detach().clone() for b in bottoms]
    tops = fn(bottoms, params, buffers)
    tensors = []
    for i, b in enumerate(bottoms_before):
        tensors.append(("bottom.%d" % i, b))
    for k, v in params_before.items():
        tensors.append(("param." + k, v))
    for k, v in buffers_before.items():
        tensors.append(("buffer." + k, v))
    for j, t in enumerate(tops):
        tensors.append(("top.%d" % j, t.detach()))
    if backward:
        top_grads = [g.randn(*t.shape) if t.dim() > 0 else f32_exact(torch.tensor(0.7, dtype=torch.float64))
                     for t in tops]
        for j, tg in enumerate(top_grads):
            tensors.append(("top_grad.%d" % j, tg))
        grads = torch.autograd.grad(tops, [leaf for _, leaf in leaves], top_grads,
                                    allow_unused=True)
        for (lname, leaf), gr in zip(leaves, grads):
            tensors.append((lname, gr if gr is not None else torch.zeros_like(leaf)))
    for k, v in buffers.items():
        tensors.append(("buffer_after." + k, v))
    CASES.append((name, ltype, phase, settings, tensors))


def conv_case(name, n, cin, h, w, cout, kernel, stride=1, pad=0, dilation=1, groups=1, bias=True,
              seed=0):
    g = Gen(seed)
    pair = lambda v: (v, v) if isinstance(v, int) else tuple(v)
    kh, kw = pair(kernel)
    x = g.randn(n, cin, h, w)
    wt = g.randn(cout, cin // groups, kh, kw, scale=0.3)
    params = {"weight": wt}
    if bias:
        params["bias"] = g.randn(cout, scale=0.3)
    settings = {"num_output": str(cout), "kernel": kernel, "stride": stride, "pad": pad,
                "dilation": dilation, "groups": str(groups), "bias": "true" if bias else "false"}
    case(name, "Convolution", settings, [x],
         lambda b, p, _: [F.conv2d(b[0], p["weight"], p.get("bias"), pair(stride), pair(pad),
                                   pair(dilation), groups)],
         params=params, seed=seed)


def build():
    # Convolution.
    conv_case("conv_3x3_pad1", 2, 3, 6, 7, 4, 3, pad=1, seed=1)
    conv_case("conv_stride2_nobias", 2, 4, 8, 8, 6, 3, stride=2, pad=1, bias=False, seed=2)
    conv_case("conv_dilation2", 2, 2, 9, 9, 3, 3, pad=2, dilation=2, seed=3)
    conv_case("conv_groups2", 2, 4, 6, 6, 6, 3, pad=1, groups=2, seed=4)
    conv_case("conv_depthwise_stride2", 2, 4, 7, 7, 4, 3, stride=2, pad=1, groups=4, seed=5)
    conv_case("conv_1x1", 3, 5, 4, 5, 3, 1, seed=6)
    conv_case("conv_1x1_stride2", 2, 4, 6, 6, 5, 1, stride=2, seed=7)
    conv_case("conv_rect", 2, 3, 7, 8, 4, [3, 2], stride=[2, 1], pad=[1, 0], dilation=[1, 2],
              seed=8)
    conv_case("conv_blocked_small_spatial", 12, 3, 5, 5, 4, 3, pad=1, seed=9)
    conv_case("conv_5x5_pad2", 2, 1, 8, 8, 4, 5, pad=2, seed=10)
    conv_case("conv_1x1_blocked", 10, 3, 3, 3, 4, 1, bias=False, seed=11)

    # InnerProduct.
    g = Gen(20)
    x, w, b = g.randn(3, 7), g.randn(5, 7, scale=0.4), g.randn(5, scale=0.4)
    case("ip_2d", "InnerProduct", {"num_output": "5"}, [x],
         lambda bt, p, _: [F.linear(bt[0], p["weight"], p["bias"])],
         params={"weight": w, "bias": b}, seed=20)
    g = Gen(21)
    x, w = g.randn(2, 3, 2, 2), g.randn(4, 12, scale=0.4)
    case("ip_4d_nobias", "InnerProduct", {"num_output": "4", "bias": "false"}, [x],
         lambda bt, p, _: [F.linear(bt[0].flatten(1), p["weight"])],
         params={"weight": w}, seed=21)

    # BatchNorm.
    def bn_case(name, shape, settings, phase, affine=True, momentum=0.1, eps=1e-5, training=True,
                seed=0):
        g = Gen(seed)
        x = g.randn(*shape, scale=1.5) + 0.5
        x = f32_exact(x)
        c = shape[1]
        params = {"weight": g.uniform(0.5, 1.5, c), "bias": g.randn(c, scale=0.3)} if affine else {}
        buffers = {"running_mean": g.randn(c, scale=0.2), "running_var": g.uniform(0.5, 2.0, c)}

        def fn(bt, p, buf):
            return [F.batch_norm(bt[0], buf["running_mean"], buf["running_var"], p.get("weight"),
                                 p.get("bias"), training, momentum, eps)]
        case(name, "BatchNorm", settings, [x], fn, params=params, buffers=buffers, phase=phase,
             seed=seed)

    bn_case("bn_train_4d", (3, 4, 3, 5), {}, 0, seed=30)
    bn_case("bn_train_2d", (6, 5), {}, 0, seed=31)
    bn_case("bn_train_noaffine", (4, 3, 2, 3), {"affine": "false", "momentum": "0.3", "eps": "0.001"},
            0, affine=False, momentum=0.3, eps=1e-3, seed=32)
    bn_case("bn_eval", (3, 4, 3, 3), {}, 1, training=False, seed=33)
    bn_case("bn_global_stats_in_train", (3, 4, 2, 2), {"use_global_stats": "true"}, 0,
            training=False, seed=34)

    # ReLU.
    g = Gen(40)
    case("relu", "ReLU", {}, [g.away_from_zero(2, 3, 4, 5)], lambda b, p, _: [F.relu(b[0])], seed=40)
    g = Gen(41)
    case("relu_leaky", "ReLU", {"negative_slope": "0.1"}, [g.away_from_zero(3, 17)],
         lambda b, p, _: [F.leaky_relu(b[0], 0.1)], seed=41)

    # Pooling.
    def pool_case(name, shape, settings, fn, seed):
        g = Gen(seed)
        case(name, "Pooling", settings, [g.distinct(*shape)], lambda b, p, _: [fn(b[0])], seed=seed)

    pool_case("maxpool_2x2", (2, 3, 8, 8), {"pool": "max", "kernel": "2", "stride": "2"},
              lambda x: F.max_pool2d(x, 2, 2), 50)
    pool_case("maxpool_3x3_s2_p1_ceil", (2, 2, 7, 7),
              {"pool": "max", "kernel": "3", "stride": "2", "pad": "1", "ceil_mode": "true"},
              lambda x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True), 51)
    pool_case("maxpool_ceil_last_window_rule", (2, 2, 5, 5),
              {"pool": "max", "kernel": "2", "stride": "2", "pad": "1", "ceil_mode": "true"},
              lambda x: F.max_pool2d(x, 2, 2, 1, ceil_mode=True), 52)
    pool_case("avepool_3x3_s2_p1", (2, 2, 7, 7),
              {"pool": "ave", "kernel": "3", "stride": "2", "pad": "1"},
              lambda x: F.avg_pool2d(x, 3, 2, 1), 53)
    pool_case("avepool_exclude_pad", (2, 2, 7, 7),
              {"pool": "ave", "kernel": "3", "stride": "2", "pad": "1", "count_include_pad": "false"},
              lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False), 54)
    pool_case("avepool_ceil", (2, 2, 8, 8),
              {"pool": "ave", "kernel": "3", "stride": "2", "pad": "1", "ceil_mode": "true"},
              lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True), 55)
    pool_case("avepool_ceil_exclude_pad", (2, 2, 8, 8),
              {"pool": "ave", "kernel": "3", "stride": "2", "pad": "1", "ceil_mode": "true",
               "count_include_pad": "false"},
              lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False), 56)
    pool_case("global_ave", (3, 4, 5, 6), {"pool": "ave", "global": "true"},
              lambda x: F.adaptive_avg_pool2d(x, 1), 57)
    pool_case("global_max", (3, 4, 5, 6), {"pool": "max", "global": "true"},
              lambda x: F.adaptive_max_pool2d(x, 1), 58)
    pool_case("maxpool_rect", (2, 2, 6, 9), {"pool": "max", "kernel": [2, 3], "stride": [1, 2]},
              lambda x: F.max_pool2d(x, (2, 3), (1, 2)), 59)

    # Eltwise.
    g = Gen(60)
    xs = [g.randn(2, 3, 4) for _ in range(2)]
    case("eltwise_sum", "Eltwise", {}, xs, lambda b, p, _: [b[0] + b[1]], seed=60)
    g = Gen(61)
    xs = [g.randn(2, 3, 4) for _ in range(3)]
    case("eltwise_sum_coeffs", "Eltwise", {"operation": "sum", "coeffs": ["0.5", "-1", "2"]}, xs,
         lambda b, p, _: [0.5 * b[0] - b[1] + 2 * b[2]], seed=61)
    g = Gen(62)
    xs = [g.randn(2, 3, 4) for _ in range(3)]
    case("eltwise_prod", "Eltwise", {"operation": "prod"}, xs,
         lambda b, p, _: [b[0] * b[1] * b[2]], seed=62)
    g = Gen(63)
    xs = [g.randn(2, 3, 4) for _ in range(3)]
    case("eltwise_max", "Eltwise", {"operation": "max"}, xs,
         lambda b, p, _: [torch.stack(b).max(0).values], seed=63)

    # Concat.
    g = Gen(70)
    xs = [g.randn(2, c, 3, 2) for c in (1, 3, 2)]
    case("concat_axis1", "Concat", {}, xs, lambda b, p, _: [torch.cat(b, 1)], seed=70)
    g = Gen(71)
    xs = [g.randn(n, 3, 2) for n in (2, 1)]
    case("concat_axis0", "Concat", {"axis": "0"}, xs, lambda b, p, _: [torch.cat(b, 0)], seed=71)
    g = Gen(72)
    xs = [g.randn(2, 3, w) for w in (2, 4)]
    case("concat_axis_last", "Concat", {"axis": "-1"}, xs, lambda b, p, _: [torch.cat(b, -1)],
         seed=72)

    # Flatten.
    g = Gen(80)
    case("flatten_axis1", "Flatten", {}, [g.randn(2, 3, 4, 5)],
         lambda b, p, _: [torch.flatten(b[0], 1)], seed=80)
    g = Gen(81)
    case("flatten_axis2", "Flatten", {"axis": "2"}, [g.randn(2, 3, 4, 5)],
         lambda b, p, _: [torch.flatten(b[0], 2)], seed=81)

    # SoftmaxWithLoss.
    for name, eps, seed in (("softmax_loss", 0.0, 90), ("softmax_loss_smoothing", 0.1, 91)):
        g = Gen(seed)
        x = g.randn(5, 7, scale=2.0)
        y = g.labels(5, 7)
        settings = {"label_smoothing": str(eps)} if eps else {}
        case(name, "SoftmaxWithLoss", settings, [x, y],
             lambda b, p, _, eps=eps: [F.cross_entropy(b[0], b[1].long(), label_smoothing=eps)],
             grad_inputs=[0], seed=seed)
    g = Gen(92)
    x = g.randn(4, 3) + f32_exact(torch.tensor([0.0, 0.0, 40.0], dtype=torch.float64))
    case("softmax_loss_large_logits", "SoftmaxWithLoss", {}, [f32_exact(x * 20), g.labels(4, 3)],
         lambda b, p, _: [F.cross_entropy(b[0], b[1].long())], grad_inputs=[0], seed=92)

    # Accuracy (forward only). Random scores have no ties, so topk membership is exact.
    for name, k, seed in (("accuracy_top1", 1, 100), ("accuracy_top3", 3, 101)):
        g = Gen(seed)
        x = g.randn(20, 6)
        y = g.labels(20, 6)

        def acc(b, p, _, k=k):
            top = b[0].topk(k, 1).indices
            return [(top == b[1].long()[:, None]).any(1).double().mean()]
        case(name, "Accuracy", {"top_k": str(k)}, [x, y], acc, grad_inputs=[], seed=seed,
             backward=False)

    # Dropout in the test phase is the identity.
    g = Gen(110)
    case("dropout_test_phase", "Dropout", {"ratio": "0.3"}, [g.randn(3, 8)],
         lambda b, p, _: [F.dropout(b[0], 0.3, training=False)], phase=1, seed=110)

    # Split: every top is the bottom; the bottom's gradient is the sum of the top gradients.
    g = Gen(120)
    case("split_3", "Split", {}, [g.randn(2, 3, 4)],
         lambda b, p, _: [b[0] * 1.0, b[0] * 1.0, b[0] * 1.0], seed=120)

    prior_box_cases()
    detection_cases()


def prior_box_cases():
    """PriorBox: torchvision's DefaultBoxGenerator (run in float64) and an independent transcription
    of Caffe SSD's prior_box_layer.cpp. Only the feature maps' H and W are read."""
    from torchvision.models.detection.anchor_utils import DefaultBoxGenerator

    def torchvision_priors(ratios, maps, image_hw, **kwargs):
        gen = DefaultBoxGenerator(ratios, **kwargs)
        gen._wh_pairs = gen._generate_wh_pairs(len(ratios), dtype=torch.float64)
        saved = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)  # torchvision's arange + 0.5 in float64 too
        try:
            return gen._grid_default_boxes(maps, image_hw, dtype=torch.float64)
        finally:
            torch.set_default_dtype(saved)

    def fmap(h, w):
        return torch.zeros(1, 1, h, w, dtype=torch.float64)

    # Scales spread from min_ratio to max_ratio, sizes from the grid, clip (the defaults).
    maps = [(4, 4), (2, 2), (1, 1)]
    pri = torchvision_priors([[2], [2, 3], [2]], maps, (32, 32))
    case("priorbox_torchvision_defaults", "PriorBox",
         {"aspect_ratios": ["2", "2", "3", "2"], "aspect_ratios_per_map": ["1", "2", "1"]},
         [fmap(*m) for m in maps] + [fmap(32, 32)], lambda b, p, _: [pri], backward=False)
    # Explicit scales (one above 1, unclipped), steps, a non-square image given as image_size.
    maps = [(5, 4), (3, 2)]
    pri = torchvision_priors([[2, 3], [2]], maps, (50, 40), scales=[0.2, 0.5, 1.1], steps=[10, 20],
                             clip=False)
    case("priorbox_torchvision_steps_noclip", "PriorBox",
         {"aspect_ratios": ["2", "3", "2"], "aspect_ratios_per_map": ["2", "1"],
          "scales": ["0.2", "0.5", "1.1"], "steps": ["10", "20"], "clip": "false",
          "image_size": ["50", "40"]},
         [fmap(*m) for m in maps], lambda b, p, _: [pri], backward=False)

    def caffe_priors(maps, image_hw, min_sizes, max_sizes, ratios, flip, clip, steps=None,
                     offset=0.5):
        img_h, img_w = image_hw
        rows = []
        for k, (fh, fw) in enumerate(maps):
            ars = [1.0]
            for r in ratios[k]:
                if any(abs(r - a) < 1e-6 for a in ars):
                    continue
                ars.append(r)
                if flip:
                    ars.append(1.0 / r)
            step_w = steps[k] if steps else img_w / fw
            step_h = steps[k] if steps else img_h / fh
            for h in range(fh):
                for w in range(fw):
                    cx, cy = (w + offset) * step_w, (h + offset) * step_h
                    sizes = [(min_sizes[k], min_sizes[k])]
                    if max_sizes:
                        s = (min_sizes[k] * max_sizes[k]) ** 0.5
                        sizes.append((s, s))
                    for a in ars[1:]:
                        sizes.append((min_sizes[k] * a ** 0.5, min_sizes[k] / a ** 0.5))
                    for bw, bh in sizes:
                        box = [(cx - bw / 2.0) / img_w, (cy - bh / 2.0) / img_h,
                               (cx + bw / 2.0) / img_w, (cy + bh / 2.0) / img_h]
                        if clip:
                            box = [min(max(v, 0.0), 1.0) for v in box]
                        rows.append([(box[0] + box[2]) / 2, (box[1] + box[3]) / 2,
                                     box[2] - box[0], box[3] - box[1]])
        return torch.tensor(rows, dtype=torch.float64)

    maps = [(4, 4), (2, 2)]
    pri = caffe_priors(maps, (32, 32), [6, 14], [14, 24], [[2], [2, 3]], True, False)
    case("priorbox_caffe", "PriorBox",
         {"convention": "caffe", "min_sizes": ["6", "14"], "max_sizes": ["14", "24"],
          "aspect_ratios": ["2", "2", "3"], "aspect_ratios_per_map": ["1", "2"]},
         [fmap(*m) for m in maps] + [fmap(32, 32)], lambda b, p, _: [pri], backward=False)
    maps = [(3, 4), (2, 2)]
    pri = caffe_priors(maps, (30, 40), [9, 20], None, [[2, 3], [2, 2]], False, True, steps=[10, 15],
                       offset=0.4)
    case("priorbox_caffe_clip_steps", "PriorBox",
         {"convention": "caffe", "min_sizes": ["9", "20"], "aspect_ratios": ["2", "3", "2", "2"],
          "aspect_ratios_per_map": ["2", "2"], "flip": "false", "clip": "true",
          "steps": ["10", "15"], "offset": "0.4"},
         [fmap(*m) for m in maps] + [fmap(30, 40)], lambda b, p, _: [pri], backward=False)


def detection_cases():
    """L2Norm, Permute, Reshape, and MultiBoxLoss / DetectionOutput against torchvision's SSD code
    (compute_loss, SSDMatcher and postprocess_detections driven directly), in float64."""
    import types

    from torchvision.models.detection import _utils as det_utils
    from torchvision.models.detection.anchor_utils import DefaultBoxGenerator
    from torchvision.models.detection.ssd import SSD
    from torchvision.ops import boxes as box_ops

    g = Gen(130)
    x, w = g.randn(2, 6, 3, 4), g.uniform(5.0, 25.0, 6)
    case("l2norm", "L2Norm", {}, [x],
         lambda b, p, _: [p["weight"].view(1, -1, 1, 1) * F.normalize(b[0])],
         params={"weight": w}, seed=130)
    g = Gen(131)
    case("l2norm_2d", "L2Norm", {"eps": "0.001"}, [g.randn(5, 7)],
         lambda b, p, _: [p["weight"].view(1, -1) * F.normalize(b[0], eps=1e-3)],
         params={"weight": g.uniform(0.5, 2.0, 7)}, seed=131)
    g = Gen(132)
    case("permute_nhwc", "Permute", {"order": ["0", "2", "3", "1"]}, [g.randn(2, 3, 4, 5)],
         lambda b, p, _: [b[0].permute(0, 2, 3, 1)], seed=132)
    g = Gen(133)
    case("permute_any", "Permute", {"order": ["3", "1", "0", "2"]}, [g.randn(2, 3, 4, 5)],
         lambda b, p, _: [b[0].permute(3, 1, 0, 2)], seed=133)
    g = Gen(134)
    case("reshape", "Reshape", {"shape": ["0", "-1", "5"]}, [g.randn(2, 3, 4, 5)],
         lambda b, p, _: [b[0].reshape(2, -1, 5)], seed=134)

    # Priors of two maps (4x4 with ratios [2], 2x2 with [2, 3]): 88, rounded to float32 so an f32
    # run sees the same boxes.
    gen = DefaultBoxGenerator([[2], [2, 3]])
    gen._wh_pairs = gen._generate_wh_pairs(2, dtype=torch.float64)
    priors = f32_exact(gen._grid_default_boxes([(4, 4), (2, 2)], (32, 32), dtype=torch.float64))
    anchors = torch.cat([priors[:, :2] - 0.5 * priors[:, 2:], priors[:, :2] + 0.5 * priors[:, 2:]], 1)
    num_priors, classes = priors.shape[0], 4

    # Ground truth: image 0 has three boxes, image 1 one (difficult: trained on all the same),
    # image 2 none; a row of -1s (Caffe's "no box") is skipped.
    g = Gen(140)
    rows = []
    for item, count in ((0, 3), (1, 1)):
        for j in range(count):
            c = g.uniform(0.2, 0.8, 2)
            s = g.uniform(0.15, 0.6, 2)
            label = int(torch.randint(1, classes, (1,), generator=g.g))
            rows.append([item, label, j, c[0] - s[0] / 2, c[1] - s[1] / 2, c[0] + s[0] / 2,
                         c[1] + s[1] / 2, 1.0 if item == 1 else 0.0])
    rows.append([-1.0] * 8)
    gt = f32_exact(torch.tensor(rows, dtype=torch.float64)).view(1, 1, -1, 8)
    logits = g.randn(3, num_priors, classes, scale=1.5)
    regression = g.randn(3, num_priors, 4)

    def multibox(b, p, _):
        fake = types.SimpleNamespace(box_coder=det_utils.BoxCoder(weights=(10.0, 10.0, 5.0, 5.0)),
                                     neg_to_pos_ratio=3.0)
        matcher = det_utils.SSDMatcher(0.5)
        table = b[3].view(-1, 8)
        targets, matched = [], []
        for item in range(b[0].shape[0]):
            mine = table[table[:, 0] == item]
            targets.append({"boxes": mine[:, 3:7], "labels": mine[:, 1].long()})
            if mine.shape[0] == 0:
                matched.append(torch.full((num_priors,), -1, dtype=torch.int64))
            else:
                matched.append(matcher(box_ops.box_iou(mine[:, 3:7], anchors)))
            # Cortado mines min(3 x positives, negatives); torchvision's rank rule agrees while
            # 4 x positives <= priors, which this case keeps.
            assert 4 * int((matched[-1] >= 0).sum()) <= num_priors
        losses = SSD.compute_loss(fake, targets, {"cls_logits": b[0], "bbox_regression": b[1]},
                                  [anchors] * b[0].shape[0], matched)
        return [losses["bbox_regression"] + losses["classification"]]

    case("multibox_loss", "MultiBoxLoss", {}, [logits, regression, priors, gt], multibox,
         grad_inputs=[0, 1], seed=140)

    g = Gen(150)
    logits = g.randn(2, num_priors, classes, scale=2.0)
    regression = g.randn(2, num_priors, 4, scale=0.5)

    def detect(b, p, _):
        fake = types.SimpleNamespace(box_coder=det_utils.BoxCoder(weights=(10.0, 10.0, 5.0, 5.0)),
                                     score_thresh=0.05, topk_candidates=10, nms_thresh=0.45,
                                     detections_per_img=12)
        dets = SSD.postprocess_detections(fake, {"cls_logits": b[0], "bbox_regression": b[1]},
                                          [anchors] * b[0].shape[0], [(1, 1)] * b[0].shape[0])
        out = []
        for item, d in enumerate(dets):
            for box, score, label in zip(d["boxes"], d["scores"], d["labels"]):
                out.append([float(item), float(label), float(score)] + [float(v) for v in box])
        return [torch.tensor(out, dtype=torch.float64).view(1, 1, -1, 7)]

    case("detection_output", "DetectionOutput",
         {"confidence_threshold": "0.05", "nms_threshold": "0.45", "top_k": "10",
          "keep_top_k": "12"}, [logits, regression, priors], detect, phase=1, backward=False,
         seed=150)


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    out_path = sys.argv[1] if len(sys.argv) > 1 else "tests/testdata/layers_golden.bin"
    build()
    out = [MAGIC, struct.pack("<I", VERSION)]
    wstr(out, torch.__version__)
    import torchvision
    wstr(out, "tests/make_golden.py: float64 torch reference for Cortado's CPU layers "
              "(torchvision %s for the detection layers)" % torchvision.__version__)
    out.append(struct.pack("<I", len(CASES)))
    for name, ltype, phase, settings, tensors in CASES:
        wstr(out, name)
        wstr(out, ltype)
        out.append(struct.pack("<B", phase))
        out.append(struct.pack("<I", len(settings)))
        for key, value in settings.items():
            wstr(out, key)
            if isinstance(value, (list, tuple)):
                items, is_list = [str(v) for v in value], 1
            else:
                items, is_list = [str(value)], 0
            out.append(struct.pack("<BI", is_list, len(items)))
            for item in items:
                wstr(out, item)
        out.append(struct.pack("<I", len(tensors)))
        for tname, t in tensors:
            wtensor(out, tname, t)
    data = b"".join(out)
    with open(out_path, "wb") as f:
        f.write(data)
    print("wrote %s: %d cases, %d bytes (torch %s)" % (out_path, len(CASES), len(data),
                                                        torch.__version__))


if __name__ == "__main__":
    main()
