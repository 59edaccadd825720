#include "engine/parallel/bucket_plan.h"

#include <algorithm>

#include "engine/base/error.h"

namespace cortado {
namespace {

constexpr int64_t kAlignBytes = 64;  // each gradient starts on a cache line (vector loads)

int64_t AlignUp(int64_t elements, int64_t esize) {
  const int64_t per_line = std::max<int64_t>(1, kAlignBytes / esize);
  return (elements + per_line - 1) / per_line * per_line;
}

// The index of each bucket's first parameter, by size alone: bucket 0 first, then the last
// bucket from what remains, then the middle.
std::vector<size_t> StartsBySize(const std::vector<BucketedParam>& order, const BucketSizes& sizes,
                                 int64_t esize) {
  const auto elements = [&](double mb) {
    return std::max<int64_t>(1, static_cast<int64_t>(mb * 1048576.0 / esize));
  };
  std::vector<size_t> starts{0};
  size_t head = 0;  // bucket 0 is order[0, head)
  for (int64_t n = 0; head < order.size(); ++head) {
    n += order[head].numel;
    if (n > elements(sizes.first_bucket_mb) && head > 0) break;
  }
  size_t tail = order.size();  // the last bucket is order[tail, end)
  for (int64_t n = 0; tail > head;) {
    n += order[tail - 1].numel;
    if (n > elements(sizes.last_bucket_mb) && tail < order.size()) break;
    --tail;
  }
  for (size_t i = head, n = 0; i < tail; ++i) {
    const int64_t numel = order[i].numel;
    if (i == head || static_cast<int64_t>(n) + numel > elements(sizes.bucket_mb)) {
      starts.push_back(i);
      n = 0;
    }
    n += static_cast<size_t>(numel);
  }
  if (tail < order.size()) starts.push_back(tail);
  return starts;
}

}  // namespace

BucketPlan PlanBuckets(const std::vector<BucketedParam>& order, const BucketSizes& sizes,
                       int64_t element_bytes) {
  CORTADO_CHECK(sizes.bucket_mb > 0 && sizes.first_bucket_mb > 0 && sizes.last_bucket_mb > 0,
                "gradient bucket sizes must be positive (distributed.bucket_mb ", sizes.bucket_mb,
                ", first_bucket_mb ", sizes.first_bucket_mb, ", last_bucket_mb ",
                sizes.last_bucket_mb, ")");
  CORTADO_CHECK(!order.empty(), "the net has no parameters to train");
  std::vector<size_t> starts = StartsBySize(order, sizes, element_bytes);
  // Buckets never mix codecs: a change of codec starts a new bucket.
  for (size_t i = 1; i < order.size(); ++i) {
    if (order[i].codec != order[i - 1].codec &&
        std::find(starts.begin(), starts.end(), i) == starts.end()) {
      starts.insert(std::upper_bound(starts.begin(), starts.end(), i), i);
    }
  }

  BucketPlan plan;
  plan.offset.resize(order.size());
  plan.bucket_of.resize(order.size());
  int64_t at = 0;
  for (size_t b = 0; b < starts.size(); ++b) {
    const size_t end = b + 1 < starts.size() ? starts[b + 1] : order.size();
    GradientBucket bucket{at,
                          at,
                          static_cast<int>(end - starts[b]),
                          order[starts[b]].name,
                          order[end - 1].name,
                          order[starts[b]].codec};
    for (size_t i = starts[b]; i < end; ++i) {
      plan.offset[i] = at;
      plan.bucket_of[i] = b;
      at = AlignUp(at + order[i].numel, element_bytes);
    }
    bucket.end = at;
    plan.buckets.push_back(bucket);
  }
  plan.control_index = at;
  if (plan.buckets.back().codec != dist::CodecKind::kF32) {
    // The stop vote and the loss must arrive exactly: they get an f32 bucket of their own.
    plan.buckets.push_back(
        GradientBucket{at, at, 0, "(control)", "(control)", dist::CodecKind::kF32});
  }
  plan.buckets.back().end = plan.control_index + 2;
  plan.block_elements = plan.buckets.back().end;
  return plan;
}

std::vector<IssueRun> MergeRuns(const std::vector<double>& bytes,
                                const std::vector<bool>& mergeable, const BucketSizes& sizes) {
  CORTADO_CHECK(bytes.size() == mergeable.size(), "MergeRuns: ", bytes.size(), " sizes but ",
                mergeable.size(), " flags");
  const size_t n = bytes.size();
  const double mb = 1048576.0;
  // Extends a run from `at` in direction `step` while the buckets are mergeable and the run
  // stays within `limit` bytes; returns one past the last bucket taken (in that direction).
  const auto extend = [&](size_t at, int step, size_t stop, double limit) {
    size_t i = at;
    double total = 0;
    while (i != stop && mergeable[i] && (i == at || total + bytes[i] <= limit)) {
      total += bytes[i];
      i = step > 0 ? i + 1 : i - 1;
    }
    return i;
  };
  std::vector<IssueRun> runs;
  if (n == 0) return runs;
  const size_t head = mergeable[0] ? extend(0, 1, n, sizes.first_bucket_mb * mb) : 1;
  runs.push_back({0, head});
  size_t tail = n;  // the last run is [tail, n)
  if (head < n && mergeable[n - 1]) {
    // extend() walks down from n - 1 and stops at the bucket it does not take.
    const size_t below = extend(n - 1, -1, head - 1, sizes.last_bucket_mb * mb);
    tail = below + 1;
  } else if (head < n) {
    tail = n - 1;
  }
  for (size_t i = head; i < tail;) {
    const size_t end = mergeable[i] ? extend(i, 1, tail, sizes.bucket_mb * mb) : i + 1;
    runs.push_back({i, end});
    i = end;
  }
  if (tail < n) runs.push_back({tail, n});
  return runs;
}

}  // namespace cortado
