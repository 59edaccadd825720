// Forwards to transport/tcp/frames.h for tests/fuzz/fuzz_targets.cpp, which includes this
// header by its old name (its include path is distributed/src). Delete once that file includes
// "transport/tcp/frames.h".
#pragma once

#include "transport/tcp/frames.h"
