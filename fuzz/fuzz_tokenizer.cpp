// libFuzzer target: a SentencePiece model from arbitrary bytes (Tokenizer::from_bytes, what
// `lrnn tokenizer` and `lrnn tokenize` do with a .model file), then, if it loads, the special ids,
// pieces, and encode -> decode of a few short texts. fuzz/corpus/tokenizer holds small real
// models (bpe and unigram, 400 pieces, trained by `lrnn tokenizer train`).
// Anything but a UserError (a crash, a sanitizer report, an lrnn::Error, another exception, an
// abort inside SentencePiece, a hang, an allocation over the limit) is a finding.
#include <cstdint>
#include <string>
#include <vector>
#include "data/tokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  lrnn::fuzz::quiet_limits();
  try {
    auto t = lrnn::data::Tokenizer::from_bytes(std::string(reinterpret_cast<const char*>(data), size), "fuzz.model");
    const int v = t.vocab_size();
    for (int id : {0, v - 1, t.bos_id(), t.eos_id(), t.pad_id(), t.unk_id()}) {
      if (id < 0) continue;
      (void)t.piece(id);
      (void)t.is_control(id);
      (void)t.is_byte(id);
    }
    for (const char* text : {"To be, or not to be: that is the question.\n", "  Gr\xc3\xb6\xc3\x9f" "e \xe6\x9d\xb1 \xf0\x9f\x99\x82\t1234", ""}) {
      try {
        std::vector<int32_t> ids = t.encode(text);
        (void)t.decode(ids);
      } catch (const lrnn::UserError&) {
      }
    }
    try {
      std::vector<int32_t> all;
      for (int i = 0; i < v && i < 64; ++i) all.push_back(i);
      (void)t.decode(all);
    } catch (const lrnn::UserError&) {
    }
  } catch (const lrnn::UserError&) {
  }
  return 0;
}
