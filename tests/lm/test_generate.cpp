// Generation (infer/decoder.h) with a hand-set model whose next token is known: a DeltaNet whose
// mixers and MLPs are switched off (o_proj and down_proj zero) and whose head maps the embedding
// of each token of a chosen text to the next one. Greedy generation must then write the text,
// end at EOS, stop at stop strings, hand over whole UTF-8 characters only, and respect
// max_tokens; sampling with a seed repeats itself.
#include <cmath>
#include <string>
#include <vector>
#include "lm_util.h"
#include "next_token_model.h"
#include "core/rng.h"
#include "data/tokenizer.h"
#include "infer/decoder.h"
#include "models/model.h"

using namespace lrnn;
using namespace lrnn::test;

namespace {

const fs::path& tokenizer_file() {
  static fs::path p = train_small_tokenizer(temp_dir("generate"), 512);
  return p;
}

bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const uint8_t c = uint8_t(s[i]);
    const size_t n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((uint8_t(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

struct Fixture {
  data::Tokenizer tok = data::Tokenizer::load(tokenizer_file());
  // Distinct pieces, one of them a character the tokenizer spells in bytes (é: <0xC3> <0xA9>).
  std::string text = "Good night, sweet princé";
  std::vector<int32_t> ids = tok.encode(text);
  std::unique_ptr<Model<float>> model;
  Fixture() {
    std::vector<int32_t> sorted = ids;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_TRUE(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end()) << "pieces repeat";
    bool bytes = false;
    for (int32_t t : ids) bytes = bytes || tok.is_byte(t);
    EXPECT_TRUE(bytes) << "the text should need byte pieces for é";
    model = next_token_model(tok, ids);
  }
  // The text after the first piece.
  std::string continuation() const { return text.substr(tok.decode(std::vector<int32_t>{ids[0]}).size()); }
};

GenerateOptions greedy(int max_tokens) {
  GenerateOptions o;
  o.max_tokens = max_tokens;
  o.sampling.temperature = 0;
  return o;
}

}  // namespace

TEST(Generate, GreedyWritesTheKnownTextAndEndsAtEos) {
  Fixture f;
  Decoder dec(*f.model);
  std::vector<std::string> pieces;
  Generation g = generate(dec, f.tok, std::vector<int32_t>{f.ids[0]}, greedy(100), [&](const std::string& s) {
    pieces.push_back(s);
    return true;
  });
  EXPECT_EQ(g.text, f.continuation());
  EXPECT_EQ(g.finish_reason, "stop");
  ASSERT_EQ(g.tokens.size(), f.ids.size() - 1);
  for (size_t i = 0; i < g.tokens.size(); ++i) {
    EXPECT_EQ(g.tokens[i].token, f.ids[i + 1]);
    EXPECT_LE(g.tokens[i].logprob, 0.0);
    EXPECT_GT(g.tokens[i].logprob, -1.0);  // the model is sure of each next piece
  }
  std::string joined;
  for (const auto& p : pieces) {
    EXPECT_TRUE(valid_utf8(p)) << "a piece split a character: " << p;
    joined += p;
  }
  EXPECT_EQ(joined, g.text);
  EXPECT_GT(pieces.size(), 3u);  // streamed, not handed over at the end
  // Constant memory: the decode state did not grow while it read and wrote the text.
  EXPECT_EQ(dec.state_bytes(), Decoder(*f.model).state_bytes());
  EXPECT_EQ(dec.position(), int64_t(f.ids.size()));  // the prompt and every generated token but EOS fed back
}

TEST(Generate, StopStringsMaxTokensAndCancel) {
  Fixture f;
  Decoder dec(*f.model);
  GenerateOptions o = greedy(100);
  o.stop = {"zz", "eet"};
  Generation g = generate(dec, f.tok, std::vector<int32_t>{f.ids[0]}, o);
  EXPECT_EQ(g.text, "ood night, sw");
  EXPECT_EQ(g.finish_reason, "stop");

  dec.reset();
  Generation l = generate(dec, f.tok, std::vector<int32_t>{f.ids[0]}, greedy(2));
  EXPECT_EQ(l.tokens.size(), 2u);
  EXPECT_EQ(l.finish_reason, "length");
  EXPECT_EQ(l.text, "ood n");

  dec.reset();
  int calls = 0;
  Generation c = generate(dec, f.tok, std::vector<int32_t>{f.ids[0]}, greedy(100), [&](const std::string&) {
    return ++calls < 2;
  });
  EXPECT_EQ(c.finish_reason, "cancelled");
  EXPECT_EQ(calls, 2);
}

TEST(Generate, SamplingRepeatsWithItsSeed) {
  Fixture f;
  auto m = create_model<float>(YAML::Load("{model_type: delta_net, vocab_size: " + std::to_string(f.tok.vocab_size()) +
                                          ", hidden_size: 32, num_hidden_layers: 1, num_heads: 2, intermediate_size: 32}"),
                               "test", 3);
  Decoder dec(*m);
  GenerateOptions o;
  o.max_tokens = 30;
  o.stop_at_eos = false;
  o.sampling.seed = 5;
  o.sampling.top_p = 0.9;
  Generation a = generate(dec, f.tok, f.ids, o);
  dec.reset();
  Generation b = generate(dec, f.tok, f.ids, o);
  ASSERT_EQ(a.tokens.size(), 30u);
  EXPECT_EQ(a.text, b.text);
  o.sampling.seed = 6;
  dec.reset();
  Generation c = generate(dec, f.tok, f.ids, o);
  bool differs = false;
  for (size_t i = 0; i < 30; ++i) differs = differs || a.tokens[i].token != c.tokens[i].token;
  EXPECT_TRUE(differs) << "an untrained model's near-uniform distribution over 512 pieces drew the same 30 tokens twice";
}
