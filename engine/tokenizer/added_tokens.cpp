#include "engine/tokenizer/added_tokens.h"

#include <algorithm>

namespace moebatch::tok {

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  for (std::uint32_t i = 0; i < tokens_.size(); ++i) {
    if (tokens_[i].content.empty()) continue;
    by_first_byte_[static_cast<unsigned char>(tokens_[i].content[0])].push_back(i);
  }
  for (auto& list : by_first_byte_) {
    std::stable_sort(list.begin(), list.end(), [this](std::uint32_t a, std::uint32_t b) {
      return tokens_[a].content.size() > tokens_[b].content.size();
    });
  }
}

std::vector<Segment> AddedTokenMatcher::split(std::string_view text, bool match_special) const {
  std::vector<Segment> out;
  std::size_t plain_start = 0;
  std::size_t i = 0;
  while (i < text.size()) {
    const auto& candidates = by_first_byte_[static_cast<unsigned char>(text[i])];
    const AddedToken* hit = nullptr;
    for (const std::uint32_t c : candidates) {
      const AddedToken& t = tokens_[c];
      if (!match_special && t.special) continue;
      if (text.compare(i, t.content.size(), t.content) == 0) {
        hit = &t;
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    if (i > plain_start) out.push_back(Segment{text.substr(plain_start, i - plain_start), false, 0});
    out.push_back(Segment{{}, true, hit->id});
    i += hit->content.size();
    plain_start = i;
  }
  if (plain_start < text.size()) out.push_back(Segment{text.substr(plain_start), false, 0});
  return out;
}

}  // namespace moebatch::tok
