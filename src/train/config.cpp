#include "train/config.h"
#include <filesystem>
#include "core/check.h"
#include "models/model.h"

namespace lrnn {

void TrainingConfig::describe(io::Schema& s) {
  s.add("num_steps", &num_steps, "optimizer steps", 0, double(kMaxSteps))
      .add("batch_size", &batch_size, "sequences per optimizer step (all micro-batches together)", 1, 1 << 24)
      .add("gradient_accumulation_steps", &gradient_accumulation_steps,
           "micro-batches per step: forward and backward run on batch_size / this many sequences at a time, the "
           "step's gradient is the mean of theirs (memory for one micro-batch)", 1, 1 << 20)
      .add("lr", &lr, "peak learning rate", 0.0, 10.0)
      .add("min_lr", &min_lr, "learning rate at the end of the cosine decay", 0.0, 10.0)
      .add("warmup_steps", &warmup_steps, "linear warmup steps", 0, 1e12)
      .add("weight_decay", &weight_decay, "AdamW decoupled weight decay (not on norms)", 0.0, 10.0)
      .add("beta1", &beta1, "AdamW beta1", 0.0, 0.999999)
      .add("beta2", &beta2, "AdamW beta2", 0.0, 0.99999999)
      .add("adam_eps", &adam_eps, "AdamW epsilon (> 0: with 0, a parameter whose gradient is zero divides 0 by 0)",
           1e-30, 1.0)
      .add("grad_clip", &grad_clip, "max global gradient norm (0 = no clipping)", 0.0, 1e12)
      .add("val_every", &val_every, "evaluate every N steps (0 = only at the end)", 0, 1e12)
      .add("stop_at", &stop_at,
           "stop early once a periodic evaluation (val_every) reaches this scaled accuracy (on the lengths stop_on names) "
           "(P2 stops at 0.99; 0 = never)",
           0.0, 1.0)
      .add("stop_on", &stop_on,
           "the lengths whose scaled accuracy stop_at reads: eval (task.eval_len) or train (task.train_len, like the "
           "DeltaProduct authors' validation split of training-length sequences)",
           {"eval", "train"})
      .add("checkpoint_every", &checkpoint_every, "resumable checkpoint every N steps (0 = only at the end)", 0, 1e12)
      .add("curriculum", &curriculum,
           "curriculum over positions: supervise only the first N target positions (a BOS counts as one), one more "
           "after each epoch whose mean loss is below curriculum_loss, up to the whole sequence (the DeltaProduct "
           "authors' script starts at 2); tasks with a label at every position only; 0 = off",
           0, kMaxSequenceLength)
      .add("curriculum_loss", &curriculum_loss, "mean epoch loss below which the curriculum adds a position", 0.0, 1e6)
      .add("curriculum_every", &curriculum_every,
           "steps per curriculum epoch (0 = one pass over task.train_pool, rounded up)", 0, 1e12)
      .add("curriculum_lr_factor", &curriculum_lr_factor,
           "once the curriculum covers the whole sequence, the learning rate (the schedule's) times this; 1 = unchanged",
           1e-6, 1.0)
      .add("seed", &seed, "seed of initialisation and data", 0, 9.007e15)
      .add("device", &device, "where to train", {"cpu", "cuda"})
      .add("precision", &precision,
           "CUDA only (the CPU computes in fp32): bf16 = the delta-rule family's projections, MLPs and LM head as "
           "bf16 GEMMs and its chunked delta rule with bf16 products, other GEMMs TF32 (close to a bf16 autocast; "
           "the DeltaProduct authors' state-tracking script instead casts the whole model and its AdamW state to "
           "bf16), tf32 = TF32 GEMMs on fp32 data, fp32 = full fp32 GEMMs; parameters, optimizer "
           "state, recurrent state and accumulators are fp32 in every mode",
           {"bf16", "tf32", "fp32"})
      .add("num_threads", &num_threads, "CPU threads (0 = all cores)", 0, 4096);
}

void LoggingConfig::describe(io::Schema& s) {
  s.add("log_every", &log_every, "write a metrics line every N steps", 1, 1e12)
      .add("progress", &progress, "progress display", {"auto", "bar", "lines", "none"});
}

ExperimentConfig ExperimentConfig::load(const std::string& path, const std::vector<std::string>& overrides,
                                        bool open_task) {
  YAML::Node root = io::load_yaml_file(path);
  if (root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  for (auto& o : overrides) io::apply_override(root, o);
  std::string src = overrides.empty() ? path : path + " (with --set)";
  return from_yaml(root, src, open_task);
}

ExperimentConfig ExperimentConfig::from_yaml(YAML::Node root, const std::string& source, bool open_task) {
  ExperimentConfig c;
  c.source = source;
  c.spelled = YAML::Clone(root);
  for (auto it = root.begin(); it != root.end(); ++it) {
    std::string k = it->first.as<std::string>();
    if (k != "training" && k != "model" && k != "task" && k != "logging")
      LRNN_USER_ERROR("{}: {}: unknown block; valid blocks are training, model, task, logging", source, k);
  }
  { io::Schema s(source, "training"); c.training.describe(s); s.parse(root["training"]); }
  { io::Schema s(source, "task"); c.task.describe(s); s.parse(root["task"]); }
  if (!c.task.data.empty() && std::filesystem::path(c.task.data).is_relative())
    c.task.data = std::filesystem::absolute(c.task.data).lexically_normal().string();
  { io::Schema s(source, "logging"); c.logging.describe(s); s.parse(root["logging"]); }
  if (c.task.eval_len[0] < 2 || c.task.train_len[0] < 2)
    LRNN_USER_ERROR("{}: task: lengths must be at least 2", source);
  if (c.training.lr * c.training.weight_decay > 1.0)
    LRNN_USER_ERROR("{}: training.weight_decay: lr * weight_decay must not exceed 1 (each step multiplies the "
                    "weights by 1 - lr * weight_decay), got {} * {}", source, c.training.lr, c.training.weight_decay);
  if (c.training.batch_size % c.training.gradient_accumulation_steps != 0)
    LRNN_USER_ERROR("{}: training.gradient_accumulation_steps: must divide training.batch_size ({}) into equal "
                    "micro-batches, got {}", source, c.training.batch_size, c.training.gradient_accumulation_steps);
  if (c.training.min_lr > c.training.lr)
    LRNN_USER_ERROR("{}: training.min_lr: must not exceed training.lr ({}), got {}", source, c.training.lr, c.training.min_lr);
  if (c.training.curriculum == 0 && c.training.curriculum_lr_factor != 1.0)
    LRNN_USER_ERROR("{}: training.curriculum_lr_factor: applies once a curriculum is complete, and "
                    "training.curriculum is 0", source);
  if (c.training.curriculum > 0 && c.training.curriculum_every == 0 && c.task.train_pool == 0)
    LRNN_USER_ERROR("{}: training.curriculum: its epochs are passes over task.train_pool, which is 0 (fresh data "
                    "every step); set task.train_pool, or training.curriculum_every to the steps per epoch", source);
  c.model = YAML::Clone(root["model"]);
  if (!c.model || c.model.IsNull()) LRNN_USER_ERROR("{}: model: missing block (needs at least model_type)", source);
  if (!c.model.IsMap())
    LRNN_USER_ERROR("{}: model: expected a mapping of keys (model_type: ..., hidden_size: ...), got '{}'", source,
                    c.model.IsScalar() ? c.model.Scalar() : std::string("a list"));
  int vocab = 0;
  if (open_task || !c.model["vocab_size"]) {
    try {
      vocab = create_task(c.task)->vocab_size();  // also checks the task's own keys
    } catch (const UserError& e) {
      LRNN_USER_ERROR("{}: {}", source, e.what());
    }
  }
  if (!c.model["vocab_size"]) c.model["vocab_size"] = vocab;
  // Validate the model block now, so errors come before any work (without building the model: its
  // parameters may not fit this machine, e.g. a config checked on a laptop for a GPU).
  c.model = resolve_model_block(c.model, source);
  const int model_vocab = c.model["vocab_size"].as<int>();
  if (model_vocab < vocab)
    LRNN_USER_ERROR("{}: model.vocab_size: task '{}' needs at least {}, got {}", source, c.task.name, vocab, model_vocab);
  return c;
}

YAML::Node ExperimentConfig::to_yaml() const {
  YAML::Node root(YAML::NodeType::Map);
  TrainingConfig t = training;
  TaskConfig k = task;
  LoggingConfig l = logging;
  { io::Schema s("", "training"); t.describe(s); root["training"] = s.dump(); }
  root["model"] = YAML::Clone(model);
  { io::Schema s("", "task"); k.describe(s); root["task"] = s.dump(); }
  { io::Schema s("", "logging"); l.describe(s); root["logging"] = s.dump(); }
  io::tidy_numbers(root, spelled);
  return root;
}

}  // namespace lrnn
