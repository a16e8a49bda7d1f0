// Typed, validated binding of a YAML mapping to a C++ struct. Each config struct lists its keys
// once (name, target field, help, range); the same list parses, validates, reports unknown keys,
// and writes the resolved config back. Errors are UserErrors naming the source and the key.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>
#include <yaml-cpp/yaml.h>

namespace lrnn::io {

class Schema {
 public:
  // `where` names the source for messages (a file path); `prefix` the block ("training").
  Schema(std::string where, std::string prefix) : where_(std::move(where)), prefix_(std::move(prefix)) {}

  struct Field {
    std::string key, help, type;
    std::function<void(const YAML::Node&)> read;   // throws UserError on a bad value
    std::function<YAML::Node()> write;
  };

  Schema& add(const std::string& key, int64_t* t, const std::string& help,
              std::optional<double> lo = {}, std::optional<double> hi = {});
  Schema& add(const std::string& key, int* t, const std::string& help,
              std::optional<double> lo = {}, std::optional<double> hi = {});
  Schema& add(const std::string& key, double* t, const std::string& help,
              std::optional<double> lo = {}, std::optional<double> hi = {});
  Schema& add(const std::string& key, bool* t, const std::string& help);
  Schema& add(const std::string& key, std::string* t, const std::string& help,
              std::vector<std::string> choices = {});
  // An inclusive integer range written as [lo, hi], min_lo <= lo <= hi <= max_hi.
  Schema& add(const std::string& key, std::array<int, 2>* t, const std::string& help, int min_lo = 0,
              int max_hi = 1 << 30);

  // Reads every key of `node` (a mapping or null); unknown keys are errors listing the valid ones.
  void parse(const YAML::Node& node) const;
  YAML::Node dump() const;
  const std::vector<Field>& fields() const { return fields_; }
  std::string full(const std::string& key) const { return prefix_.empty() ? key : prefix_ + "." + key; }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const;

 private:
  std::string where_, prefix_;
  std::vector<Field> fields_;
};

// Applies `key=value` (dotted key, YAML scalar or flow value) to a YAML tree, creating blocks.
void apply_override(YAML::Node& root, const std::string& assignment);
// Reads a YAML file whose top level is a mapping (`expected` describes it for the error) and
// checks it with check_yaml_tree. UserError naming the file, line and key otherwise.
YAML::Node load_yaml_file(const std::string& path,
                          const std::string& expected = "blocks training/model/task/logging");
// What YAML allows but a config must not have: a key said twice (YAML parsers keep one of them
// silently) and keys that are not plain names (a list or mapping as a key).
void check_yaml_tree(const YAML::Node& n, const std::string& where, const std::string& path);
// The largest YAML file lrnn reads (configs and grids are a few KB).
inline constexpr uint64_t kMaxYamlBytes = 16 << 20;

// Numbers in a resolved config as a person writes them: a value the user spelled (in `spelled`,
// the same tree as the user's YAML) keeps that spelling ("5.0e-3"); any other non-integer number
// gets its shortest exact form ("0.1", not yaml-cpp's "0.10000000000000001"). Other scalars stay.
void tidy_numbers(YAML::Node& resolved, const YAML::Node& spelled);
// The number a scalar's whole text denotes, if it is one.
std::optional<double> scalar_number(const std::string& text);

}  // namespace lrnn::io
