// What the training thread is doing now ("building the model", "step 12: forward and
// backward", "saving the checkpoint of step 12"), for the one error that carries no context
// of its own: std::bad_alloc. Non-obvious: a fixed buffer, written with snprintf, so naming a
// phase allocates nothing (it must still work when memory has run out).
#pragma once
#include <cstdarg>
#include <cstdio>

namespace lt {

inline char* phaseBuffer() {
  static char buf[160] = "starting up";
  return buf;
}

__attribute__((format(printf, 1, 2))) inline void setPhase(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(phaseBuffer(), 160, fmt, ap);
  va_end(ap);
}

inline const char* currentPhase() { return phaseBuffer(); }

}  // namespace lt
