// Language-model training end to end on the CPU (task.name: lm): a tokenizer and token shards
// made from the Shakespeare corpus with the CLI, a small DeltaNet [-1,1] trained on them; the
// validation loss, perplexity and per-position curve; resume onto the same trajectory; the
// evaluation loss itself against a hand computation; the keys the lm task refuses.
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include "lm_util.h"
#include "data/shards.h"
#include "tasks/lm.h"
#include "infer/decoder.h"
#include "infer/run.h"
#ifdef LRNN_WITH_CUDA
#include "cuda/runtime.h"
#endif
#include "train/evaluate.h"
#include "train/trainer.h"

using namespace lrnn;
using namespace lrnn::test;

namespace {

// The corpus every test here trains on: a 512-piece tokenizer and four plays in blank-line
// documents (~300k tokens), 5 % of the documents held out. Made once per test binary.
const fs::path& corpus_dir() {
  static fs::path dir = [] {
    fs::path d = temp_dir("lm_train");
    fs::path tok = train_small_tokenizer(d, 512);
    auto files = corpus_files();
    files.resize(std::min<size_t>(files.size(), kTokenizerFiles));
    RunResult r = run_lrnn("tokenize --tokenizer '" + tok.string() + "' --input" + join_paths(files) +
                           " --text-unit blank-line --val-fraction 0.05 --out '" + (d / "data").string() + "'");
    EXPECT_EQ(r.code, 0) << r.out;
    return d;
  }();
  return dir;
}

std::string lm_config(const std::string& extra_training = "") {
  return "training: {num_steps: 200, batch_size: 16, lr: 3.0e-3, warmup_steps: 20, weight_decay: 0.01, val_every: 100, "
         "checkpoint_every: 50" + extra_training + "}\n"
         "model: {model_type: delta_net, hidden_size: 32, num_hidden_layers: 1, num_heads: 2, intermediate_size: 64, "
         "use_short_conv: true, allow_neg_eigval: true}\n"
         "task: {name: lm, data: '" + (corpus_dir() / "data").string() + "', context: 64, eval_batch_size: 16, "
         "eval_tokens: 8192}\n"
         "logging: {log_every: 20, progress: none}\n";
}

// Cross-entropy on the validation split of a model that predicts each token with its frequency
// in the training split (add-one smoothed): what a model that ignores its context can reach.
double unigram_loss(const fs::path& data) {
  auto train = data::TokenStream::open(data, "train");
  auto val = data::TokenStream::open(data, "val");
  std::vector<double> count(train.vocab_size(), 1.0);
  for (int32_t t : train.read(0, train.size())) count[size_t(t)] += 1;
  double total = 0;
  for (double c : count) total += c;
  double loss = 0;
  for (int32_t t : val.read(0, val.size())) loss -= std::log(count[size_t(t)] / total);
  return loss / double(val.size());
}

}  // namespace

// Measured (seeds 0-4, with this CPU's kernels and with OPENBLAS_CORETYPE=Haswell, AMD Zen 4):
// the unigram model's loss is 5.12 nats; the trained model ends at 4.15-4.51 (the same per seed
// within 0.003 across the two). The bound, 0.4 below unigram (4.72), is one a model reaches only
// by using its context, and leaves 0.2 of room over the worst seed.
TEST(LmTrain, LearnsBeyondUnigramStatisticsAndLogsPerplexity) {
  fs::path dir = temp_dir("lm_learn");
  write_text(dir / "lm.yaml", lm_config());
  RunResult r = run_lrnn("train --config '" + (dir / "lm.yaml").string() + "' --out '" + (dir / "run").string() + "'");
  ASSERT_EQ(r.code, 0) << r.out;
  auto evals = lines_of(dir / "run", "eval");
  ASSERT_EQ(evals.size(), 2u);  // step 100 (val_every) and the final one
  for (const auto& e : evals) {
    EXPECT_NEAR(double(e["perplexity"]), std::exp(double(e["val_loss"])), 1e-9 * double(e["perplexity"]));
    EXPECT_EQ(int64_t(e["tokens"]), 8192);  // eval_tokens: 128 windows of 64
  }
  auto eval = nlohmann::json::parse(read_text(dir / "run" / "eval.json"));
  const double unigram = unigram_loss(corpus_dir() / "data");
  std::printf("validation loss %.4f (unigram model %.4f, ln V %.4f)\n", double(eval["val_loss"]), unigram, std::log(512.0));
  EXPECT_LT(double(eval["val_loss"]), unigram - 0.4);
  EXPECT_LT(double(evals[1]["val_loss"]), double(evals[0]["val_loss"]));
  ASSERT_EQ(eval["loss_by_position"].size(), 64u);
  ASSERT_EQ(eval["cumulative_loss"].size(), 64u);  // the running mean of the curve; at the end, val_loss
  EXPECT_NEAR(double(eval["cumulative_loss"][63]), double(eval["val_loss"]), 1e-9);
  EXPECT_DOUBLE_EQ(double(eval["cumulative_loss"][0]), double(eval["loss_by_position"][0]));
  // Later positions see more context: the mean over the second half is below the first position's.
  double late = 0;
  for (size_t t = 32; t < 64; ++t) late += double(eval["loss_by_position"][t]) / 32;
  EXPECT_LT(late, double(eval["loss_by_position"][0]));

  // Evaluation at a longer window than training (length extrapolation): one curve point per position.
  RunResult e = run_lrnn("eval --run '" + (dir / "run").string() + "' --set task.eval_context=256");
  ASSERT_EQ(e.code, 0) << e.out;
  auto longer = nlohmann::json::parse(read_text(dir / "run" / "eval_context256.json"));
  EXPECT_EQ(longer["loss_by_position"].size(), 256u);
  EXPECT_EQ(int64_t(longer["context"]), 256);
  // On the CPU the longer windows were read 64 tokens (the training context) at a time through the
  // decode state; the same numbers as one forward over each whole window.
  EXPECT_EQ(int64_t(longer["read_in_pieces_of"]), 64);
  {
    LoadedRun lr = load_run(dir / "run", {"task.eval_context=256", "task.eval_tokens=2048"});
    nlohmann::json whole = evaluate_run(lr.engine->logits_fn(), lr.model().vocab_size(), lr.cfg);
    auto reader = host_reader(lr.model());
    nlohmann::json pieces = evaluate_run(lr.engine->logits_fn(), lr.model().vocab_size(), lr.cfg,
                                         token_losses_piecewise(*reader, 64));
    EXPECT_NEAR(double(pieces["val_loss"]), double(whole["val_loss"]), 1e-5);
    for (size_t t = 0; t < 256; ++t)
      EXPECT_NEAR(double(pieces["loss_by_position"][t]), double(whole["loss_by_position"][t]), 1e-4) << t;
  }

  // `lrnn generate`: greedy continuation, one token per forward through the decode state, equals
  // what one whole forward (`lrnn predict`) over the prompt and the generated tokens predicts.
  const std::string run = "'" + (dir / "run").string() + "'";
  RunResult g = run_lrnn("generate --run " + run + " --prompt 'ROMEO:' --max-tokens 12 --temperature 0 --json");
  ASSERT_EQ(g.code, 0) << g.out;
  auto gj = nlohmann::json::parse(g.out);
  std::vector<int32_t> all = gj["prompt_tokens"].get<std::vector<int32_t>>();
  const size_t np = all.size();
  for (int32_t t : gj["tokens"].get<std::vector<int32_t>>()) all.push_back(t);
  ASSERT_GT(all.size(), np);
  std::string ids;
  for (int32_t t : all) ids += std::to_string(t) + " ";
  RunResult p = run_lrnn("predict --run " + run + " --tokens '" + ids + "'");
  ASSERT_EQ(p.code, 0) << p.out;
  auto pj = nlohmann::json::parse(p.out);
  for (size_t i = np - 1; i + 1 < all.size(); ++i) EXPECT_EQ(int32_t(pj["positions"][i]["predicted"]), all[i + 1]) << i;
  // The same seed, the same text; the text is streamed to stdout after the prompt.
  // (The statistics line that follows on stderr holds a timing: compared up to it.)
  const std::string sample = "generate --run " + run + " --prompt 'ROMEO: I will' --max-tokens 20 --seed 4";
  RunResult s1 = run_lrnn(sample), s2 = run_lrnn(sample);
  ASSERT_EQ(s1.code, 0) << s1.out;
  const std::string text1 = s1.out.substr(0, s1.out.find("\n[")), text2 = s2.out.substr(0, s2.out.find("\n["));
  EXPECT_EQ(text1, text2);
  EXPECT_EQ(text1.rfind("ROMEO: I will", 0), 0u) << s1.out;
  EXPECT_GT(text1.size(), std::string("ROMEO: I will").size()) << s1.out;
  // The run keeps its tokenizer: a copy whose data is gone still generates the same text.
  EXPECT_TRUE(fs::exists(dir / "run" / "tokenizer.model"));
  fs::copy(dir / "run", dir / "moved");
  {
    std::string yaml = read_text(dir / "moved" / "config.yaml");
    const std::string data = (corpus_dir() / "data").string();
    ASSERT_NE(yaml.find(data), std::string::npos);  // task.data is written absolute
    yaml.replace(yaml.find(data), data.size(), (dir / "gone").string());
    write_text(dir / "moved" / "config.yaml", yaml);
  }
  RunResult s3 = run_lrnn("generate --run '" + (dir / "moved").string() + "' --prompt 'ROMEO: I will' --max-tokens 20 --seed 4");
  ASSERT_EQ(s3.code, 0) << s3.out;
  EXPECT_EQ(s3.out.substr(0, s3.out.find("\n[")), text1);
  RunResult bad = run_lrnn("generate --run " + run + " --prompt x --tokenizer '" + (dir / "none.model").string() + "'");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("none.model"), std::string::npos) << bad.out;
  // --device cuda without a GPU (or without the CUDA backend): exit 2, naming the way out.
#ifdef LRNN_WITH_CUDA
  const bool gpu = cuda::available();
#else
  const bool gpu = false;
#endif
  RunResult on_gpu = run_lrnn("generate --run " + run + " --prompt 'ROMEO:' --max-tokens 3 --device cuda");
  if (gpu) {
    EXPECT_EQ(on_gpu.code, 0) << on_gpu.out;
  } else {
    EXPECT_EQ(on_gpu.code, 2) << on_gpu.out;
    EXPECT_NE(on_gpu.out.find("--device cpu"), std::string::npos) << on_gpu.out;
  }

  // `lrnn data` prints the run's training windows: context tokens in, the next tokens out.
  RunResult d = run_lrnn("data --config '" + (dir / "lm.yaml").string() + "' --n 2");
  ASSERT_EQ(d.code, 0) << d.out;
  auto first = nlohmann::json::parse(d.out.substr(0, d.out.find('\n')));
  ASSERT_EQ(first["input"].size(), 64u);
  for (size_t t = 0; t + 1 < 64; ++t) EXPECT_EQ(first["target"][t], first["input"][t + 1]);
}

// The training order is a function of (seed, step): a run killed after step 70 (checkpoint at
// 50) and resumed logs the losses of the uninterrupted run bit for bit.
TEST(LmTrain, ResumeAfterKillFollowsTheUninterruptedRun) {
  fs::path dir = temp_dir("lm_resume");
  write_text(dir / "lm.yaml", lm_config());
  const std::string cfg = (dir / "lm.yaml").string();
  ASSERT_EQ(run_lrnn("train --config '" + cfg + "' --out '" + (dir / "a").string() + "' --set training.num_steps=100").code, 0);
  setenv("LRNN_FAULT_KILL_AFTER_STEP", "70", 1);
  RunResult k = run_lrnn("train --config '" + cfg + "' --out '" + (dir / "b").string() + "' --set training.num_steps=100");
  unsetenv("LRNN_FAULT_KILL_AFTER_STEP");
  ASSERT_NE(k.code, 0);
  RunResult r = run_lrnn("train --resume '" + (dir / "b").string() + "'");
  ASSERT_EQ(r.code, 0) << r.out;
  auto a = lines_of(dir / "a", "train"), b = lines_of(dir / "b", "train");
  ASSERT_EQ(a.size(), 5u);
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(double(a[i]["loss"]), double(b[i]["loss"])) << "line " << i;
  EXPECT_EQ(double(lines_of(dir / "a", "eval").back()["val_loss"]), double(lines_of(dir / "b", "eval").back()["val_loss"]));
}

// Gradient accumulation: 4 micro-batches of 4 windows make the step of one batch of 16 (every
// position of a window is supervised, so the mean of the micro-batch means is the batch mean),
// up to the rounding of the different summation order; with tied embeddings, as P2's models.
TEST(LmTrain, GradientAccumulationMakesTheSameSteps) {
  fs::path dir = temp_dir("lm_accum");
  write_text(dir / "lm.yaml", lm_config());
  auto run = [&](const std::string& name, int accumulation) {
    RunResult r = run_lrnn("train --config '" + (dir / "lm.yaml").string() + "' --out '" + (dir / name).string() +
                           "' --set training.num_steps=12 --set training.warmup_steps=2 --set training.val_every=0 --set logging.log_every=1"
                           " --set model.tie_word_embeddings=true --set training.num_threads=2"
                           " --set training.gradient_accumulation_steps=" + std::to_string(accumulation));
    EXPECT_EQ(r.code, 0) << r.out;
    std::vector<double> loss;
    for (const auto& j : lines_of(dir / name, "train")) loss.push_back(double(j["loss"]));
    return loss;
  };
  const auto one = run("one", 1), four = run("four", 4);
  ASSERT_EQ(one.size(), 12u);
  ASSERT_EQ(four.size(), 12u);
  // Measured: the same losses to 1e-7 over the 12 steps (fp32 sums in another order).
  for (size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(four[i], one[i], 1e-4) << "step " << i + 1;
  EXPECT_LT(one.back(), one.front() - 0.05);  // and the steps do train (measured: 6.24 -> 6.16)
  // A batch the micro-batches do not divide is refused, naming both keys.
  RunResult bad = run_lrnn("train --config '" + (dir / "lm.yaml").string() + "' --out '" + (dir / "bad").string() +
                           "' --set training.gradient_accumulation_steps=3");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("gradient_accumulation_steps"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("batch_size"), std::string::npos) << bad.out;
}

// evaluate_lm against a hand computation: logits that put log-probability log p on the right
// token of every position give val_loss = -log p exactly, and uniform logits give ln V.
TEST(LmTrain, EvaluationLossIsTheMeanNextTokenCrossEntropy) {
  TaskConfig tc;
  tc.name = "lm";
  tc.data = (corpus_dir() / "data").string();
  tc.context = 32;
  LmTask task(tc);
  const int V = task.vocab_size();
  std::vector<float> logits;
  auto uniform = [&](const Batch& b) {
    logits.assign(size_t(b.B) * b.T * V, 0.25f);
    return logits.data();
  };
  nlohmann::json u = evaluate_lm(token_losses_of(uniform, V), task, 8, 32 * 20);
  EXPECT_EQ(int64_t(u["tokens"]), 32 * 20);
  EXPECT_NEAR(double(u["val_loss"]), std::log(double(V)), 1e-12);
  // The right token gets logit 3 and the others 0: p = e^3 / (e^3 + V - 1).
  auto peaked = [&](const Batch& b) {
    logits.assign(size_t(b.B) * b.T * V, 0.0f);
    for (size_t i = 0; i < b.labels.size(); ++i) logits[i * size_t(V) + size_t(b.labels[i])] = 3.0f;
    return logits.data();
  };
  nlohmann::json p = evaluate_lm(token_losses_of(peaked, V), task, 8, 0);
  const double expect = -std::log(std::exp(3.0) / (std::exp(3.0) + V - 1));
  EXPECT_NEAR(double(p["val_loss"]), expect, 1e-9);
  EXPECT_EQ(uint64_t(p["windows"]), task.eval_windows());
  EXPECT_NEAR(token_loss(std::vector<float>{1.f, 2.f, 3.f}.data(), 3, 0), std::log(std::exp(1.) + std::exp(2.) + std::exp(3.)) - 1.0,
              1e-12);
}

TEST(LmTrain, RefusesKeysItDoesNotUseAndMissingData) {
  fs::path dir = temp_dir("lm_keys");
  write_text(dir / "lm.yaml", lm_config());
  const std::string cfg = "train --config '" + (dir / "lm.yaml").string() + "' --out '" + (dir / "r").string() + "'";
  RunResult a = run_lrnn(cfg + " --set 'task.train_len=[3,10]'");
  EXPECT_EQ(a.code, 2);
  EXPECT_NE(a.out.find("task.train_len"), std::string::npos) << a.out;
  RunResult b = run_lrnn(cfg + " --set task.data=" + (dir / "nowhere").string());
  EXPECT_EQ(b.code, 2);
  EXPECT_NE(b.out.find("task.data"), std::string::npos) << b.out;
  RunResult c = run_lrnn(cfg + " --set task.context=1000000");
  EXPECT_EQ(c.code, 2) << c.out;
  RunResult d = run_lrnn(cfg + " --set task.name=parity");
  EXPECT_EQ(d.code, 2);
  EXPECT_NE(d.out.find("task.data"), std::string::npos) << d.out;
  // A sweep ranks runs by scaled accuracy: it refuses lm configs by name.
  write_text(dir / "grid.yaml", "name: lm\nconfigs: ['" + (dir / "lm.yaml").string() + "']\nlr: [1.0e-3]\nseeds: [0]\n");
  RunResult s = run_lrnn("sweep --grid '" + (dir / "grid.yaml").string() + "' --out '" + (dir / "sw").string() + "' --dry-run");
  EXPECT_EQ(s.code, 2) << s.out;
  EXPECT_NE(s.out.find("lm"), std::string::npos) << s.out;
}
