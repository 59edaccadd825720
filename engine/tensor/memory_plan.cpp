#include "engine/tensor/memory_plan.h"

#include <algorithm>
#include <numeric>

#include "engine/base/error.h"

namespace cortado {
namespace {

size_t Aligned(size_t bytes) {
  return (bytes + kPlanAlignment - 1) / kPlanAlignment * kPlanAlignment;
}

// Offsets in one arena: groups by size, largest first (ties: earlier first, then by index),
// each at the lowest aligned offset where it overlaps no placed group alive at the same time.
void PlaceGroups(MemoryPlan& plan) {
  const size_t n = plan.group_bytes.size();
  plan.group_offset.assign(n, 0);
  plan.arena_bytes = 0;
  auto last = [&](size_t g) { return std::min(plan.group_last[g], plan.steps - 1); };
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (plan.group_bytes[a] != plan.group_bytes[b])
      return plan.group_bytes[a] > plan.group_bytes[b];
    if (plan.group_first[a] != plan.group_first[b])
      return plan.group_first[a] < plan.group_first[b];
    return a < b;
  });
  std::vector<size_t> placed;
  std::vector<std::pair<size_t, size_t>> taken;  // [offset, end) of placed groups alive with g
  for (size_t g : order) {
    taken.clear();
    for (size_t h : placed) {
      if (plan.group_first[h] <= last(g) && plan.group_first[g] <= last(h)) {
        taken.emplace_back(plan.group_offset[h],
                           plan.group_offset[h] + Aligned(plan.group_bytes[h]));
      }
    }
    std::sort(taken.begin(), taken.end());
    const size_t size = Aligned(plan.group_bytes[g]);
    size_t offset = 0;
    for (const auto& [begin, end] : taken) {
      if (begin >= offset + size) break;  // the gap before this one fits
      offset = std::max(offset, end);
    }
    plan.group_offset[g] = offset;
    plan.arena_bytes = std::max(plan.arena_bytes, offset + size);
    placed.push_back(g);
  }
}

}  // namespace

MemoryPlan PlanMemory(const PlanGraph& graph, bool training) {
  const int num_layers = static_cast<int>(graph.layers.size());
  const size_t num_blobs = graph.blob_bytes.size();
  CORTADO_CHECK(graph.external.size() == num_blobs, "PlanMemory: ", graph.external.size(),
                " external flags for ", num_blobs, " blobs");
  MemoryPlan plan;
  plan.training = training;
  plan.steps = training ? 2 * num_layers : num_layers;
  plan.group.assign(num_blobs, -1);
  plan.grad_group.assign(num_blobs, -1);
  std::vector<bool> consumed(num_blobs, false);
  auto backward_step = [&](int layer) { return 2 * num_layers - 1 - layer; };
  auto use = [&](int blob, int step) {
    const int g = plan.group[static_cast<size_t>(blob)];
    if (g < 0) return;
    int& last = plan.group_last[static_cast<size_t>(g)];
    last = std::max(last, step);
  };
  // Groups in forward order: an output that shares an input's storage joins its group.
  for (int i = 0; i < num_layers; ++i) {
    const PlanLayer& layer = graph.layers[static_cast<size_t>(i)];
    for (size_t j = 0; j < layer.outputs.size(); ++j) {
      const size_t blob = static_cast<size_t>(layer.outputs[j]);
      CORTADO_CHECK(blob < num_blobs, "PlanMemory: layer ", i, " writes blob ", blob, " of ",
                    num_blobs);
      if (graph.external[blob]) continue;
      const int from = j < layer.shares_input.size() ? layer.shares_input[j] : -1;
      if (from >= 0) {
        plan.group[blob] = plan.group[static_cast<size_t>(layer.inputs[static_cast<size_t>(from)])];
        continue;
      }
      plan.group[blob] = static_cast<int>(plan.group_bytes.size());
      plan.group_bytes.push_back(graph.blob_bytes[blob]);
      plan.group_blob.push_back(static_cast<int>(blob));
      plan.group_is_grad.push_back(false);
      plan.group_first.push_back(i);
      plan.group_last.push_back(i);
    }
  }
  for (int i = 0; i < num_layers; ++i) {
    const PlanLayer& layer = graph.layers[static_cast<size_t>(i)];
    const bool backward = training && layer.runs_backward;
    for (int b : layer.inputs) {
      consumed[static_cast<size_t>(b)] = true;
      use(b, i);
      if (backward && layer.backward_reads_inputs) use(b, backward_step(i));
    }
    for (int b : layer.outputs) {
      use(b, i);
      if (backward && layer.backward_reads_outputs) use(b, backward_step(i));
    }
  }
  // The net's results (blobs nothing reads) stay readable after the pass.
  for (size_t b = 0; b < num_blobs; ++b) {
    if (!consumed[b]) use(static_cast<int>(b), plan.steps);
  }
  if (training && graph.gradients) {
    // The gradient of every output of a layer that runs backward: from its writer's backward
    // (the first backward step when nothing writes it) to its producer's.
    std::vector<int> written_at(num_blobs, plan.steps);
    for (int i = 0; i < num_layers; ++i) {
      const PlanLayer& layer = graph.layers[static_cast<size_t>(i)];
      if (!layer.runs_backward) continue;
      for (size_t j = 0; j < layer.inputs.size() && j < layer.propagate.size(); ++j) {
        if (!layer.propagate[j]) continue;
        int& at = written_at[static_cast<size_t>(layer.inputs[j])];
        at = std::min(at, backward_step(i));
      }
    }
    for (int i = 0; i < num_layers; ++i) {
      const PlanLayer& layer = graph.layers[static_cast<size_t>(i)];
      if (!layer.runs_backward) continue;
      for (int out : layer.outputs) {
        const size_t blob = static_cast<size_t>(out);
        if (graph.external[blob] || plan.grad_group[blob] >= 0) continue;
        const int first = written_at[blob] < plan.steps ? written_at[blob] : num_layers;
        plan.grad_group[blob] = static_cast<int>(plan.group_bytes.size());
        plan.group_bytes.push_back(graph.blob_bytes[blob]);
        plan.group_blob.push_back(out);
        plan.group_is_grad.push_back(true);
        plan.group_first.push_back(first);
        plan.group_last.push_back(std::max(first, backward_step(i)));
      }
    }
  }
  plan.take_before.assign(static_cast<size_t>(plan.steps), {});
  plan.give_after.assign(static_cast<size_t>(plan.steps), {});
  plan.live_bytes.assign(static_cast<size_t>(plan.steps), 0);
  for (size_t g = 0; g < plan.group_bytes.size(); ++g) {
    plan.take_before[static_cast<size_t>(plan.group_first[g])].push_back(static_cast<int>(g));
    const int last = std::min(plan.group_last[g], plan.steps - 1);
    if (plan.group_last[g] < plan.steps) {
      plan.give_after[static_cast<size_t>(last)].push_back(static_cast<int>(g));
    }
    for (int s = plan.group_first[g]; s <= last; ++s) {
      plan.live_bytes[static_cast<size_t>(s)] += plan.group_bytes[g];
    }
  }
  for (size_t bytes : plan.live_bytes) plan.peak_bytes = std::max(plan.peak_bytes, bytes);
  PlaceGroups(plan);
  return plan;
}

}  // namespace cortado
