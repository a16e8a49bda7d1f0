// Parity (P1 Table 3; the xLSTM harness's format). Vocabulary 3: 0 = pad, 1 = bit 0, 2 = bit 1.
// A sequence of length L holds L-1 random bits and then the answer (#ones mod 2) + 1; the model
// reads the bits and must emit the answer at the last bit. Only the answer is supervised.
#pragma once
#include "tasks/task.h"

namespace lrnn {

class ParityTask final : public Task {
 public:
  std::string name() const override { return "parity"; }
  int vocab_size() const override { return 3; }
  int pad_token() const override { return 0; }
  double chance() const override { return 0.5; }
  Sample sample(uint64_t seed, Split split, uint64_t id, int len) const override;
  std::string render(const Sample& s) const override;
  std::string token_name(int32_t tok) const override;
};

}  // namespace lrnn
