// Modular arithmetic with brackets (Delétang et al.'s task in the format of P1's
// xLSTM-harness port, P1 Table 3). Vocabulary 12: digits 0..4 are ids 0..4, '+' 5, '-' 6, '*' 7,
// '(' 8, ')' 9, '=' 10, pad 11.
// A length L (as the harness counts it) becomes an expression of n = L - 3 tokens followed by
// '=' and the answer (the harness also appends one pad, which the model never reads before the
// answer). The expression is built recursively: n < 5 gives d, -d, (d) or (-d) for n = 1..4;
// otherwise a left length l ~ U{1..n-4} and "(left op right)" with the right part n - l - 3
// tokens and op uniform in {+, -} ({+, -, *} with task.mult). The answer is the value mod 5.
// Lengths as in the harness: L = max(U{lo..hi}, 5), so 3 and 4 become 5. The model reads the
// expression and '='; only the answer (at '=') is supervised. Chance 0.2.
#pragma once
#include "tasks/task.h"

namespace lrnn {

class ModularArithmeticBracketsTask final : public Task {
 public:
  explicit ModularArithmeticBracketsTask(bool mult) : mult_(mult) {}
  std::string name() const override { return "modular_arithmetic_with_brackets"; }
  int vocab_size() const override { return 12; }
  int pad_token() const override { return 11; }
  double chance() const override { return 0.2; }
  std::vector<int> lengths(std::array<int, 2> range) const override;
  Sample sample(uint64_t seed, Split split, uint64_t id, int len) const override;
  std::string render(const Sample& s) const override;
  std::string token_name(int32_t tok) const override;

 private:
  bool mult_;
};

}  // namespace lrnn
