// `lrnn serve` (serve/completions.h, serve/http.h): the completions API in-process on the hand-set
// model whose next token is known (next_token_model.h), checked against an independent forward
// and against what lm-evaluation-harness's local-completions does with the answer; then the real
// server over HTTP on loopback, on a small trained run, whose log-probabilities must be the
// losses `lrnn eval` reports for the same window.
#include <chrono>
#include <cmath>
#include <thread>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include "lm_util.h"
#include "next_token_model.h"
#include "infer/decoder.h"
#include "infer/run.h"
#include "serve/completions.h"
#include "tasks/lm.h"

using namespace lrnn;
using namespace lrnn::test;
using nlohmann::json;

namespace {

const fs::path& tokenizer_file() {
  static fs::path p = train_small_tokenizer(temp_dir("serve"), 512);
  return p;
}

struct Fixture {
  data::Tokenizer tok = data::Tokenizer::load(tokenizer_file());
  std::string text = "Good night, sweet prince";
  std::vector<int32_t> ids = tok.encode(text);
  std::unique_ptr<Model<float>> model = next_token_model(tok, ids);
  serve::CompletionService service(bool doc_start) {
    serve::ServiceOptions o;
    o.model_name = "handset";
    o.doc_start = doc_start;
    o.chunk = 3;  // several forwards per prompt
    return serve::CompletionService(*model, data::Tokenizer::load(tokenizer_file()), o);
  }
  // log-softmax of one whole forward over `seq`: row t is the distribution of the token after t.
  std::vector<std::vector<double>> forward_logprobs(const std::vector<int32_t>& seq) {
    model->forward(seq.data(), nullptr, 1, int(seq.size()));
    const int V = model->vocab_size();
    std::vector<std::vector<double>> out(seq.size());
    for (size_t t = 0; t < seq.size(); ++t) log_softmax(model->logits() + t * size_t(V), V, out[t]);
    return out;
  }
};

// What lm-eval's local-completions does with a loglikelihood answer (parse_logprobs): the sum of
// token_logprobs[ctxlen:-1], and greedy when each equals the largest of its top_logprobs.
std::pair<double, bool> lm_eval_parse(const json& choice, size_t ctxlen) {
  const auto& lp = choice["logprobs"]["token_logprobs"];
  const auto& top = choice["logprobs"]["top_logprobs"];
  double sum = 0;
  bool greedy = true;
  for (size_t i = ctxlen; i + 1 < lp.size(); ++i) {
    sum += lp[i].get<double>();
    double best = -INFINITY;
    for (const auto& [k, v] : top[i].items()) best = std::max(best, v.get<double>());
    greedy = greedy && lp[i].get<double>() == best;
  }
  return {sum, greedy};
}

int error_status(const std::function<void()>& f, std::string* param = nullptr) {
  try {
    f();
  } catch (const serve::RequestError& e) {
    if (param) *param = e.param;
    return e.status;
  }
  return 0;
}

}  // namespace

TEST(Serve, GreedyCompletionWritesTheKnownText) {
  Fixture f;
  auto svc = f.service(true);
  const std::string first = f.tok.decode(std::vector<int32_t>{f.ids[0]});
  json r = svc.completions({{"prompt", first}, {"max_tokens", 50}, {"temperature", 0}});
  ASSERT_EQ(r["choices"].size(), 1u);
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["model"], "handset");
  EXPECT_EQ(r["choices"][0]["text"], f.text.substr(first.size()));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");  // EOS after the text
  EXPECT_TRUE(r["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(r["usage"]["prompt_tokens"], 1);
  EXPECT_EQ(r["usage"]["completion_tokens"], int(f.ids.size()));  // the rest of the text, then EOS
  // Token prompts and a batch: the same answer for each.
  json b = svc.completions({{"prompt", {json::array({f.ids[0]}), first}}, {"max_tokens", 2}, {"temperature", 0}});
  ASSERT_EQ(b["choices"].size(), 2u);
  EXPECT_EQ(b["choices"][0]["text"], b["choices"][1]["text"]);
  EXPECT_EQ(b["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(b["choices"][1]["index"], 1);
  // A stop string ends the text before it.
  json s = svc.completions({{"prompt", first}, {"max_tokens", 50}, {"temperature", 0}, {"stop", "sweet"}});
  EXPECT_EQ(s["choices"][0]["text"], f.text.substr(first.size(), f.text.find("sweet") - first.size()));
  EXPECT_EQ(s["choices"][0]["finish_reason"], "stop");
}

// echo + logprobs + max_tokens 1, as lm-eval scores a continuation: the prompt's tokens with their
// log-probabilities (the first null: nothing precedes it without the document-start token), then
// the one generated token; each number equals the log-softmax of one whole forward.
TEST(Serve, EchoLogprobsAreTheForwardsAndParseAsLmEvalDoes) {
  Fixture f;
  for (bool doc_start : {false, true}) {
    SCOPED_TRACE(doc_start ? "with the document-start token" : "without it");
    auto svc = f.service(doc_start);
    // A context that is not the model's text, then its known continuation.
    std::vector<int32_t> ctx = f.tok.encode("Sweet");
    std::vector<int32_t> prompt = ctx;
    prompt.insert(prompt.end(), f.ids.begin(), f.ids.begin() + 4);
    json r = svc.completions({{"prompt", prompt}, {"max_tokens", 1}, {"temperature", 0}, {"echo", true}, {"logprobs", 1}});
    const json& c = r["choices"][0];
    const auto& lp = c["logprobs"]["token_logprobs"];
    ASSERT_EQ(lp.size(), prompt.size() + 1);
    ASSERT_EQ(c["logprobs"]["tokens"].size(), prompt.size() + 1);
    EXPECT_EQ(c["logprobs"]["tokens"][1], svc.token_text(prompt[1]));
    std::vector<int32_t> seq = prompt;
    if (doc_start) seq.insert(seq.begin(), svc.document_start());
    const auto ref = f.forward_logprobs(seq);
    const size_t off = doc_start ? 1 : 0;  // ref row of the token before prompt[i] is i - 1 + off
    if (doc_start) EXPECT_NEAR(lp[0].get<double>(), ref[0][size_t(prompt[0])], 1e-5);
    else EXPECT_TRUE(lp[0].is_null());
    for (size_t i = 1; i < prompt.size(); ++i)
      EXPECT_NEAR(lp[i].get<double>(), ref[i - 1 + off][size_t(prompt[i])], 1e-5) << i;
    // The generated token: the model's next piece of the text.
    EXPECT_EQ(c["logprobs"]["tokens"].back(), svc.token_text(f.ids[4]));
    const std::string echoed = c["text"];
    EXPECT_EQ(echoed.rfind(f.tok.decode(prompt), 0), 0u) << echoed;
    EXPECT_GT(echoed.size(), f.tok.decode(prompt).size());
    // lm-eval: a continuation of the text's pieces after its first one is greedy, its
    // log-likelihood the forward's sum; one that starts after "Sweet" is not greedy.
    const size_t ctxlen = ctx.size() + 1;
    auto [ll, greedy] = lm_eval_parse(c, ctxlen);
    double expect = 0;
    for (size_t i = ctxlen; i < prompt.size(); ++i) expect += ref[i - 1 + off][size_t(prompt[i])];
    EXPECT_NEAR(ll, expect, 1e-5);
    EXPECT_TRUE(greedy);
    EXPECT_FALSE(lm_eval_parse(c, ctx.size()).second);
  }
}

// A generation that ends at EOS still lists one generated token (EOS) in the log-probabilities, so
// that lm-eval's [ctxlen:-1] drops it and not the continuation's last token; the text has no EOS.
TEST(Serve, EosEndsTheTextButStaysInTheLogprobs) {
  Fixture f;
  auto svc = f.service(false);
  json r = svc.completions({{"prompt", f.ids}, {"max_tokens", 1}, {"temperature", 0}, {"echo", true}, {"logprobs", 2}});
  const json& c = r["choices"][0];
  EXPECT_EQ(c["finish_reason"], "stop");
  EXPECT_EQ(c["text"], f.text);
  ASSERT_EQ(c["logprobs"]["token_logprobs"].size(), f.ids.size() + 1);
  EXPECT_EQ(c["logprobs"]["tokens"].back(), svc.token_text(f.tok.eos_id()));
  EXPECT_EQ(c["logprobs"]["top_logprobs"].back().size(), 2u);
  auto [ll, greedy] = lm_eval_parse(c, 1);
  EXPECT_TRUE(greedy);
  EXPECT_GT(ll, -1.0 * double(f.ids.size()));
}

TEST(Serve, TokenizerEndpointsMapSpecialPieces) {
  Fixture f;
  auto svc = f.service(true);
  json info = svc.tokenizer_info();
  ASSERT_TRUE(info["eos_token"].is_string());
  const std::string eos = info["eos_token"];
  // lm-eval finds the EOS id by tokenizing the EOS string.
  json t = svc.tokenize({{"prompt", eos}, {"add_special_tokens", false}});
  EXPECT_EQ(t["tokens"], json::array({f.tok.eos_id()}));
  json u = svc.tokenize({{"prompt", f.text + eos + f.text}});
  std::vector<int32_t> expect = f.ids;
  expect.push_back(f.tok.eos_id());
  expect.insert(expect.end(), f.ids.begin(), f.ids.end());
  EXPECT_EQ(u["tokens"].get<std::vector<int32_t>>(), expect);
  json with_bos = svc.tokenize({{"prompt", f.text}, {"add_special_tokens", true}});
  EXPECT_EQ(with_bos["tokens"][0], f.tok.bos_id());
  EXPECT_EQ(svc.detokenize({{"tokens", f.ids}})["prompt"], f.text);
  EXPECT_EQ(svc.models()["data"][0]["id"], "handset");
}

TEST(Serve, BadRequestsAreRefusedWithTheField) {
  Fixture f;
  auto svc = f.service(false);
  std::string param;
  auto refused = [&](const json& req) { return error_status([&] { svc.completions(req); }, &param); };
  EXPECT_EQ(refused({{"max_tokens", 4}}), 400);
  EXPECT_EQ(param, "prompt");
  EXPECT_EQ(refused({{"prompt", json::array()}}), 400);
  EXPECT_EQ(refused({{"prompt", "x"}, {"n", 2}}), 400);
  EXPECT_EQ(param, "n");
  EXPECT_EQ(refused({{"prompt", "x"}, {"stream", true}}), 400);
  EXPECT_EQ(refused({{"prompt", "x"}, {"max_tokens", -1}}), 400);
  EXPECT_EQ(param, "max_tokens");
  EXPECT_EQ(refused({{"prompt", "x"}, {"max_tokens", "many"}}), 400);
  EXPECT_EQ(refused({{"prompt", "x"}, {"logprobs", 1000}}), 400);
  EXPECT_EQ(refused({{"prompt", "x"}, {"temperature", -1}}), 400);
  EXPECT_EQ(refused({{"prompt", "x"}, {"top_p", 0}}), 400);
  EXPECT_EQ(refused({{"prompt", "x"}, {"stop", 3}}), 400);
  EXPECT_EQ(refused({{"prompt", json::array({1, f.tok.vocab_size()})}}), 400);
  EXPECT_EQ(refused({{"prompt", json::array({1, -2})}}), 400);
  EXPECT_EQ(refused({{"prompt", json::array({json::array({1}), 2})}}), 400);
  EXPECT_EQ(refused({{"prompt", ""}}), 400);  // nothing to start from without the document-start token
  EXPECT_EQ(refused({{"prompt", "\xff"}}), 400);
  EXPECT_EQ(refused(json::array({1})), 400);
  EXPECT_EQ(error_status([&] { svc.tokenize({{"text", 3}}); }), 400);
  EXPECT_EQ(error_status([&] { svc.detokenize({{"tokens", {1, 1 << 30}}}); }), 400);
  // The service still answers afterwards.
  EXPECT_EQ(svc.completions({{"prompt", f.text}, {"max_tokens", 0}})["choices"][0]["text"], "");
}

// Sampling is a pure function of the seed.
TEST(Serve, SeededSamplingRepeats) {
  Fixture f;
  auto svc = f.service(true);
  json req = {{"prompt", "Good"}, {"max_tokens", 12}, {"temperature", 1.5}, {"seed", 5}};
  EXPECT_EQ(svc.completions(req)["choices"][0]["text"], svc.completions(req)["choices"][0]["text"]);
}

// The real server on loopback, on a small trained run: its log-probabilities for an evaluation
// window are the per-position losses `lrnn eval` writes for it; text and token prompts agree; HTTP
// errors come back as OpenAI error bodies; SIGTERM ends it.
TEST(Serve, HttpAnswersEqualLrnnEval) {
  fs::path dir = temp_dir("serve_http");
  fs::path tok = train_small_tokenizer(dir, 512);
  auto files = corpus_files();
  files.resize(std::min<size_t>(files.size(), 2));
  RunResult d = run_lrnn("tokenize --tokenizer '" + tok.string() + "' --input" + join_paths(files) +
                         " --text-unit blank-line --val-fraction 0.05 --out '" + (dir / "data").string() + "'");
  ASSERT_EQ(d.code, 0) << d.out;
  const int T = 48;
  write_text(dir / "lm.yaml",
             "training: {num_steps: 30, batch_size: 8, lr: 3.0e-3, warmup_steps: 5, checkpoint_every: 0}\n"
             "model: {model_type: delta_net, hidden_size: 32, num_hidden_layers: 1, num_heads: 2, intermediate_size: 64, "
             "allow_neg_eigval: true}\n"
             "task: {name: lm, data: '" + (dir / "data").string() + "', context: " + std::to_string(T) +
             ", eval_tokens: " + std::to_string(T) + ", eval_batch_size: 1}\n"
             "logging: {progress: none}\n");
  const fs::path run = dir / "run";
  RunResult tr = run_lrnn("train --config '" + (dir / "lm.yaml").string() + "' --out '" + run.string() + "'");
  ASSERT_EQ(tr.code, 0) << tr.out;
  RunResult ev = run_lrnn("eval --run '" + run.string() + "' --json");
  ASSERT_EQ(ev.code, 0) << ev.out;
  json e = json::parse(ev.out.substr(ev.out.find('{')));
  ASSERT_EQ(e["windows"], 1);
  const auto curve = e["loss_by_position"].get<std::vector<double>>();
  ASSERT_EQ(curve.size(), size_t(T));
  // The window `lrnn eval` read: the val split's first T + 1 tokens.
  TaskConfig tc;
  tc.name = "lm";
  tc.data = (dir / "data").string();
  tc.context = T;
  LmTask task(tc);
  Batch b = task.eval_batch(0, 1);
  std::vector<int32_t> window(b.tokens.begin(), b.tokens.begin() + T);
  window.push_back(b.labels[size_t(T) - 1]);

  Child server({"serve", "--run", run.string(), "--port", "0", "--no-doc-start", "--model-name", "tiny"},
               dir / "serve.log");
  ASSERT_GT(server.pid, 0);
  int port = 0;
  for (int i = 0; i < 600 && port == 0; ++i) {  // up to 60 s for the model to load
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const std::string log = read_text(dir / "serve.log");
    if (size_t at = log.find("{\"model\""); at != std::string::npos) port = json::parse(log.substr(at, log.find('\n', at) - at))["port"];
  }
  ASSERT_GT(port, 0) << read_text(dir / "serve.log");
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(60);
  auto post = [&](const std::string& path, const json& body) { return cli.Post(path.c_str(), body.dump(), "application/json"); };

  auto res = post("/v1/completions", {{"prompt", window}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 1}, {"model", "tiny"}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  json c = json::parse(res->body)["choices"][0];
  const auto& lp = c["logprobs"]["token_logprobs"];
  ASSERT_EQ(lp.size(), window.size());
  EXPECT_TRUE(lp[0].is_null());
  double max_diff = 0;
  for (int t = 0; t < T; ++t) max_diff = std::max(max_diff, std::abs(-lp[size_t(t) + 1].get<double>() - curve[size_t(t)]));
  // The server reads the window in pieces of the training context through the decode state, eval
  // in one forward: the same numbers up to fp32 rounding (seen: ~1e-6).
  EXPECT_LT(max_diff, 1e-4);

  // A text prompt: the same tokens, the same numbers.
  data::Tokenizer tk = data::Tokenizer::load(tok);
  const std::string text = "ROMEO: But soft, what light through yonder window breaks?";
  auto by_text = post("/v1/completions", {{"prompt", text}, {"max_tokens", 3}, {"temperature", 0}, {"echo", true}, {"logprobs", 0}});
  auto by_ids = post("/v1/completions", {{"prompt", tk.encode(text)}, {"max_tokens", 3}, {"temperature", 0}, {"echo", true}, {"logprobs", 0}});
  ASSERT_TRUE(by_text && by_ids);
  json jt = json::parse(by_text->body)["choices"][0], ji = json::parse(by_ids->body)["choices"][0];
  EXPECT_EQ(jt["logprobs"], ji["logprobs"]);
  EXPECT_EQ(jt["text"], ji["text"]);
  EXPECT_EQ(jt["text"].get<std::string>().rfind(text, 0), 0u);

  auto models = cli.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "tiny");
  EXPECT_EQ(json::parse(models->body)["data"][0]["max_model_len"], T);
  auto info = cli.Get("/tokenizer_info");
  ASSERT_TRUE(info);
  EXPECT_TRUE(json::parse(info->body).contains("eos_token"));
  auto garbage = cli.Post("/v1/completions", "{not json", "application/json");
  ASSERT_TRUE(garbage);
  EXPECT_EQ(garbage->status, 400);
  EXPECT_TRUE(json::parse(garbage->body)["error"]["message"].is_string());
  auto bad_id = post("/v1/completions", {{"prompt", {1, 99999}}});
  ASSERT_TRUE(bad_id);
  EXPECT_EQ(bad_id->status, 400);
  EXPECT_EQ(json::parse(bad_id->body)["error"]["param"], "prompt");
  auto nowhere = cli.Get("/v2/nothing");
  ASSERT_TRUE(nowhere);
  EXPECT_EQ(nowhere->status, 404);
  EXPECT_TRUE(json::parse(nowhere->body).contains("error"));

  // The port is taken: a second server says so.
  RunResult busy = run_lrnn("serve --run '" + run.string() + "' --port " + std::to_string(port));
  EXPECT_EQ(busy.code, 2);
  EXPECT_NE(busy.out.find(std::to_string(port)), std::string::npos) << busy.out;

  kill(server.pid, SIGTERM);
  const int st = server.wait_status();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << read_text(dir / "serve.log");

  // Clear errors: no run, a run that is not a language model, a port in use.
  RunResult none = run_lrnn("serve --run '" + (dir / "nothing").string() + "'");
  EXPECT_EQ(none.code, 2);
  EXPECT_NE(none.out.find("nothing"), std::string::npos) << none.out;
  write_text(dir / "parity.yaml", tiny_config({"training.num_steps=2", "training.checkpoint_every=0"}));
  ASSERT_EQ(run_lrnn("train --config '" + (dir / "parity.yaml").string() + "' --out '" + (dir / "parity").string() + "'").code, 0);
  RunResult parity = run_lrnn("serve --run '" + (dir / "parity").string() + "'");
  EXPECT_EQ(parity.code, 2);
  EXPECT_NE(parity.out.find("not a language model"), std::string::npos) << parity.out;
}
