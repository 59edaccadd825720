# CORTADO_SANITIZE: build everything with sanitizers, for the test stage of scripts/test.sh
# --sanitize. "address,undefined" (ASan + UBSan, any error fatal) or "thread" (TSan); empty
# for none. Shared by the Cortado build and the communication library built alone.
set(CORTADO_SANITIZE "" CACHE STRING "Sanitizers: address,undefined | thread | empty for none")
if(CORTADO_SANITIZE)
  if(NOT CORTADO_SANITIZE MATCHES "^(address,undefined|address|undefined|thread)$")
    message(FATAL_ERROR "CORTADO_SANITIZE='${CORTADO_SANITIZE}': use address,undefined or thread")
  endif()
  # -O1: a third of -O3's compile time, and the sanitizers find the same bugs (the stage's
  # budget is CI time, not speed).
  add_compile_options(-fsanitize=${CORTADO_SANITIZE} -fno-omit-frame-pointer -g1 -O1)
  # The instrumentation makes GCC 12 warn of maybe-uninitialized members inside std::regex and
  # std::function (false positives the sanitizers themselves would catch if real).
  add_compile_options(-Wno-error=maybe-uninitialized)
  if(CORTADO_SANITIZE MATCHES "undefined")
    add_compile_options(-fno-sanitize-recover=undefined)
  endif()
  add_link_options(-fsanitize=${CORTADO_SANITIZE})
  # What the code tests to know it runs under TSan (GCC and Clang spell their own macros
  # differently): see UcxTransport::Allocate.
  if(CORTADO_SANITIZE STREQUAL "thread")
    add_compile_definitions(CORTADO_TSAN=1)
  endif()
endif()
