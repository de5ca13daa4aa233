// The one place where the libtorch versions longtrain builds against differ: Debian 12's 1.13
// (with oneDNN 2) and Debian 13's 2.6 (with oneDNN 3). Every other file is written once against
// what this header gives; no version test (#if) appears anywhere else.
// Non-obvious: it lives in core so that every module may include it, but it is header only and
// includes nothing but version headers (and 1.13's string helper): core's own sources still build
// without libtorch, and only the modules that link libtorch (and oneDNN) include it.
#pragma once
#include <torch/version.h>

#if TORCH_VERSION_MAJOR < 2
#include <c10/util/string_utils.h>
#endif
#if __has_include(<oneapi/dnnl/dnnl_version.h>)
#include <oneapi/dnnl/dnnl_version.h>
#endif

namespace lt::compat {

// The key of a parameter's entry in torch::optim::Optimizer::state(): its TensorImpl's address,
// as a string in 1.13 and as the pointer itself in 2.x. A template, so no ATen header is needed.
template <class Tensor>
auto optimizerStateKey(const Tensor& parameter) {
#if TORCH_VERSION_MAJOR >= 2
  return static_cast<void*>(parameter.unsafeGetTensorImpl());
#else
  return c10::guts::to_string(parameter.unsafeGetTensorImpl());
#endif
}

// TCPStore's options as 1.13 has them: its classic server and client. 2.x defaults to a libuv
// server, and Debian 13's libtorch, built without it, refuses the default ("use_libuv was
// requested but PyTorch was build without libuv support"). `Options` is c10d::TCPStoreOptions.
template <class Options>
Options tcpStoreOptions() {
  Options options;
#if TORCH_VERSION_MAJOR >= 2
  options.useLibUV = false;
#endif
  return options;
}

// A matmul's primitive descriptor. oneDNN 3 dropped the operation descriptors: the primitive
// descriptor takes the engine and the memory descriptors itself. `Matmul` is dnnl::matmul (a
// template, so this header needs no dnnl.hpp).
template <class Matmul, class Engine, class MemoryDesc, class Attr>
typename Matmul::primitive_desc matmulPrimitiveDesc(const Engine& engine, const MemoryDesc& src,
                                                    const MemoryDesc& weights, const MemoryDesc& dst,
                                                    const Attr& attr) {
#if defined(DNNL_VERSION_MAJOR) && DNNL_VERSION_MAJOR >= 3
  return typename Matmul::primitive_desc(engine, src, weights, dst, attr);
#else
  return typename Matmul::primitive_desc(typename Matmul::desc(src, weights, dst), attr, engine);
#endif
}

}  // namespace lt::compat
