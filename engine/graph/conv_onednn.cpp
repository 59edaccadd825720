#include "engine/graph/conv_onednn.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <unordered_map>

#ifdef CORTADO_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

#include "cortado/dist/codec.h"
#include "engine/base/cpu_isa.h"
#include "engine/base/error.h"
#include "engine/base/thread_pool.h"
#include "engine/graph/onednn_runtime.h"

namespace cortado {

#ifdef CORTADO_HAVE_ONEDNN
namespace {

using dnnl::memory;
using onednn::Engine;
using onednn::ThreadScratchpad;
using onednn::ThreadStream;
using Tag = memory::format_tag;
using DataType = memory::data_type;

// Elements of f32 staging per thread on the widened path (16 MB): a few images at a time.
constexpr int64_t kStagingElements = int64_t{4} << 20;

bool IsReference(const char* impl) { return std::string(impl).rfind("ref", 0) == 0; }

dist::CodecKind LowKind(DType dtype) {
  return dtype == DType::kBF16 ? dist::CodecKind::kBF16 : dist::CodecKind::kF16;
}

}  // namespace

// The primitives of one number of images per call.
struct Primitives {
  dnnl::convolution_forward::primitive_desc fwd_pd;
  dnnl::convolution_forward fwd;
  dnnl::convolution_backward_data::primitive_desc bwd_data_pd;
  dnnl::convolution_backward_data bwd_data;
  dnnl::convolution_backward_weights::primitive_desc bwd_weights_pd;
  dnnl::convolution_backward_weights bwd_weights;
};

struct ChannelsLastConv::Impl {
  ConvShape s;
  DType dtype = DType::kF32;
  bool train = false, relu = false, keep = false;
  bool wide = false;  // 16-bit storage widened around f32 primitives
  DataType act = DataType::f32;
  int64_t chunk = 1;  // images per primitive call on the widened path
  std::map<int64_t, Primitives> by_images;
  // The first entry's chosen weight formats: every later entry is built with them, so one
  // reordered copy serves every call.
  memory::desc fwd_weights, bwd_data_weights, bwd_diff_weights;
  // keep_weights: the forward's own reordered copy.
  Tensor kept;
  bool kept_valid = false;
  std::string describe;

  int64_t InImage() const { return s.c * s.h * s.w; }
  int64_t OutImage() const { return s.oc * s.oh * s.ow; }
  size_t Elem() const { return dtype == DType::kF32 ? 4 : 2; }
  memory::dims WeightDims() const {
    if (s.groups == 1) return {s.oc, s.c, s.kh, s.kw};
    return {s.groups, s.oc / s.groups, s.c / s.groups, s.kh, s.kw};
  }
  // The canonical f32 OIHW weights as oneDNN sees them (goihw with groups: the same memory).
  memory::desc UserWeights() const {
    return memory::desc(WeightDims(), DataType::f32, s.groups == 1 ? Tag::oihw : Tag::goihw);
  }

  Primitives Build(int64_t n, bool first) const {
    const memory::desc src({n, s.c, s.h, s.w}, act, Tag::nhwc);
    const memory::desc dst({n, s.oc, s.oh, s.ow}, act, Tag::nhwc);
    const memory::desc any_weights(WeightDims(), act, Tag::any);
    const memory::desc bias = s.bias ? memory::desc({s.oc}, DataType::f32, Tag::a) : memory::desc();
    const memory::dims strides{s.sh, s.sw}, dilation{s.dh - 1, s.dw - 1}, pad{s.ph, s.pw};
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (relu) {
      dnnl::post_ops ops;
      ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
      attr.set_post_ops(ops);
    }
    Primitives p;
    p.fwd_pd = dnnl::convolution_forward::primitive_desc(
        dnnl::convolution_forward::desc(
            train ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference,
            dnnl::algorithm::convolution_direct, src, first ? any_weights : fwd_weights, bias, dst,
            strides, dilation, pad, pad),
        attr, Engine());
    p.fwd = dnnl::convolution_forward(p.fwd_pd);
    if (!train) return p;
    dnnl::primitive_attr user_scratchpad;
    user_scratchpad.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    p.bwd_data_pd = dnnl::convolution_backward_data::primitive_desc(
        dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, src,
                                              first ? any_weights : bwd_data_weights, dst, strides,
                                              dilation, pad, pad),
        user_scratchpad, Engine(), p.fwd_pd);
    p.bwd_data = dnnl::convolution_backward_data(p.bwd_data_pd);
    const memory::desc any_diff(WeightDims(), DataType::f32, Tag::any);
    p.bwd_weights_pd = dnnl::convolution_backward_weights::primitive_desc(
        dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, src,
                                                 first ? any_diff : bwd_diff_weights, bias, dst,
                                                 strides, dilation, pad, pad),
        user_scratchpad, Engine(), p.fwd_pd);
    p.bwd_weights = dnnl::convolution_backward_weights(p.bwd_weights_pd);
    return p;
  }

  // Builds the first entry (formats "any") and remembers its weight formats.
  void BuildFirst(int64_t n) {
    Primitives p = Build(n, /*first=*/true);
    fwd_weights = p.fwd_pd.weights_desc();
    if (train) {
      bwd_data_weights = p.bwd_data_pd.weights_desc();
      bwd_diff_weights = p.bwd_weights_pd.diff_weights_desc();
    }
    by_images.emplace(n, std::move(p));
  }

  const Primitives& At(int64_t n) {
    auto it = by_images.find(n);
    if (it == by_images.end()) {
      if (by_images.size() >= 16) {
        // A net that changes its batch every call: keep the first entry (its formats).
        auto first = by_images.begin();
        auto next = std::next(first);
        by_images.erase(next, by_images.end());
      }
      it = by_images.emplace(n, Build(n, /*first=*/false)).first;
    }
    return it->second;
  }

  // Images [begin[t], begin[t + 1]) for each pool task.
  static std::vector<int64_t> Split(int64_t n, int tasks) {
    std::vector<int64_t> begin(static_cast<size_t>(tasks) + 1);
    for (int t = 0; t <= tasks; ++t) begin[static_cast<size_t>(t)] = n * t / tasks;
    return begin;
  }

  // Builds, on the calling thread, every entry the tasks' calls will need (primitive creation
  // is not something to do inside the pool's tasks).
  void Ensure(const std::vector<int64_t>& begin) {
    for (size_t t = 0; t + 1 < begin.size(); ++t) {
      const int64_t len = begin[t + 1] - begin[t];
      if (len == 0) continue;
      if (!wide) {
        At(len);
      } else {
        At(std::min(chunk, len));
        if (len % chunk != 0 && len > chunk) At(len % chunk);
      }
    }
  }

  // Reorders `src` (desc `from`) into `dst` (desc `to`), optionally scaling per output channel.
  static void Reorder(const memory::desc& from, const void* src, const memory::desc& to, void* dst,
                      const float* scales, int64_t oc, int64_t groups) {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (scales != nullptr) {
      // Output channel o of group g is element (g, o) of the first two dims with groups.
      const int mask = groups == 1 ? 1 : 3;
      attr.set_output_scales(mask, std::vector<float>(scales, scales + oc));
    }
    dnnl::reorder::primitive_desc pd(Engine(), from, Engine(), to, attr);
    memory a(from, Engine(), const_cast<void*>(src)), b(to, Engine(), dst);
    dnnl::reorder(pd).execute(ThreadStream(),
                              {{DNNL_ARG_FROM, a},
                               {DNNL_ARG_TO, b},
                               {DNNL_ARG_SCRATCHPAD, ThreadScratchpad(pd.scratchpad_desc())}});
  }

  // The weights in `desc`'s format: into the caller's buffer (or the kept copy). On the widened
  // path they are rounded to the 16-bit storage type too (to nearest even), as the native kernels
  // and the im2col path read them, so every path multiplies the same weights.
  void* ReorderWeights(const memory::desc& desc, const float* weights, const float* scales,
                       Tensor& buffer) {
    const int64_t bytes = static_cast<int64_t>(desc.get_size());
    if (buffer.dtype() != DType::kU8 || buffer.numel() < bytes) buffer.Resize({bytes}, DType::kU8);
    Reorder(UserWeights(), weights, desc, buffer.raw_data(), scales, s.oc, s.groups);
    if (wide) {
      float* w = static_cast<float*>(buffer.raw_data());
      const int64_t n = bytes / static_cast<int64_t>(sizeof(float));
      uint16_t low[1024];
      for (int64_t i = 0; i < n; i += 1024) {
        const size_t k = static_cast<size_t>(std::min<int64_t>(1024, n - i));
        dist::Encode(LowKind(dtype), w + i, k, low);
        dist::Decode(LowKind(dtype), low, k, w + i);
      }
    }
    return buffer.raw_data();
  }
};

ChannelsLastConv::ChannelsLastConv() : impl_(std::make_unique<Impl>()) {}
ChannelsLastConv::~ChannelsLastConv() = default;

bool ChannelsLastConv::Built() { return true; }

bool ChannelsLastConv::Prepare(const ConvShape& shape, DType dtype, int64_t images, bool train,
                               bool relu, bool keep_weights, std::string* why) {
  CORTADO_CHECK(!(relu && train), "ChannelsLastConv: a ReLU post-op is for inference only");
  *impl_ = Impl();
  Impl& m = *impl_;
  m.s = shape;
  m.dtype = dtype;
  m.train = train;
  m.relu = relu;
  m.keep = keep_weights;
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16) {
    *why = StrCat(DTypeName(dtype), " has no oneDNN convolution (f64 is for reference runs)");
    return false;
  }
  images = std::max<int64_t>(images, 1);
  // 16-bit storage: bf16 natively where oneDNN has a kernel other than its reference one for
  // every direction, else (and for f16 always) widened around the f32 primitives.
  auto usable = [&](const Primitives& p) {
    std::vector<const char*> impls = {p.fwd_pd.impl_info_str()};
    if (train) {
      impls.push_back(p.bwd_data_pd.impl_info_str());
      impls.push_back(p.bwd_weights_pd.impl_info_str());
    }
    for (const char* impl : impls) {
      if (IsReference(impl)) return false;
    }
    return true;
  };
  auto describe = [&](const Primitives& p) {
    std::string d = p.fwd_pd.impl_info_str();
    if (train) {
      d = StrCat(d, " / ", p.bwd_data_pd.impl_info_str(), " / ", p.bwd_weights_pd.impl_info_str());
    }
    return d;
  };
  std::string native_why;
  if (dtype == DType::kBF16) {
    m.act = DataType::bf16;
    try {
      m.BuildFirst(images);
      if (usable(m.by_images.begin()->second)) {
        m.describe = describe(m.by_images.begin()->second);
        return true;
      }
      native_why = "only oneDNN's reference bf16 kernels";
    } catch (const dnnl::error& e) {
      native_why = StrCat("no bf16 kernel (", e.what(), ")");
    }
    m.by_images.clear();
  }
  m.act = DataType::f32;
  m.wide = dtype != DType::kF32;
  if (m.wide) {
    m.chunk = std::clamp<int64_t>(kStagingElements / (m.InImage() + m.OutImage()), 1, images);
  }
  const int64_t first = m.wide ? m.chunk : images;
  try {
    m.BuildFirst(first);
  } catch (const dnnl::error& e) {
    *why = StrCat("oneDNN has no f32 convolution for it (", e.what(), ")");
    return false;
  }
  const Primitives& p = m.by_images.begin()->second;
  if (!usable(p)) {
    *why = StrCat("oneDNN offers only its reference kernel for it (", describe(p), ")");
    return false;
  }
  m.describe = describe(p);
  if (m.wide) {
    m.describe = StrCat(m.describe, ", ", DTypeName(dtype), " widened to f32",
                        native_why.empty() ? "" : StrCat(": ", native_why, " on this CPU"));
  }
  return true;
}

std::string ChannelsLastConv::Describe() const { return impl_->describe; }
bool ChannelsLastConv::widened() const { return impl_->wide; }

// One pass that maps each image of `src` to one of `dst` (forward: x to y; backward data: dy to
// dx), on the pool's threads, each over its slice of the batch (`begin`). `run(len, src, dst)`
// executes the primitive for `len` images. On the widened path (16-bit activations, f32
// kernels) each slice goes in chunks through the thread's f32 staging: decode, run, encode.
// (`Conv` is ChannelsLastConv::Impl, private to the class: its members call this.)
template <class Conv, class Run>
void RunSliced(Conv& m, const std::vector<int64_t>& begin, int64_t src_image, int64_t dst_image,
               const void* src, void* dst, const ConvScratch& scratch, const Run& run) {
  const int tasks = static_cast<int>(begin.size()) - 1;
  const size_t elem = m.Elem();
  if (m.wide) {
    if (static_cast<int>(scratch.staging->size()) < tasks) scratch.staging->resize(tasks);
    for (int t = 0; t < tasks; ++t) {
      (*scratch.staging)[static_cast<size_t>(t)].Resize({m.chunk * (src_image + dst_image)});
    }
  }
  ParallelTasks(tasks, [&](int t) {
    const int64_t b0 = begin[static_cast<size_t>(t)], b1 = begin[static_cast<size_t>(t) + 1];
    if (!m.wide) {
      if (b1 > b0) {
        run(b1 - b0, static_cast<char*>(const_cast<void*>(src)) + b0 * src_image * elem,
            static_cast<char*>(dst) + b0 * dst_image * elem);
      }
      return;
    }
    float* stage = (*scratch.staging)[static_cast<size_t>(t)].data<float>();
    const dist::CodecKind kind = LowKind(m.dtype);
    for (int64_t c0 = b0; c0 < b1; c0 += m.chunk) {
      const int64_t len = std::min(m.chunk, b1 - c0);
      float* wide_src = stage;
      float* wide_dst = stage + len * src_image;
      dist::Decode(kind, static_cast<const char*>(src) + c0 * src_image * elem,
                   static_cast<size_t>(len * src_image), wide_src);
      run(len, wide_src, wide_dst);
      dist::Encode(kind, wide_dst, static_cast<size_t>(len * dst_image),
                   static_cast<char*>(dst) + c0 * dst_image * elem);
    }
  });
}

void ChannelsLastConv::Forward(int64_t n, const void* x, const float* weights, const float* scales,
                               const float* bias, void* y, bool weights_changed,
                               const ConvScratch& scratch) {
  Impl& m = *impl_;
  if (n == 0) return;
  const int tasks = static_cast<int>(std::min<int64_t>(NumThreads(), n));
  const std::vector<int64_t> begin = Impl::Split(n, tasks);
  m.Ensure(begin);
  void* w = nullptr;
  if (m.keep) {
    if (weights_changed || !m.kept_valid) {
      m.ReorderWeights(m.fwd_weights, weights, scales, m.kept);
      m.kept_valid = true;
    }
    w = m.kept.raw_data();
  } else {
    w = m.ReorderWeights(m.fwd_weights, weights, scales, *scratch.weights);
  }
  RunSliced(
      m, begin, m.InImage(), m.OutImage(), x, y, scratch, [&](int64_t len, void* src, void* dst) {
        const Primitives& p = m.by_images.at(len);
        memory sm(p.fwd_pd.src_desc(), Engine(), src), dm(p.fwd_pd.dst_desc(), Engine(), dst);
        memory wm(p.fwd_pd.weights_desc(), Engine(), w);
        std::unordered_map<int, memory> args = {
            {DNNL_ARG_SRC, sm}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, dm}};
        if (m.s.bias) {
          args[DNNL_ARG_BIAS] = memory(p.fwd_pd.bias_desc(), Engine(), const_cast<float*>(bias));
        }
        args[DNNL_ARG_SCRATCHPAD] = ThreadScratchpad(p.fwd_pd.scratchpad_desc());
        p.fwd.execute(ThreadStream(), args);
      });
}

void ChannelsLastConv::BackwardData(int64_t n, const void* dy, const float* weights, void* dx,
                                    const ConvScratch& scratch) {
  Impl& m = *impl_;
  CORTADO_CHECK(m.train, "ChannelsLastConv: backward of a convolution prepared for inference");
  if (n == 0) return;
  const int tasks = static_cast<int>(std::min<int64_t>(NumThreads(), n));
  const std::vector<int64_t> begin = Impl::Split(n, tasks);
  m.Ensure(begin);
  void* w = m.ReorderWeights(m.bwd_data_weights, weights, nullptr, *scratch.weights);
  RunSliced(m, begin, m.OutImage(), m.InImage(), dy, dx, scratch,
            [&](int64_t len, void* diff_dst, void* diff_src) {
              const Primitives& p = m.by_images.at(len);
              memory gm(p.bwd_data_pd.diff_dst_desc(), Engine(), diff_dst);
              memory wm(p.bwd_data_pd.weights_desc(), Engine(), w);
              memory dm(p.bwd_data_pd.diff_src_desc(), Engine(), diff_src);
              p.bwd_data.execute(
                  ThreadStream(),
                  {{DNNL_ARG_DIFF_DST, gm},
                   {DNNL_ARG_WEIGHTS, wm},
                   {DNNL_ARG_DIFF_SRC, dm},
                   {DNNL_ARG_SCRATCHPAD, ThreadScratchpad(p.bwd_data_pd.scratchpad_desc())}});
            });
}

void ChannelsLastConv::BackwardWeights(int64_t n, const void* x, const void* dy, float* dweights,
                                       float* dbias, const ConvScratch& scratch) {
  Impl& m = *impl_;
  CORTADO_CHECK(m.train, "ChannelsLastConv: backward of a convolution prepared for inference");
  const int64_t w_numel = m.s.oc * (m.s.c / m.s.groups) * m.s.kh * m.s.kw;
  if (n == 0) {
    std::fill(dweights, dweights + w_numel, 0.0f);
    if (dbias != nullptr) std::fill(dbias, dbias + m.s.oc, 0.0f);
    return;
  }
  const int tasks = static_cast<int>(std::min<int64_t>(NumThreads(), n));
  const std::vector<int64_t> begin = Impl::Split(n, tasks);
  m.Ensure(begin);
  // Each thread's partial: the weight gradient in oneDNN's format, then the bias gradient;
  // on the widened path a second such region takes each chunk's before it is added.
  const int64_t blocked = static_cast<int64_t>(m.bwd_diff_weights.get_size() / sizeof(float));
  const int64_t part = blocked + m.s.oc;
  const int64_t in_image = m.InImage(), out_image = m.OutImage();
  const size_t elem = m.Elem();
  std::vector<Tensor>& partials = *scratch.partials;
  if (static_cast<int>(partials.size()) < tasks) partials.resize(tasks);
  for (int t = 0; t < tasks; ++t) {
    partials[static_cast<size_t>(t)].Resize({m.wide ? 2 * part : part}, DType::kF32);
  }
  if (m.wide && static_cast<int>(scratch.staging->size()) < tasks) scratch.staging->resize(tasks);
  if (m.wide) {
    for (int t = 0; t < tasks; ++t) {
      (*scratch.staging)[static_cast<size_t>(t)].Resize({m.chunk * (in_image + out_image)});
    }
  }
  ParallelTasks(tasks, [&](int t) {
    dnnl::stream& stream = ThreadStream();
    const int64_t b0 = begin[static_cast<size_t>(t)], b1 = begin[static_cast<size_t>(t) + 1];
    float* acc = partials[static_cast<size_t>(t)].data<float>();
    if (b1 == b0) {
      std::fill(acc, acc + part, 0.0f);
      return;
    }
    auto run = [&](int64_t len, void* src, void* diff_dst, float* out) {
      const Primitives& p = m.by_images.at(len);
      memory sm(p.bwd_weights_pd.src_desc(), Engine(), src);
      memory gm(p.bwd_weights_pd.diff_dst_desc(), Engine(), diff_dst);
      memory wm(p.bwd_weights_pd.diff_weights_desc(), Engine(), out);
      std::unordered_map<int, memory> args = {
          {DNNL_ARG_SRC, sm}, {DNNL_ARG_DIFF_DST, gm}, {DNNL_ARG_DIFF_WEIGHTS, wm}};
      if (m.s.bias) {
        args[DNNL_ARG_DIFF_BIAS] =
            memory(p.bwd_weights_pd.diff_bias_desc(), Engine(), out + blocked);
      }
      args[DNNL_ARG_SCRATCHPAD] = ThreadScratchpad(p.bwd_weights_pd.scratchpad_desc());
      p.bwd_weights.execute(stream, args);
    };
    if (!m.wide) {
      run(b1 - b0, static_cast<char*>(const_cast<void*>(x)) + b0 * in_image * elem,
          static_cast<char*>(const_cast<void*>(dy)) + b0 * out_image * elem, acc);
      if (!m.s.bias) std::fill(acc + blocked, acc + part, 0.0f);
      return;
    }
    float* stage = (*scratch.staging)[static_cast<size_t>(t)].data<float>();
    float* tmp = acc + part;
    const dist::CodecKind kind = LowKind(m.dtype);
    for (int64_t c0 = b0; c0 < b1; c0 += m.chunk) {
      const int64_t len = std::min(m.chunk, b1 - c0);
      float* wide_x = stage;
      float* wide_dy = stage + len * in_image;
      dist::Decode(kind, static_cast<const char*>(x) + c0 * in_image * elem,
                   static_cast<size_t>(len * in_image), wide_x);
      dist::Decode(kind, static_cast<const char*>(dy) + c0 * out_image * elem,
                   static_cast<size_t>(len * out_image), wide_dy);
      float* out = c0 == b0 ? acc : tmp;
      run(len, wide_x, wide_dy, out);
      if (!m.s.bias) std::fill(out + blocked, out + part, 0.0f);
      if (out == tmp) {
        for (int64_t i = 0; i < part; ++i) acc[i] += tmp[i];
      }
    }
  });
  // Thread order (deterministic at a fixed thread count), then into OIHW.
  float* sum = partials[0].data<float>();
  for (int t = 1; t < tasks; ++t) {
    const float* p = partials[static_cast<size_t>(t)].data<float>();
    for (int64_t i = 0; i < part; ++i) sum[i] += p[i];
  }
  Impl::Reorder(m.bwd_diff_weights, sum, m.UserWeights(), dweights, nullptr, m.s.oc, m.s.groups);
  if (dbias != nullptr) std::copy(sum + blocked, sum + part, dbias);
}

#else  // no oneDNN

struct ChannelsLastConv::Impl {};
ChannelsLastConv::ChannelsLastConv() : impl_(std::make_unique<Impl>()) {}
ChannelsLastConv::~ChannelsLastConv() = default;
bool ChannelsLastConv::Built() { return false; }
bool ChannelsLastConv::Prepare(const ConvShape&, DType, int64_t, bool, bool, bool,
                               std::string* why) {
  *why = "this build has no oneDNN (libdnnl-dev)";
  return false;
}
std::string ChannelsLastConv::Describe() const { return ""; }
bool ChannelsLastConv::widened() const { return false; }
void ChannelsLastConv::Forward(int64_t, const void*, const float*, const float*, const float*,
                               void*, bool, const ConvScratch&) {
  Fail("ChannelsLastConv: no oneDNN in this build");
}
void ChannelsLastConv::BackwardData(int64_t, const void*, const float*, void*, const ConvScratch&) {
  Fail("ChannelsLastConv: no oneDNN in this build");
}
void ChannelsLastConv::BackwardWeights(int64_t, const void*, const void*, float*, float*,
                                       const ConvScratch&) {
  Fail("ChannelsLastConv: no oneDNN in this build");
}

#endif

}  // namespace cortado
