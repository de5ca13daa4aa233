# Checks that every module under SRC/longtrain includes only the modules the design's layering
# allows (the arrows below). Run by the build (target longtrain_layers, part of `all`) and by
# CTest; a wrong-way include fails both, naming the file, the line and the allowed modules.
# Usage: cmake -DSRC=<dir holding longtrain/> -P check_layers.cmake
#   core <- config, comm, kernels <- data, model, offload <- sp, zero, compile, ckpt <- plan <- train <- cli
#   (config is the base of its layer: model and data take their sections from it; kernels, the CPU
#   kernel families, include core alone, and the modules above them that run kernels may include
#   them; plan includes the footprint headers of the modules below it (libtorch-free), and within
#   the third layer no module includes another.)
set(allowed_core "")
set(allowed_config "core")
set(allowed_comm "core")
set(allowed_kernels "core")
set(allowed_data "core;config;kernels")
set(allowed_model "core;config;kernels")
set(allowed_offload "core;kernels")
set(allowed_report "core")
set(allowed_sp "core;config;comm;kernels;data;model")
set(allowed_zero "core;config;comm;kernels;model;offload")
set(allowed_compile "core;config;kernels;data;model;offload")
set(allowed_ckpt "core;config;comm;kernels;model")
set(allowed_plan "core;config;kernels;model;offload;sp;zero;compile")
set(allowed_train "core;config;comm;kernels;data;model;offload;sp;zero;compile;ckpt;plan")
set(allowed_cli "core;config;comm;kernels;data;model;offload;sp;zero;compile;ckpt;plan;train;report")

if(NOT SRC)
  message(FATAL_ERROR "check_layers.cmake: pass -DSRC=<directory holding longtrain/>")
endif()
# A relative SRC is taken from the working directory (GLOB's RELATIVE needs an absolute path: a
# relative one matched nothing, and the check passed having read no file).
get_filename_component(SRC "${SRC}" ABSOLUTE)
file(GLOB_RECURSE files RELATIVE "${SRC}/longtrain" "${SRC}/longtrain/*.h" "${SRC}/longtrain/*.cpp" "${SRC}/longtrain/*.inc")
if(NOT files)
  message(FATAL_ERROR "check_layers.cmake: no source file under ${SRC}/longtrain")
endif()
set(errors "")
foreach(f IN LISTS files)
  string(REGEX MATCH "^[^/]+" module "${f}")
  if(NOT f MATCHES "/")  # pch.h and other files at the top are not in a module
    continue()
  endif()
  if(NOT DEFINED allowed_${module})
    string(APPEND errors "  ${f}: module '${module}' is not in the layering (cmake/check_layers.cmake)\n")
    continue()
  endif()
  file(STRINGS "${SRC}/longtrain/${f}" lines REGEX "^[ \t]*#[ \t]*include[ \t]+\"longtrain/")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE ".*\"longtrain/([^/\"]+)/.*" "\\1" target "${line}")
    if(target STREQUAL module)
      continue()
    endif()
    list(FIND allowed_${module} "${target}" at)
    if(at EQUAL -1)
      string(APPEND errors "  ${f}: ${line}  (${module} may include: ${allowed_${module}})\n")
    endif()
  endforeach()
endforeach()
if(errors)
  message(FATAL_ERROR "include against the module layering:\n${errors}")
endif()
