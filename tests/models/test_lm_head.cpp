// The language-model head in chunks of rows (models/core_frame.h LmHead): when every label
// counts and the logits of a training batch would exceed lm_head_chunk_elements(), the loss and
// every gradient must be those of the whole-batch head — checked in double for each head the
// models use (RMSNorm for the delta family, Mamba, Llama; LayerNorm for the xLSTMs; tied
// embeddings), with chunks that do not divide the rows — and the training step must hold less.
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include "core/rng.h"
#include "models/core_frame.h"
#include "models/model.h"

using namespace lrnn;

namespace {

struct ChunkElements {  // sets lm_head_chunk_elements() for one scope
  size_t prev;
  explicit ChunkElements(size_t n) : prev(lm_head_chunk_elements()) { lm_head_chunk_elements() = n; }
  ~ChunkElements() { lm_head_chunk_elements() = prev; }
};

void check_chunked_equals_whole(const std::string& yaml) {
  SCOPED_TRACE(yaml);
  const int B = 2, T = 13, N = B * T;
  auto whole = create_model<double>(YAML::Load(yaml), "test", 5);
  auto chunked = create_model<double>(YAML::Load(yaml), "test", 5);
  const int V = whole->vocab_size();
  std::vector<int32_t> tok(N), lab(N);
  Rng r{3, 1};
  for (int i = 0; i < N; ++i) {
    tok[size_t(i)] = int32_t(r.u32(2 * uint64_t(i)) % uint32_t(V));
    lab[size_t(i)] = int32_t(r.u32(2 * uint64_t(i) + 1) % uint32_t(V));  // dense: every position counts
  }
  whole->set_dense_labels(true);
  chunked->set_dense_labels(true);
  const size_t big = whole->activation_bytes(B, T, true);
  const double l_whole = whole->forward(tok.data(), lab.data(), B, T);
  whole->backward();
  ChunkElements five_rows(size_t(5) * V);  // chunks of 5 rows: 5 + 5 + 5 + 5 + 5 + 1
  const size_t small = chunked->activation_bytes(B, T, true);
  const double l_chunked = chunked->forward(tok.data(), lab.data(), B, T);
  chunked->backward();
  EXPECT_NEAR(l_chunked, l_whole, 1e-12 * l_whole);
  double worst = 0;
  for (const auto& e : whole->layout().entries()) {
    double d = 0, s = 0;
    for (size_t i = e.offset; i < e.offset + e.numel; ++i) {
      d = std::max(d, std::abs(chunked->grads[i] - whole->grads[i]));
      s = std::max(s, std::abs(whole->grads[i]));
    }
    worst = std::max(worst, d / (s + 1e-300));
    EXPECT_LE(d, 1e-11 * (s + 1e-300)) << e.name;
  }
  // Logits and dlogits for 5 rows instead of 26: (2 * 21 rows) * V elements less (up to the
  // arena's alignment of the two buffers and the chunk's loss scalar).
  EXPECT_LE(small + size_t(2 * (N - 5)) * V * sizeof(double), big + 256);
  std::printf("%s: loss %.6f, worst gradient difference %.1e (relative), activations %zu -> %zu bytes\n",
              yaml.c_str(), l_whole, worst, big, small);
}

}  // namespace

TEST(LmHead, ChunkedLossAndGradientsEqualTheWholeHead) {
  check_chunked_equals_whole("{model_type: delta_net, vocab_size: 61, hidden_size: 16, num_hidden_layers: 1, "
                             "num_heads: 2, intermediate_size: 32, allow_neg_eigval: true}");
  check_chunked_equals_whole("{model_type: delta_net, vocab_size: 61, hidden_size: 16, num_hidden_layers: 1, "
                             "num_heads: 2, intermediate_size: 32, tie_word_embeddings: true}");
  check_chunked_equals_whole("{model_type: gated_deltaproduct, vocab_size: 47, hidden_size: 16, num_hidden_layers: 1, "
                             "num_heads: 2, head_dim: 8, num_householder: 2, use_forget_gate: true, intermediate_size: 32}");
  check_chunked_equals_whole("{model_type: mamba, vocab_size: 53, hidden_size: 16, num_hidden_layers: 1, state_size: 4, "
                             "tie_word_embeddings: true}");
  check_chunked_equals_whole("{model_type: llama, vocab_size: 59, hidden_size: 16, num_hidden_layers: 1, "
                             "num_attention_heads: 2, intermediate_size: 32}");
  check_chunked_equals_whole("{model_type: mlstm, vocab_size: 43, embedding_dim: 16, num_blocks: 1, num_heads: 2}");
}

// Without dense labels (a task whose labels may be ignored) or below the size, nothing changes:
// the whole batch's logits stay available after a training forward.
TEST(LmHead, OnlyDenseLargeTrainingBatchesAreChunked) {
  auto m = create_model<double>(YAML::Load("{model_type: delta_net, vocab_size: 61, hidden_size: 16, "
                                           "num_hidden_layers: 1, num_heads: 2, intermediate_size: 32}"),
                                "test", 5);
  ChunkElements tiny(61);
  const size_t plain_train = m->activation_bytes(2, 13, true), plain_infer = m->activation_bytes(2, 13, false);
  m->set_dense_labels(true);
  EXPECT_LT(m->activation_bytes(2, 13, true), plain_train);
  EXPECT_EQ(m->activation_bytes(2, 13, false), plain_infer);  // a forward without labels keeps every logit
  m->set_dense_labels(false);
  EXPECT_EQ(m->activation_bytes(2, 13, true), plain_train);
}

// Chunks of 256 rows or more are whole multiples of 128 (the head's GEMM tiles): the default cap
// at V 32000 gives 524 rows, taken as 512; smaller chunks keep cap / V rows.
TEST(LmHead, ChunksOfManyRowsAreWholeTiles) {
  LmHead<float, CpuOps<float>> h;
  h.dense = true;
  const size_t V = 32000;
  {
    ChunkElements cap(size_t(1) << 24);  // 524.3 rows of V
    EXPECT_EQ(h.rows(16384, V, true), 512u);
    EXPECT_EQ(h.rows(300, V, true), 300u);  // fewer rows than a chunk: all of them
    EXPECT_EQ(h.rows(16384, V, false), 16384u);
  }
  {
    ChunkElements cap(255 * V + V / 2);
    EXPECT_EQ(h.rows(16384, V, true), 255u);
  }
  {
    ChunkElements cap(300 * V);
    EXPECT_EQ(h.rows(16384, V, true), 256u);
  }
}
