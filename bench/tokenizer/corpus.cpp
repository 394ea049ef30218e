#include "bench/tokenizer/corpus.h"

#include "engine/tokenizer/utf8.h"

#include <random>
#include <string_view>
#include <vector>

namespace moebatch::bench {
namespace {

constexpr std::string_view kEnglish[] = {
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be",
    "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have",
    "an", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "model", "expert",
    "experts", "routing", "token", "tokens", "layer", "batch", "inference", "memory", "GPU",
    "throughput", "latency", "attention", "weights", "mixture", "sparse", "dense", "training",
    "performance", "cache", "kernel", "queue", "request", "server", "benchmark", "result",
    "language", "research", "history", "government", "people", "system", "during", "between",
    "important", "without", "however", "although", "because", "different", "following",
    "understanding", "particularly", "approximately", "international", "development",
    "don't", "it's", "we're", "they'll", "I've", "Mixture-of-Experts", "state-of-the-art"};

constexpr std::string_view kChinese[] = {
    "我们", "模型", "专家", "混合", "推理", "服务", "批处理", "显卡", "内存", "延迟", "吞吐量",
    "注意力", "权重", "训练", "数据", "系统", "性能", "优化", "计算", "网络", "语言", "文本",
    "问题", "方法", "研究", "发展", "经济", "社会", "历史", "文化", "国家", "城市", "政府",
    "人民", "时间", "工作", "学习", "生活", "重要", "不同", "可以", "因为", "所以", "但是",
    "如果", "已经", "正在", "通过", "进行", "提高", "实现", "使用", "需要", "包括", "以及",
    "一个", "这个", "那些", "非常", "更加", "的", "了", "在", "是", "和", "与", "对", "中",
    "上", "下", "大", "小", "新", "多", "少", "高", "低", "长", "短", "快", "慢"};
constexpr std::string_view kChinesePunct[] = {"，", "，", "，", "、", "；", "："};

constexpr std::string_view kIdents[] = {
    "result", "value", "index", "count", "buffer", "tokens", "weights", "batch_size", "expert_id",
    "hidden", "output", "input", "config", "logits", "scores", "offset", "stride", "cache",
    "request", "queue", "layer", "router", "topk", "num_experts", "seq_len", "head_dim"};
constexpr std::string_view kTypes[] = {"int", "float", "std::size_t", "std::vector<float>",
                                       "const Tensor&", "double", "uint32_t", "bool"};

template <std::size_t N>
std::string_view pick(std::mt19937& rng, const std::string_view (&list)[N]) {
  return list[rng() % N];
}

std::string english_paragraph(std::mt19937& rng) {
  std::string p;
  for (int s = 0, ns = 3 + static_cast<int>(rng() % 5); s < ns; ++s) {
    for (int w = 0, nw = 6 + static_cast<int>(rng() % 14); w < nw; ++w) {
      std::string word(pick(rng, kEnglish));
      if (w == 0) word[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(word[0])));
      if (rng() % 23 == 0) word = std::to_string(rng() % 100000);
      p += word;
      if (w + 1 < nw) p += (rng() % 12 == 0) ? ", " : " ";
    }
    p += (rng() % 8 == 0) ? "? " : ". ";
  }
  p.back() = '\n';
  return p + "\n";
}

std::string chinese_paragraph(std::mt19937& rng) {
  std::string p;
  for (int s = 0, ns = 2 + static_cast<int>(rng() % 4); s < ns; ++s) {
    for (int w = 0, nw = 8 + static_cast<int>(rng() % 16); w < nw; ++w) {
      p += pick(rng, kChinese);
      if (rng() % 30 == 0) p += "GPU";
      if (rng() % 40 == 0) p += std::to_string(rng() % 1000);
      if (w + 1 < nw && rng() % 7 == 0) p += pick(rng, kChinesePunct);
    }
    p += "。";
  }
  return p + "\n\n";
}

std::string code_block(std::mt19937& rng) {
  std::string c;
  const std::string fn(pick(rng, kIdents));
  if (rng() % 2 == 0) {
    c += "// Computes " + fn + " for each expert.\n";
    c += std::string(pick(rng, kTypes)) + " compute_" + fn + "(" + std::string(pick(rng, kTypes)) +
         " " + std::string(pick(rng, kIdents)) + ", int n) {\n";
    for (int l = 0, nl = 3 + static_cast<int>(rng() % 8); l < nl; ++l) {
      const std::string a(pick(rng, kIdents)), b(pick(rng, kIdents));
      switch (rng() % 4) {
        case 0: c += "  for (int i = 0; i < n; ++i) " + a + "[i] += " + b + "[i] * 0.5f;\n"; break;
        case 1: c += "  if (" + a + " > " + std::to_string(rng() % 4096) + ") return " + b + ";\n"; break;
        case 2: c += "  auto " + a + " = " + b + ".size() / " + std::to_string(1 + rng() % 64) + ";\n"; break;
        default: c += "  MB_CHECK(" + a + " != nullptr, \"" + b + " missing\");\n"; break;
      }
    }
    c += "  return " + std::string(pick(rng, kIdents)) + ";\n}\n\n";
  } else {
    c += "def " + fn + "(self, " + std::string(pick(rng, kIdents)) + "):\n";
    c += "    \"\"\"Return the " + fn + " of the batch.\"\"\"\n";
    for (int l = 0, nl = 3 + static_cast<int>(rng() % 8); l < nl; ++l) {
      const std::string a(pick(rng, kIdents)), b(pick(rng, kIdents));
      switch (rng() % 3) {
        case 0: c += "    " + a + " = [x * 2 for x in self." + b + "]\n"; break;
        case 1: c += "    if " + a + " is None:\n        raise ValueError(\"" + b + "\")\n"; break;
        default: c += "    " + a + "[\"" + b + "\"] = {\"k\": " + std::to_string(rng() % 99) + "}\n"; break;
      }
    }
    c += "    return " + std::string(pick(rng, kIdents)) + "\n\n";
  }
  return c;
}

template <typename F>
std::string fill(std::size_t bytes, unsigned seed, F make) {
  std::mt19937 rng(seed);
  std::string out;
  while (out.size() < bytes) out += make(rng);
  return out;
}

}  // namespace

std::string english_text(std::size_t bytes, unsigned seed) {
  return fill(bytes, seed, english_paragraph);
}
std::string chinese_text(std::size_t bytes, unsigned seed) {
  return fill(bytes, seed, chinese_paragraph);
}
std::string code_text(std::size_t bytes, unsigned seed) { return fill(bytes, seed, code_block); }

std::string unicode_text(std::size_t bytes, unsigned seed) {
  // Ranges: Latin-1 + Latin Extended, combining marks, Greek/Cyrillic, Arabic, Devanagari,
  // Thai, Hangul jamo and syllables, CJK, kana, emoji, plus single special characters.
  static constexpr std::pair<char32_t, char32_t> kRanges[] = {
      {0x20, 0x7E},     {0xA0, 0x24F},    {0x300, 0x36F},     {0x370, 0x4FF},
      {0x600, 0x6FF},   {0x900, 0x97F},   {0xE00, 0xE7F},     {0x1100, 0x11FF},
      {0xAC00, 0xD7A3}, {0x4E00, 0x9FFF}, {0x3040, 0x30FF},   {0x1F300, 0x1FAFF},
      {0xFF00, 0xFFEF}, {0x2000, 0x206F}, {0x10000, 0x1FFFF}, {0x20000, 0x2A6DF}};
  static constexpr char32_t kSingles[] = {0x0A, 0x0D, 0x09, 0x85, 0xA0, 0x180E, 0x3000,
                                          0x200D, 0xFE0F, 0x2028, 0x27,  0x20,   0x20};
  std::mt19937 rng(seed);
  std::string out;
  while (out.size() < bytes) {
    char32_t cp;
    if (rng() % 4 == 0) {
      cp = kSingles[rng() % std::size(kSingles)];
    } else {
      const auto [lo, hi] = kRanges[rng() % std::size(kRanges)];
      cp = lo + static_cast<char32_t>(rng() % (hi - lo + 1));
    }
    tok::utf8_append_codepoint(cp, out);
  }
  return out;
}

std::string mixed_text(std::size_t bytes, unsigned seed) {
  return fill(bytes, seed, [](std::mt19937& rng) {
    const unsigned r = rng() % 10;
    return r < 4 ? english_paragraph(rng) : r < 7 ? chinese_paragraph(rng) : code_block(rng);
  });
}

}  // namespace moebatch::bench
