// The `lrnn` command line: train, eval, data, predict, generate, serve, sweep; tokenizer, tokenize, shards
// (language-model data).
#include "cli/cli.h"
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <sys/resource.h>
#include <CLI/CLI.hpp>
#include "core/check.h"
#include "core/version.h"
#include "data/shards.h"
#include "data/tokenize.h"
#include "dist/world.h"
#include "data/tokenizer.h"
#include "io/atomic_file.h"
#include "serve/http.h"
#include "infer/decoder.h"
#include "infer/run.h"
#include "train/checkpoint.h"
#include "train/engine.h"
#include "train/provenance.h"
#include "train/sweep.h"
#include "train/trainer.h"

namespace lrnn::cli {

namespace fs = std::filesystem;

namespace {

// One row per range: lengths, accuracy, the task's metric, samples.
struct EvalRow {
  std::string lengths, note;
  double accuracy, metric;
  long long samples;
};

// The result of an evaluation as a short table: the training lengths, the evaluation lengths, and
// the evaluation lengths in up to eight bins (Answer tasks: the metric over each bin's samples;
// Prefix tasks: sequence accuracy up to the bin's last length). The full numbers are in the JSON.
std::string eval_table(const nlohmann::json& e) {
  if (e.value("metric", "") == "val_loss") {  // lm: the loss over the window, and by position in up to 8 bins
    std::string out = fmt::format("{:<16}{:>10}{:>12}\n", "positions", "loss", "perplexity");
    const auto& curve = e["loss_by_position"];
    const size_t T = curve.size(), bins = std::min<size_t>(8, T);
    out += fmt::format("{:<16}{:>10.4f}{:>12.3f}  ({} tokens, {} windows)\n", fmt::format("0-{}", T - 1),
                       double(e["val_loss"]), double(e["perplexity"]), int64_t(e["tokens"]), int64_t(e["windows"]));
    for (size_t b = 0; bins > 1 && b < bins; ++b) {
      size_t lo = b * T / bins, hi = (b + 1) * T / bins;
      double sum = 0;
      for (size_t i = lo; i < hi; ++i) sum += double(curve[i]);
      const double mean = sum / double(hi - lo);
      out += fmt::format("{:<16}{:>10.4f}{:>12.3f}\n", fmt::format("  {}-{}", lo, hi - 1), mean, std::exp(mean));
    }
    return out;
  }
  const bool prefix = e.value("metric", "") == "sequence_accuracy_up_to_length";
  const char* metric = prefix ? "seq. acc." : "scaled";
  std::vector<EvalRow> rows;
  auto whole = [&](const nlohmann::json& x, const std::string& note) {
    // Word problems: the column is the sequence accuracy itself (their scaled accuracy differs from
    // it by chance^n, ~1e-200, and printed a minus sign on zero).
    rows.push_back({fmt::format("{}-{}", int(x["lengths"][0]), int(x["lengths"][1])), note, double(x["accuracy"]),
                    prefix ? double(x["accuracy"]) : double(x["scaled_accuracy"]), (long long)x["samples"]});
  };
  if (e.contains("train_range")) whole(e["train_range"], "training lengths");
  whole(e, "evaluation lengths");
  // Bins over the evaluation lengths.
  std::vector<std::pair<int, nlohmann::json>> per;
  for (auto& [k, v] : e["per_length"].items()) per.emplace_back(std::stoi(k), v);
  std::sort(per.begin(), per.end(), [](auto& a, auto& b) { return a.first < b.first; });
  if (per.size() > 1) {
    const size_t bins = std::min<size_t>(8, per.size());
    for (size_t b = 0; b < bins; ++b) {
      size_t lo = b * per.size() / bins, hi = (b + 1) * per.size() / bins;  // [lo, hi)
      if (lo >= hi) continue;
      EvalRow r{fmt::format("  {}-{}", per[lo].first, per[hi - 1].first), "", 0, 0, 0};
      if (prefix) {  // sequence accuracy up to the bin's last length
        r.accuracy = r.metric = double(per[hi - 1].second["accuracy"]);
        r.samples = (long long)per[hi - 1].second["n"];
      } else {  // pooled over the bin's samples
        double acc = 0, sc = 0;
        for (size_t i = lo; i < hi; ++i) {
          double n = double(per[i].second["n"]);
          acc += n * double(per[i].second["accuracy"]);
          sc += n * double(per[i].second["scaled_accuracy"]);
          r.samples += (long long)n;
        }
        r.accuracy = r.samples ? acc / double(r.samples) : 0;
        r.metric = r.samples ? sc / double(r.samples) : 0;
      }
      rows.push_back(r);
    }
  }
  std::string out = fmt::format("{:<14}{:>10}{:>11}{:>9}\n", "lengths", "accuracy", metric, "samples");
  for (auto& r : rows)
    out += fmt::format("{:<14}{:>10.4f}{:>11.4f}{:>9}{}\n", r.lengths, r.accuracy, r.metric, r.samples,
                       r.note.empty() ? "" : "  (" + r.note + ")");
  // Word problems: P2's measure of length generalisation, the length up to which sequence
  // accuracy stays at or above kReachAccuracy (what `lrnn sweep` tabulates as the reach).
  const double reach = prefix && !per.empty() ? sweep::sequence_reach(e) : std::nan("");
  if (!std::isnan(reach)) {
    const double at = sweep::kReachAccuracy;
    const int first = per.front().first, last = per.back().first;
    if (reach >= last)
      out += fmt::format("sequence accuracy >= {} at every length evaluated (up to {})\n", at, last);
    else if (reach < first)
      out += fmt::format("sequence accuracy below {} from the first length evaluated ({})\n", at, first);
    else
      out += fmt::format("sequence accuracy >= {} up to length {}\n", at, reach);
  }
  return out;
}

int cmd_train(const std::string& config, std::vector<std::string> sets, std::string out, const std::string& resume,
              bool force, const std::string& device) {
  if (!device.empty()) sets.push_back("training.device=" + device);
  TrainOptions opt;
  ExperimentConfig cfg;
  if (!resume.empty()) {
    if (!config.empty()) LRNN_USER_ERROR("train: give either --config or --resume, not both");
    opt.out_dir = resume;
    opt.resume = true;
    if (!fs::exists(fs::path(resume) / "config.yaml")) LRNN_USER_ERROR("{}: not a run directory (no config.yaml)", resume);
    cfg = ExperimentConfig::load((fs::path(resume) / "config.yaml").string(), sets);
  } else {
    if (config.empty()) LRNN_USER_ERROR("train: --config FILE.yaml is required (or --resume DIR)");
    cfg = ExperimentConfig::load(config, sets);
    if (out.empty()) out = (fs::path("runs") / fs::path(config).stem()).string();
    opt.out_dir = out;
    if (fs::exists(opt.out_dir / "train_state.safetensors") && !force)
      LRNN_USER_ERROR("{}: holds a run already; continue it with --resume {}, or pass --force to start over", out, out);
  }
  const bool lead = dist::world().leader();
  if (lead) std::fprintf(stderr, "lrnn train: %s -> %s\n", cfg.source.c_str(), opt.out_dir.string().c_str());
  TrainSummary s = train(cfg, opt);
  if (s.interrupted) {
    if (!lead) return 128 + s.interrupted;
    std::fprintf(stderr, "lrnn: stopped by %s after step %lld of %lld; checkpoint saved in %s\n"
                 "continue with: lrnn train --resume %s\n",
                 s.interrupted == SIGINT ? "Ctrl-C (SIGINT)" : strsignal(s.interrupted), (long long)s.steps,
                 (long long)cfg.training.num_steps, opt.out_dir.c_str(), opt.out_dir.c_str());
    // Exit "by the signal", as a shell expects of a program that was interrupted (status 128 + n).
    std::fflush(nullptr);
    std::signal(s.interrupted, SIG_DFL);
    std::raise(s.interrupted);
    return 128 + s.interrupted;
  }
  if (!s.leader) return 0;
  std::fprintf(stderr, "done: %lld steps (%lld skipped) in %.1f s, final loss %.4f\n", (long long)s.steps,
               (long long)s.skipped, s.seconds, s.final_loss);
  std::fprintf(stderr, "%s", eval_table(s.eval).c_str());
  nlohmann::json summary = {{"run", opt.out_dir.string()}, {"steps", s.steps}, {"seconds", s.seconds}};
  for (const char* k : {"accuracy", "scaled_accuracy", "val_loss", "perplexity"})
    if (s.eval.contains(k)) summary[k] = s.eval[k];
  std::printf("%s\n", summary.dump().c_str());
  return 0;
}

int cmd_eval(const std::string& run, const std::vector<std::string>& sets, const std::string& device, bool json) {
  for (auto& a : sets)
    if (a.rfind("task.", 0) != 0)
      LRNN_USER_ERROR("eval: --set {}: only task.* keys apply when evaluating a saved run (e.g. --set "
                      "task.eval_len=[40,512]); the model and its training are what the run saved", a);
  LoadedRun r = load_run(run, sets, device);
  // A language model evaluated on windows longer than it trained on, on the CPU: read the windows
  // a training context at a time through the decode state, so memory does not grow with the
  // window (P2's length extrapolation to 32k tokens).
  TokenLossFn piecewise;
  std::unique_ptr<PieceReader> host;
  const auto& tc = r.cfg.task;
  if (tc.name == "lm" && r.cfg.training.device == "cpu" && r.model().new_decode_state(1) &&
      task_input_lengths(tc)[1] > tc.context)
    piecewise = token_losses_piecewise(*(host = host_reader(r.model())), tc.context);
  nlohmann::json e = evaluate_run(r.engine->logits_fn(), r.model().vocab_size(), r.cfg, piecewise);
  if (piecewise) e["read_in_pieces_of"] = tc.context;
  // Next to the run's own eval.json, named after the lengths, so evaluations at other lengths
  // never overwrite each other or the training's result.
  const auto& t = r.cfg.task;
  fs::path file = fs::path(run) / (t.name == "lm" ? fmt::format("eval_context{}.json", task_input_lengths(t)[1])
                                                  : fmt::format("eval_{}-{}.json", t.eval_len[0], t.eval_len[1]));
  io::write_file_atomic(file, e.dump(2) + "\n");
  if (json) {
    std::printf("%s\n", e.dump().c_str());
  } else {
    std::printf("%s", eval_table(e).c_str());
    std::printf("wrote %s\n", file.c_str());
  }
  return 0;
}

int cmd_data(const std::string& config, const std::string& task_name, int n, int64_t seed,
             const std::vector<std::string>& sets, const std::string& split, int length) {
  YAML::Node root(YAML::NodeType::Map);
  std::string where = "--set";
  if (!config.empty()) {
    // The task block of an experiment config (the data a run of it trains on); --set task.* on top.
    YAML::Node file = io::load_yaml_file(config);
    if (file["task"]) root["task"] = file["task"];
    where = config;
  } else {
    root["task"]["name"] = task_name;
  }
  for (auto& s : sets) io::apply_override(root, s);
  for (auto it = root.begin(); it != root.end(); ++it)
    if (it->first.as<std::string>() != "task") LRNN_USER_ERROR("data: --set {}.*: only task.* keys apply here", it->first.as<std::string>());
  TaskConfig tc;
  io::Schema s(where, "task");
  tc.describe(s);
  s.parse(root["task"]);
  auto task = create_task(tc);
  Split sp = split == "eval" ? Split::Eval : Split::Data;
  auto range = split == "eval" ? tc.eval_len : tc.train_len;
  if (length > 0) range = {length, length};
  if (range[0] < 2) LRNN_USER_ERROR("data: --length must be at least 2");
  for (int i = 0; i < n; ++i) {
    int len = task->draw_length(uint64_t(seed), sp, uint64_t(i), range);
    Sample smp = task->sample(uint64_t(seed), sp, uint64_t(i), len);
    std::printf("%s\n", nlohmann::json{{"input", smp.input}, {"target", smp.target}, {"text", task->render(smp)}}.dump().c_str());
  }
  return 0;
}

int cmd_predict(const std::string& run, const std::string& tokens_text, bool full_logits, const std::string& device) {
  LoadedRun r = load_run(run, {}, device);
  std::vector<int32_t> tok;
  std::istringstream in(tokens_text);
  std::string w;
  const int V = r.model().vocab_size();
  while (in >> w) {
    char* end = nullptr;
    long x = std::strtol(w.c_str(), &end, 10);
    if (*end != '\0' || x < 0 || x >= V)
      LRNN_USER_ERROR("predict: --tokens: '{}' is not a token id in [0, {})", w, V);
    tok.push_back(int32_t(x));
  }
  if (tok.empty()) LRNN_USER_ERROR("predict: --tokens: give at least one token id, e.g. --tokens \"1 2 2 1\"");
  auto task = create_task(r.cfg.task);
  for (int32_t x : tok)
    if (x == task->pad_token())
      LRNN_USER_ERROR("predict: --tokens: {} is the padding token of task {} ({}); the model never reads it as input",
                      x, r.cfg.task.name, task->token_name(x));
  // A model trained on samples that start with BOS sees one in front of what the user typed.
  const int bos = task->bos_token();
  const bool add_bos = bos >= 0 && tok.front() != bos;
  if (add_bos) tok.insert(tok.begin(), bos);
  Batch b;
  b.B = 1;
  b.T = int(tok.size());
  b.tokens = tok;
  b.labels.assign(tok.size(), -1);
  b.lengths = {b.T};
  const float* lg = r.engine->logits_fn()(b);
  nlohmann::json pos = nlohmann::json::array();
  for (size_t t = 0; t < tok.size(); ++t) {
    const float* row = lg + t * V;
    int best = int(std::max_element(row, row + V) - row);
    nlohmann::json p = {{"position", t}, {"token", tok[t]}, {"predicted", best},
                        {"predicted_text", task->token_name(best)}};
    if (full_logits || V <= 64) p["logits"] = std::vector<float>(row, row + V);
    pos.push_back(p);
  }
  nlohmann::json out = {{"run", run}, {"positions", pos}};
  if (add_bos) out["bos_added"] = bos;
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

// The tokens a document of the run's data starts with (docs/DATA.md: BOS, or the previous
// document's EOS where the tokenizer has no BOS).
int32_t document_start(const data::Tokenizer& tok) { return tok.bos_id() >= 0 ? tok.bos_id() : tok.eos_id(); }

int cmd_generate(const std::string& run, const std::string& prompt, const std::string& tokenizer, GenerateOptions opt,
                 bool no_doc_start, bool json, std::string device) {
  // The weights load on the host; the reader runs there or on a device twin (--device, default:
  // where the run trained).
  if (device.empty()) device = run_training_device(run);
  LoadedRun r = load_run(run, {}, "cpu", /*open_task=*/false);
  data::Tokenizer tok = run_tokenizer(r, tokenizer);
  auto reader = run_reader(r, device);
  std::vector<int32_t> ids;
  if (!no_doc_start) ids.push_back(document_start(tok));
  tok.encode_into(prompt, ids);
  if (ids.empty()) LRNN_USER_ERROR("generate: --prompt is empty and --no-doc-start leaves nothing to start from");
  Decoder dec(*reader);
  if (!json) {
    std::fputs(prompt.c_str(), stdout);
    std::fflush(stdout);
  }
  const auto t0 = std::chrono::steady_clock::now();
  Generation g = generate(dec, tok, ids, opt, [&](const std::string& piece) {
    if (!json) {
      std::fputs(piece.c_str(), stdout);
      std::fflush(stdout);
    }
    return true;
  });
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<int32_t> out_ids;
  double logprob = 0;
  for (const auto& t : g.tokens) {
    out_ids.push_back(t.token);
    logprob += t.logprob;
  }
  if (json) {
    nlohmann::json j = {{"prompt", prompt},       {"prompt_tokens", ids},        {"text", g.text},
                        {"tokens", out_ids},      {"logprob", logprob},          {"finish_reason", g.finish_reason},
                        {"seconds", sec},         {"state_bytes", dec.state_bytes()},
                        {"device", reader->describe()}, {"device_bytes", reader->device_bytes()}};
    struct rusage ru {};
    if (getrusage(RUSAGE_SELF, &ru) == 0) j["peak_rss_bytes"] = int64_t(ru.ru_maxrss) * 1024;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("\n");
    std::fflush(stdout);
    std::fprintf(stderr, "[%zu prompt + %zu generated tokens in %.2f s (%.1f tokens/s), decode state %.1f KiB, %s; %s]\n",
                 ids.size(), out_ids.size(), sec, sec > 0 ? double(ids.size() + out_ids.size()) / sec : 0.0,
                 double(dec.state_bytes()) / 1024.0, g.finish_reason.c_str(), reader->describe().c_str());
  }
  return 0;
}

// `lrnn serve`: the completions API (serve/completions.h) of a language-model run over HTTP.
struct ServeFlags {
  std::string host = "127.0.0.1", model_name, tokenizer, device;
  int port = 8000;
  bool no_doc_start = false;
};

int cmd_serve(const std::string& run, const ServeFlags& f) {
  // As generate: the weights load on the host, the reader runs where --device says.
  LoadedRun r = load_run(run, {}, "cpu", /*open_task=*/false);
  data::Tokenizer tok = run_tokenizer(r, f.tokenizer);
  auto reader = run_reader(r, f.device.empty() ? run_training_device(run) : f.device);
  serve::ServiceOptions o;
  o.model_name = f.model_name.empty() ? fs::absolute(run).lexically_normal().filename().string() : f.model_name;
  if (o.model_name.empty()) o.model_name = fs::absolute(run).lexically_normal().parent_path().filename().string();
  o.doc_start = !f.no_doc_start;
  o.chunk = std::max(1, r.cfg.task.context);
  o.max_model_len = r.cfg.task.context;
  serve::CompletionService svc(*reader, std::move(tok), o);
  return serve::run_http(svc, f.host, f.port, [&](int port) {
    std::fprintf(stderr, "lrnn serve: %s (%s) on http://%s:%d/v1/completions; Ctrl-C stops\n", o.model_name.c_str(),
                 run.c_str(), f.host.c_str(), port);
    std::printf("%s\n", nlohmann::json{{"url", fmt::format("http://{}:{}", f.host, port)}, {"port", port},
                                       {"model", o.model_name}}.dump().c_str());
    std::fflush(stdout);
  });
}

int cmd_sweep(const std::string& grid_file, int jobs, std::string out, bool dry_run, bool report, bool force,
              const std::vector<std::string>& only) {
  sweep::Grid grid = sweep::Grid::load(grid_file);
  if (out.empty()) out = (fs::path("runs") / grid.name).string();
  if (report) {
    if (dry_run || force || !only.empty())
      LRNN_USER_ERROR("sweep: --report only aggregates finished runs; drop --dry-run, --force and --only");
    std::printf("%s", sweep::write_report(grid, out).c_str());
    std::fprintf(stderr, "wrote %s and %s\n", (fs::path(out) / "results.md").c_str(), (fs::path(out) / "results.csv").c_str());
    return 0;
  }
  sweep::SweepOutcome res = sweep::run_sweep(grid, {out, jobs, dry_run, force, only});
  if (dry_run) return 0;
  std::printf("%s", sweep::write_report(grid, out).c_str());
  std::fprintf(stderr, "wrote %s and %s\n", (fs::path(out) / "results.md").c_str(), (fs::path(out) / "results.csv").c_str());
  if (res.interrupted) return 130;
  return res.failed > 0 ? 1 : 0;
}

// Language-model data (docs/DATA.md): options shared by `tokenizer train` and `tokenize`.
struct CorpusFlags {
  std::string text_unit = "file", jsonl_field = "text";
  data::CorpusOptions options() const {
    data::CorpusOptions o;
    o.text_unit = data::parse_text_unit(text_unit);
    if (jsonl_field.empty()) LRNN_USER_ERROR("--jsonl-field: give the name of the text field");
    o.jsonl_field = jsonl_field;
    return o;
  }
};

std::vector<fs::path> as_paths(const std::vector<std::string>& v) { return {v.begin(), v.end()}; }

int cmd_tokenizer_train(const std::vector<std::string>& inputs, data::TokenizerTrainOptions opt, const CorpusFlags& cf,
                        const std::string& out) {
  opt.corpus = cf.options();
  if (out.empty()) LRNN_USER_ERROR("tokenizer train: --out FILE.model is required");
  if (fs::is_directory(out)) LRNN_USER_ERROR("{}: a directory; --out names the .model file to write", out);
  for (auto& in : inputs)
    if (!fs::exists(in)) LRNN_USER_ERROR("{}: no such input file", in);
  data::TokenizerTrainResult r = data::train_tokenizer(as_paths(inputs), opt);
  io::write_file_atomic(out, r.model);
  data::Tokenizer tok = data::Tokenizer::from_bytes(r.model, out);
  std::fprintf(stderr, "tokenizer train: %llu documents, %llu lines (%llu used) -> %s\n",
               (unsigned long long)r.documents, (unsigned long long)r.lines, (unsigned long long)r.lines_used,
               out.c_str());
  std::printf("%s\n", nlohmann::json{{"tokenizer", out}, {"vocab_size", tok.vocab_size()}, {"sha256", tok.sha256()},
                                     {"bos_id", tok.bos_id()}, {"eos_id", tok.eos_id()}, {"pad_id", tok.pad_id()},
                                     {"unk_id", tok.unk_id()}}
                          .dump().c_str());
  return 0;
}

int cmd_tokenizer_info(const std::string& model) {
  data::Tokenizer tok = data::Tokenizer::load(model);
  std::printf("%s\n", nlohmann::json{{"tokenizer", model}, {"vocab_size", tok.vocab_size()}, {"sha256", tok.sha256()},
                                     {"bos_id", tok.bos_id()}, {"eos_id", tok.eos_id()}, {"pad_id", tok.pad_id()},
                                     {"unk_id", tok.unk_id()}}
                          .dump().c_str());
  return 0;
}

int cmd_tokenizer_encode(const std::string& model, const std::string& text, bool pieces) {
  if (size_t bad = data::find_invalid_utf8(text); bad != std::string::npos)
    LRNN_USER_ERROR("tokenizer encode: --text is not valid UTF-8 at byte {}", bad);
  data::Tokenizer tok = data::Tokenizer::load(model);
  std::vector<int32_t> ids = tok.encode(text);
  nlohmann::json out = {{"ids", ids}};
  if (pieces) {
    std::vector<std::string> p;
    for (int32_t id : ids) p.push_back(tok.piece(id));
    out["pieces"] = p;
  }
  // A crafted model could hold pieces that are not UTF-8: replaced (U+FFFD), never an exception.
  std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  return 0;
}

int cmd_tokenizer_decode(const std::string& model, const std::string& ids_text) {
  data::Tokenizer tok = data::Tokenizer::load(model);
  std::vector<int32_t> ids;
  std::istringstream in(ids_text);
  std::string w;
  while (in >> w) {
    char* end = nullptr;
    errno = 0;
    long long x = std::strtoll(w.c_str(), &end, 10);
    if (*end != '\0' || errno != 0 || x < 0 || x >= tok.vocab_size())
      LRNN_USER_ERROR("tokenizer decode: --ids: '{}' is not a token id in [0, {})", w, tok.vocab_size());
    ids.push_back(int32_t(x));
  }
  std::printf("%s\n", nlohmann::json{{"text", tok.decode(ids)}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  return 0;
}

int cmd_tokenize(data::TokenizeOptions opt, const std::vector<std::string>& inputs, const CorpusFlags& cf) {
  opt.inputs = as_paths(inputs);
  opt.corpus = cf.options();
  std::string cmd;
  for (const auto& a : command_line()) cmd += (cmd.empty() ? "" : " ") + a;
  opt.command = cmd;
  nlohmann::json idx = data::tokenize_corpus(opt);
  nlohmann::json out = {{"out", opt.out.string()}, {"documents", idx["documents"]},
                        {"train_tokens", idx["splits"]["train"]["tokens"]}};
  if (idx["splits"].contains("val")) out["val_tokens"] = idx["splits"]["val"]["tokens"];
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

// `lrnn shards --dir DIR`: every shard of both splits read back with the full check.
int cmd_shards(const std::string& dir) {
  nlohmann::json idx = data::read_index(dir);
  nlohmann::json out = {{"dir", dir}, {"tokenizer_sha256", idx["tokenizer"]["sha256"]},
                        {"vocab_size", idx["tokenizer"]["vocab_size"]}};
  for (const char* split : {"train", "val"}) {
    if (!idx["splits"].contains(split)) continue;
    data::TokenStream ts = data::TokenStream::open(dir, split, data::Verify::Full);
    uint64_t docs = 0;
    for (const auto& s : ts.shards()) docs += s.header().num_documents;
    out[split] = {{"shards", ts.shards().size()}, {"tokens", ts.size()}, {"documents", docs}};
  }
  if (!out.contains("train")) LRNN_USER_ERROR("{}/index.json: no train split", dir);
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace

namespace {
// "lrnn", or "lrnn (rank 3 of 8)" for one of several training processes.
std::string who() {
  try {
    const dist::World& w = dist::world();
    if (w.distributed()) return fmt::format("lrnn (rank {} of {})", w.rank, w.size);
  } catch (...) {  // (the environment itself may be what was wrong)
  }
  return "lrnn";
}
}  // namespace

int run(int argc, char** argv) {
  CLI::App app{"lrnn: linear RNNs that track state (DeltaNet, Mamba, DeltaProduct, ...; eigenvalues in [0,1] or [-1,1])",
               "lrnn"};
  app.footer(fmt::format("Tasks (task.name): {}\nModel types (model.model_type): {}\n"
                         "Config keys, run directory files: README.md; experiments and sweeps: docs/EXPERIMENTS.md",
                         fmt::join(task_names(), ", "), fmt::join(model_types(), ", ")));
  app.require_subcommand(1);
  app.set_version_flag("--version", version_line());

  std::string config, out, resume, run_dir, task = "parity", split = "train", tokens, device;
  const auto devices = CLI::IsMember({"cpu", "cuda"});
  std::vector<std::string> sets;
  bool force = false, full_logits = false;
  int n = 5, length = 0;
  int64_t seed = 0;

  auto* train = app.add_subcommand("train", "train a model from a YAML config");
  train->add_option("--config", config, "experiment YAML (blocks training, model, task, logging)");
  train->add_option("--set", sets, "override a key, e.g. --set training.lr=3e-4 (repeatable)");
  train->add_option("--out", out, "run directory (default runs/<config name>)");
  train->add_option("--resume", resume, "continue the run in this directory from its last checkpoint");
  train->add_flag("--force", force, "start over in a directory that holds a run");
  train->add_option("--device", device, "cpu or cuda (same as --set training.device=...)")->check(devices);
  int gpus = 0;
  train->add_option("--gpus", gpus, "data-parallel over this many GPUs of this host, one process each (implies --device "
                    "cuda; training.batch_size stays the global batch). Several hosts: docs/MULTI_GPU.md")
      ->check(CLI::Range(1, 1024));

  auto* eval = app.add_subcommand("eval", "re-evaluate a saved run (e.g. --set task.eval_len=[40,512])");
  eval->add_option("--run", run_dir, "run directory")->required();
  eval->add_option("--set", sets, "override task.* keys");
  eval->add_option("--device", device, "cpu or cuda (default: the run's training.device)")->check(devices);
  bool eval_json = false;
  eval->add_flag("--json", eval_json, "print the whole result as JSON instead of the table");

  auto* data = app.add_subcommand("data", "print task samples as JSON lines");
  std::string data_config;
  auto* data_task = data->add_option("--task", task, "task name (" + fmt::format("{}", fmt::join(task_names(), ", ")) + ")")
                        ->capture_default_str();
  data->add_option("--config", data_config, "take the task block of this experiment YAML")->excludes(data_task);
  data->add_option("--n", n, "number of samples")->capture_default_str()->check(CLI::Range(1, 1000000));
  data->add_option("--seed", seed, "seed")->capture_default_str();
  data->add_option("--split", split, "train lengths or eval lengths")->check(CLI::IsMember({"train", "eval"}))->capture_default_str();
  data->add_option("--length", length, "fix the sequence length")->check(CLI::Range(2, 1 << 24));
  data->add_option("--set", sets, "override task.* keys");

  auto* predict = app.add_subcommand("predict", "run a trained model on tokens; print logits and predictions as JSON");
  predict->add_option("--run", run_dir, "run directory")->required();
  predict->add_option("--tokens", tokens, "space-separated token ids, e.g. \"1 2 2 1\"")->required();
  predict->add_flag("--logits", full_logits, "print logits even for large vocabularies");
  predict->add_option("--device", device, "cpu or cuda (default: the run's training.device)")->check(devices);

  std::string gen_prompt, gen_tokenizer;
  GenerateOptions gen;
  bool gen_no_doc_start = false, gen_json = false;
  auto* generate_cmd = app.add_subcommand("generate", "continue a text with a trained language model (streams the text)");
  generate_cmd->add_option("--run", run_dir, "run directory of a language model (task.name lm)")->required();
  generate_cmd->add_option("--prompt", gen_prompt, "the text to continue")->required();
  generate_cmd->add_option("--max-tokens", gen.max_tokens, "tokens to generate at most")
      ->capture_default_str()->check(CLI::Range(0, 1 << 24));
  generate_cmd->add_option("--temperature", gen.sampling.temperature, "softmax temperature; 0 = greedy")
      ->capture_default_str()->check(CLI::Range(0.0, 100.0));
  generate_cmd->add_option("--top-k", gen.sampling.top_k, "sample among the k most likely tokens (0 = all)")
      ->capture_default_str()->check(CLI::Range(0, 1 << 24));
  generate_cmd->add_option("--top-p", gen.sampling.top_p, "sample among the most likely tokens of total probability p")
      ->capture_default_str()->check(CLI::Range(1e-9, 1.0));
  generate_cmd->add_option("--seed", gen.sampling.seed, "sampling seed (the same seed, the same text)")->capture_default_str();
  generate_cmd->add_option("--stop", gen.stop, "end at this text (repeatable; not printed)");
  generate_cmd->add_option("--tokenizer", gen_tokenizer, "SentencePiece .model (default: the one the run's data names)");
  generate_cmd->add_flag("--no-doc-start", gen_no_doc_start,
                         "do not put the document-start token (BOS, or EOS without BOS) before the prompt");
  bool gen_ignore_eos = false;
  generate_cmd->add_flag("--ignore-eos", gen_ignore_eos, "go on past EOS (benchmarks: always --max-tokens tokens)");
  generate_cmd->add_flag("--json", gen_json, "print one JSON object (text, token ids, log-probability) at the end instead");
  generate_cmd->add_option("--device", device, "cpu or cuda (default: the run's training.device)")->check(devices);

  ServeFlags serve_flags;
  auto* serve_cmd = app.add_subcommand(
      "serve", "answer OpenAI-style /v1/completions requests with a language model (lm-evaluation-harness's local-completions)");
  serve_cmd->add_option("--run", run_dir, "run directory of a language model (task.name lm)")->required();
  serve_cmd->add_option("--host", serve_flags.host, "address to listen on")->capture_default_str();
  serve_cmd->add_option("--port", serve_flags.port, "port (0: any free port, printed at start)")
      ->capture_default_str()->check(CLI::Range(0, 65535));
  serve_cmd->add_option("--model-name", serve_flags.model_name, "the model's name in the API (default: the run directory's)");
  serve_cmd->add_option("--tokenizer", serve_flags.tokenizer, "SentencePiece .model (default: the run's)");
  serve_cmd->add_option("--device", serve_flags.device, "cpu or cuda (default: the run's training.device)")
      ->check(devices);
  serve_cmd->add_flag("--no-doc-start", serve_flags.no_doc_start,
                      "do not read the document-start token (BOS, or EOS without BOS) before each prompt");

  std::string grid;
  int jobs = 1;
  bool dry_run = false, report = false;
  std::vector<std::string> only;
  auto* sweep = app.add_subcommand("sweep", "run a grid of configs x learning rates x seeds and aggregate (median, MAD, best)");
  sweep->add_option("--grid", grid, "grid YAML (name, configs, lr, seeds, set; see docs/EXPERIMENTS.md)")->required();
  sweep->add_option("--jobs", jobs, "runs trained at once (each with max(1, cores/jobs) threads; with several GPUs, each CUDA run on the least busy one)")
      ->capture_default_str()->check(CLI::Range(1, 4096));
  sweep->add_option("--out", out, "sweep directory (default runs/<grid name>)");
  sweep->add_flag("--dry-run", dry_run, "print what would run, with the commands; write nothing");
  sweep->add_flag("--report", report, "only aggregate finished runs into results.md and results.csv");
  sweep->add_flag("--force", force, "retrain runs whose saved config differs from the grid");
  sweep->add_option("--only", only, "run only the runs whose id (config/lr..._seed..., as --dry-run lists them) matches one "
                                    "of these shell patterns, e.g. 's5_*/lr1e-4_*'; the report still covers the whole grid");

  // Language-model data: docs/DATA.md.
  std::vector<std::string> lm_inputs;
  CorpusFlags corpus_flags;
  std::string tok_model, tok_out, tok_text, tok_ids;
  bool tok_pieces = false;
  data::TokenizerTrainOptions tok_opt;
  auto* tokenizer = app.add_subcommand("tokenizer", "SentencePiece tokenizers: train one, inspect, encode, decode");
  tokenizer->require_subcommand(1);
  auto add_corpus_flags = [&](CLI::App* c) {
    c->add_option("--text-unit", corpus_flags.text_unit,
                  "documents of a plain-text file: the whole file, or blocks between blank lines")
        ->check(CLI::IsMember({"file", "blank-line"}))->capture_default_str();
    c->add_option("--jsonl-field", corpus_flags.jsonl_field, "the text field of *.jsonl lines")->capture_default_str();
  };
  auto* tok_train = tokenizer->add_subcommand("train", "train a SentencePiece model on text files (deterministic)");
  tok_train->add_option("--input", lm_inputs, "text files (*.jsonl: JSON lines with a text field)")->required();
  tok_train->add_option("--vocab-size", tok_opt.vocab_size, "vocabulary size")->required()->check(CLI::Range(261, 1 << 24));
  tok_train->add_option("--out", tok_out, "the .model file to write")->required();
  tok_train->add_option("--model-type", tok_opt.model_type, "bpe or unigram")
      ->check(CLI::IsMember({"bpe", "unigram"}))->capture_default_str();
  tok_train->add_option("--character-coverage", tok_opt.character_coverage,
                        "share of characters with pieces of their own; the rest fall back to bytes")->capture_default_str();
  tok_train->add_option("--seed", tok_opt.seed, "picks the lines when there are more than --max-sentences")->capture_default_str();
  tok_train->add_option("--max-sentences", tok_opt.max_sentences, "lines to train on at most (0 = all)")->capture_default_str();
  tok_train->add_option("--threads", tok_opt.threads, "SentencePiece threads (the model depends on it for unigram)")
      ->capture_default_str()->check(CLI::Range(1, 128));
  add_corpus_flags(tok_train);
  auto* tok_info = tokenizer->add_subcommand("info", "vocabulary size, special ids and sha256 of a .model file");
  tok_info->add_option("--tokenizer", tok_model, "SentencePiece .model file")->required();
  auto* tok_encode = tokenizer->add_subcommand("encode", "token ids of a text");
  tok_encode->add_option("--tokenizer", tok_model, "SentencePiece .model file")->required();
  tok_encode->add_option("--text", tok_text, "the text")->required();
  tok_encode->add_flag("--pieces", tok_pieces, "also print the pieces");
  auto* tok_decode = tokenizer->add_subcommand("decode", "text of token ids");
  tok_decode->add_option("--tokenizer", tok_model, "SentencePiece .model file")->required();
  tok_decode->add_option("--ids", tok_ids, "space-separated token ids")->required();

  data::TokenizeOptions tz;
  std::string tz_tokenizer, tz_out;
  auto* tokenize = app.add_subcommand("tokenize", "text files -> token shards for language modelling (docs/DATA.md)");
  tokenize->add_option("--tokenizer", tz_tokenizer, "SentencePiece .model file")->required();
  tokenize->add_option("--input", lm_inputs, "text files (*.jsonl: JSON lines with a text field)")->required();
  tokenize->add_option("--out", tz_out, "directory for the shards and index.json")->required();
  tokenize->add_option("--val-fraction", tz.val_fraction, "share of documents held out for validation (whole documents)")
      ->capture_default_str()->check(CLI::Range(0.0, 0.5));
  tokenize->add_option("--seed", tz.seed, "picks the validation documents")->capture_default_str();
  tokenize->add_option("--shard-tokens", tz.shard_tokens, "tokens per shard file")
      ->capture_default_str()->check(CLI::Range(uint64_t(1), data::kMaxShardTokens));
  tokenize->add_option("--threads", tz.threads, "documents encoded at once (0 = all cores; the output is the same)")
      ->capture_default_str()->check(CLI::Range(0, 4096));
  tokenize->add_flag("--force", tz.force, "replace the tokenized corpus in --out");
  add_corpus_flags(tokenize);
  std::string shards_dir;
  auto* shards = app.add_subcommand("shards", "check a tokenized directory: read every shard back (docs/DATA.md)");
  shards->add_option("--dir", shards_dir, "the --out DIR of lrnn tokenize or tools/parquet_to_shards.py")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  try {
    if (*train) {
      if (gpus > 0) {
        if (!device.empty() && device != "cuda") LRNN_USER_ERROR("train: --gpus {} trains on GPUs; drop --device {}", gpus, device);
        device = "cuda";
        if (dist::world().distributed())
          LRNN_USER_ERROR("train: --gpus {}: this process is already rank {} of {} ({}); start one process per GPU "
                          "without --gpus, or --gpus without a launcher", gpus, dist::world().rank, dist::world().size,
                          dist::world().source);
        if (gpus > 1) {
          // The launcher: the same command line once per GPU, without --gpus (dist/world.h).
          std::vector<std::string> args;
          for (int i = 0; i < argc; ++i) {
            const std::string a = argv[i];
            if (a == "--gpus" || a == "--device") { ++i; continue; }  // (--device cuda is added below)
            if (a.rfind("--gpus=", 0) == 0 || a.rfind("--device=", 0) == 0) continue;
            args.push_back(a);
          }
          args.push_back("--device");
          args.push_back("cuda");
          return dist::launch_local(gpus, "/proc/self/exe", args);
        }
      }
      return cmd_train(config, sets, out, resume, force, device);
    }
    if (*eval) return cmd_eval(run_dir, sets, device, eval_json);
    if (*data) return cmd_data(data_config, task, n, seed, sets, split, length);
    if (*predict) return cmd_predict(run_dir, tokens, full_logits, device);
    gen.stop_at_eos = !gen_ignore_eos;
    if (*generate_cmd) return cmd_generate(run_dir, gen_prompt, gen_tokenizer, gen, gen_no_doc_start, gen_json, device);
    if (*serve_cmd) return cmd_serve(run_dir, serve_flags);
    if (*sweep) return cmd_sweep(grid, jobs, out, dry_run, report, force, only);
    if (*tok_train) return cmd_tokenizer_train(lm_inputs, tok_opt, corpus_flags, tok_out);
    if (*tok_info) return cmd_tokenizer_info(tok_model);
    if (*tok_encode) return cmd_tokenizer_encode(tok_model, tok_text, tok_pieces);
    if (*tok_decode) return cmd_tokenizer_decode(tok_model, tok_ids);
    if (*tokenize) {
      tz.tokenizer = tz_tokenizer;
      tz.out = tz_out;
      return cmd_tokenize(tz, lm_inputs, corpus_flags);
    }
    if (*shards) return cmd_shards(shards_dir);
  } catch (const UserError& e) {
    std::fprintf(stderr, "%s: error: %s\n", who().c_str(), e.what());
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: internal error: %s\n", who().c_str(), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", who().c_str(), e.what());
    return 1;
  }
  return 0;
}

}  // namespace lrnn::cli
