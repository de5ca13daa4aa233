// SIMD CPU Adam/AdamW with DeepSpeed CPUAdam's semantics (csrc/includes/cpu_adam.h), whose
// oracle is torch::optim::AdamW/Adam. Non-obvious: the float ops follow libtorch 1.13's order
// (scalars in double, then cast), so results match it element by element, not just by norm.
//
// Guarantees:
// - Updates are in place: p (or the fp32 master), m and v are read and written, g is only
//   read. The buffers must not overlap; no alignment is required.
// - `step` is 1-based (the step being taken); bias correction uses it.
// - The kernel is chosen at run time (kernels/isa.h): AVX-512 when the CPU has F/BW/DQ/VL, else
//   AVX2+FMA, else the scalar reference (Isa::Baseline; the *With forms take the Isa). Every
//   kernel agrees with the scalar one within 1e-6 on unit-scale data. The AVX2 and AVX-512
//   kernels are bit-identical to each other (and, measured on an AVX-512 Xeon, to
//   torch::optim::AdamW/Adam); the scalar one rounds the fma-fused ops of libtorch's vector
//   path as a separate mul and add, so it differs from them by a rounding now and then.
// - `threads` splits the range into contiguous 64-element-aligned chunks, one std::thread
//   each (threads <= 1, or a small n, runs on the caller). Each element's arithmetic does not
//   depend on the split: results are bit-identical for every thread count.
// - Calls are synchronous: everything is written when they return.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "longtrain/kernels/isa.h"

namespace lt::kernels {

// Defaults are torch::optim::AdamW's. Doubles, as libtorch keeps its options: the step's
// scalars (bias corrections, step size, decay) are computed from the same doubles, so a
// schedule's lr rounds as in torch::optim and the kernels stay bit-identical to it.
struct AdamParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weightDecay = 1e-2;
  bool adamw = true;           // true: decoupled, p *= 1 - lr*wd first; false: L2, g += wd*p
  bool biasCorrection = true;  // false: bias1 = bias2 = 1
};

// fp32 parameters: p, m, v updated in place from g, n elements.
void adamStep(float* p, const float* g, float* m, float* v, int64_t n, int64_t step,
              const AdamParams& params, int threads);
void adamStepWith(Isa isa, float* p, const float* g, float* m, float* v, int64_t n,
                  int64_t step, const AdamParams& params, int threads);

// Out of place: reads (pIn, mIn, vIn), writes (pOut, mOut, vOut); the inputs are untouched.
// The arithmetic is the in-place step's, so the outputs are bit-identical to it. This is what
// makes SuperOffload's rollback exact at no extra memory traffic: a speculative step writes
// shadow buffers, committing swaps them in, rolling back drops them.
void adamStepInto(const float* pIn, const float* mIn, const float* vIn, const float* g, float* pOut,
                  float* mOut, float* vOut, int64_t n, int64_t step, const AdamParams& params, int threads);

// bf16 parameters with fp32 states. With pMaster, the fp32 master is updated and pBf16 only
// written (round to nearest even); without it (nullptr), pBf16 is widened, updated in fp32
// and rounded back. NaN becomes the quiet NaN 0x7FC0, as c10::BFloat16 does.
void adamStepBf16(uint16_t* pBf16, float* pMaster, const float* g, float* m, float* v,
                  int64_t n, int64_t step, const AdamParams& params, int threads);
void adamStepBf16With(Isa isa, uint16_t* pBf16, float* pMaster, const float* g, float* m,
                      float* v, int64_t n, int64_t step, const AdamParams& params, int threads);

// Elements [offset, offset + length) of a group decay by weightDecay (weight-decay groups:
// matrices decay, norms do not). A group's spans tile it in order.
struct DecaySpan {
  int64_t offset, length;
  double weightDecay;
};

// Optimizer state for the sub-groups of one optimizer (DeepSpeed's step_subgroup): each group
// owns zeroed m and v and its own step count, and may mix weight decays over spans of it (a
// step runs the kernel once per span; the arithmetic is elementwise, so splitting is exact). addGroup must not run concurrently with other
// calls; step() on distinct groups may run concurrently. m/v pointers stay valid for the
// object's lifetime.
class CpuAdam {
 public:
  CpuAdam(AdamParams params, int threads);
  ~CpuAdam();
  CpuAdam(const CpuAdam&) = delete;
  CpuAdam& operator=(const CpuAdam&) = delete;

  // Returns the group id, 0, 1, ...; without spans, params().weightDecay everywhere.
  int addGroup(int64_t numel, std::vector<DecaySpan> decay = {});
  // Increments the group's step count, then updates p (numel fp32 values) from g.
  void step(int group, float* p, const float* g);
  // The same for bf16 parameters (see adamStepBf16).
  void stepBf16(int group, uint16_t* pBf16, float* pMaster, const float* g);
  // A speculative step: from p and the group's state, writes pOut and the group's shadow m, v
  // (allocated on first use); the state and step count stay as they were until
  // commitSpeculative (which swaps the shadows in and counts the step). Not committing is the
  // rollback, exact by construction.
  void stepSpeculative(int group, const float* p, const float* g, float* pOut);
  void commitSpeculative(int group);

  int groupCount() const;
  int64_t groupNumel(int group) const;
  float* expAvg(int group);    // m, groupNumel floats, 64-byte aligned
  float* expAvgSq(int group);  // v, groupNumel floats, 64-byte aligned
  int64_t stepCount(int group) const;
  void setStepCount(int group, int64_t step);  // for checkpoint load and rollback

  void setLr(double lr);
  const AdamParams& params() const { return params_; }
  int threads() const { return threads_; }

 private:
  struct AlignedFree {
    void operator()(float* ptr) const;
  };
  using Buffer = std::unique_ptr<float[], AlignedFree>;
  static Buffer allocBuffer(int64_t numel);
  struct Group {
    Buffer m, v;
    Buffer mShadow, vShadow;  // speculative step outputs
    int64_t numel = 0;
    int64_t step = 0;
    std::vector<DecaySpan> decay;  // merged: adjacent spans differ in weight decay
  };
  // Calls fn(offset, length, params) for each span of the group, params carrying its decay.
  template <typename Fn>
  void forEachSpan(const Group& g, Fn fn) const;
  Group& groupAt(int group);
  const Group& groupAt(int group) const;

  AdamParams params_;
  int threads_;
  std::vector<Group> groups_;
};

namespace detail {

// One step's scalars, computed in double as libtorch does and then cast to float.
struct AdamCoeffs {
  float decay;       // AdamW: 1 - lr*wd; otherwise 1
  float l2;          // Adam with wd != 0: wd (g += wd*p); otherwise 0 and unused
  float beta1, oneMinusBeta1;
  float beta2, oneMinusBeta2;
  float sqrtBias2;   // sqrt(1 - beta2^t)
  float eps;
  float negStepSize; // -lr / (1 - beta1^t)
};

// The per-ISA kernels over [0, n), defined in cpu_adam_avx2.cpp / cpu_adam_avx512.cpp. They
// execute ISA instructions unconditionally: call them only through the dispatch above.
// fp32 kernels read (pIn, mIn, vIn) and write (p, m, v); in place when they are the same.
void adamKernelAvx2(const float* pIn, const float* mIn, const float* vIn, const float* g, float* p, float* m,
                    float* v, int64_t n, const AdamCoeffs& c);
void adamKernelBf16Avx2(uint16_t* pBf16, float* pMaster, const float* g, float* m, float* v,
                        int64_t n, const AdamCoeffs& c);
void adamKernelAvx512(const float* pIn, const float* mIn, const float* vIn, const float* g, float* p, float* m,
                      float* v, int64_t n, const AdamCoeffs& c);
void adamKernelBf16Avx512(uint16_t* pBf16, float* pMaster, const float* g, float* m, float* v,
                          int64_t n, const AdamCoeffs& c);

}  // namespace detail

}  // namespace lt::kernels
