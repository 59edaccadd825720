// The collective test matrix shared by the thread tests (collectives_test.cpp) and the process
// tests (dist_test_worker matrix): every collective and algorithm, element types and reductions,
// for the given counts, checked against exact expected values and for bitwise agreement between
// ranks. Inputs are small integers so sums are exact in f32, f16 and bf16; f64 inputs add
// fine bits below f32's precision (still exact in every order), so f64 must stay f64 end to end.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "cortado/dist/communicator.h"

namespace cortado::dist::testing {

// The counts the issue asks for: 0, 1, odd, large (2^20 + 3), and an odd medium one.
std::vector<size_t> DefaultCounts();

// Runs the matrix on comm; returns one line per failure (empty when everything matched).
std::vector<std::string> RunMatrix(Communicator& comm, const std::vector<size_t>& counts);

// The value rank r contributes at element i.
float InputValue(int rank, size_t i);

}  // namespace cortado::dist::testing
