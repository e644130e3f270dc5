#include "embed_flags.h"

#include <fmt/format.h>

#include <cmath>

namespace ferry::tools {

void AddModelFlags(CLI::App* cmd, ModelFlags* f) {
  cmd->add_option("--vocab", f->vocab, "V: vocabulary size")->capture_default_str();
  cmd->add_option("--eos", f->eos, "EOS token id")->capture_default_str();
  cmd->add_option("--ngram", f->ngram, "N: n-gram size")->capture_default_str();
  cmd->add_option("--heads", f->heads, "H: heads per n-gram order")->capture_default_str();
  cmd->add_option("--embed-dim", f->embed_dim, "E: values per token")->capture_default_str();
  cmd->add_option("--base-vocab", f->base_vocab,
                  "B: head sizes start at B (smaller: a smaller synthetic table)")
      ->capture_default_str();
  cmd->add_option("--padding", f->padding, "P: table rows padded to a multiple of P")
      ->capture_default_str();
  cmd->add_option("--seed", f->seed, "S: hash seed")->capture_default_str();
}

embed::Config ToConfig(const ModelFlags& f) {
  embed::Config c;
  c.vocab_size = f.vocab;
  c.eos_id = f.eos;
  c.ngram_size = f.ngram;
  c.heads_per_ngram = f.heads;
  c.embed_dim = f.embed_dim;
  c.base_vocab = f.base_vocab;
  c.row_padding = f.padding;
  c.seed = f.seed;
  return c;
}

std::vector<std::string> ModelArgs(const ModelFlags& f) {
  return {"--vocab",      std::to_string(f.vocab),      "--eos",        std::to_string(f.eos),
          "--ngram",      std::to_string(f.ngram),      "--heads",      std::to_string(f.heads),
          "--embed-dim",  std::to_string(f.embed_dim),  "--base-vocab", std::to_string(f.base_vocab),
          "--padding",    std::to_string(f.padding),    "--seed",       std::to_string(f.seed)};
}

Result<std::chrono::nanoseconds> DurationFlag(std::string_view flag, double seconds,
                                              std::chrono::seconds max) {
  if (!std::isfinite(seconds) || seconds <= 0 || seconds > static_cast<double>(max.count()))
    return Status(Code::kInvalidArgument,
                  fmt::format("{} {:g}: seconds must be finite and in (0, {}]", flag, seconds,
                              max.count()));
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(seconds));
}

Status RangeFlag(std::string_view flag, int64_t v, int64_t lo, int64_t hi) {
  if (v >= lo && v <= hi) return Status::Ok();
  return Status(Code::kInvalidArgument, std::string(flag) + " " + std::to_string(v) +
                                            " outside [" + std::to_string(lo) + ", " +
                                            std::to_string(hi) + "]");
}

}  // namespace ferry::tools
