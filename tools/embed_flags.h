// The model flags shared by `ferry embed-serve` and `ferry bench-embed` (the n-gram layout of
// ferry/embed.h): one declaration of the options, their defaults (the model ferry serves:
// V 248320, N 3, H 8, E 2560, B 20,000,000, P 128, S 1234), and the arguments that hand the
// same values to a spawned embed-serve.
#pragma once

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/embed.h"
#include "ferry/status.h"

namespace ferry::tools {

struct ModelFlags {
  int64_t vocab = 248320;
  int64_t eos = 1;
  int ngram = 3;
  int heads = 8;
  int64_t embed_dim = 2560;
  uint64_t base_vocab = 20000000;
  uint64_t padding = 128;
  uint64_t seed = 1234;
};

// --vocab, --eos, --ngram, --heads, --embed-dim, --base-vocab, --padding, --seed.
void AddModelFlags(CLI::App* cmd, ModelFlags* f);
embed::Config ToConfig(const ModelFlags& f);
// The flags above as command-line arguments.
std::vector<std::string> ModelArgs(const ModelFlags& f);

// A duration flag given in seconds: kInvalidArgument, naming `flag`, unless it is finite and in
// (0, max].
Result<std::chrono::nanoseconds> DurationFlag(std::string_view flag, double seconds,
                                              std::chrono::seconds max);
// An integer flag: kInvalidArgument, naming `flag` and the range, unless lo <= v <= hi.
Status RangeFlag(std::string_view flag, int64_t v, int64_t lo, int64_t hi);

}  // namespace ferry::tools
