// A hand-set language model whose next token is known, for the generation and serving tests: a
// DeltaNet whose mixers and MLPs are switched off (o_proj and down_proj zero) and whose head maps
// the embedding of each token of a chosen text to the next one.
#pragma once
#include <algorithm>
#include <memory>
#include <string>
#include <vector>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>
#include "core/rng.h"
#include "data/tokenizer.h"
#include "models/model.h"

namespace lrnn::test {

// The model: next(ids[i]) = ids[i + 1] and next(ids.back()) = EOS; the ids must be distinct.
inline std::unique_ptr<Model<float>> next_token_model(const data::Tokenizer& tok, const std::vector<int32_t>& ids) {
  const int V = tok.vocab_size(), d = 64;
  auto m = create_model<float>(YAML::Load("{model_type: delta_net, vocab_size: " + std::to_string(V) +
                                          ", hidden_size: 64, num_hidden_layers: 2, num_heads: 2, intermediate_size: 32}"),
                               "test", 1);
  auto& lay = m->layout();
  auto zero = [&](const std::string& name) {
    const ParamEntry* e = lay.find(name);
    EXPECT_TRUE(e) << name;
    std::fill_n(m->params.begin() + std::ptrdiff_t(e->offset), e->numel, 0.f);
  };
  for (int l = 0; l < 2; ++l) {
    zero("model.layers." + std::to_string(l) + ".attn.o_proj.weight");
    zero("model.layers." + std::to_string(l) + ".mlp.down_proj.weight");
  }
  // Embeddings: random unit-scale rows (nearly orthogonal in 64 dimensions); the head's row of
  // next(x) is x's embedding, every other row zero: logit(next(x)) = sqrt(d)·|e_x| after the final
  // RMSNorm, against |cos| · that (cos ~ N(0, 1/64)) for a wrong one.
  const ParamEntry* emb = lay.find("model.embeddings.weight");
  const ParamEntry* head = lay.find("lm_head.weight");
  Rng r{7, 3};
  for (size_t i = 0; i < emb->numel; ++i) m->params[emb->offset + i] = float(r.normal(i));
  std::fill_n(m->params.begin() + std::ptrdiff_t(head->offset), head->numel, 0.f);
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t next = i + 1 < ids.size() ? ids[i + 1] : tok.eos_id();
    for (int c = 0; c < d; ++c)
      m->params[head->offset + size_t(next) * d + size_t(c)] += 4.f * m->params[emb->offset + size_t(ids[i]) * d + size_t(c)];
  }
  return m;
}

}  // namespace lrnn::test
