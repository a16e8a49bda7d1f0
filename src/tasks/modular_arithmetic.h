// Modular arithmetic without brackets (Delétang et al.; the xLSTM harness's format, P1 Table 3).
// Vocabulary 10: 0 pad, 1 '+', 2 '-', 3 '*', 4 '=', 5..9 the digits 0..4. A sequence of odd
// length L holds numbers at even positions 0..L-3, operators drawn uniformly from {+, -, *} at
// the odd positions between them, '=' at L-2 and the answer at L-1: the expression's value mod 5
// with the usual precedence ('*' before '+' and '-'), e.g. "2 - 3 - 3 * 2 = 3".
// Lengths as in the harness: L = 2·U{(lo+1)//2 .. (hi+1)//2} - 1, so a range [40, 256] yields
// 39, 41, ..., 255; L >= 3. The model reads seq[:-1]; only the answer (at '=') is supervised.
// Chance 0.2.
#pragma once
#include "tasks/task.h"

namespace lrnn {

class ModularArithmeticTask final : public Task {
 public:
  std::string name() const override { return "modular_arithmetic"; }
  int vocab_size() const override { return 10; }
  int pad_token() const override { return 0; }
  double chance() const override { return 0.2; }
  std::vector<int> lengths(std::array<int, 2> range) const override;
  Sample sample(uint64_t seed, Split split, uint64_t id, int len) const override;
  std::string render(const Sample& s) const override;
  std::string token_name(int32_t tok) const override;
};

}  // namespace lrnn
