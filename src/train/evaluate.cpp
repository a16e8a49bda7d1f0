#include "train/evaluate.h"
#include <algorithm>
#include <cmath>
#include <set>
#include "core/check.h"
#include "tasks/lm.h"

namespace lrnn {

double EvalResult::accuracy() const {
  if (kind == EvalKind::Prefix) return per_length.empty() ? 0.0 : per_length.rbegin()->second.accuracy();
  int64_t c = 0, t = 0;
  for (auto& [len, b] : per_length) c += b.correct, t += b.total;
  return t ? double(c) / double(t) : 0.0;
}

double EvalResult::scaled_accuracy() const {
  double c = kind == EvalKind::Prefix && !per_length.empty() ? per_length.rbegin()->second.chance : chance;
  return (accuracy() - c) / (1.0 - c);
}

nlohmann::json EvalResult::to_json() const {
  nlohmann::json per = nlohmann::json::object();
  for (auto& [len, b] : per_length)
    per[std::to_string(len)] = {{"n", b.total}, {"accuracy", b.accuracy()}, {"scaled_accuracy", b.scaled_accuracy()}};
  nlohmann::json j = {{"lengths", range}, {"samples", samples}, {"accuracy", accuracy()},
                      {"scaled_accuracy", scaled_accuracy()}, {"per_length", per}};
  if (kind == EvalKind::Prefix) {
    j["metric"] = "sequence_accuracy_up_to_length";
    j["eval_length"] = eval_length;
    j["token_accuracy"] = labels_total ? double(labels_correct) / double(labels_total) : 0.0;
    // The curve in length order (per_length's keys are strings, which JSON readers sort as text).
    std::vector<int> ts;
    std::vector<double> accs;
    for (auto& [t, b] : per_length) ts.push_back(t), accs.push_back(b.accuracy());
    j["curve"] = {{"length", ts}, {"sequence_accuracy", accs}};
  } else {
    j["metric"] = "answer_accuracy";
  }
  return j;
}

namespace {

// Runs `n` samples through the model in batches; calls score(sample index, batch, row, logits).
template <class Score>
void run_samples(const LogitsFn& logits_of, const Task& task, int n, int batch_size, const Score& score,
                 const std::function<Sample(int)>& make) {
  for (int start = 0; start < n; start += batch_size) {
    std::vector<Sample> samples;
    for (int j = start; j < std::min(n, start + batch_size); ++j) samples.push_back(make(j));
    Batch b = task.make_batch(samples);
    const float* logits = logits_of(b);
    for (int i = 0; i < b.B; ++i) score(b, i, logits);
  }
}

bool predicted(const float* logits, const Batch& b, int i, int t, int V, int32_t y) {
  const float* row = logits + (size_t(i) * b.T + t) * V;
  return int32_t(std::max_element(row, row + V) - row) == y;
}

}  // namespace

EvalResult evaluate(const LogitsFn& logits_of, int vocab, const Task& task, std::array<int, 2> range,
                    int n_samples, int batch_size, uint64_t seed) {
  EvalResult r;
  r.kind = task.eval_kind();
  r.range = range;
  r.chance = task.chance();
  const int V = vocab;
  std::vector<int> lens = task.lengths(range);
  if (lens.empty()) LRNN_USER_ERROR("evaluate: task {} has no sequence length in [{}, {}]", task.name(), range[0], range[1]);
  std::sort(lens.begin(), lens.end());
  lens.erase(std::unique(lens.begin(), lens.end()), lens.end());
  auto eval_sample = [&](int len) {
    return [&, len](int j) { return task.sample(seed, Split::Eval, (uint64_t(len) << 32) | uint64_t(j), len); };
  };

  if (r.kind == EvalKind::Answer) {
    const int per_len = std::max(1, (n_samples + int(lens.size()) - 1) / int(lens.size()));
    for (int len : lens) {
      auto& bucket = r.per_length[len];
      bucket.chance = r.chance;
      run_samples(logits_of, task, per_len, batch_size, [&](const Batch& b, int i, const float* logits) {
        bool ok = true;
        for (int t = 0; t < b.T; ++t) {
          int32_t y = b.labels[size_t(i) * b.T + t];
          if (y < 0) continue;
          bool hit = predicted(logits, b, i, t, V, y);
          r.labels_correct += hit;
          r.labels_total += 1;
          ok = ok && hit;
        }
        bucket.correct += ok;
        bucket.total += 1;
      }, eval_sample(len));
      r.samples += per_len;
    }
    return r;
  }

  // Prefix: every sample has the longest length L; record where each first goes wrong.
  const int L = lens.back();
  r.eval_length = L;
  r.samples = n_samples;
  std::vector<int64_t> first_wrong(size_t(L) + 2, 0);  // [t]: samples whose first error is at t; [L+1]: none
  std::set<int> supervised;                            // prefix lengths t that carry a label
  run_samples(logits_of, task, n_samples, batch_size, [&](const Batch& b, int i, const float* logits) {
    const int offset = b.lengths[i] - L;  // tokens before x_1 (BOS)
    int first = L + 1;
    for (int p = 0; p < b.T; ++p) {
      int32_t y = b.labels[size_t(i) * b.T + p];
      if (y < 0) continue;
      const int t = std::max(0, p + 1 - offset);
      supervised.insert(t);
      bool hit = predicted(logits, b, i, p, V, y);
      r.labels_correct += hit;
      r.labels_total += 1;
      if (!hit) first = std::min(first, t);
    }
    first_wrong[first] += 1;
  }, eval_sample(L));
  int64_t wrong = 0;
  int n_labels = 0;
  for (int t = 0; t <= L; ++t) {
    wrong += first_wrong[t];
    if (t == 0 || !supervised.count(t)) continue;
    ++n_labels;
    auto& bucket = r.per_length[t];
    bucket.total = n_samples;
    bucket.correct = n_samples - wrong;
    bucket.chance = std::pow(r.chance, n_labels);
  }
  return r;
}

double token_loss(const float* logits, int vocab, int label) {
  float mx = logits[0];
  for (int v = 1; v < vocab; ++v) mx = std::max(mx, logits[v]);
  double sum = 0;
  for (int v = 0; v < vocab; ++v) sum += std::exp(double(logits[v]) - double(mx));
  return double(mx) + std::log(sum) - double(logits[label]);
}

TokenLossFn token_losses_of(const LogitsFn& logits_of, int vocab) {
  return [logits_of, vocab](const Batch& b, int rows, std::vector<double>& loss) {
    const float* logits = logits_of(b);
    const size_t n = size_t(rows) * size_t(b.T);
    loss.assign(n, 0.0);
    for (size_t i = 0; i < n; ++i)  // (checked before the parallel loop: nothing may throw in it)
      LRNN_CHECK(b.labels[i] >= 0 && b.labels[i] < vocab, "label {} outside the vocabulary {}", b.labels[i], vocab);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < int64_t(n); ++i)
      loss[size_t(i)] = token_loss(logits + size_t(i) * size_t(vocab), vocab, b.labels[size_t(i)]);
  };
}

nlohmann::json evaluate_lm(const TokenLossFn& losses, const LmTask& task, int batch_size, int64_t max_tokens) {
  const int T = task.eval_context();
  const uint64_t windows = task.eval_windows();
  uint64_t use = windows;
  if (max_tokens > 0) use = std::min<uint64_t>(windows, std::max<uint64_t>(1, uint64_t(max_tokens) / uint64_t(T)));
  std::vector<double> pos_sum(size_t(T), 0.0);
  std::vector<int64_t> pos_n(size_t(T), 0);
  uint64_t done = 0;
  std::vector<double> loss;
  for (uint64_t index = 0; done < use; ++index) {
    Batch b = task.eval_batch(index, batch_size);
    const int rows = int(std::min<uint64_t>(uint64_t(b.B), use - done));
    losses(b, rows, loss);
    for (int r = 0; r < rows; ++r)
      for (int t = 0; t < T; ++t) pos_sum[size_t(t)] += loss[size_t(r) * size_t(T) + size_t(t)], ++pos_n[size_t(t)];
    done += uint64_t(rows);
  }
  double total = 0;
  int64_t n = 0;
  std::vector<double> curve(static_cast<size_t>(T));
  for (int t = 0; t < T; ++t) {
    total += pos_sum[size_t(t)];
    n += pos_n[size_t(t)];
    curve[size_t(t)] = pos_n[size_t(t)] ? pos_sum[size_t(t)] / double(pos_n[size_t(t)]) : 0.0;
  }
  const double mean = n ? total / double(n) : 0.0;
  // P2's length-extrapolation metric: the mean loss over positions 0..t, at every t.
  std::vector<double> cumulative(curve.size());
  double run = 0;
  for (size_t t = 0; t < curve.size(); ++t) cumulative[t] = (run += curve[t]) / double(t + 1);
  return {{"metric", "val_loss"}, {"val_loss", mean}, {"perplexity", std::exp(mean)}, {"tokens", n},
          {"windows", done}, {"context", T}, {"loss_by_position", curve}, {"cumulative_loss", cumulative}};
}

}  // namespace lrnn
