// Trace recorder (trace.h). Events are kept as formatted JSON text, so dumping needs no
// JSON library here and core stays free of dependencies.
#include "longtrain/core/trace.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <vector>

namespace lt::trace {

namespace {

std::atomic<bool> on{false};
std::atomic<int> processId{0};
std::atomic<int> nextThread{0};
std::mutex mu;
std::vector<std::string> events;  // guarded by mu

int threadId() {
  thread_local const int id = nextThread++;
  return id;
}

int64_t nowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string escaped(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out;
}

void push(std::string e) {
  std::lock_guard<std::mutex> lk(mu);
  events.push_back(std::move(e));
}

}  // namespace

void enable(int pid) {
  processId = pid;
  on = true;
  char buf[160];
  std::snprintf(buf, sizeof buf, R"({"ph":"M","name":"process_name","pid":%d,"args":{"name":"rank %d"}})", pid, pid);
  push(buf);
  nameThread("trainer");
}

bool enabled() { return on.load(std::memory_order_relaxed); }

void nameThread(const std::string& name) {
  if (!enabled()) return;
  push(R"({"ph":"M","name":"thread_name","pid":)" + std::to_string(processId.load()) + R"(,"tid":)" +
       std::to_string(threadId()) + R"(,"args":{"name":")" + escaped(name) + R"("}})");
}

Scope::Scope(const char* category, std::string name) {
  if (!enabled()) return;
  category_ = category;
  name_ = std::move(name);
  startUs_ = nowUs();
}

Scope::~Scope() {
  if (!category_) return;
  const int64_t end = nowUs();
  push(R"({"ph":"X","cat":")" + std::string(category_) + R"(","name":")" + escaped(name_) + R"(","pid":)" +
       std::to_string(processId.load()) + R"(,"tid":)" + std::to_string(threadId()) + R"(,"ts":)" +
       std::to_string(startUs_) + R"(,"dur":)" + std::to_string(end - startUs_) + "}");
}

std::string eventsJson() {
  std::lock_guard<std::mutex> lk(mu);
  std::string out;
  for (const auto& e : events) {
    if (!out.empty()) out += ",\n";
    out += e;
  }
  return out;
}

}  // namespace lt::trace
