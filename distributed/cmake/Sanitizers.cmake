# CORTADO_SANITIZE: build everything with sanitizers, for the test stage of scripts/test.sh
# --sanitize. "address,undefined" (ASan + UBSan, any error fatal) or "thread" (TSan); empty
# for none. Shared by the Cortado build and the communication library built alone.
set(CORTADO_SANITIZE "" CACHE STRING "Sanitizers: address,undefined | thread | empty for none")
if(CORTADO_SANITIZE)
  if(NOT CORTADO_SANITIZE MATCHES "^(address,undefined|address|undefined|thread)$")
    message(FATAL_ERROR "CORTADO_SANITIZE='${CORTADO_SANITIZE}': use address,undefined or thread")
  endif()
  add_compile_options(-fsanitize=${CORTADO_SANITIZE} -fno-omit-frame-pointer -g1)
  if(CORTADO_SANITIZE MATCHES "undefined")
    add_compile_options(-fno-sanitize-recover=undefined)
  endif()
  add_link_options(-fsanitize=${CORTADO_SANITIZE})
endif()
