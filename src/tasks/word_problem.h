// Group word problems (Merrill et al., "The Illusion of State"; P1 §5.2; P2), task
// "word_problem".
//
// Input x_1..x_T: group elements drawn i.i.d. uniformly (from the whole group, or from the S<n>
// subsets below); target at every position: the prefix product y_t = y_{t-1} ∘ x_t with
// y_0 = identity, i.e. y_t = x_1 ∘ ... ∘ x_t, composition as in tasks/groups.h (Merrill et al.'s
// convention). Unlike the Chomsky tasks, targets are not shifted: the label at the position of
// x_t is y_t.
//
// Tokens: 0..|G|-1 are the elements (lexicographic order, 0 = identity); then pad (|G|); then,
// when enabled, BOS; then, when tokens_per_element > 1, the filler token.
//
// Keys (task.*):
// - group: the group (tasks/groups.h), e.g. S3, S5, A5, Z5, Z2xZ3.
// - bos: prepend BOS to input and target, as P2 (and Merrill et al.'s tokenizer) do; every
//   position is supervised, the BOS position with the BOS token.
// - only_swaps: inputs are the transpositions of S<n> (exactly two points moved).
// - max_moved: inputs are the permutations moving at most k points, identity included
//   (k = 2: identity and swaps; k = 3: also the 3-cycles).
// - tokens_per_element = k: each element is followed by k-1 filler tokens, giving the model k
//   positions (k Householder factors of a DeltaNet) per element (P1's S5 study); only the last
//   token of each element is supervised, with y_t.
//
// Length: the number of input tokens without BOS, T·k; with k > 1 only multiples of k occur.
// Chance: 1/|G| per supervised label.
#pragma once
#include "tasks/groups.h"
#include "tasks/task.h"

namespace lrnn {

class WordProblemTask final : public Task {
 public:
  explicit WordProblemTask(const TaskConfig& cfg);
  std::string name() const override { return "word_problem"; }
  int vocab_size() const override;
  int pad_token() const override { return group_.order(); }
  int bos_token() const override { return bos_ ? group_.order() + 1 : -1; }
  int filler_token() const { return tokens_per_element_ > 1 ? group_.order() + 1 + int(bos_) : -1; }
  double chance() const override { return 1.0 / group_.order(); }
  EvalKind eval_kind() const override { return EvalKind::Prefix; }
  std::vector<int> lengths(std::array<int, 2> range) const override;
  Sample sample(uint64_t seed, Split split, uint64_t id, int len) const override;
  std::string render(const Sample& s) const override;
  std::string token_name(int32_t tok) const override;

  const Group& group() const { return group_; }
  const std::vector<int>& alphabet() const { return alphabet_; }  // elements the inputs draw from

 private:
  Group group_;
  bool bos_;
  int tokens_per_element_;
  std::vector<int> alphabet_;
};

}  // namespace lrnn
