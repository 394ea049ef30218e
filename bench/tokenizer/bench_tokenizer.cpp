// Tokenizer encode throughput, single-threaded, on deterministic English / Chinese / code /
// mixed text (corpus.cpp). "cold" is the first encode of the mixed text by a freshly loaded
// tokenizer (empty piece cache); the other rows are the best of --iters warm runs.
// Prints a table and writes JSON; --corpus-dir also writes each text and our ids for it
// (uint32 little-endian) so hf_peer.py can time Hugging Face tokenizers on identical bytes and check the ids.
//
//   bench_tokenizer [--tokenizer DIR] [--mb 4] [--iters 3] [--json out.json] [--corpus-dir D]
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bench/tokenizer/corpus.h"
#include "engine/tokenizer/tokenizer.h"

namespace {

struct Row {
  std::string name;
  std::size_t bytes;
  std::size_t tokens;
  double seconds;
};

double time_encode(const moebatch::Tokenizer& tk, const std::string& text, std::size_t& tokens) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = tk.encode(text);
  const auto t1 = std::chrono::steady_clock::now();
  tokens = ids.size();
  return std::chrono::duration<double>(t1 - t0).count();
}

Row best_of(const moebatch::Tokenizer& tk, const std::string& name, const std::string& text,
            int iters) {
  Row r{name, text.size(), 0, 1e30};
  for (int i = 0; i < iters; ++i) r.seconds = std::min(r.seconds, time_encode(tk, text, r.tokens));
  return r;
}

void write_file(const std::filesystem::path& p, const void* data, std::size_t n) {
  std::ofstream out(p, std::ios::binary);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = std::string(MOEBATCH_TEST_DATA) + "/qwen3-tokenizer";
  std::string json_path = "bench_tokenizer.json";
  std::string corpus_dir;
  double mb = 4.0;
  int iters = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--tokenizer") dir = argv[i + 1];
    else if (k == "--mb") mb = std::atof(argv[i + 1]);
    else if (k == "--iters") iters = std::max(1, std::atoi(argv[i + 1]));
    else if (k == "--json") json_path = argv[i + 1];
    else if (k == "--corpus-dir") corpus_dir = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  const auto bytes = static_cast<std::size_t>(mb * 1024 * 1024);
  const std::vector<std::pair<std::string, std::string>> texts = {
      {"mixed", moebatch::bench::mixed_text(bytes, 1)},
      {"english", moebatch::bench::english_text(bytes / 2, 2)},
      {"chinese", moebatch::bench::chinese_text(bytes / 2, 3)},
      {"code", moebatch::bench::code_text(bytes / 2, 4)},
      {"unicode", moebatch::bench::unicode_text(bytes / 8, 5)},
  };

  const auto t0 = std::chrono::steady_clock::now();
  const moebatch::Tokenizer tk = moebatch::Tokenizer::from_dir(dir);
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::vector<Row> rows;
  Row cold{"mixed (cold)", texts[0].second.size(), 0, 0};
  cold.seconds = time_encode(tk, texts[0].second, cold.tokens);
  rows.push_back(cold);
  for (const auto& [name, text] : texts) rows.push_back(best_of(tk, name, text, iters));

  std::printf("tokenizer: %s (load %.2f s)\n", dir.c_str(), load_s);
  std::printf("%-14s %10s %10s %9s %10s %12s\n", "text", "MiB", "tokens", "bytes/tok", "MB/s",
              "Mtok/s");
  nlohmann::json out = {{"tokenizer", dir}, {"load_seconds", load_s}, {"iters", iters}};
  for (const Row& r : rows) {
    const double mbps = static_cast<double>(r.bytes) / 1e6 / r.seconds;
    const double mtok = static_cast<double>(r.tokens) / 1e6 / r.seconds;
    std::printf("%-14s %10.2f %10zu %9.2f %10.2f %12.3f\n", r.name.c_str(),
                static_cast<double>(r.bytes) / (1 << 20), r.tokens,
                static_cast<double>(r.bytes) / static_cast<double>(r.tokens), mbps, mtok);
    out["rows"].push_back({{"name", r.name}, {"bytes", r.bytes}, {"tokens", r.tokens},
                           {"seconds", r.seconds}, {"mb_per_s", mbps}});
  }
  std::ofstream(json_path) << out.dump(2) << "\n";

  if (!corpus_dir.empty()) {
    std::filesystem::create_directories(corpus_dir);
    for (const auto& [name, text] : texts) {
      const std::filesystem::path base = std::filesystem::path(corpus_dir) / name;
      write_file(base.string() + ".txt", text.data(), text.size());
      const auto ids = tk.encode(text);
      write_file(base.string() + ".ids.u32", ids.data(), ids.size() * sizeof(ids[0]));
    }
  }
  return 0;
}
