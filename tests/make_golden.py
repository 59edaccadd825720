#!/usr/bin/python3
"""Writes tests/testdata/layers_golden.bin: PyTorch reference values for Cortado's CPU layers.

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


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    out_path = sys.argv[1] if len(sys.argv) > 1 else "tests/testdata/layers_golden.bin"
    build()
    out = [MAGIC, struct.pack("<I", VERSION)]
    wstr(out, torch.__version__)
    wstr(out, "tests/make_golden.py: float64 torch reference for Cortado's CPU layers")
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
