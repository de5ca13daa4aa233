// The step trace behind `--trace PATH`: Chrome trace-event JSON ("X" complete events, which
// Perfetto and chrome://tracing open). Off unless enable() was called; then every Scope
// records one event (name, category, start, duration, thread) under a mutex — tens of events
// a step, so the lock costs nothing measurable. Timestamps are wall-clock microseconds, so
// the ranks of one host line up when their events are merged into one file.
#pragma once
#include <cstdint>
#include <string>

namespace lt::trace {

void enable(int pid);  // pid: the world rank, Perfetto's "process" row
bool enabled();
void nameThread(const std::string& name);  // the calling thread's row label

// Records [construction, destruction) as one event when tracing is on.
class Scope {
 public:
  Scope(const char* category, std::string name);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  const char* category_ = nullptr;  // nullptr: tracing was off at construction
  std::string name_;
  int64_t startUs_ = 0;
};

// This process's events so far as comma-separated JSON objects (no brackets), metadata
// (process and thread names) included; "" when there are none.
std::string eventsJson();

}  // namespace lt::trace
