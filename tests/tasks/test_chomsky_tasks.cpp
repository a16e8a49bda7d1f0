// The Chomsky-hierarchy tasks checked against evaluators written here independently of the
// generators: a recursive-descent parser for the arithmetic expressions, pair counting for even
// pairs, a walk for cycle navigation; exact length distributions, token ranges, determinism.
#include <gtest/gtest.h>
#include <cmath>
#include <map>
#include <set>
#include "core/check.h"
#include "tasks/task.h"

using namespace lrnn;

namespace {

TaskConfig named(const std::string& name) {
  TaskConfig c;
  c.name = name;
  return c;
}

// Chi-square of observed against expected counts, and a conservative critical value
// (Wilson-Hilferty, z = 4.5: a correct generator fails about once in 300,000 runs).
double chi_square(const std::map<int, int64_t>& observed, const std::map<int, double>& expected) {
  double x = 0;
  for (auto& [k, e] : expected) {
    double o = observed.count(k) ? double(observed.at(k)) : 0.0;
    x += (o - e) * (o - e) / e;
  }
  return x;
}
double chi_critical(int dof) {
  double k = dof, z = 4.5;
  return k * std::pow(1 - 2 / (9 * k) + z * std::sqrt(2 / (9 * k)), 3);
}

// Draws n lengths for `range` and checks them against `weights` (length -> relative weight).
void expect_length_distribution(const Task& task, std::array<int, 2> range, const std::map<int, double>& weights,
                                int n) {
  std::map<int, int64_t> seen;
  for (int id = 0; id < n; ++id) seen[task.draw_length(9, Split::Train, id, range)]++;
  double total = 0;
  for (auto& [len, w] : weights) total += w;
  std::map<int, double> expected;
  for (auto& [len, w] : weights) expected[len] = n * w / total;
  for (auto& [len, c] : seen) EXPECT_TRUE(weights.count(len)) << "unexpected length " << len;
  EXPECT_LT(chi_square(seen, expected), chi_critical(int(weights.size()) - 1));
}

// Common checks: the answer is the only label, at the last input position; tokens in range, no
// pad inside a sample; deterministic per (seed, split, id); ids differ.
void expect_common(const Task& task, int len, int input_len) {
  const int V = task.vocab_size();
  for (int id = 0; id < 300; ++id) {
    Sample s = task.sample(1, Split::Train, id, len);
    ASSERT_EQ(int(s.input.size()), input_len);
    ASSERT_EQ(s.target.size(), s.input.size());
    for (size_t t = 0; t + 1 < s.target.size(); ++t) ASSERT_EQ(s.target[t], -1);
    ASSERT_GE(s.target.back(), 0);
    ASSERT_LT(s.target.back(), V);
    for (auto x : s.input) {
      ASSERT_GE(x, 0);
      ASSERT_LT(x, V);
      ASSERT_NE(x, task.pad_token());
    }
  }
  Sample a = task.sample(3, Split::Eval, 17, len), b = task.sample(3, Split::Eval, 17, len);
  EXPECT_EQ(a.input, b.input);
  EXPECT_EQ(a.target, b.target);
  std::set<std::vector<int32_t>> distinct;
  for (int id = 0; id < 100; ++id) distinct.insert(task.sample(3, Split::Eval, id, len).input);
  EXPECT_EQ(distinct.size(), 100u);
  EXPECT_NE(task.sample(3, Split::Train, 17, len).input, a.input);
  EXPECT_NE(task.sample(4, Split::Eval, 17, len).input, a.input);
}

// Recursive-descent evaluator of +, -, * (with precedence), unary minus and brackets, mod 5.
struct Parser {
  std::vector<char> s;  // one character per token
  size_t at = 0;
  bool ok = true;
  static int mod(long long x) { return int(((x % 5) + 5) % 5); }
  char peek() const { return at < s.size() ? s[at] : '\0'; }
  int primary() {
    char c = peek();
    if (c >= '0' && c <= '4') {
      ++at;
      return c - '0';
    }
    if (c == '(') {
      ++at;
      int v = expr();
      if (peek() != ')') ok = false;
      ++at;
      return v;
    }
    ok = false;
    return 0;
  }
  int unary() {
    if (peek() == '-') {
      ++at;
      return mod(-unary());
    }
    return primary();
  }
  int term() {
    int v = unary();
    while (peek() == '*') {
      ++at;
      v = mod(1LL * v * unary());
    }
    return v;
  }
  int expr() {
    int v = term();
    while (peek() == '+' || peek() == '-') {
      char op = s[at++];
      int r = term();
      v = mod(op == '+' ? v + r : v - r);
    }
    return v;
  }
  int whole() {
    int v = expr();
    if (at != s.size()) ok = false;
    return v;
  }
};

}  // namespace

TEST(ModularArithmetic, AnswersMatchAnIndependentParser) {
  auto task = create_task(named("modular_arithmetic"));
  EXPECT_EQ(task->vocab_size(), 10);
  EXPECT_EQ(task->pad_token(), 0);
  EXPECT_DOUBLE_EQ(task->chance(), 0.2);
  const char sym[] = {'?', '+', '-', '*', '=', '0', '1', '2', '3', '4'};
  std::map<int, int64_t> ops, digits;
  for (int id = 0; id < 4000; ++id) {
    int len = task->draw_length(2, Split::Train, id, {3, 80});
    ASSERT_EQ(len % 2, 1);
    Sample s = task->sample(2, Split::Train, id, len);
    ASSERT_EQ(int(s.input.size()), len - 1);
    ASSERT_EQ(s.input.back(), 4);  // '=' at L-2
    Parser p;
    for (int i = 0; i + 1 < len - 1; ++i) {
      int32_t t = s.input[i];
      if (i % 2 == 0) {
        ASSERT_TRUE(t >= 5 && t <= 9) << "number expected at " << i;
        digits[t]++;
      } else {
        ASSERT_TRUE(t >= 1 && t <= 3) << "operator expected at " << i;
        ops[t]++;
      }
      p.s.push_back(sym[t]);
    }
    int value = p.whole();
    ASSERT_TRUE(p.ok);
    ASSERT_EQ(s.target.back(), 5 + value) << task->render(s);
  }
  double n_ops = double(ops[1] + ops[2] + ops[3]), n_dig = 0;
  for (auto& [t, c] : digits) n_dig += double(c);
  EXPECT_LT(chi_square(ops, {{1, n_ops / 3}, {2, n_ops / 3}, {3, n_ops / 3}}), chi_critical(2));
  EXPECT_LT(chi_square(digits, {{5, n_dig / 5}, {6, n_dig / 5}, {7, n_dig / 5}, {8, n_dig / 5}, {9, n_dig / 5}}),
            chi_critical(4));
  // The paper's example, rendered.
  Sample ex;
  ex.input = {7, 2, 8, 2, 8, 3, 7, 4};
  ex.target = {-1, -1, -1, -1, -1, -1, -1, 8};
  EXPECT_EQ(task->render(ex), "2 - 3 - 3 * 2 = 3");
  expect_common(*task, 41, 40);
}

TEST(ModularArithmetic, LengthsFollowTheHarness) {
  auto task = create_task(named("modular_arithmetic"));
  // L = 2 U{(lo+1)//2 .. (hi+1)//2} - 1.
  std::vector<int> train, test;
  for (int k = 2; k <= 20; ++k) train.push_back(2 * k - 1);
  for (int k = 20; k <= 128; ++k) test.push_back(2 * k - 1);
  EXPECT_EQ(task->lengths({3, 40}), train);  // 3, 5, ..., 39
  EXPECT_EQ(task->lengths({40, 256}), test);  // 39, 41, ..., 255
  EXPECT_EQ(task->lengths({40, 40}), (std::vector<int>{39}));
  EXPECT_TRUE(task->lengths({2, 2}).empty());  // L = 1 has no expression
  std::map<int, double> w;
  for (int len : train) w[len] = 1;
  expect_length_distribution(*task, {3, 40}, w, 38000);
  TaskConfig c = named("modular_arithmetic");
  c.train_len = {2, 2};
  EXPECT_THROW(create_task(c), UserError);
}

TEST(ModularArithmeticBrackets, AnswersMatchAnIndependentParser) {
  for (bool mult : {false, true}) {
    SCOPED_TRACE(mult ? "mult" : "+-");
    TaskConfig c = named("modular_arithmetic_with_brackets");
    c.mult = mult;
    auto task = create_task(c);
    EXPECT_EQ(task->vocab_size(), 12);
    EXPECT_EQ(task->pad_token(), 11);
    const char sym[] = {'0', '1', '2', '3', '4', '+', '-', '*', '(', ')', '=', '?'};
    int64_t stars = 0, minus = 0;
    std::map<int, int64_t> answers;
    for (int id = 0; id < 4000; ++id) {
      int len = task->draw_length(5, Split::Train, id, {3, 80});
      Sample s = task->sample(5, Split::Train, id, len);
      ASSERT_EQ(int(s.input.size()), len - 2);  // n = L-3 expression tokens, then '='
      ASSERT_EQ(s.input.back(), 10);
      Parser p;
      int depth = 0;
      for (size_t i = 0; i + 1 < s.input.size(); ++i) {
        int32_t t = s.input[i];
        ASSERT_TRUE(t >= 0 && t <= 9) << t;
        depth += t == 8 ? 1 : t == 9 ? -1 : 0;
        ASSERT_GE(depth, 0);
        stars += t == 7;
        minus += t == 6;
        p.s.push_back(sym[t]);
      }
      ASSERT_EQ(depth, 0);
      int value = p.whole();
      ASSERT_TRUE(p.ok) << task->render(s);
      ASSERT_EQ(s.target.back(), value) << task->render(s);
      answers[value]++;
    }
    EXPECT_EQ(stars > 0, mult);
    EXPECT_GT(minus, 0);
    EXPECT_EQ(answers.size(), 5u);
    expect_common(*task, 40, 38);
  }
  auto task = create_task(named("modular_arithmetic_with_brackets"));
  Sample ex;
  ex.input = {8, 8, 3, 5, 6, 1, 9, 6, 8, 2, 9, 9, 10};  // ((3+-1)-(2)) =
  ex.target.assign(13, -1);
  ex.target.back() = 0;
  EXPECT_EQ(task->render(ex), "((3 + -1) - (2)) = 0");
}

TEST(ModularArithmeticBrackets, ShortExpressionsAndLengths) {
  auto task = create_task(named("modular_arithmetic_with_brackets"));
  // n = 2, 3, 4 give -d, (d), (-d).
  for (int id = 0; id < 50; ++id) {
    auto a = task->sample(0, Split::Train, id, 5).input, b = task->sample(0, Split::Train, id, 6).input,
         c = task->sample(0, Split::Train, id, 7).input;
    ASSERT_EQ(a.size(), 3u);
    EXPECT_EQ(a[0], 6);
    EXPECT_EQ(b[0], 8);
    EXPECT_EQ(b[2], 9);
    EXPECT_EQ(c[0], 8);
    EXPECT_EQ(c[1], 6);
    EXPECT_EQ(c[3], 9);
  }
  // L = max(U{lo..hi}, 5): 3 and 4 become 5.
  std::map<int, double> w;
  for (int len = 5; len <= 40; ++len) w[len] = len == 5 ? 3 : 1;
  expect_length_distribution(*task, {3, 40}, w, 38000);
  TaskConfig parity;
  parity.mult = true;  // a bracket-task key on another task
  EXPECT_THROW(create_task(parity), UserError);
}

TEST(EvenPairs, AnswerIsTheParityOfAbAndBaPairs) {
  auto task = create_task(named("even_pairs"));
  EXPECT_EQ(task->vocab_size(), 3);
  EXPECT_DOUBLE_EQ(task->chance(), 0.5);
  std::map<int, int64_t> answers;
  for (int id = 0; id < 4000; ++id) {
    int len = task->draw_length(8, Split::Train, id, {2, 60});
    Sample s = task->sample(8, Split::Train, id, len);
    ASSERT_EQ(int(s.input.size()), len - 1);
    int pairs = 0;
    for (size_t i = 0; i + 1 < s.input.size(); ++i) pairs += s.input[i] != s.input[i + 1];
    ASSERT_EQ(s.target.back(), pairs % 2 == 0 ? 1 : 2);
    answers[s.target.back()]++;
  }
  EXPECT_LT(chi_square(answers, {{1, 2000}, {2, 2000}}), chi_critical(1));
  std::map<int, double> w;
  for (int len = 3; len <= 40; ++len) w[len] = 1;
  expect_length_distribution(*task, {3, 40}, w, 38000);
  expect_common(*task, 40, 39);
}

TEST(CycleNavigation, AnswerIsTheFinalPosition) {
  for (int m : {5, 6}) {
    SCOPED_TRACE(m);
    TaskConfig c = named("cycle_navigation");
    c.cycle_length = m;
    auto task = create_task(c);
    EXPECT_EQ(task->vocab_size(), 4 + m);
    EXPECT_DOUBLE_EQ(task->chance(), 1.0 / m);
    std::map<int, int64_t> answers, actions;
    for (int id = 0; id < 4000; ++id) {
      int len = task->draw_length(6, Split::Train, id, {2, 60});
      Sample s = task->sample(6, Split::Train, id, len);
      int pos = 0;
      for (auto a : s.input) {
        ASSERT_TRUE(a >= 1 && a <= 3);
        actions[a]++;
        pos += a == 2 ? 1 : a == 3 ? -1 : 0;
      }
      ASSERT_EQ(s.target.back(), 4 + ((pos % m) + m) % m);
      answers[s.target.back()]++;
    }
    EXPECT_EQ(int(answers.size()), m);
    double n = 0;
    for (auto& [a, k] : actions) n += double(k);
    EXPECT_LT(chi_square(actions, {{1, n / 3}, {2, n / 3}, {3, n / 3}}), chi_critical(2));
    expect_common(*task, 40, 39);
  }
  TaskConfig c = named("cycle_navigation");
  c.cycle_length = 1;
  EXPECT_THROW(create_task(c), UserError);
  EXPECT_EQ(create_task(named("cycle_navigation"))->token_name(6), "@2");
}

TEST(Parity, AnswerIsTheParityOfOnes) {
  auto task = create_task(named("parity"));
  for (int id = 0; id < 2000; ++id) {
    int len = task->draw_length(4, Split::Train, id, {3, 40});
    ASSERT_GE(len, 3);
    ASSERT_LE(len, 40);
    Sample s = task->sample(4, Split::Train, id, len);
    int ones = 0;
    for (auto x : s.input) ones += x == 2;
    ASSERT_EQ(s.target.back(), 1 + ones % 2);
  }
  std::map<int, double> w;
  for (int len = 3; len <= 40; ++len) w[len] = 1;
  expect_length_distribution(*task, {3, 40}, w, 38000);
  expect_common(*task, 40, 39);
}

TEST(Tasks, TableListsEveryTask) {
  std::vector<std::string> want = {"parity", "modular_arithmetic", "modular_arithmetic_with_brackets",
                                   "even_pairs", "cycle_navigation", "word_problem", "lm"};
  EXPECT_EQ(task_names(), want);
  want.pop_back();  // lm needs a tokenized corpus (tests/lm/test_lm_train.cpp); without one it is an error
  for (auto& n : want) EXPECT_EQ(create_task(named(n))->name(), n);
  EXPECT_THROW(create_task(named("lm")), UserError);
  EXPECT_THROW(create_task(named("dyck")), UserError);
}
