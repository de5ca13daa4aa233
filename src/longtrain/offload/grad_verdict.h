// What an optimizer step does with its gradients, decided once for every ZeRO stage from the
// global sum of squared gradient elements: a non-finite norm skips the step (and is
// counted); a norm above gradient_clipping scales the gradients by PyTorch's
// clip_grad_norm_ coefficient, clip / (norm + 1e-6). Non-obvious: the check is on the norm,
// so a NaN anywhere skips the step: `NaN > clip` is false and would otherwise step on NaN.
#pragma once
#include <cmath>

namespace lt::offload {

struct GradVerdict {
  double norm = 0;      // global L2 norm before clipping
  bool skip = false;    // not finite: no parameter, Adam state or step count changes
  bool clip = false;    // finite and above gradient_clipping
  double clipCoef = 1;  // the factor the gradients are scaled by when clip
};

inline GradVerdict judgeGradients(double squaredSum, double gradientClipping) {
  GradVerdict v;
  v.norm = std::sqrt(squaredSum);
  v.skip = !std::isfinite(v.norm);
  v.clip = !v.skip && gradientClipping > 0 && v.norm > gradientClipping;
  if (v.clip) v.clipCoef = gradientClipping / (v.norm + 1e-6);
  return v;
}

}  // namespace lt::offload
