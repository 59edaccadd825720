# FindOpenCV: OpenCV's own package configuration when it is installed (Debian: libopencv-dev),
# else the per-module headers and libraries that Debian's split packages ship
# (libopencv-core-dev, libopencv-imgproc-dev, libopencv-imgcodecs-dev) without a CMake package.
# Either way the modules are the imported targets opencv_<module>, as OpenCV names them.
find_package(OpenCV CONFIG QUIET COMPONENTS ${OpenCV_FIND_COMPONENTS})
if(OpenCV_FOUND)
  return()
endif()
find_path(OpenCV_INCLUDE_DIR opencv2/core.hpp PATH_SUFFIXES opencv4)
set(_opencv_libraries)
foreach(_module IN LISTS OpenCV_FIND_COMPONENTS)
  find_library(OpenCV_${_module}_LIBRARY NAMES opencv_${_module})
  mark_as_advanced(OpenCV_${_module}_LIBRARY)
  list(APPEND _opencv_libraries OpenCV_${_module}_LIBRARY)
endforeach()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(OpenCV REQUIRED_VARS OpenCV_INCLUDE_DIR ${_opencv_libraries})
if(OpenCV_FOUND)
  foreach(_module IN LISTS OpenCV_FIND_COMPONENTS)
    if(NOT TARGET opencv_${_module})
      add_library(opencv_${_module} UNKNOWN IMPORTED)
      set_target_properties(opencv_${_module} PROPERTIES
                            IMPORTED_LOCATION "${OpenCV_${_module}_LIBRARY}"
                            INTERFACE_INCLUDE_DIRECTORIES "${OpenCV_INCLUDE_DIR}")
    endif()
  endforeach()
endif()
mark_as_advanced(OpenCV_INCLUDE_DIR)
unset(_opencv_libraries)
