// Placeholder: filled in by its owner.
#include <benchmark/benchmark.h>
BENCHMARK_MAIN();
