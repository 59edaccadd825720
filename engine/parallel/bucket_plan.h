// How the data-parallel glue cuts the flat gradient block into buckets
// (engine/parallel/data_parallel.h says why buckets exist and how they are used): a pure function
// of the parameters in the order backward finishes them, the bucket sizes and the element size, so
// a plan can be computed and tested without a net or a communicator.
//
// Rules: buckets hold whole parameters. Bucket 0 (the net's last layers, ready first) takes
// parameters until it passes first_bucket_mb, so communication starts early; the last bucket
// (the first layers, ready only when backward ends, so its whole all-reduce is exposed) takes
// them from the end until it passes last_bucket_mb; the middle is cut at bucket_mb. A change of
// codec between neighbours starts a new bucket (a bucket travels in one codec). Each parameter
// starts on a 64-byte boundary. Two control words (the stop vote and the loss) follow the last
// parameter in the last bucket, which must then be f32: when the last parameters are compressed
// the control words get an f32 bucket of their own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cortado/dist/codec.h"

namespace cortado {

struct GradientBucket {
  int64_t begin = 0, end = 0;  // element range in the gradient block
  int params = 0;              // parameters in it
  std::string first, last;     // names of its first and last parameter (for logs)
  dist::CodecKind codec = dist::CodecKind::kF32;
};

// One parameter as the planner sees it.
struct BucketedParam {
  std::string name;
  int64_t numel = 0;
  dist::CodecKind codec = dist::CodecKind::kF32;
};

struct BucketSizes {
  double bucket_mb = 25;
  double first_bucket_mb = 1;
  double last_bucket_mb = 1;
};

struct BucketPlan {
  std::vector<GradientBucket> buckets;  // in issue order; the last holds the control words
  std::vector<int64_t> offset;          // per parameter: its first element in the block
  std::vector<size_t> bucket_of;        // per parameter: its bucket
  int64_t control_index = 0;            // the stop vote's element; the loss follows it
  int64_t block_elements = 0;           // the block's length (control words included)
};

// `order`: the parameters in the order backward finishes them (not empty); element_bytes: the
// gradients' element size. Throws naming the sizes when one is not positive.
BucketPlan PlanBuckets(const std::vector<BucketedParam>& order, const BucketSizes& sizes,
                       int64_t element_bytes);

// Buckets [begin, end) issued as one all-reduce over their joined range of the block.
struct IssueRun {
  size_t begin = 0, end = 0;
};

// Under `distributed.codec: auto` buckets are cut where a codec could change, and a plan that
// keeps neighbours in f32 would otherwise pay one all-reduce (its latency, its wake-ups) per
// small bucket: consecutive mergeable buckets (f32 without a residual) join, by the rules
// PlanBuckets cuts by: the first run up to first_bucket_mb, the last up to last_bucket_mb, the
// middle ones up to bucket_mb (a bucket larger than its limit runs alone). A bucket that is not
// mergeable runs alone. `bytes`: each bucket's size in bytes.
std::vector<IssueRun> MergeRuns(const std::vector<double>& bytes,
                                const std::vector<bool>& mergeable, const BucketSizes& sizes);

}  // namespace cortado
