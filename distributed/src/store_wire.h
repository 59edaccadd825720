// Forwards to bootstrap/store_wire.h for tests/fuzz/fuzz_targets.cpp, which includes this
// header by its old name (its include path is distributed/src). Delete once that file includes
// "bootstrap/store_wire.h".
#pragma once

#include "bootstrap/store_wire.h"
