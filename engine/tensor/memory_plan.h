// Memory plan: when each activation's storage is taken from the net's pool and when it goes
// back, computed from the graph alone (a pure function, tested without running a net).
//
// A step is numbered: forward of layer i is step i, backward of layer i is step 2L - 1 - i
// (L layers; inference has only the forward steps). Blobs that share storage (an output that
// is a view of, or written in place into, an input: Split, Flatten, an in-place ReLU or sum)
// form one group with one buffer. A group is taken before the step of its first producer and
// given back after the last step that reads any of its blobs:
//   - the forward of every consumer;
//   - in training, the backward of a consumer that reads its inputs (BackwardReadsInputs) and
//     of the producer when it reads its outputs (BackwardReadsOutputs), if they run backward.
// Blobs nothing consumes (the loss, the accuracy) are the net's results and stay to the end of
// the pass; net inputs belong to the caller and are not planned.
//
// With PlanGraph::gradients (training) every activation gradient is a group too: the gradient
// of an output of a layer that runs backward is taken before the backward of the consumer that
// writes it (propagate), or before the first backward step when nothing writes it (a loss
// seed, a gradient that reads as zero), and given back after its producer's backward has read
// it. Gradients so reuse the memory of activations whose last reader has run.
//
// So the memory a pass holds at step s is the sum of the groups alive at s, and the plan's peak
// is the largest such sum. The groups are then placed in one arena (offsets, greedy by size,
// largest first, each at the lowest offset free of every group alive at the same time): no two
// groups alive at once overlap, and arena_bytes, the arena's size, is the storage the pass
// needs (at least the peak; a little more where sizes do not pack).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace cortado {

struct PlanLayer {
  std::vector<int> inputs, outputs;  // blob ids
  // By input: whether this layer's backward writes that input's gradient (gradients only).
  std::vector<bool> propagate;
  // By output: the index in `inputs` whose storage it shares, or -1 for storage of its own.
  std::vector<int> shares_input;
  bool runs_backward = false;
  bool backward_reads_inputs = true, backward_reads_outputs = true;
};

struct PlanGraph {
  std::vector<size_t> blob_bytes;  // by blob id
  std::vector<bool> external;      // by blob id: owned by the caller (net inputs), not planned
  std::vector<PlanLayer> layers;   // in forward order
  bool gradients = false;          // plan the activation gradients too (training only)
};

struct MemoryPlan {
  bool training = false;
  int steps = 0;                    // 2L in training, L in inference
  std::vector<int> group;           // by blob: its storage group, -1 when external
  std::vector<size_t> group_bytes;  // by group
  std::vector<int> group_blob;      // by group: the blob whose own storage it is
  std::vector<bool> group_is_grad;  // by group: the gradient of group_blob, not its data
  std::vector<int> grad_group;      // by blob: its gradient's group, -1 when none is planned
  // By group: the steps it is taken before and given back after; a result's group_last is
  // `steps` (kept until the next pass begins, listed in no give_after).
  std::vector<int> group_first, group_last;
  std::vector<std::vector<int>> take_before, give_after;  // by step: groups
  std::vector<size_t> live_bytes;  // by step: bytes of the groups alive during it
  size_t peak_bytes = 0;           // the largest live_bytes
  // By group: where it lies in the arena (bytes, a multiple of kPlanAlignment).
  std::vector<size_t> group_offset;
  size_t arena_bytes = 0;
};

constexpr size_t kPlanAlignment = 64;

MemoryPlan PlanMemory(const PlanGraph& graph, bool training);

}  // namespace cortado
