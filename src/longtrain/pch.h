// Precompiled header for longtrain_lib and every target that reuses it: the libtorch and
// c10d headers cost ~10-35 s per translation unit on 2 cores, so they are parsed once here.
#pragma once
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/optim/adamw.h>
#include <torch/optim/adam.h>
#include <nlohmann/json.hpp>
#include <fmt/format.h>
