// litellama-tokenizer-bench: single-thread encode throughput of the tokenizer library on a corpus
// of records (bench/make_tokenizer_corpus.py writes one; one JSON string per line). Each
// repetition loads the tokenizer afresh (so its word cache starts empty) and encodes every record
// once with add_special_tokens=false, the way bench/tokenizer_bench.py times Hugging Face
// tokenizers and tiktoken on the same records. Prints one JSON object: bytes, records, the best
// and median seconds of the repetitions, the best thread CPU seconds, and MB/s of the best
// (1 MB = 10^6 bytes). With
// --ids-out it writes the ids of every record (one line of space-separated ids per record), which
// the driver compares with the reference implementations line by line.
#include <time.h>
#include <algorithm>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "services/tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  CLI::App app{"Single-thread encode throughput of the tokenizer library"};
  std::string tokenizer_dir, corpus_path, ids_out;
  int n_repeat = 5;
  app.add_option("--tokenizer", tokenizer_dir, "tokenizer directory")->required();
  app.add_option("--corpus", corpus_path, "records, one JSON string per line")->required();
  app.add_option("--repeat", n_repeat, "repetitions (the best is reported)")
      ->check(CLI::Range(1, 100));
  app.add_option("--ids-out", ids_out, "write the ids of every record here");
  CLI11_PARSE(app, argc, argv);

  std::ifstream in(corpus_path);
  if (!in) {
    std::fprintf(stderr, "tokenizer-bench: cannot open '%s'\n", corpus_path.c_str());
    return 1;
  }
  std::vector<std::string> records;
  size_t n_bytes = 0;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_string()) {
      std::fprintf(stderr, "tokenizer-bench: record %zu of '%s' is not a JSON string\n",
                   records.size() + 1, corpus_path.c_str());
      return 1;
    }
    records.push_back(j.get<std::string>());
    n_bytes += records.back().size();
  }

  // Wall-clock seconds per repetition, and the thread's CPU seconds (steadier on a busy machine).
  std::vector<double> seconds, cpu_seconds;
  auto thread_cpu_seconds = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  };
  std::vector<std::vector<int32_t>> ids(records.size());
  for (int r = 0; r < n_repeat; ++r) {
    auto tok = litellama::Tokenizer::load(tokenizer_dir);
    if (!tok.is_ok()) {
      std::fprintf(stderr, "tokenizer-bench: %s\n", tok.status().to_string().c_str());
      return 1;
    }
    const double c0 = thread_cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < records.size(); ++i) {
      ids[i] = tok->encode(records[i], /*add_special_tokens=*/false);
    }
    const auto t1 = std::chrono::steady_clock::now();
    seconds.push_back(std::chrono::duration<double>(t1 - t0).count());
    cpu_seconds.push_back(thread_cpu_seconds() - c0);
  }
  std::vector<double> sorted = seconds;
  std::sort(sorted.begin(), sorted.end());

  if (!ids_out.empty()) {
    std::ofstream out(ids_out);
    for (const auto& v : ids) {
      for (size_t k = 0; k < v.size(); ++k) out << (k ? " " : "") << v[k];
      out << '\n';
    }
    if (!out) {
      std::fprintf(stderr, "tokenizer-bench: cannot write '%s'\n", ids_out.c_str());
      return 1;
    }
  }
  nlohmann::json result = {
      {"bytes", n_bytes},
      {"records", records.size()},
      {"repeat", n_repeat},
      {"best_seconds", sorted.front()},
      {"median_seconds", sorted[sorted.size() / 2]},
      {"best_cpu_seconds", *std::min_element(cpu_seconds.begin(), cpu_seconds.end())},
      {"mb_per_s", static_cast<double>(n_bytes) / 1e6 / sorted.front()}};
  std::printf("%s\n", result.dump().c_str());
  return 0;
}
