#include "io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "io/atomic_file.h"

namespace lrnn::io {

// Tensor bytes are copied as-is; safetensors stores little-endian data.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

// ordered_json keeps the header's key order (file order for ties between zero-size tensors)
// and lets the writer put "__metadata__" first and "dtype, shape, data_offsets" in PyTorch's order.
using Json = nlohmann::ordered_json;
// Limits on what a header may ask for (a file from elsewhere is untrusted input):
constexpr uint64_t kMaxHeader = 100'000'000;  // bytes of JSON: the same limit as the reference implementation
constexpr int kMaxDepth = 4;                  // nesting: {tensor: {shape: [..]}} needs 3
constexpr size_t kMaxTensors = 1'000'000;     // entries (a 1.3B-parameter LM has a few hundred)
constexpr size_t kMaxMetadata = 10'000;       // __metadata__ entries

template <class... A>
[[noreturn]] void bad(const std::string& what, fmt::format_string<A...> f, A&&... args) {
  LRNN_USER_ERROR("[safetensors] {}: {} (corrupt or truncated file?)", what,
                  fmt::format(f, std::forward<A>(args)...));
}

// Names come from untrusted files: keep error messages short.
std::string clip(std::string_view s) {
  return s.size() <= 64 ? fmt::format("'{}'", s) : fmt::format("'{}...'", s.substr(0, 64));
}

// numel * element size, or false on overflow.
bool checked_nbytes(const std::vector<uint64_t>& dims, size_t elem, uint64_t& out) {
  out = elem;
  for (uint64_t d : dims)
    if (__builtin_mul_overflow(out, d, &out)) return false;
  return true;
}

uint64_t as_u64(const Json& j, const std::string& what, const std::string& tensor, const char* field) {
  if (!j.is_number_unsigned())
    bad(what, "tensor {}: {} entries must be non-negative integers, got {}", clip(tensor), field, clip(j.dump()));
  return j.get<uint64_t>();
}

struct Entry {
  StTensor t;
  uint64_t begin = 0, end = 0;
};

Entry parse_entry(const std::string& name, const Json& v, const std::string& what) {
  if (!v.is_object()) bad(what, "tensor {} is not a JSON object", clip(name));
  for (auto& [k, _] : v.items())
    if (k != "dtype" && k != "shape" && k != "data_offsets")
      bad(what, "tensor {} has unknown field {}", clip(name), clip(k));
  for (const char* k : {"dtype", "shape", "data_offsets"})
    if (!v.contains(k)) bad(what, "tensor {} has no \"{}\"", clip(name), k);

  Entry e;
  e.t.name = name;
  const Json& dt = v["dtype"];
  if (!dt.is_string() || !dtype_from_name(dt.get_ref<const std::string&>(), e.t.dtype))
    bad(what, "tensor {} has unknown dtype {}", clip(name), clip(dt.dump()));

  const Json& shape = v["shape"];
  if (!shape.is_array()) bad(what, "tensor {}: shape must be an array", clip(name));
  std::vector<uint64_t> dims;
  for (const Json& d : shape) {
    uint64_t x = as_u64(d, what, name, "shape");
    if (x > uint64_t(std::numeric_limits<int64_t>::max()))
      bad(what, "tensor {}: shape dim {} is too large", clip(name), x);
    dims.push_back(x);
  }
  uint64_t nbytes = 0;
  if (!checked_nbytes(dims, dtype_size(e.t.dtype), nbytes))
    bad(what, "tensor {}: shape {} overflows the byte count", clip(name), clip(shape.dump()));
  e.t.shape.assign(dims.begin(), dims.end());

  const Json& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2)
    bad(what, "tensor {}: data_offsets must be [begin, end]", clip(name));
  e.begin = as_u64(off[0], what, name, "data_offsets");
  e.end = as_u64(off[1], what, name, "data_offsets");
  if (e.begin > e.end) bad(what, "tensor {}: data_offsets begin {} > end {}", clip(name), e.begin, e.end);
  if (e.end - e.begin != nbytes)
    bad(what, "tensor {}: data_offsets span {} bytes but {} {} needs {}", clip(name),
        e.end - e.begin, dtype_name(e.t.dtype), clip(shape.dump()), nbytes);
  return e;
}

// nlohmann keeps the last of duplicate keys; a duplicated tensor name is ambiguous, so reject
// duplicates at every level while parsing (one key set per open object).
Json parse_header(std::string_view header, const std::string& what) {
  // The JSON ends the header; only the spaces that pad it to a multiple of 8 may follow. A NUL
  // would end nlohmann's input early and hide what comes after it.
  if (auto nul = header.find('\0'); nul != std::string_view::npos)
    bad(what, "header has a NUL byte at offset {}", nul);
  std::vector<std::set<std::string>> open;
  int depth = 0;
  size_t entries = 0;
  auto cb = [&](int, Json::parse_event_t ev, Json& v) {
    // Depth and entry counts are checked as the parser goes, before a deep or huge header is built.
    if (ev == Json::parse_event_t::object_start || ev == Json::parse_event_t::array_start) {
      if (++depth > kMaxDepth) bad(what, "header nests deeper than {} levels", kMaxDepth);
    } else if (ev == Json::parse_event_t::object_end || ev == Json::parse_event_t::array_end) {
      --depth;
    }
    if (ev == Json::parse_event_t::key && depth == 1 && ++entries > kMaxTensors + 1)
      bad(what, "header lists more than {} tensors", kMaxTensors);
    if (ev == Json::parse_event_t::object_start) open.emplace_back();
    else if (ev == Json::parse_event_t::object_end) open.pop_back();
    else if (ev == Json::parse_event_t::key && !open.back().insert(v.get<std::string>()).second)
      bad(what, "duplicate key {} in the header", clip(v.get<std::string>()));
    return true;
  };
  try {
    return Json::parse(header, cb);
  } catch (const Json::exception& e) {
    bad(what, "header is not valid JSON: {}", e.what());
  }
}

// IEEE half -> float (exact).
float half_to_float(uint16_t h) {
  const int exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float mag = exp == 0    ? std::ldexp(float(man), -24)  // zero or subnormal
              : exp == 31 ? (man ? std::numeric_limits<float>::quiet_NaN() : INFINITY)
                          : std::ldexp(float(man | 0x400), exp - 25);
  return (h & 0x8000) ? -mag : mag;
}

template <class T>
T load(const std::byte* p) { T x; std::memcpy(&x, p, sizeof x); return x; }

template <class Out>
std::vector<Out> to_float_vec(const StTensor& t) {
  if (t.dtype != DType::F32 && t.dtype != DType::F64 && t.dtype != DType::BF16 && t.dtype != DType::F16)
    LRNN_USER_ERROR("[safetensors] tensor '{}' has dtype {}, expected F32, F64, BF16 or F16", t.name,
                    dtype_name(t.dtype));
  std::vector<Out> out(t.numel());
  const std::byte* p = t.data.data();
  for (size_t i = 0; i < out.size(); ++i) {
    switch (t.dtype) {
      case DType::F32: out[i] = Out(load<float>(p + 4 * i)); break;
      case DType::F64: out[i] = Out(load<double>(p + 8 * i)); break;
      case DType::BF16: out[i] = Out(bf16{load<uint16_t>(p + 2 * i)}.to_float()); break;
      default: out[i] = Out(half_to_float(load<uint16_t>(p + 2 * i))); break;  // F16
    }
  }
  return out;
}

}  // namespace

size_t shape_numel(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) {
    LRNN_CHECK(d >= 0, "negative dim {}", d);
    LRNN_CHECK(!__builtin_mul_overflow(n, size_t(d), &n), "shape overflows");
  }
  return n;
}

size_t StTensor::numel() const { return shape_numel(shape); }
std::vector<double> StTensor::to_f64() const { return to_float_vec<double>(*this); }
std::vector<float> StTensor::to_f32() const { return to_float_vec<float>(*this); }

std::vector<int64_t> StTensor::to_i64() const {
  std::vector<int64_t> out(numel());
  if (dtype == DType::I64) std::copy(data.begin(), data.end(), reinterpret_cast<std::byte*>(out.data()));
  else if (dtype == DType::I32)
    for (size_t i = 0; i < out.size(); ++i) out[i] = load<int32_t>(data.data() + 4 * i);
  else
    LRNN_USER_ERROR("[safetensors] tensor '{}' has dtype {}, expected I64 or I32", name, dtype_name(dtype));
  return out;
}

const StTensor* SafeTensors::find(const std::string& name) const {
  for (const StTensor& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

const StTensor& SafeTensors::at(const std::string& name) const {
  if (const StTensor* t = find(name)) return *t;
  LRNN_USER_ERROR("[safetensors] no tensor named '{}' (the file has {} tensors)", name, tensors.size());
}

void SafeTensors::add(std::string name, DType dtype, std::vector<int64_t> shape, const void* src) {
  const size_t nbytes = shape_numel(shape) * dtype_size(dtype);
  LRNN_CHECK(src != nullptr || nbytes == 0, "tensor '{}': null data", name);
  const auto* p = static_cast<const std::byte*>(src);
  tensors.push_back({std::move(name), dtype, std::move(shape), std::vector<std::byte>(p, p + nbytes)});
}

SafeTensors parse_safetensors(std::string_view bytes, const std::string& what) {
  if (bytes.size() < 8) bad(what, "file has {} bytes, fewer than the 8-byte header length", bytes.size());
  const uint64_t n = load<uint64_t>(reinterpret_cast<const std::byte*>(bytes.data()));
  if (n > kMaxHeader) bad(what, "header length {} exceeds the {} byte limit", n, kMaxHeader);
  if (n > bytes.size() - 8) bad(what, "header length {} exceeds the {} bytes that follow it", n, bytes.size() - 8);
  const std::string_view buffer = bytes.substr(8 + n);

  const Json header = parse_header(bytes.substr(8, n), what);
  if (!header.is_object()) bad(what, "header is not a JSON object");

  SafeTensors st;
  std::vector<Entry> entries;
  for (auto& [key, v] : header.items()) {
    if (key != "__metadata__") { entries.push_back(parse_entry(key, v, what)); continue; }
    if (!v.is_object()) bad(what, "__metadata__ is not a JSON object");
    if (v.size() > kMaxMetadata) bad(what, "__metadata__ has {} entries, more than {}", v.size(), kMaxMetadata);
    for (auto& [mk, mv] : v.items()) {
      if (!mv.is_string()) bad(what, "__metadata__ value for {} is not a string", clip(mk));
      st.metadata[mk] = mv.get<std::string>();
    }
  }

  // The data buffer must be covered exactly: sorted by offsets, each tensor starts where the
  // previous ended, and the last ends at the end of the file. This rules out overlaps, gaps,
  // truncation and trailing bytes in one pass. stable_sort keeps header order among ties.
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  uint64_t pos = 0;
  for (const Entry& e : entries) {
    if (e.begin < pos) bad(what, "tensor {} at [{}, {}) overlaps the previous tensor", clip(e.t.name), e.begin, e.end);
    if (e.begin > pos) bad(what, "gap of {} bytes before tensor {}", e.begin - pos, clip(e.t.name));
    pos = e.end;
  }
  if (pos > buffer.size()) bad(what, "tensors need {} data bytes but only {} are present", pos, buffer.size());
  if (pos < buffer.size()) bad(what, "{} trailing bytes after the last tensor", buffer.size() - pos);

  for (Entry& e : entries) {
    const auto* p = reinterpret_cast<const std::byte*>(buffer.data()) + e.begin;
    e.t.data.assign(p, p + (e.end - e.begin));
    st.tensors.push_back(std::move(e.t));
  }
  return st;
}

SafeTensors read_safetensors(const std::filesystem::path& path) {
  return parse_safetensors(read_file(path), path.string());
}

std::string serialize_safetensors(const SafeTensors& st) {
  Json header = Json::object();
  Json& meta = header["__metadata__"] = Json::object();
  meta["format"] = "pt";  // PyTorch loaders expect it; an explicit user value wins
  for (const auto& [k, v] : st.metadata) meta[k] = v;

  std::set<std::string_view> names;
  uint64_t offset = 0;
  for (const StTensor& t : st.tensors) {
    if (t.name == "__metadata__" || !names.insert(t.name).second)
      LRNN_USER_ERROR("[safetensors] cannot write: tensor name '{}' is reserved or duplicated", t.name);
    LRNN_CHECK(t.data.size() == t.numel() * dtype_size(t.dtype), "tensor '{}': {} bytes for {} elements of {}",
               t.name, t.data.size(), t.numel(), dtype_name(t.dtype));
    header[t.name] = Json{{"dtype", std::string(dtype_name(t.dtype))},
                          {"shape", t.shape},
                          {"data_offsets", Json::array({offset, offset + t.data.size()})}};
    offset += t.data.size();
  }

  std::string json;
  try {
    json = header.dump();
  } catch (const Json::exception& e) {  // names that are not valid UTF-8
    LRNN_USER_ERROR("[safetensors] cannot write: {}", e.what());
  }
  json.append((8 - json.size() % 8) % 8, ' ');  // 8 + N is a multiple of 8, as PyTorch pads

  std::string out(8, '\0');
  const uint64_t n = json.size();
  std::memcpy(out.data(), &n, 8);
  out.reserve(8 + json.size() + offset);
  out += json;
  for (const StTensor& t : st.tensors) out.append(reinterpret_cast<const char*>(t.data.data()), t.data.size());
  return out;
}

void write_safetensors(const std::filesystem::path& path, const SafeTensors& st) {
  write_file_atomic(path, serialize_safetensors(st));
}

}  // namespace lrnn::io
