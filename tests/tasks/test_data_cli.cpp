// `lrnn data` prints samples of every task and every word-problem variant, and rejects bad task
// keys with exit code 2 and a message naming the key.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sstream>
#include "../e2e/cli_util.h"
#include "tasks/task.h"

using namespace lrnn;
using lrnn::test::run_lrnn;

namespace {

std::vector<nlohmann::json> lines(const std::string& out) {
  std::vector<nlohmann::json> v;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) v.push_back(nlohmann::json::parse(line));
  return v;
}

}  // namespace

TEST(DataCli, PrintsSamplesOfEveryTask) {
  for (auto& name : task_names()) {
    if (name == "lm") continue;  // needs a tokenized corpus: tests/lm/test_lm_train.cpp prints its windows
    SCOPED_TRACE(name);
    auto r = run_lrnn("data --task " + name + " --n 3 --seed 2");
    ASSERT_EQ(r.code, 0) << r.out;
    auto js = lines(r.out);
    ASSERT_EQ(js.size(), 3u) << r.out;
    TaskConfig c;
    c.name = name;
    auto task = create_task(c);
    for (auto& j : js) {
      ASSERT_TRUE(j.contains("input") && j.contains("target") && j.contains("text"));
      EXPECT_EQ(j["input"].size(), j["target"].size());
      EXPECT_FALSE(j["text"].get<std::string>().empty());
      for (int x : j["input"]) EXPECT_TRUE(x >= 0 && x < task->vocab_size());
    }
  }
}

TEST(DataCli, WordProblemVariants) {
  auto r = run_lrnn("data --task word_problem --set task.group=S5 --set task.bos=true --length 6 --n 1");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = lines(r.out).at(0);
  EXPECT_EQ(j["input"].size(), 7u);
  EXPECT_EQ(j["input"][0], 121);
  EXPECT_EQ(j["target"][0], 121);
  EXPECT_EQ(j["text"].get<std::string>().rfind("<bos> [", 0), 0u) << j["text"];

  r = run_lrnn("data --task word_problem --set task.group=S5 --set task.tokens_per_element=4 --length 8 --n 1");
  ASSERT_EQ(r.code, 0) << r.out;
  j = lines(r.out).at(0);
  EXPECT_EQ(j["input"][1], 121);
  EXPECT_EQ(j["target"][2], -1);
  EXPECT_NE(j["text"].get<std::string>().find(" _ _ _ "), std::string::npos) << j["text"];

  r = run_lrnn("data --task word_problem --set task.group=S5 --set task.only_swaps=true --length 30 --n 2");
  ASSERT_EQ(r.code, 0) << r.out;
  r = run_lrnn("data --task word_problem --set task.group=S3xZ2 --n 1 --length 4");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(lines(r.out).at(0)["text"].get<std::string>().find("(["), std::string::npos);
  r = run_lrnn("data --task cycle_navigation --set task.cycle_length=6 --n 2");
  ASSERT_EQ(r.code, 0) << r.out;
  r = run_lrnn("data --task modular_arithmetic_with_brackets --set task.mult=true --split eval --n 2");
  ASSERT_EQ(r.code, 0) << r.out;
}

TEST(DataCli, BadTaskKeysExitTwo) {
  struct Case {
    std::string args, says;
  };
  for (auto& c : std::vector<Case>{
           {"--task word_problem --set task.group=Q8", "task.group"},
           {"--task word_problem --set task.group=S3xZ", "task.group"},
           {"--task word_problem --set task.max_moved=-1", "task.max_moved"},
           {"--task word_problem --set task.tokens_per_element=0", "task.tokens_per_element"},
           {"--task word_problem --set task.group=A5 --set task.only_swaps=true", "task.only_swaps"},
           {"--task word_problem --set task.bos=maybe", "task.bos"},
           {"--task parity --set task.group=S5", "task.group"},
           {"--task cycle_navigation --set task.cycle_length=1", "task.cycle_length"},
           {"--task modular_arithmetic --length 2", "no sequence length"},
           {"--task nope", "task.name"},
       }) {
    auto r = run_lrnn("data " + c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << c.args << "\n" << r.out;
  }
}
