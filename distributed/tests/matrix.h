// The collective test matrix shared by the thread tests (collectives_test.cpp) and the process
// tests (dist_test_worker matrix): every collective and algorithm, element types and reductions,
// for the given counts, checked against exact expected values and for bitwise agreement between
// ranks; the compressed all-reduce bitwise against a one-process simulation of its ring. Inputs are
// small integers so sums are exact in f32, f16 and bf16; f64 inputs add fine bits below f32's
// precision (still exact in every order), so f64 must stay f64 end to end.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "cortado/dist/communicator.h"

namespace cortado::dist::testing {

// The counts the issue asks for: 0, 1, odd, an odd medium one, and a large one: 2^20 + 3, or
// CORTADO_TEST_LARGE_COUNT (at least 2^17) where set. The sanitizer stages of scripts/test.sh
// set it smaller: the reference arithmetic at the large count is most of the matrix's time.
// From 2^17 on the matrix runs fewer type and reduction pairs.
std::vector<size_t> DefaultCounts();

// Runs the matrix on comm; returns one line per failure (empty when everything matched).
std::vector<std::string> RunMatrix(Communicator& comm, const std::vector<size_t>& counts);

// The value rank r contributes at element i.
float InputValue(int rank, size_t i);

}  // namespace cortado::dist::testing
