#include "io/schema.h"
#include <cmath>
#include <filesystem>
#include <fmt/format.h>
#include "core/check.h"
#include "io/atomic_file.h"
#include <map>

namespace lrnn::io {

void Schema::fail(const std::string& key, const std::string& what) const {
  LRNN_USER_ERROR("{}: {}: {}", where_, full(key), what);
}

static std::string shown(const YAML::Node& n) {
  if (n.IsScalar()) return "'" + n.Scalar() + "'";
  if (n.IsSequence()) return "a list";
  if (n.IsMap()) return "a mapping";
  return "nothing";
}

template <class N>
static std::function<void(const YAML::Node&)> number_reader(const Schema* s, std::string key, N* t,
                                                            std::optional<double> lo,
                                                            std::optional<double> hi, const char* type) {
  return [=](const YAML::Node& n) {
    std::string range = lo && hi ? fmt::format(" in [{}, {}]", *lo, *hi)
                        : lo     ? fmt::format(" >= {}", *lo)
                        : hi     ? fmt::format(" <= {}", *hi)
                                 : "";
    N v{};
    bool ok = n.IsScalar();
    if (ok) {
      try { v = n.as<N>(); } catch (const YAML::Exception&) { ok = false; }
    }
    if (ok && std::is_floating_point_v<N> && !std::isfinite(double(v))) ok = false;
    if (!ok) s->fail(key, fmt::format("expected {}{}, got {}", type, range, shown(n)));
    if ((lo && double(v) < *lo) || (hi && double(v) > *hi))
      s->fail(key, fmt::format("expected {}{}, got {}", type, range, n.Scalar()));
    *t = v;
  };
}

Schema& Schema::add(const std::string& key, int64_t* t, const std::string& help,
                    std::optional<double> lo, std::optional<double> hi) {
  fields_.push_back({key, help, "integer", number_reader(this, key, t, lo, hi, "an integer"),
                     [t] { return YAML::Node(*t); }});
  return *this;
}
Schema& Schema::add(const std::string& key, int* t, const std::string& help,
                    std::optional<double> lo, std::optional<double> hi) {
  fields_.push_back({key, help, "integer", number_reader(this, key, t, lo, hi, "an integer"),
                     [t] { return YAML::Node(*t); }});
  return *this;
}
Schema& Schema::add(const std::string& key, double* t, const std::string& help,
                    std::optional<double> lo, std::optional<double> hi) {
  fields_.push_back({key, help, "number", number_reader(this, key, t, lo, hi, "a number"),
                     [t] { return YAML::Node(*t); }});
  return *this;
}
Schema& Schema::add(const std::string& key, bool* t, const std::string& help) {
  fields_.push_back({key, help, "bool",
                     [this, key, t](const YAML::Node& n) {
                       bool ok = n.IsScalar();
                       if (ok) {
                         try { *t = n.as<bool>(); } catch (const YAML::Exception&) { ok = false; }
                       }
                       if (!ok) fail(key, fmt::format("expected true or false, got {}", shown(n)));
                     },
                     [t] { return YAML::Node(*t); }});
  return *this;
}
Schema& Schema::add(const std::string& key, std::string* t, const std::string& help,
                    std::vector<std::string> choices) {
  fields_.push_back({key, help, "string",
                     [this, key, t, choices](const YAML::Node& n) {
                       if (!n.IsScalar()) fail(key, fmt::format("expected a string, got {}", shown(n)));
                       std::string v = n.Scalar();
                       if (!choices.empty() && std::find(choices.begin(), choices.end(), v) == choices.end())
                         fail(key, fmt::format("expected one of [{}], got '{}'", fmt::join(choices, ", "), v));
                       *t = v;
                     },
                     [t] { return YAML::Node(*t); }});
  return *this;
}
Schema& Schema::add(const std::string& key, std::array<int, 2>* t, const std::string& help, int min_lo,
                    int max_hi) {
  fields_.push_back({key, help, "range",
                     [this, key, t, min_lo, max_hi](const YAML::Node& n) {
                       std::array<int, 2> v{};
                       bool ok = n.IsSequence() && n.size() == 2;
                       if (ok) {
                         try { v = {n[0].as<int>(), n[1].as<int>()}; } catch (const YAML::Exception&) { ok = false; }
                       }
                       if (!ok || v[0] < min_lo || v[1] < v[0] || v[1] > max_hi)
                         fail(key, fmt::format("expected [lo, hi] with {} <= lo <= hi <= {}, got {}", min_lo, max_hi,
                                               n.IsSequence() ? YAML::Dump(n) : shown(n)));
                       *t = v;
                     },
                     [t] {
                       YAML::Node n(YAML::NodeType::Sequence);
                       n.push_back((*t)[0]);
                       n.push_back((*t)[1]);
                       n.SetStyle(YAML::EmitterStyle::Flow);
                       return n;
                     }});
  return *this;
}

void Schema::parse(const YAML::Node& node) const {
  if (!node || node.IsNull()) return;
  if (!node.IsMap()) LRNN_USER_ERROR("{}: {}: expected a mapping of keys, got {}", where_, prefix_, shown(node));
  for (auto it = node.begin(); it != node.end(); ++it) {
    std::string key = it->first.as<std::string>();
    auto f = std::find_if(fields_.begin(), fields_.end(), [&](const Field& x) { return x.key == key; });
    if (f == fields_.end()) {
      std::vector<std::string> keys;
      for (auto& x : fields_) keys.push_back(x.key);
      fail(key, fmt::format("unknown key; valid keys are: {}", fmt::join(keys, ", ")));
    }
    f->read(it->second);
  }
}

YAML::Node Schema::dump() const {
  YAML::Node n(YAML::NodeType::Map);
  for (auto& f : fields_) n[f.key] = f.write();
  return n;
}

void apply_override(YAML::Node& root, const std::string& assignment) {
  auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    LRNN_USER_ERROR("--set {}: expected key=value with a dotted key, e.g. training.lr=3e-4", assignment);
  std::string key = assignment.substr(0, eq), value = assignment.substr(eq + 1);
  YAML::Node v;
  try { v = YAML::Load(value); } catch (const YAML::Exception& e) {
    LRNN_USER_ERROR("--set {}: value is not valid YAML: {}", assignment, e.msg);
  }
  check_yaml_tree(v, "--set " + assignment, key);
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    auto dot = key.find('.', start);
    parts.push_back(key.substr(start, dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  if (parts.size() < 2) LRNN_USER_ERROR("--set {}: key must name a block and a key, e.g. training.lr", assignment);
  // yaml-cpp nodes are handles: walking with operator[] on copies edits the tree in place.
  std::vector<YAML::Node> chain{root};
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    YAML::Node next = chain.back()[parts[i]];
    if (next.IsDefined() && !next.IsNull() && !next.IsMap())
      LRNN_USER_ERROR("--set {}: '{}' is not a block", assignment, parts[i]);
    chain.push_back(next);
  }
  chain.back()[parts.back()] = v;
}

void check_yaml_tree(const YAML::Node& n, const std::string& where, const std::string& path) {
  if (n.IsSequence()) {
    for (size_t i = 0; i < n.size(); ++i) check_yaml_tree(n[i], where, fmt::format("{}[{}]", path, i));
    return;
  }
  if (!n.IsMap()) return;
  std::map<std::string, YAML::Mark> seen;
  for (auto it = n.begin(); it != n.end(); ++it) {
    const YAML::Mark at = it->first.Mark();
    if (!it->first.IsScalar())
      LRNN_USER_ERROR("{}:{}:{}: {}: a key must be a plain name, got {}", where, at.line + 1, at.column + 1,
                      path.empty() ? "top level" : path, it->first.IsSequence() ? "a list" : "a mapping");
    const std::string key = it->first.Scalar();
    const std::string full = path.empty() ? key : path + "." + key;
    auto [first, fresh] = seen.emplace(key, at);
    if (!fresh)
      LRNN_USER_ERROR("{}:{}:{}: {}: duplicate key (first at line {}); say each key once", where, at.line + 1,
                      at.column + 1, full, first->second.line + 1);
    check_yaml_tree(it->second, where, full);
  }
}

YAML::Node load_yaml_file(const std::string& path, const std::string& expected) {
  if (!std::filesystem::is_regular_file(path)) LRNN_USER_ERROR("{}: no such config file", path);
  YAML::Node n;
  try {
    n = YAML::Load(read_file(path, kMaxYamlBytes));
  } catch (const YAML::Exception& e) {
    LRNN_USER_ERROR("{}:{}:{}: not valid YAML: {}", path, e.mark.line + 1, e.mark.column + 1, e.msg);
  }
  if (!n.IsNull() && !n.IsMap()) LRNN_USER_ERROR("{}: expected a mapping with {}", path, expected);
  check_yaml_tree(n, path, "");
  return n;
}

std::optional<double> scalar_number(const std::string& text) {
  if (text.empty()) return std::nullopt;
  YAML::Node n(text);
  try {
    return n.as<double>();
  } catch (const YAML::Exception&) {
    return std::nullopt;
  }
}

void tidy_numbers(YAML::Node& resolved, const YAML::Node& spelled) {
  if (resolved.IsMap()) {
    for (auto it = resolved.begin(); it != resolved.end(); ++it) {
      YAML::Node child = it->second;  // a handle: edits land in `resolved`
      const std::string key = it->first.as<std::string>();
      YAML::Node user = spelled && spelled.IsMap() ? spelled[key] : YAML::Node();
      tidy_numbers(child, user);
    }
    return;
  }
  if (resolved.IsSequence()) {
    for (size_t i = 0; i < resolved.size(); ++i) {
      YAML::Node child = resolved[i];
      YAML::Node user = spelled && spelled.IsSequence() && i < spelled.size() ? spelled[i] : YAML::Node();
      tidy_numbers(child, user);
    }
    return;
  }
  if (!resolved.IsScalar()) return;
  const std::string text = resolved.Scalar();
  auto v = scalar_number(text);
  if (!v || text.find_first_of(".eE") == std::string::npos) return;  // not a number, or an integer
  if (spelled && spelled.IsScalar()) {
    auto u = scalar_number(spelled.Scalar());
    if (u && *u == *v) {
      resolved = spelled.Scalar();
      return;
    }
  }
  std::string shortest = fmt::format("{}", *v);
  if (shortest.find_first_of(".eEn") == std::string::npos) shortest += ".0";  // stays a float: 1 -> 1.0
  resolved = shortest;
}

}  // namespace lrnn::io
