// How much memory a run may plan for, and the check that refuses a plan over it with a clear
// error instead of a crash (std::bad_alloc, the kernel's OOM killer) deep inside a step.
#pragma once
#include <cstdint>
#include <string>

namespace lrnn {

// The bytes a run may use: LRNN_MEMORY_LIMIT_MB when set (tests, fuzzing, a shared machine), else
// what the kernel reports as available (MemAvailable in /proc/meminfo), else physical memory.
uint64_t memory_budget_bytes();

// UserError "<what> needs X GiB ... this machine can give Y GiB" when `bytes` exceeds the budget.
// `what` says which keys set the size (e.g. "training.batch_size x task.train_len").
void check_memory(uint64_t bytes, const std::string& what);

// "1.5 GiB", "320 MiB"
std::string human_bytes(uint64_t bytes);

}  // namespace lrnn
