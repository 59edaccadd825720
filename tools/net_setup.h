// The config's net and what a run will read: building the model for the data's sample shape,
// and the tables and summaries that `cortado train --dry-run`, `cortado inspect` and the
// trainer print about them.
#pragma once

#include <cstdint>
#include <string>

#include "data/batch_source.h"
#include "engine/graph/net.h"
#include "tools/run_config.h"

namespace cortado {

// The activations' memory format: model.layout, auto resolved for this build and the compute
// dtype (engine/graph/net.h, AutoLayout).
MemoryFormat ConfigLayout(const RunConfig& config);
// What every tool builds the config's net with: its layout, the fusion rewrites, and `mode`
// (a training net follows its memory plan).
NetOptions ConfigNetOptions(const RunConfig& config, NetMode mode);
// One line for logs and tables: "layout: nhwc (model.layout: auto); ..." with the reorders the
// net inserted, and a line on which kernels run its convolutions.
std::string LayoutSummary(const RunConfig& config, const Net& net);

// Builds the config's model for inputs of the given sample shape {C, H, W}.
NetSpec MakeNetSpec(const RunConfig& config, const Shape& sample_shape, int64_t num_classes,
                    int64_t batch_size);

// The net as a table (layer, type with its fusion note, output shape, parameters), columns as
// wide as their longest entry, and the total.
std::string NetTable(Net& net);

// NetTable of a config whose data is not on this machine (inspect, a dry run): the net built
// from the model section's num_classes and the input the data section describes (LMDB: 3 x
// crop x crop; synthetic: its shape), and a line that says so. Throws when they do not say
// enough (no num_classes; IDX files, whose header holds the image size).
std::string NetTableWithoutData(const RunConfig& config);

// What the data section yields: records in data.train and data.val, and how an epoch of this
// rank's `train` source is made of them ("47 records; an epoch is 5 batches of 8 = 40 samples,
// drop_last leaves 7 out").
std::string DataSummary(const RunConfig& config, const BatchSource& train);

}  // namespace cortado
